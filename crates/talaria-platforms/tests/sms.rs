//! The SMS adapter against the fake Twilio in talaria-testkit: webhooks
//! posted to the shared listener on 127.0.0.1 as Twilio posts them
//! (signed over the public URL), and sends to the fake REST API.
#![cfg(feature = "sms")]

use std::sync::Arc;
use std::time::Duration;

use talaria_gateway::{
    Adapter, AdapterContext, AdapterError, ChatType, Inbox, Liveness, LivenessReporter,
    MessageEvent, OutboundMessage, SendError,
};
use talaria_platforms::ingress::Ingress;
use talaria_platforms::sms::{PATH, SmsAdapter, SmsSettings};
use talaria_testkit::FakeTwilio;
use talaria_testkit::twilio::{Failure, InboundSms, WebhookReply, WebhookSender, sign};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio_util::sync::{CancellationToken, DropGuard};

const SID: &str = "AC0123456789abcdef0123456789abcdef";
const TOKEN: &str = "twilio-auth-token-0123456789";
const NUMBER: &str = "+15550001111";
const ALICE: &str = "+15552223333";
/// What Twilio calls: the gateway sits behind a proxy, so this is not
/// the address the tests post to.
const PUBLIC_URL: &str = "https://gateway.example.com/sms/twilio";
const WAIT: Duration = Duration::from_secs(10);

fn settings(fake: &FakeTwilio) -> SmsSettings {
    SmsSettings {
        api_base: fake.base_url(),
        send_timeout: Duration::from_secs(5),
        ..SmsSettings::new(SID, TOKEN, NUMBER, PUBLIC_URL)
    }
}

struct Running {
    fake: FakeTwilio,
    adapter: Arc<SmsAdapter>,
    /// Posts as Twilio does, to the listener, signed over [`PUBLIC_URL`].
    twilio: WebhookSender,
    /// `http://127.0.0.1:PORT/sms/twilio`.
    local_url: String,
    events: mpsc::Receiver<MessageEvent>,
    shutdown: CancellationToken,
    task: JoinHandle<Result<(), AdapterError>>,
    _server: DropGuard,
}

/// The adapter mounted on a listener, not running yet.
async fn mounted(
    fake: FakeTwilio,
    settings: SmsSettings,
) -> (Running, Inbox, LivenessReporter, watch::Receiver<Liveness>) {
    let adapter = Arc::new(SmsAdapter::new(settings).unwrap());
    let mut ingress = Ingress::bind("127.0.0.1", 0).await.unwrap();
    ingress.mount(adapter.mount());
    let local_url = format!("http://{}{PATH}", ingress.local_addr());
    let server = CancellationToken::new();
    tokio::spawn(ingress.serve(server.clone()));
    let (inbox, events) = Inbox::channel(16);
    let (reporter, liveness) = LivenessReporter::new();
    let twilio = fake.webhook_sender(&local_url, PUBLIC_URL);
    let running = Running {
        fake,
        adapter,
        twilio,
        local_url,
        events,
        shutdown: CancellationToken::new(),
        task: tokio::spawn(async { Ok(()) }),
        _server: server.drop_guard(),
    };
    (running, inbox, reporter, liveness)
}

/// The adapter running, live, with its inbox attached.
async fn start_with(settings: impl FnOnce(&FakeTwilio) -> SmsSettings) -> Running {
    let fake = FakeTwilio::start(SID, TOKEN, NUMBER);
    let s = settings(&fake);
    let (mut running, inbox, reporter, mut liveness) = mounted(fake, s).await;
    let ctx = AdapterContext {
        inbox,
        liveness: reporter,
        shutdown: running.shutdown.clone(),
    };
    let a = running.adapter.clone();
    running.task = tokio::spawn(async move { a.run(ctx).await });
    tokio::time::timeout(WAIT, liveness.wait_for(|l| *l == Liveness::Live))
        .await
        .expect("never live")
        .expect("the reporter is kept");
    running
}

async fn start() -> Running {
    start_with(settings).await
}

fn sms(r: &Running, body: &str) -> InboundSms {
    r.fake.inbound(ALICE, body)
}

fn assert_twiml(reply: &WebhookReply) {
    assert_eq!(reply.status, 200, "{reply:?}");
    assert_eq!(reply.content_type.as_deref(), Some("text/xml"));
    assert!(reply.body.ends_with("<Response/>"), "{reply:?}");
}

impl Running {
    async fn next_event(&mut self) -> MessageEvent {
        tokio::time::timeout(WAIT, self.events.recv())
            .await
            .expect("an event in time")
            .expect("the inbox is open")
    }

    fn no_event(&mut self) {
        assert!(
            self.events.try_recv().is_err(),
            "an event was handed over that should not have been"
        );
    }

    fn message(&self, to: &str, text: &str) -> OutboundMessage {
        OutboundMessage {
            chat_id: to.to_owned(),
            thread_id: None,
            reply_to: None,
            text: text.to_owned(),
            choices: Vec::new(),
        }
    }
}

#[test]
fn the_signer_matches_twilios_documented_example() {
    let params: Vec<(String, String)> = [
        ("CallSid", "CA1234567890ABCDE"),
        ("Caller", "+12349013030"),
        ("Digits", "1234"),
        ("From", "+12349013030"),
        ("To", "+18005551212"),
    ]
    .iter()
    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
    .collect();
    assert_eq!(
        sign(
            "12345",
            "https://mycompany.com/myapp.php?foo=1&bar=2",
            &params
        ),
        "0/KCTR6DLpKmkAf8muzZqo1nDgQ="
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_signed_sms_becomes_one_dm_event_answered_with_empty_twiml() {
    let mut r = start().await;
    let text = "Hi & welcome + 100% = ünïcode 👋\nsecond line; a=b?c";
    let inbound = sms(&r, text);
    let reply = r.twilio.send(&inbound).await;
    assert_twiml(&reply);
    let event = r.next_event().await;
    assert_eq!(event.text, text, "the form is decoded exactly");
    assert_eq!(
        event.message_id.as_deref(),
        Some(inbound.message_sid.as_str())
    );
    assert_eq!(event.source.platform, "sms");
    assert_eq!(event.source.chat_type, ChatType::Dm);
    assert_eq!(event.source.chat_id, ALICE);
    assert_eq!(event.source.user_id.as_deref(), Some(ALICE));
    assert!(event.attachments.is_empty());
    assert_eq!(event.reply_target, None);
    // Twilio's credential check ran before the inbox was attached.
    assert!(
        r.fake
            .requests()
            .iter()
            .any(|q| q.method == "GET" && q.path.ends_with(&format!("{SID}.json")) && q.authorized)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_or_bad_signatures_get_401_and_nothing_is_handed_over() {
    let mut r = start().await;
    let inbound = sms(&r, "let me in");
    let params = inbound.params();

    // No header at all, an empty one, and one that is not base64.
    for signature in [None, Some(""), Some("not base64!")] {
        let reply = r.twilio.post(&params, signature).await;
        assert_eq!(reply.status, 401, "{signature:?}: {reply:?}");
    }
    // Signed with another token.
    let forged = sign("not-the-token", PUBLIC_URL, &params);
    assert_eq!(r.twilio.post(&params, Some(&forged)).await.status, 401);
    // Signed over the URL the request really went to: behind a proxy
    // that is not what Twilio signs, so the configured URL must be used.
    let local = sign(TOKEN, &r.local_url, &params);
    assert_eq!(r.twilio.post(&params, Some(&local)).await.status, 401);
    // A correct signature, then a field changed or added.
    let good = r.twilio.signature(&params);
    let mut tampered = params.clone();
    for (k, v) in tampered.iter_mut() {
        if k == "Body" {
            *v = "let me in, please".to_owned();
        }
    }
    assert_eq!(r.twilio.post(&tampered, Some(&good)).await.status, 401);
    let mut added = params.clone();
    added.push(("Extra".to_owned(), "x".to_owned()));
    assert_eq!(r.twilio.post(&added, Some(&good)).await.status, 401);
    r.no_event();

    // The genuine one goes through, and is the first event.
    assert_twiml(&r.twilio.post(&params, Some(&good)).await);
    assert_eq!(r.next_event().await.text, "let me in");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_account_or_number_is_refused_even_when_signed() {
    let mut r = start().await;
    let other_account = InboundSms {
        account_sid: "ACffffffffffffffffffffffffffffffff".to_owned(),
        ..sms(&r, "wrong account")
    };
    assert_eq!(r.twilio.send(&other_account).await.status, 403);
    let other_number = InboundSms {
        to: "+15559990000".to_owned(),
        ..sms(&r, "wrong number")
    };
    assert_eq!(r.twilio.send(&other_number).await.status, 403);
    let no_sid: Vec<(String, String)> = sms(&r, "no sid")
        .params()
        .into_iter()
        .filter(|(k, _)| k != "MessageSid" && k != "SmsSid")
        .collect();
    let signature = r.twilio.signature(&no_sid);
    assert_eq!(r.twilio.post(&no_sid, Some(&signature)).await.status, 400);
    r.no_event();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mms_media_is_handed_over_to_be_fetched() {
    let mut r = start().await;
    let base = format!("https://api.twilio.com/2010-04-01/Accounts/{SID}/Messages/MM1/Media");
    let inbound = sms(&r, "")
        .with_media(&format!("{base}/ME1"), "image/jpeg")
        .with_media(&format!("{base}/ME2"), "audio/amr");
    assert_twiml(&r.twilio.send(&inbound).await);
    let event = r.next_event().await;
    assert_eq!(event.text, "");
    let claimed: Vec<(String, Option<String>)> = event
        .attachments
        .iter()
        .map(|a| (a.label(), a.mime.clone()))
        .collect();
    assert_eq!(
        claimed,
        [
            ("image".to_owned(), Some("image/jpeg".to_owned())),
            ("audio".to_owned(), Some("audio/amr".to_owned()))
        ]
    );
    assert_eq!(
        event.attachments[0].source,
        talaria_adapter::AttachmentSource::Remote(format!("{base}/ME1"))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn short_codes_opt_out_keywords_and_empty_messages_are_acknowledged_but_not_taken() {
    let mut r = start().await;
    let short_code = r.fake.inbound("12345", "promo reply");
    assert_twiml(&r.twilio.send(&short_code).await);
    for keyword in ["STOP", " stop ", "Unsubscribe"] {
        assert_twiml(&r.twilio.send(&sms(&r, keyword)).await);
    }
    let flagged = sms(&r, "Arrêt").with_field("OptOutType", "STOP");
    assert_twiml(&r.twilio.send(&flagged).await);
    let help = sms(&r, "HELP").with_field("OptOutType", "HELP");
    assert_twiml(&r.twilio.send(&help).await);
    assert_twiml(&r.twilio.send(&sms(&r, "   ")).await);
    assert_twiml(&r.twilio.send(&sms(&r, "a real question")).await);
    assert_eq!(r.next_event().await.text, "a real question");
    // "yes" is an answer, not a keyword, unless Twilio flags it.
    assert_twiml(&r.twilio.send(&sms(&r, "yes")).await);
    assert_eq!(r.next_event().await.text, "yes");
    r.no_event();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_an_attached_inbox_the_answer_is_503() {
    let fake = FakeTwilio::start(SID, TOKEN, NUMBER);
    let s = settings(&fake);
    let (r, _inbox, _reporter, _liveness) = mounted(fake, s).await;
    // Mounted, but the adapter's run has not attached an inbox.
    assert_eq!(r.twilio.send(&sms(&r, "too early")).await.status, 503);

    // A run whose runner is gone: the inbox refuses.
    let mut r = start().await;
    r.events.close();
    assert_eq!(r.twilio.send(&sms(&r, "too late")).await.status, 503);
    r.shutdown.cancel();
    (&mut r.task).await.unwrap().unwrap();
    assert_eq!(r.twilio.send(&sms(&r, "stopped")).await.status, 503);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_body_gets_413() {
    let r = start().await;
    let inbound = sms(&r, &"x".repeat(talaria_platforms::sms::MAX_BODY_BYTES + 1));
    assert_eq!(r.twilio.send(&inbound).await.status, 413);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn send_posts_plain_text_with_basic_auth_from_our_number() {
    let r = start().await;
    let sent = r
        .adapter
        .send(&r.message(
            ALICE,
            "**Done.** See [docs](https://x.example) — it’s `ok`.",
        ))
        .await
        .unwrap();
    let got = r.fake.sent();
    assert_eq!(got.len(), 1);
    assert_eq!(sent.message_id.as_deref(), Some(got[0].sid.as_str()));
    assert_eq!(got[0].to, ALICE);
    assert_eq!(got[0].from, NUMBER);
    assert_eq!(got[0].body, "Done. See docs (https://x.example) - it's ok.");
    let attempt = &r.fake.send_attempts()[0];
    assert!(attempt.authorized);
    assert_eq!(
        attempt.path,
        format!("/2010-04-01/Accounts/{SID}/Messages.json")
    );

    // A chat id that is not a number never reaches Twilio.
    let e = r.adapter.send(&r.message("alice", "hi")).await.unwrap_err();
    assert!(matches!(e, SendError::Rejected(_)), "{e:?}");
    assert_eq!(r.fake.send_attempts().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twilio_errors_map_to_what_the_ledger_needs() {
    let r = start().await;
    let send = |to: &'static str| {
        let m = r.message(to, "hello");
        let a = r.adapter.clone();
        async move { a.send(&m).await }
    };

    r.fake.unsubscribe(ALICE);
    let e = send(ALICE).await.unwrap_err();
    assert!(
        matches!(&e, SendError::Rejected(m) if m.contains("STOP") && m.contains("21610")),
        "{e:?}"
    );
    r.fake.resubscribe(ALICE);

    r.fake.landline("+15554445555");
    let e = send("+15554445555").await.unwrap_err();
    assert!(
        matches!(&e, SendError::Rejected(m) if m.contains("21614")),
        "{e:?}"
    );

    r.fake.fail_next_send(Failure::code(400, 21211));
    let e = send(ALICE).await.unwrap_err();
    assert!(
        matches!(&e, SendError::Rejected(m) if m.contains("21211")),
        "{e:?}"
    );

    r.fake.fail_next_send(Failure::code(500, 20500));
    assert!(matches!(send(ALICE).await, Err(SendError::Transient(_))));

    r.fake.fail_next_send(Failure::code(401, 20003));
    assert!(matches!(send(ALICE).await, Err(SendError::Unavailable(_))));

    assert!(r.fake.sent().is_empty());
    send(ALICE).await.unwrap();
    assert_eq!(r.fake.sent().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_token_is_unavailable_for_sends_and_fatal_for_run() {
    let fake = FakeTwilio::start(SID, TOKEN, NUMBER);
    let adapter = SmsAdapter::new(SmsSettings {
        auth_token: "wrong-token-0000".into(),
        ..settings(&fake)
    })
    .unwrap();
    let e = adapter
        .send(&OutboundMessage {
            chat_id: ALICE.to_owned(),
            thread_id: None,
            reply_to: None,
            text: "hi".to_owned(),
            choices: Vec::new(),
        })
        .await
        .unwrap_err();
    assert!(
        matches!(&e, SendError::Unavailable(m) if !m.contains("wrong-token")),
        "{e:?}"
    );
    assert!(fake.send_attempts().iter().all(|q| !q.authorized));

    let (inbox, _events) = Inbox::channel(1);
    let (liveness, _) = LivenessReporter::new();
    let ctx = AdapterContext {
        inbox,
        liveness: liveness.clone(),
        shutdown: CancellationToken::new(),
    };
    let e = tokio::time::timeout(WAIT, adapter.run(ctx))
        .await
        .expect("run gives up in time")
        .unwrap_err();
    assert!(
        matches!(&e, AdapterError::Fatal(m) if m.contains("TWILIO_AUTH_TOKEN")),
        "{e:?}"
    );
    assert_ne!(liveness.get(), Liveness::Live);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_429_is_waited_out_once_then_reported() {
    let r = start_with(|fake| SmsSettings {
        rate_limit_retries: 1,
        ..settings(fake)
    })
    .await;
    let message = r.message(ALICE, "patience");
    r.fake.fail_next_send(Failure::RateLimited {
        retry_after: Some(1),
    });
    r.adapter.send(&message).await.unwrap();
    assert_eq!(r.fake.send_attempts().len(), 2);
    assert_eq!(r.fake.sent().len(), 1);

    // Twice in a row is more than the one retry allowed: the wait is
    // reported for the ledger to honour.
    for _ in 0..2 {
        r.fake.fail_next_send(Failure::RateLimited {
            retry_after: Some(1),
        });
    }
    let e = r.adapter.send(&message).await.unwrap_err();
    assert_eq!(e, SendError::RateLimited(Duration::from_secs(1)));
    assert_eq!(r.fake.sent().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_or_hung_twilio_is_unavailable_or_ambiguous() {
    let r = start_with(|fake| SmsSettings {
        send_timeout: Duration::from_millis(300),
        ..settings(fake)
    })
    .await;
    r.fake.fail_next_send(Failure::Hang);
    let e = r
        .adapter
        .send(&r.message(ALICE, "lost?"))
        .await
        .unwrap_err();
    assert!(matches!(e, SendError::Ambiguous(_)), "{e:?}");

    // Nothing listens on the API's port any more.
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        format!("http://{}", l.local_addr().unwrap())
    };
    let adapter = SmsAdapter::new(SmsSettings {
        api_base: closed,
        ..settings(&r.fake)
    })
    .unwrap();
    let e = adapter
        .send(&r.message(ALICE, "anyone?"))
        .await
        .unwrap_err();
    assert!(matches!(e, SendError::Unavailable(_)), "{e:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_segments_caps_each_sms() {
    let r = start_with(|fake| SmsSettings {
        max_segments: 1,
        ..settings(fake)
    })
    .await;
    let long = "word ".repeat(100);
    r.adapter.send(&r.message(ALICE, &long)).await.unwrap();
    let body = &r.fake.sent()[0].body;
    assert!(body.ends_with("..."), "{body}");
    assert!(body.chars().count() <= 160, "{}", body.chars().count());
    assert_eq!(talaria_platforms::sms::segments::count(body), 1);
}

// ---- media ----------------------------------------------------------------

/// A 2×2 red PNG, encoded by hand (signature, IHDR, zlib'd IDAT, IEND).
const PNG: [u8; 73] = [
    0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a, 0x00, 0x00, 0x00, 0x0d, 0x49, 0x48, 0x44, 0x52,
    0x00, 0x00, 0x00, 0x02, 0x00, 0x00, 0x00, 0x02, 0x08, 0x02, 0x00, 0x00, 0x00, 0xfd, 0xd4, 0x9a,
    0x73, 0x00, 0x00, 0x00, 0x10, 0x49, 0x44, 0x41, 0x54, 0x78, 0x9c, 0x63, 0xf8, 0xcf, 0xc0, 0x00,
    0x44, 0x0c, 0x10, 0x0a, 0x00, 0x1f, 0xee, 0x03, 0xfd, 0x8b, 0x5f, 0x14, 0xd4, 0x00, 0x00, 0x00,
    0x00, 0x49, 0x45, 0x4e, 0x44, 0xae, 0x42, 0x60, 0x82,
];

/// An AMR-NB file's header and one silent frame: how phones record
/// voice for MMS (nothing here decodes it).
const AMR: &[u8] = b"#!AMR\n\x7c\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00";

const PDF: &[u8] = b"%PDF-1.4\n1 0 obj<<>>endobj\ntrailer<<>>\n%%EOF\n";

async fn read_all(download: talaria_adapter::Download) -> Vec<u8> {
    use tokio::io::AsyncReadExt;
    let mut reader = download.reader;
    let mut bytes = Vec::new();
    reader.read_to_end(&mut bytes).await.unwrap();
    bytes
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mms_media_downloads_as_the_bytes_sent_with_the_account_credentials() {
    use talaria_adapter::{AttachmentSource, MediaKind};
    let mut r = start().await;
    let photo = r.fake.add_media(&PNG, "image/png");
    let voice = r.fake.add_media(AMR, "audio/amr");
    let doc = r.fake.add_media(PDF, "application/pdf");
    let inbound = sms(&r, "three files")
        .with_media(&photo, "image/png")
        .with_media(&voice, "audio/amr")
        .with_media(&doc, "application/pdf");
    assert_twiml(&r.twilio.send(&inbound).await);
    let event = r.next_event().await;
    let kinds: Vec<_> = event.attachments.iter().map(|a| a.kind).collect();
    assert_eq!(
        kinds,
        [MediaKind::Image, MediaKind::Audio, MediaKind::Document]
    );
    for (attachment, want) in event.attachments.iter().zip([&PNG[..], AMR, PDF]) {
        let AttachmentSource::Remote(url) = &attachment.source else {
            panic!("a remote attachment: {attachment:?}")
        };
        let download = r.adapter.download(url).await.unwrap();
        assert_eq!(download.length, Some(want.len() as u64));
        assert_eq!(read_all(download).await, want);
    }
    // The media URL was asked for with the account's basic auth, then the
    // short-lived URL it redirected to.
    let fetches: Vec<_> = r
        .fake
        .requests()
        .into_iter()
        .filter(|q| q.method == "GET" && !q.path.ends_with(".json"))
        .collect();
    assert_eq!(fetches.len(), 6, "{fetches:?}");
    assert!(
        fetches
            .iter()
            .filter(|q| q.path.contains("/Media/"))
            .all(|q| q.authorized)
    );
    assert_eq!(
        fetches
            .iter()
            .filter(|q| q.path.starts_with("/cdn/"))
            .count(),
        3
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleted_media_is_gone_and_foreign_hosts_are_never_asked() {
    use talaria_adapter::DownloadError;
    let r = start().await;
    let url = r.fake.add_media(&PNG, "image/png");
    r.fake.delete_media(&url);
    let err = r.adapter.download(&url).await.unwrap_err();
    assert!(
        matches!(&err, DownloadError::Gone(m) if m.contains("404")),
        "{err:?}"
    );
    assert!(!err.to_string().contains(TOKEN), "{err}");
    // Another server on the same address but another port is not the
    // configured API base: the credentials must not go there.
    let elsewhere = FakeTwilio::start(SID, TOKEN, NUMBER);
    let foreign = elsewhere.add_media(&PNG, "image/png");
    for locator in [
        foreign.as_str(),
        "ftp://api.twilio.com/x",
        "not a url",
        "http://api.twilio.com/x",
    ] {
        let err = r.adapter.download(locator).await.unwrap_err();
        assert!(
            matches!(&err, DownloadError::Gone(m) if m.contains("not a Twilio file address")),
            "{locator}: {err:?}"
        );
    }
    assert!(elsewhere.requests().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_goes_as_a_text_line_naming_it() {
    use talaria_adapter::{MediaKind, OutboundFile};
    let r = start().await;
    assert!(r.adapter.capabilities().sends.is_empty());
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("chart.png");
    std::fs::write(&path, PNG).unwrap();
    let file = OutboundFile {
        chat_id: ALICE.to_owned(),
        thread_id: None,
        reply_to: None,
        path,
        kind: MediaKind::Image,
        mime: "image/png".to_owned(),
        name: "chart.png".to_owned(),
        caption: Some("Q3 sales".to_owned()),
    };
    let sent = r.adapter.send_file(&file).await.unwrap();
    let got = r.fake.wait_for_sent(1, WAIT).await;
    assert_eq!(sent.message_id.as_deref(), Some(got[0].sid.as_str()));
    assert_eq!(got[0].to, ALICE);
    assert!(
        got[0]
            .body
            .contains("chart.png (image/png; sms cannot carry this file)"),
        "{}",
        got[0].body
    );
    assert!(got[0].body.ends_with("Q3 sales"), "{}", got[0].body);
    // No media was asked of Twilio.
    assert!(
        r.fake
            .requests()
            .iter()
            .all(|q| q.field("MediaUrl").is_none())
    );
}
