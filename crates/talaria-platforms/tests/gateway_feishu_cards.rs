//! Feishu's interactive cards end to end, through the fake Open Platform:
//! answers streamed into a card (created, then patched), approvals asked
//! with buttons whose clicks (`card.action.trigger`, over the webhook and
//! the long connection) answer them, and the limits Feishu sets on cards.
#![cfg(feature = "feishu")]

use crate::contract;

use std::path::PathBuf;
use std::time::Duration;

use contract::{Rig, WAIT};
use serde_json::{Value, json};
use talaria_adapter::{Adapter, Choice, OutboundMessage, SendError};
use talaria_platforms::feishu::{FeishuAdapter, FeishuSettings};
use talaria_testkit::feishu::{FakeFeishu, MAX_CARD_REQUEST_BYTES};
use talaria_testkit::kit::feishu::{
    ADA, APP_ID, APP_SECRET, BOT, FeishuKit, FeishuSocketKit, GROUP, MALLORY, TOPIC,
};
use talaria_testkit::kit::{PlatformKit, Who};
use talaria_testkit::{Reply, ToolCallReply};

/// The labels of the approval's buttons, in order.
const APPROVAL_BUTTONS: [&str; 4] = [
    "Approve once",
    "Approve for this conversation",
    "Always approve",
    "Deny",
];

/// A call of `terminal` removing `victim` recursively: the guard asks.
fn remove_call(victim: &std::path::Path) -> Reply {
    let args = json!({"command": format!("rm -r {}", victim.display())}).to_string();
    Reply::tool_calls(vec![ToolCallReply::new("call_rm", "terminal", args)])
        .with_text("Let me clean up.")
}

/// A directory (with something inside) for the agent to remove.
fn victim<K>(rig: &Rig<K>) -> PathBuf {
    let victim = rig.dir.path().join("victim");
    std::fs::create_dir_all(victim.join("inside")).unwrap();
    victim
}

/// The `toast` text of a callback's answer.
fn toast(answer: &Value) -> &str {
    answer["toast"]["content"].as_str().unwrap_or("")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streamed_answer_is_one_card_patched_into_the_answer_in_its_thread() {
    let rig = Rig::<FeishuKit>::started(&[("FEISHU_STREAMING_CARDS", "true")], |c| {
        c.gateway.stream_edit_interval_ms = 300;
    })
    .await;
    let answer = "A card grows while the model writes, **one piece** at a time, until whole.";
    rig.llm
        .push(Reply::text(answer).with_chunk_pause(Duration::from_millis(400)));
    let asked = rig.kit.push_in_thread("stream something");
    let sent = rig.kit.fake.wait_for_sent(1, WAIT).await;
    let card = &sent[0];
    assert_eq!(card.msg_type, "interactive");
    assert_eq!(card.parent.as_deref(), Some(asked.id.as_str()), "a reply");
    assert_eq!(card.thread.as_deref(), Some(TOPIC), "in the thread");
    assert!(card.uuid.is_some(), "idempotent like every send");
    assert!(card.text.len() < answer.len(), "opened early: {card:?}");
    let shown = rig
        .kit
        .fake
        .wait_for_card(&card.message_id, WAIT, |c| c.text == answer)
        .await;
    assert!(
        shown.notes.is_empty() && shown.buttons.is_empty(),
        "{shown:?}"
    );
    rig.wait_for_delivered(1).await;
    assert_eq!(rig.kit.fake.sent().len(), 1, "the card was the answer");
    let patches = rig.kit.fake.patches();
    assert!(patches.len() >= 2, "it grew, then ended: {patches:?}");
    assert!(patches.iter().all(|p| p.message_id == card.message_id));
    assert!(
        patches.iter().any(|p| p.card.text.len() < answer.len()),
        "a patch before the end showed part of it: {patches:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_turn_leaves_its_card_marked_unfinished() {
    let rig = Rig::<FeishuKit>::started(&[("FEISHU_STREAMING_CARDS", "true")], |c| {
        c.gateway.stream_edit_interval_ms = 100;
        c.gateway.busy_ack = false;
    })
    .await;
    rig.llm
        .push(Reply::text("This answer never finishes because").stall_after(1));
    rig.llm.push(Reply::text("Second answer."));
    rig.kit.push_dm(Who::Friend, "first");
    let first = rig.kit.fake.wait_for_sent(1, WAIT).await[0].clone();
    assert_eq!(first.msg_type, "interactive");
    // A new message stops the first turn.
    rig.kit.push_dm(Who::Friend, "second");
    let stopped = rig
        .kit
        .fake
        .wait_for_card(&first.message_id, WAIT, |c| !c.notes.is_empty())
        .await;
    assert!(
        stopped.notes[0].contains("did not finish"),
        "{:?}",
        stopped.notes
    );
    assert!(stopped.text.contains("Stopped before"), "{stopped:?}");
    let sent = rig.kit.fake.wait_for_sent(2, WAIT).await;
    let second = rig
        .kit
        .fake
        .wait_for_card(&sent[1].message_id, WAIT, |c| c.text == "Second answer.")
        .await;
    assert!(second.notes.is_empty(), "{second:?}");
}

/// The approval is a card with four buttons; a click on "Approve once"
/// answers it as the typed `/approve` would: the command runs and the
/// answer arrives.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_approval_is_answered_with_its_button() {
    let rig = Rig::<FeishuKit>::started(&[], |_| {}).await;
    let victim = victim(&rig);
    rig.llm.push(remove_call(&victim));
    rig.llm.push(Reply::text("Removed the directory."));
    rig.kit.push_dm(Who::Friend, "clean up please");
    let question = wait_for_card_with_buttons(&rig.kit).await;
    assert_eq!(question.chat, rig.kit.dm_chat(Who::Friend));
    // The text still says the commands, for platforms without buttons.
    assert!(question.text.contains("/approve session"), "{question:?}");
    let buttons = &question.card.as_ref().unwrap().buttons;
    let labels: Vec<&str> = buttons.iter().map(|b| b.label.as_str()).collect();
    assert_eq!(labels, APPROVAL_BUTTONS);
    for (button, command) in
        buttons
            .iter()
            .zip(["/approve", "/approve session", "/approve always", "/deny"])
    {
        assert!(
            button.value.to_string().contains(&format!("\"{command}\"")),
            "{button:?}"
        );
    }
    assert!(victim.exists(), "nothing runs before the answer");

    let answer = rig
        .kit
        .click(&question.message_id, ADA, "Approve once")
        .await;
    assert_eq!(answer["toast"]["type"], "success", "{answer}");
    assert!(toast(&answer).contains("/approve"), "{answer}");
    rig.wait_for_text("Removed the directory.").await;
    assert!(!victim.exists(), "the approved command ran");
    let said: Vec<String> = rig.kit.sent().into_iter().map(|o| o.text).collect();
    assert!(said.iter().any(|t| t == "Approved."), "{said:?}");
    let tool_result = rig.llm.requests()[1].body.to_string();
    assert!(!tool_result.contains("BLOCKED"), "{tool_result}");
}

/// Over the long connection, in a group whose conversation everyone
/// shares: a stranger's click is refused like a stranger's message, a
/// click delivered again is ignored, and the owner's click approves once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_strangers_click_is_refused_and_a_replayed_click_ignored() {
    let rig = Rig::<FeishuSocketKit>::started(&[], |c| {
        c.gateway.group_sessions_per_user = false;
        // Commands in groups run where the guard asks first.
        c.terminal.untrusted_backend = talaria_core::config::BackendKind::Local;
    })
    .await;
    let kit = &rig.kit.0;
    let victim = victim(&rig);
    rig.llm.push(remove_call(&victim));
    rig.llm.push(Reply::text("Removed the directory."));
    rig.kit.push_in_group("clean up please", true);
    let question = wait_for_card_with_buttons(kit).await;
    assert_eq!(question.chat, GROUP);

    // The stranger's click is taken by nobody: had it been, it would have
    // answered the shared conversation's waiting approval.
    let refused = kit
        .click(&question.message_id, MALLORY, "Approve once")
        .await;
    assert_eq!(refused["toast"]["type"], "warning", "{refused}");
    assert!(victim.exists());

    let click = kit.click_envelope(&question.message_id, ADA, "Approve once");
    let answer = kit.deliver_click(&click).await;
    assert_eq!(answer["toast"]["type"], "success", "{answer}");
    rig.wait_for_text("Removed the directory.").await;
    assert!(!victim.exists());

    // Feishu delivers the same click again: nothing is shown, nothing is
    // answered (a second `/approve` would say nothing waits).
    let again = kit.deliver_click(&click).await;
    assert_eq!(again, json!({}), "{again}");
    rig.llm.push(Reply::text("Still here."));
    rig.kit.push_in_group("anything else?", true);
    rig.wait_for_text("Still here.").await;
    let said: Vec<String> = rig.kit.sent().into_iter().map(|o| o.text).collect();
    assert_eq!(
        said.iter().filter(|t| *t == "Approved.").count(),
        1,
        "{said:?}"
    );
    assert!(
        !said.iter().any(|t| t.contains("Nothing is waiting")),
        "{said:?}"
    );
    kit.fake.wait_for_all_delivered(WAIT).await;
}

/// A click on a card the adapter does not know, or on a button whose value
/// it did not put there, goes nowhere and says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_click_on_an_unknown_card_or_a_forged_value_goes_nowhere() {
    let rig = Rig::<FeishuKit>::started(&[], |_| {}).await;
    let victim = victim(&rig);
    rig.llm.push(remove_call(&victim));
    rig.llm.push(Reply::text("Removed the directory."));
    rig.kit.push_dm(Who::Friend, "clean up please");
    let question = wait_for_card_with_buttons(&rig.kit).await;

    let mut forged = rig.kit.click_envelope(&question.message_id, ADA, "Deny");
    forged["event"]["action"]["value"] = json!({"talaria_command": "/reset"});
    let answer = rig.kit.deliver_click(&forged).await;
    assert_eq!(answer["toast"]["type"], "info", "{answer}");
    let mut unknown = rig
        .kit
        .click_envelope(&question.message_id, ADA, "Approve once");
    unknown["event"]["context"]["open_message_id"] = json!("om_someone_elses");
    let answer = rig.kit.deliver_click(&unknown).await;
    assert!(toast(&answer).contains("no longer works"), "{answer}");
    assert!(victim.exists());

    // The real button still works.
    rig.kit
        .click(&question.message_id, ADA, "Approve once")
        .await;
    rig.wait_for_text("Removed the directory.").await;
}

/// The first card sent that has buttons.
async fn wait_for_card_with_buttons(kit: &FeishuKit) -> talaria_testkit::feishu::Sent {
    talaria_testkit::wait::wait_for("a card with buttons", || async {
        let sent = kit.fake.sent();
        match sent
            .iter()
            .find(|s| s.card.as_ref().is_some_and(|c| !c.buttons.is_empty()))
        {
            Some(s) => Ok(s.clone()),
            None => Err(sent),
        }
    })
    .await
}

/// The adapter on its own against the fake: `kit` settings, fast retries.
async fn adapter_and_fake(streaming: bool) -> (FeishuAdapter, FakeFeishu) {
    let fake = FakeFeishu::start(APP_ID, APP_SECRET, BOT).await;
    let settings = FeishuSettings {
        streaming_cards: streaming,
        rate_limit_wait: Duration::from_millis(10),
        bot_open_id: Some(BOT.to_owned()),
        ..FeishuSettings::new(APP_ID, APP_SECRET, &fake.base_url())
    };
    (FeishuAdapter::new(settings).unwrap(), fake)
}

fn message(chat: &str, text: &str) -> OutboundMessage {
    OutboundMessage {
        chat_id: chat.to_owned(),
        thread_id: None,
        reply_to: None,
        text: text.to_owned(),
        choices: Vec::new(),
    }
}

/// A text too large for a card is cut, with a note, to what Feishu takes:
/// the card is created and patched, never refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_card_is_cut_with_a_note_never_refused() {
    let (adapter, fake) = adapter_and_fake(true).await;
    assert!(adapter.streaming_edits());
    // Quotes and newlines double when escaped into the request.
    let huge = "\"a quoted line\"\n".repeat(4000);
    assert!(huge.len() > MAX_CARD_REQUEST_BYTES);
    let sent = adapter
        .start_preview(&message(GROUP, &huge))
        .await
        .expect("the card is created");
    let id = sent.message_id.unwrap();
    let card = fake.card(&id).unwrap();
    assert!(card.text.contains("cut here"), "{}", card.text.len());
    assert!(huge.starts_with(card.text.split("\n\n…").next().unwrap()));
    adapter.edit(GROUP, &id, &huge).await.expect("patched");
    adapter
        .finish_preview(GROUP, &id, &huge, true)
        .await
        .expect("patched");
    let patches = fake.patches();
    assert_eq!(patches.len(), 2);
    assert!(patches[1].card.text.contains("cut here"));
    assert!(patches[1].card.notes[0].contains("did not finish"));
    // Finished: no more patches, and none to a message it did not stream.
    let late = adapter.edit(GROUP, &id, "late").await;
    assert!(matches!(late, Err(SendError::Rejected(_))), "{late:?}");
    let text = adapter.send(&message(GROUP, "plain text")).await.unwrap();
    let not_a_card = adapter
        .edit(GROUP, text.message_id.as_deref().unwrap(), "edited")
        .await;
    assert!(matches!(not_a_card, Err(SendError::Rejected(_))));
    assert_eq!(fake.patches().len(), 2, "refused without a call");
    assert!(
        !fake
            .calls()
            .iter()
            .any(|c| c.starts_with("PATCH") && c.contains(text.message_id.as_deref().unwrap())),
        "{:?}",
        fake.calls()
    );
}

/// A message with choices is a card with a button for each, wherever the
/// answer would go; a document comment gets the text alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn choices_are_buttons_and_a_card_is_no_preview() {
    let (adapter, fake) = adapter_and_fake(false).await;
    assert!(!adapter.streaming_edits());
    let mut asking = message(GROUP, "Run it?");
    asking.choices = vec![Choice::new("Yes", "/approve"), Choice::new("No", "/deny")];
    let sent = adapter.send(&asking).await.unwrap();
    let id = sent.message_id.unwrap();
    let card = fake.card(&id).unwrap();
    assert_eq!(card.text, "Run it?");
    let labels: Vec<&str> = card.buttons.iter().map(|b| b.label.as_str()).collect();
    assert_eq!(labels, ["Yes", "No"]);
    // The same question sent again (the ledger's re-send) is one message.
    let again = adapter.send(&asking).await.unwrap();
    assert_eq!(again.message_id.as_deref(), Some(id.as_str()));
    assert_eq!(fake.sent().len(), 1);
    // A question card is not a preview: it takes no edits.
    let edit = adapter.edit(GROUP, &id, "changed").await;
    assert!(matches!(edit, Err(SendError::Rejected(_))), "{edit:?}");
}

/// The fake refuses what Feishu refuses: patching a message that is not
/// a card, a card that is not shared, and a request over 30 KB.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fake_refuses_patches_feishu_refuses() {
    let fake = FakeFeishu::start(APP_ID, APP_SECRET, BOT).await;
    let http = reqwest::Client::new();
    let base = fake.base_url();
    let token: Value = http
        .post(format!(
            "{base}/open-apis/auth/v3/tenant_access_token/internal"
        ))
        .json(&json!({"app_id": APP_ID, "app_secret": APP_SECRET}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let token = token["tenant_access_token"].as_str().unwrap().to_owned();
    let call = |method: reqwest::Method, path: String, body: Value| {
        let request = http
            .request(method, format!("{base}{path}"))
            .bearer_auth(&token)
            .json(&body);
        async move {
            let r = request.send().await.unwrap();
            let status = r.status().as_u16();
            (status, r.json::<Value>().await.unwrap())
        }
    };
    let create = |msg_type: &str, content: String| json!({"receive_id": GROUP, "msg_type": msg_type, "content": content});
    let card = |shared: bool, text: &str| {
        json!({"config": {"update_multi": shared}, "elements": [{"tag": "markdown", "content": text}]})
            .to_string()
    };
    let send = "/open-apis/im/v1/messages?receive_id_type=chat_id".to_owned();
    let (_, text) = call(
        reqwest::Method::POST,
        send.clone(),
        create("text", json!({"text": "hi"}).to_string()),
    )
    .await;
    let text_id = text["data"]["message_id"].as_str().unwrap().to_owned();
    let (status, refused) = call(
        reqwest::Method::PATCH,
        format!("/open-apis/im/v1/messages/{text_id}"),
        json!({"content": card(true, "x")}),
    )
    .await;
    assert_eq!((status, refused["code"].clone()), (400, json!(230_001)));
    assert!(refused["msg"].as_str().unwrap().contains("NOT a card"));

    let (_, unshared) = call(
        reqwest::Method::POST,
        send.clone(),
        create("interactive", card(false, "x")),
    )
    .await;
    let unshared = unshared["data"]["message_id"].as_str().unwrap().to_owned();
    let (status, refused) = call(
        reqwest::Method::PATCH,
        format!("/open-apis/im/v1/messages/{unshared}"),
        json!({"content": card(true, "y")}),
    )
    .await;
    assert_eq!((status, refused["code"].clone()), (400, json!(230_001)));

    let (_, shared) = call(
        reqwest::Method::POST,
        send.clone(),
        create("interactive", card(true, "x")),
    )
    .await;
    let shared = shared["data"]["message_id"].as_str().unwrap().to_owned();
    let big = "x".repeat(MAX_CARD_REQUEST_BYTES);
    let (status, refused) = call(
        reqwest::Method::PATCH,
        format!("/open-apis/im/v1/messages/{shared}"),
        json!({"content": card(true, &big)}),
    )
    .await;
    assert_eq!((status, refused["code"].clone()), (400, json!(230_025)));
    let (status, refused) = call(
        reqwest::Method::POST,
        send,
        create("interactive", card(true, &big)),
    )
    .await;
    assert_eq!((status, refused["code"].clone()), (400, json!(230_025)));
    let (status, fine) = call(
        reqwest::Method::PATCH,
        format!("/open-apis/im/v1/messages/{shared}"),
        json!({"content": card(true, "y")}),
    )
    .await;
    assert_eq!((status, fine["code"].clone()), (200, json!(0)), "{fine}");
    assert_eq!(fake.card(&shared).unwrap().text, "y");
    assert_eq!(fake.patches().len(), 1);
}
