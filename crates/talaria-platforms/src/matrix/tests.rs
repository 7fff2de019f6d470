//! The Matrix adapter's unit tests.

use super::*;

struct NoCursors;
#[async_trait]
impl CursorStore for NoCursors {
    async fn cursor(&self, _: &str, _: &str) -> talaria_store::Result<Option<String>> {
        Ok(None)
    }
    async fn set_cursor(&self, _: &str, _: &str, _: &str) -> talaria_store::Result<()> {
        Ok(())
    }
    async fn delete_cursor(&self, _: &str, _: &str) -> talaria_store::Result<bool> {
        Ok(false)
    }
}

fn settings(token: &str, homeserver: &str) -> MatrixSettings {
    MatrixSettings {
        homeserver: homeserver.into(),
        access_token: token.into(),
        user_id: None,
        require_mention: true,
        sync_timeout: Duration::from_secs(1),
        retry_base: Duration::from_millis(10),
        max_sync_failures: 3,
        invite_policy: None,
        e2ee: E2eeSettings {
            mode: E2eeMode::Off,
            ..E2eeSettings::default()
        },
    }
}

fn adapter(token: &str, homeserver: &str) -> Result<MatrixAdapter, MatrixError> {
    MatrixAdapter::new(settings(token, homeserver), Arc::new(NoCursors))
}

fn out(text: &str) -> OutboundMessage {
    OutboundMessage {
        chat_id: "!r:example.org".into(),
        thread_id: None,
        reply_to: Some("$e".into()),
        text: text.into(),
        choices: Vec::new(),
    }
}

#[test]
fn from_config_reads_config_then_environment() {
    let empty = Env::from_pairs(Vec::<(String, String)>::new());
    let env = Env::from_pairs([
        ("MATRIX_HOMESERVER", "https://hs.example.org"),
        ("MATRIX_ACCESS_TOKEN", "syt_env"),
        ("MATRIX_USER_ID", "@bot:example.org"),
    ]);
    let mut cfg = MatrixConfig::default();
    assert!(
        MatrixSettings::from_config(&cfg, &empty, None)
            .unwrap()
            .is_none()
    );
    let s = MatrixSettings::from_config(&cfg, &env, None)
        .unwrap()
        .unwrap();
    assert_eq!(s.homeserver, "https://hs.example.org");
    assert_eq!(s.access_token, "syt_env");
    assert_eq!(s.user_id.as_deref(), Some("@bot:example.org"));
    assert!(s.require_mention, "mentions are required by default");
    assert_eq!(s.sync_timeout, Duration::from_secs(30));
    cfg.access_token = Some(talaria_core::Secret::new("syt_cfg"));
    cfg.homeserver = Some("http://127.0.0.1:8008".into());
    let s = MatrixSettings::from_config(&cfg, &env, None)
        .unwrap()
        .unwrap();
    assert_eq!(s.access_token, "syt_cfg");
    assert_eq!(s.homeserver, "http://127.0.0.1:8008");
    cfg.enabled = Some(false);
    assert!(
        MatrixSettings::from_config(&cfg, &env, None)
            .unwrap()
            .is_none()
    );
}

#[test]
fn new_validates_and_debug_hides_the_token() {
    assert_eq!(adapter("", "http://x").err(), Some(MatrixError::BadToken));
    assert_eq!(
        adapter("a b", "http://x").err(),
        Some(MatrixError::BadToken)
    );
    assert!(matches!(
        adapter("syt_a", "ftp://x"),
        Err(MatrixError::BadHomeserver(_))
    ));
    let mut s = settings("syt_a", "http://x");
    s.user_id = Some("bot".into());
    assert!(matches!(
        MatrixAdapter::new(s, Arc::new(NoCursors)),
        Err(MatrixError::BadUserId(_))
    ));
    let s = settings("syt_SECRETSECRETSECRET", "http://127.0.0.1:1");
    assert!(!format!("{s:?}").contains("SECRETSECRET"));
    let a = MatrixAdapter::new(s, Arc::new(NoCursors)).unwrap();
    assert!(!format!("{a:?}").contains("SECRETSECRET"));
}

#[test]
fn a_retry_reuses_the_transaction_id_and_a_new_message_does_not() {
    let a = adapter("syt_a", "http://x").unwrap();
    let (first, digest) = a.txn_for(&out("hello"));
    let (retry, _) = a.txn_for(&out("hello"));
    assert_eq!(first, retry, "an unconfirmed send is retried under its id");
    a.txn_done(&digest);
    let (again, _) = a.txn_for(&out("hello"));
    assert_ne!(
        first, again,
        "the same text after a success is a new message"
    );
    let (other, _) = a.txn_for(&out("hello!"));
    assert_ne!(other, again);
    let mut threaded = out("hello");
    threaded.thread_id = Some("$root".into());
    assert_ne!(a.txn_for(&threaded).0, again);
    // Another process never reuses this one's ids.
    let b = adapter("syt_a", "http://x").unwrap();
    assert_ne!(b.txn_for(&out("hello")).0, first);
}

#[test]
fn content_carries_html_threads_and_replies() {
    let c = MatrixAdapter::content(&out("**hi**")).unwrap();
    assert_eq!(c["body"], "**hi**");
    assert_eq!(c["formatted_body"], "<p><strong>hi</strong></p>");
    assert_eq!(c["m.relates_to"]["m.in_reply_to"]["event_id"], "$e");
    let mut m = out("x");
    m.thread_id = Some("$root".into());
    m.reply_to = None;
    let c = MatrixAdapter::content(&m).unwrap();
    assert_eq!(c["m.relates_to"]["rel_type"], "m.thread");
    assert_eq!(c["m.relates_to"]["event_id"], "$root");
    assert_eq!(c["m.relates_to"]["m.in_reply_to"]["event_id"], "$root");
    // Too big with HTML: plain only; too big even so: refused.
    let big = "€".repeat(MAX_MESSAGE_LEN);
    let c = MatrixAdapter::content(&out(&big)).unwrap();
    assert!(c.get("formatted_body").is_none());
    let huge = "😀".repeat(MAX_MESSAGE_LEN * 2);
    assert!(matches!(
        MatrixAdapter::content(&out(&huge)),
        Err(SendError::Rejected(_))
    ));
}

#[tokio::test]
async fn connection_refused_is_unavailable_and_redacted() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let a = adapter(
        "syt_SECRETSECRETSECRET",
        &format!("http://127.0.0.1:{port}"),
    )
    .unwrap();
    let err = a.send(&out("hi")).await.unwrap_err();
    assert!(matches!(err, SendError::Unavailable(_)), "{err:?}");
    assert!(!err.to_string().contains("SECRETSECRET"), "{err}");
}
