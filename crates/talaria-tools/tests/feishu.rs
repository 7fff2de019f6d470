//! The `feishu_doc_read` and `feishu_drive_*` tools against the fake
//! Feishu Open Platform on 127.0.0.1.

use std::sync::Arc;

use async_trait::async_trait;
use serde_json::{Value, json};
use talaria_agent::interaction::{ApprovalDecision, ApprovalRequest, ClarifyRequest, Interaction};
use talaria_agent::tools::{SessionState, Tool, ToolContext};
use talaria_core::{Config, Home, Redactor};
use talaria_platforms::feishu::FeishuSettings;
use talaria_testkit::feishu::FakeFeishu;
use talaria_tools::feishu::{MAX_DOCUMENT_CHARS, feishu_tools};
use tokio_util::sync::CancellationToken;

const APP_ID: &str = "cli_tools0123456789";
const APP_SECRET: &str = "tools-feishu-app-secret-0123";
const BOT: &str = "ou_bot0tools";

/// Nobody is asked anything: these tools never ask.
struct Nobody;

#[async_trait]
impl Interaction for Nobody {
    async fn approve(&self, _request: &ApprovalRequest) -> ApprovalDecision {
        ApprovalDecision::Deny
    }

    async fn clarify(&self, _request: &ClarifyRequest) -> Option<String> {
        None
    }
}

struct ToolRig {
    fake: FakeFeishu,
    tools: Vec<Arc<dyn Tool>>,
    ctx: ToolContext,
    _dir: tempfile::TempDir,
}

impl ToolRig {
    async fn start() -> ToolRig {
        let fake = FakeFeishu::start(APP_ID, APP_SECRET, BOT).await;
        let settings = FeishuSettings::new(APP_ID, APP_SECRET, &fake.base_url());
        let tools = feishu_tools(&settings).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let home = Home::at(dir.path().join("home"));
        home.ensure().unwrap();
        let store = Arc::new(talaria_store::SqliteStore::open(&home.state_db()).unwrap());
        let ctx = ToolContext {
            session_id: "s1".into(),
            home,
            workdir: dir.path().to_path_buf(),
            config: Arc::new(Config::default()),
            store,
            interaction: Arc::new(Nobody),
            session: Arc::new(SessionState::default()),
            redactor: Redactor::default(),
            cancel: CancellationToken::new(),
            execution: talaria_agent::Execution::local(dir.path()),
            tools: Arc::new(talaria_agent::tools::Registry::new()),
            platform: None,
            progress: talaria_agent::Progress::none(),
        };
        ToolRig {
            fake,
            tools,
            ctx,
            _dir: dir,
        }
    }

    fn tool(&self, name: &str) -> &Arc<dyn Tool> {
        self.tools
            .iter()
            .find(|t| t.name() == name)
            .unwrap_or_else(|| panic!("no tool {name}"))
    }

    async fn call(&self, name: &str, args: Value) -> Result<String, String> {
        self.tool(name).call(args, &self.ctx).await.map_err(|e| e.0)
    }

    /// The last call the fake accepted that starts with `prefix`.
    fn last_call(&self, prefix: &str) -> String {
        self.fake
            .calls()
            .into_iter()
            .rev()
            .find(|c| c.starts_with(prefix))
            .unwrap_or_else(|| panic!("no call {prefix}: {:?}", self.fake.calls()))
    }
}

#[tokio::test]
async fn the_tools_have_the_ancestors_names_and_arguments() {
    let rig = ToolRig::start().await;
    let names: Vec<&str> = rig.tools.iter().map(|t| t.name()).collect();
    assert_eq!(
        names,
        [
            "feishu_doc_read",
            "feishu_drive_list_comments",
            "feishu_drive_list_comment_replies",
            "feishu_drive_reply_comment",
            "feishu_drive_add_comment",
        ]
    );
    let required = |name: &str| rig.tool(name).parameters()["required"].clone();
    assert_eq!(required("feishu_doc_read"), json!(["doc_token"]));
    assert_eq!(
        required("feishu_drive_list_comments"),
        json!(["file_token"])
    );
    assert_eq!(
        required("feishu_drive_list_comment_replies"),
        json!(["file_token", "comment_id"])
    );
    assert_eq!(
        required("feishu_drive_reply_comment"),
        json!(["file_token", "comment_id", "content"])
    );
    assert_eq!(
        required("feishu_drive_add_comment"),
        json!(["file_token", "content"])
    );
    for name in names {
        assert_eq!(
            talaria_core::toolsets::toolset_of(name),
            Some(if name == "feishu_doc_read" {
                "feishu_doc"
            } else {
                "feishu_drive"
            }),
            "{name}"
        );
    }
}

#[tokio::test]
async fn doc_read_returns_the_text_and_cuts_a_long_document_with_a_note() {
    let rig = ToolRig::start().await;
    rig.fake
        .add_document("doxcnShort", "Launch plan\nShip on Friday.");
    let text = rig
        .call("feishu_doc_read", json!({"doc_token": "doxcnShort"}))
        .await
        .unwrap();
    assert_eq!(text, "Launch plan\nShip on Friday.");
    assert!(
        rig.last_call("GET /open-apis/docx/v1/documents/doxcnShort/raw_content")
            .contains("lang=0")
    );
    let long = "é".repeat(MAX_DOCUMENT_CHARS + 500);
    rig.fake.add_document("doxcnLong", &long);
    let text = rig
        .call("feishu_doc_read", json!({"doc_token": "doxcnLong"}))
        .await
        .unwrap();
    assert!(text.starts_with(&"é".repeat(MAX_DOCUMENT_CHARS)));
    assert!(
        text.ends_with(&format!(
            "[cut: showing {MAX_DOCUMENT_CHARS} of {} characters; the rest of the document is not shown]",
            MAX_DOCUMENT_CHARS + 500
        )),
        "{}",
        &text[text.len() - 200..]
    );
}

#[tokio::test]
async fn a_refusal_from_feishu_is_a_clear_tool_error() {
    let rig = ToolRig::start().await;
    rig.fake.forbid_document("doxcnSecret");
    let err = rig
        .call("feishu_doc_read", json!({"doc_token": "doxcnSecret"}))
        .await
        .unwrap_err();
    assert!(
        err.contains("cannot read the document doxcnSecret"),
        "{err}"
    );
    assert!(err.contains("1770032"), "{err}");
    assert!(err.contains("shared with the app"), "{err}");
    assert!(!err.contains(APP_SECRET), "{err}");
    let err = rig
        .call("feishu_doc_read", json!({"doc_token": "doxcnNowhere"}))
        .await
        .unwrap_err();
    assert!(
        err.contains("1770002") && err.contains("no such document"),
        "{err}"
    );
    // A token that is not Feishu's never reaches the platform.
    let before = rig.fake.calls().len();
    let err = rig
        .call(
            "feishu_doc_read",
            json!({"doc_token": "../../im/v1/messages"}),
        )
        .await
        .unwrap_err();
    assert!(err.contains("must be a Feishu token"), "{err}");
    assert_eq!(rig.fake.calls().len(), before);
}

#[tokio::test]
async fn list_comments_pages_and_sends_the_ancestors_query() {
    let rig = ToolRig::start().await;
    rig.fake.add_comment(
        "doxcnC",
        "Plan",
        "7001",
        "ship on Friday",
        &[("8001", "is Friday realistic?"), ("8002", "yes")],
        0,
    );
    rig.fake
        .add_comment("doxcnC", "Plan", "7002", "", &[("8003", "looks good")], 0);
    rig.fake.add_comment(
        "doxcnOther",
        "Other",
        "7003",
        "",
        &[("8004", "elsewhere")],
        0,
    );
    let first = rig
        .call(
            "feishu_drive_list_comments",
            json!({"file_token": "doxcnC", "page_size": 1}),
        )
        .await
        .unwrap();
    let call = rig.last_call("GET /open-apis/drive/v1/files/doxcnC/comments");
    for part in ["file_type=docx", "user_id_type=open_id", "page_size=1"] {
        assert!(call.contains(part), "{call}");
    }
    assert!(!call.contains("is_whole"), "{call}");
    assert!(
        first.contains("comment 7001 (local, open) on \"ship on Friday\""),
        "{first}"
    );
    assert!(
        first.contains("reply 8001 by ou_commenter: @ou_bot0tools is Friday realistic?"),
        "{first}"
    );
    assert!(!first.contains("7002"), "{first}");
    assert!(
        first.ends_with("more: call again with page_token \"1\""),
        "{first}"
    );
    let second = rig
        .call(
            "feishu_drive_list_comments",
            json!({"file_token": "doxcnC", "page_size": 1, "page_token": "1"}),
        )
        .await
        .unwrap();
    assert!(
        second.contains("comment 7002 (whole-document, open)"),
        "{second}"
    );
    assert!(!second.contains("more:"), "{second}");
    let whole = rig
        .call(
            "feishu_drive_list_comments",
            json!({"file_token": "doxcnC", "is_whole": true, "file_type": "docx"}),
        )
        .await
        .unwrap();
    assert!(
        rig.last_call("GET /open-apis/drive/v1/files/doxcnC/comments")
            .contains("is_whole=true")
    );
    assert!(whole.contains("7002") && !whole.contains("7001"), "{whole}");
    let err = rig
        .call(
            "feishu_drive_list_comments",
            json!({"file_token": "doxcnC", "page_size": 500}),
        )
        .await
        .unwrap_err();
    assert!(err.contains("page_size"), "{err}");
}

#[tokio::test]
async fn list_replies_pages_through_a_thread() {
    let rig = ToolRig::start().await;
    rig.fake.add_comment(
        "doxcnR",
        "Plan",
        "7101",
        "quoted",
        &[("8101", "one"), ("8102", "two"), ("8103", "three")],
        0,
    );
    let first = rig
        .call(
            "feishu_drive_list_comment_replies",
            json!({"file_token": "doxcnR", "comment_id": "7101", "page_size": 2}),
        )
        .await
        .unwrap();
    let call = rig.last_call("GET /open-apis/drive/v1/files/doxcnR/comments/7101/replies");
    assert!(
        call.contains("file_type=docx") && call.contains("page_size=2"),
        "{call}"
    );
    assert!(
        first.contains("reply 8101") && first.contains("reply 8102"),
        "{first}"
    );
    assert!(
        first.ends_with("more: call again with page_token \"2\""),
        "{first}"
    );
    let rest = rig
        .call(
            "feishu_drive_list_comment_replies",
            json!({"file_token": "doxcnR", "comment_id": "7101", "page_size": 2, "page_token": "2"}),
        )
        .await
        .unwrap();
    assert_eq!(rest, "reply 8103 by ou_commenter: @ou_bot0tools three");
    let err = rig
        .call(
            "feishu_drive_list_comment_replies",
            json!({"file_token": "doxcnR", "comment_id": "9999"}),
        )
        .await
        .unwrap_err();
    assert!(err.contains("1069303"), "{err}");
}

#[tokio::test]
async fn reply_and_add_comment_post_in_the_thread_and_on_the_document() {
    let rig = ToolRig::start().await;
    rig.fake
        .add_comment("doxcnW", "Plan", "7201", "quoted", &[("8201", "why?")], 0);
    let out = rig
        .call(
            "feishu_drive_reply_comment",
            json!({"file_token": "doxcnW", "comment_id": "7201", "content": "Because."}),
        )
        .await
        .unwrap();
    assert!(
        out.starts_with("replied to comment 7201 (reply reply_"),
        "{out}"
    );
    let added = rig
        .call(
            "feishu_drive_add_comment",
            json!({"file_token": "doxcnW", "content": "Summary: fine.", "file_type": "docx"}),
        )
        .await
        .unwrap();
    assert!(
        added.contains("added a whole-document comment on doxcnW"),
        "{added}"
    );
    let posted = rig.fake.comment_replies();
    assert_eq!(posted.len(), 2);
    assert_eq!(posted[0].comment_id.as_deref(), Some("7201"));
    assert_eq!(
        (posted[0].file_type.as_str(), posted[0].text.as_str()),
        ("docx", "Because.")
    );
    assert_eq!(posted[1].comment_id, None);
    assert_eq!(posted[1].text, "Summary: fine.");
    // The new reply is in the thread now.
    let thread = rig
        .call(
            "feishu_drive_list_comment_replies",
            json!({"file_token": "doxcnW", "comment_id": "7201"}),
        )
        .await
        .unwrap();
    assert!(thread.ends_with("Because."), "{thread}");
    // A thread that takes no replies: the error says what to do instead.
    rig.fake.close_comment("7201");
    let err = rig
        .call(
            "feishu_drive_reply_comment",
            json!({"file_token": "doxcnW", "comment_id": "7201", "content": "again"}),
        )
        .await
        .unwrap_err();
    assert!(
        err.contains("1069302") && err.contains("feishu_drive_add_comment"),
        "{err}"
    );
    assert_eq!(
        rig.fake.comment_replies().len(),
        2,
        "nothing more was posted"
    );
    let err = rig
        .call(
            "feishu_drive_add_comment",
            json!({"file_token": "doxcnW", "content": "   "}),
        )
        .await
        .unwrap_err();
    assert!(err.contains("`content`"), "{err}");
}

#[tokio::test]
async fn the_tools_share_one_tenant_token_and_renew_it_once_when_refused() {
    let rig = ToolRig::start().await;
    rig.fake.add_document("doxcnT", "text");
    for _ in 0..3 {
        rig.call("feishu_doc_read", json!({"doc_token": "doxcnT"}))
            .await
            .unwrap();
    }
    assert_eq!(rig.fake.tokens_issued(), 1);
    rig.fake.invalidate_token();
    rig.call("feishu_doc_read", json!({"doc_token": "doxcnT"}))
        .await
        .unwrap();
    assert_eq!(rig.fake.tokens_issued(), 2);
}
