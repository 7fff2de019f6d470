//! The WhatsApp Cloud adapter over real HTTP on 127.0.0.1: Meta's side
//! played by the testkit's signing sender, the Graph API by its fake, with
//! a real inbox.
#![cfg(feature = "whatsapp")]

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use talaria_core::Secret;
use talaria_gateway::{
    Adapter, AdapterContext, AdapterError, ChatType, Inbox, Liveness, LivenessReporter,
    MessageEvent, OutboundMessage, SendError,
};
use talaria_platforms::ingress::Ingress;
use talaria_platforms::whatsapp::{MAX_TEXT_CHARS, WhatsappAdapter, WhatsappSettings};
use talaria_testkit::FakeGraph;
use talaria_testkit::whatsapp::{
    API_VERSION, Failure, MetaWebhook, delivered_status, delivery, failed_status, message,
    signature, text,
};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_util::sync::{CancellationToken, DropGuard};

const WAIT: Duration = Duration::from_secs(10);
const TOKEN: &str = "EAAGtest-access-token-0123456789";
const NUMBER: &str = "106540352242922";
const APP_SECRET: &str = "app-secret-0123456789abcdef";
const VERIFY: &str = "verify-token-0123456789";
const ADA: &str = "16505551234";

struct Running {
    meta: MetaWebhook,
    graph: FakeGraph,
    adapter: Arc<WhatsappAdapter>,
    events: mpsc::Receiver<MessageEvent>,
    shutdown: CancellationToken,
    task: JoinHandle<Result<(), AdapterError>>,
    base: String,
    _server: DropGuard,
}

impl Running {
    /// The next event handed to the inbox.
    async fn next(&mut self) -> MessageEvent {
        tokio::time::timeout(WAIT, self.events.recv())
            .await
            .expect("an event in time")
            .expect("the inbox is open")
    }

    /// Asserts nothing was handed over (everything before this was
    /// answered, so nothing can still be on its way).
    fn nothing_handed_over(&mut self) {
        assert!(
            self.events.try_recv().is_err(),
            "an event was handed to the inbox"
        );
    }

    fn to_ada(&self, text: &str, reply_to: Option<&str>) -> OutboundMessage {
        OutboundMessage {
            chat_id: ADA.to_owned(),
            thread_id: None,
            reply_to: reply_to.map(str::to_owned),
            text: text.to_owned(),
            choices: Vec::new(),
        }
    }
}

fn settings(graph: &FakeGraph) -> WhatsappSettings {
    WhatsappSettings {
        graph_base: graph.base_url(),
        api_version: API_VERSION.to_owned(),
        send_timeout: Duration::from_secs(5),
        rate_limit_wait: Duration::from_millis(10),
        ..WhatsappSettings::new(TOKEN, NUMBER, APP_SECRET, VERIFY)
    }
}

async fn start() -> Running {
    start_with(|s| s).await
}

/// The adapter mounted on a shared listener, its run attached to an inbox.
async fn start_with(change: impl FnOnce(WhatsappSettings) -> WhatsappSettings) -> Running {
    let graph = FakeGraph::start(TOKEN, NUMBER).await;
    let adapter = Arc::new(WhatsappAdapter::new(change(settings(&graph))).unwrap());
    let mut ingress = Ingress::bind("127.0.0.1", 0).await.unwrap();
    ingress.mount(adapter.mount());
    let base = format!("http://{}", ingress.local_addr());
    let stop = CancellationToken::new();
    tokio::spawn(ingress.serve(stop.clone()));
    let (inbox, events) = Inbox::channel(16);
    let (liveness, mut seen) = LivenessReporter::new();
    let shutdown = CancellationToken::new();
    let ctx = AdapterContext {
        inbox,
        liveness,
        shutdown: shutdown.clone(),
    };
    let runner = adapter.clone();
    let task = tokio::spawn(async move { runner.run(ctx).await });
    tokio::time::timeout(WAIT, seen.wait_for(|l| *l == Liveness::Live))
        .await
        .unwrap()
        .unwrap();
    Running {
        meta: MetaWebhook::new(&base, APP_SECRET),
        graph,
        adapter,
        events,
        shutdown,
        task,
        base,
        _server: stop.drop_guard(),
    }
}

fn one_text(from: &str, wamid: &str, body: &str) -> serde_json::Value {
    delivery(
        NUMBER,
        &[(from, "Ada")],
        vec![text(from, wamid, body)],
        vec![],
    )
}

#[tokio::test]
async fn the_handshake_echoes_the_challenge_only_for_the_right_token() {
    let r = start().await;
    let ok = r.meta.verify("subscribe", VERIFY, "1158201444").await;
    assert_eq!(ok.status, 200);
    assert_eq!(ok.body, "1158201444");
    assert!(
        ok.content_type
            .as_deref()
            .is_some_and(|t| t.starts_with("text/plain")),
        "{ok:?}"
    );
    let wrong = [
        ("subscribe", "verify-token-0123456788"),
        ("subscribe", "verify-token-012345678"),
        ("subscribe", "verify-token-01234567890"),
        ("subscribe", ""),
        ("unsubscribe", VERIFY),
    ];
    for (mode, token) in wrong {
        let refused = r.meta.verify(mode, token, "1158201444").await;
        assert_eq!(refused.status, 403, "{mode} {token}");
        assert!(!refused.body.contains("1158201444"));
    }
    // No verify token at all.
    let bare = reqwest::get(format!("{}/whatsapp/webhook?hub.mode=subscribe", r.base))
        .await
        .unwrap();
    assert_eq!(bare.status().as_u16(), 403);
}

#[tokio::test]
async fn a_signed_text_message_is_handed_over_as_a_dm() {
    let mut r = start().await;
    let answer = r
        .meta
        .deliver(&one_text(
            ADA,
            "wamid.HBgLMTY1MDU1NTEyMzQVAgA=",
            "Hello there",
        ))
        .await;
    assert_eq!(answer.status, 200, "{answer:?}");
    let ev = r.next().await;
    assert_eq!(ev.text, "Hello there");
    assert_eq!(
        ev.message_id.as_deref(),
        Some("wamid.HBgLMTY1MDU1NTEyMzQVAgA=")
    );
    assert_eq!(ev.source.platform, "whatsapp_cloud");
    assert_eq!(ev.source.chat_type, ChatType::Dm);
    assert_eq!(ev.source.chat_id, ADA);
    assert_eq!(ev.source.user_id.as_deref(), Some(ADA));
    assert_eq!(ev.source.user_name.as_deref(), Some("Ada"));
    assert!(!ev.source.is_bot);
    assert!(!r.adapter.verifies_senders());
    talaria_gateway::SessionKey::for_source(&ev.source, talaria_gateway::KeyPolicy::default())
        .unwrap();
}

#[tokio::test]
async fn every_message_of_a_batch_is_handed_over_in_order_with_media_described() {
    let mut r = start().await;
    let photo = message(
        ADA,
        "wamid.P2",
        "image",
        json!({"id": "9", "mime_type": "image/jpeg", "caption": "my desk"}),
    );
    let batch = delivery(
        NUMBER,
        &[(ADA, "Ada")],
        vec![text(ADA, "wamid.P1", "first"), photo],
        vec![],
    );
    assert_eq!(r.meta.deliver(&batch).await.status, 200);
    let first = r.next().await;
    let second = r.next().await;
    assert_eq!(first.text, "first");
    assert_eq!(second.text, "my desk");
    assert_eq!(
        second.attachments,
        [
            talaria_adapter::Attachment::remote(talaria_adapter::MediaKind::Image, "9")
                .claiming(Some("image/jpeg"))
        ]
    );
}

#[tokio::test]
async fn bad_or_missing_signatures_get_401_and_nothing_is_handed_over() {
    let mut r = start().await;
    let body = one_text(ADA, "wamid.S1", "let me in").to_string();
    let bytes = body.as_bytes();
    let other_body = signature(APP_SECRET, b"{}");
    let other_secret = signature("not-the-app-secret", bytes);
    let bare_hex = signature(APP_SECRET, bytes)[7..].to_owned();
    for sig in [
        Some(other_body.as_str()),
        Some(other_secret.as_str()),
        Some(bare_hex.as_str()),
        Some("sha256=not-hex"),
        Some(""),
        None,
    ] {
        let answer = r.meta.post(bytes, sig).await;
        assert_eq!(answer.status, 401, "{sig:?}");
        assert!(!answer.body.contains(APP_SECRET));
    }
    r.nothing_handed_over();
    // The same body, rightly signed, goes through.
    let good = signature(APP_SECRET, bytes);
    assert_eq!(r.meta.post(bytes, Some(&good)).await.status, 200);
    assert_eq!(r.next().await.text, "let me in");
}

#[tokio::test]
async fn over_size_deliveries_get_413_unread() {
    let mut r = start_with(|s| WhatsappSettings {
        max_body_bytes: 2048,
        ..s
    })
    .await;
    let big = one_text(ADA, "wamid.BIG", &"x".repeat(4000));
    let answer = r.meta.deliver(&big).await;
    assert_eq!(answer.status, 413);
    r.nothing_handed_over();
    let small = one_text(ADA, "wamid.SMALL", "fits");
    assert_eq!(r.meta.deliver(&small).await.status, 200);
    assert_eq!(r.next().await.text, "fits");
}

#[tokio::test]
async fn receipts_other_numbers_and_other_objects_start_nothing() {
    let mut r = start().await;
    let receipts = delivery(
        NUMBER,
        &[],
        vec![],
        vec![
            delivered_status("wamid.OUT1", ADA),
            failed_status(
                "wamid.OUT2",
                ADA,
                131047,
                "Re-engagement message",
                "Message failed to send because more than 24 hours have passed since the \
                 customer last replied to this number.",
            ),
        ],
    );
    assert_eq!(r.meta.deliver(&receipts).await.status, 200);
    let elsewhere = delivery(
        "999000111",
        &[(ADA, "Ada")],
        vec![text(ADA, "wamid.E1", "for another number")],
        vec![],
    );
    assert_eq!(r.meta.deliver(&elsewhere).await.status, 200);
    let page = json!({"object": "page", "entry": [{"id": "1", "changes": []}]});
    assert_eq!(r.meta.deliver(&page).await.status, 200);
    let not_json = b"{not json";
    let sig = signature(APP_SECRET, not_json);
    assert_eq!(r.meta.post(not_json, Some(&sig)).await.status, 400);
    r.nothing_handed_over();
}

#[tokio::test]
async fn deliveries_wait_with_503_while_no_inbox_is_attached() {
    let mut r = start().await;
    r.shutdown.cancel();
    (&mut r.task).await.unwrap().unwrap();
    let answer = r.meta.deliver(&one_text(ADA, "wamid.L1", "late")).await;
    assert_eq!(answer.status, 503);
    // The handshake needs no inbox.
    assert_eq!(r.meta.verify("subscribe", VERIFY, "7").await.status, 200);
    r.nothing_handed_over();
}

#[tokio::test]
async fn a_send_posts_whatsapp_formatted_text_quoting_the_answered_message() {
    let r = start().await;
    let sent = r
        .adapter
        .send(&r.to_ada("**Done**: see [the docs](https://e.org)", Some("wamid.Q1")))
        .await
        .unwrap();
    let got = r.graph.sent();
    assert_eq!(got.len(), 1);
    assert_eq!(sent.message_id.as_deref(), Some(got[0].id.as_str()));
    assert_eq!(got[0].to, ADA);
    assert_eq!(got[0].body, "*Done*: see the docs (https://e.org)");
    assert_eq!(got[0].preview_url, Some(false));
    assert_eq!(got[0].context.as_deref(), Some("wamid.Q1"));
    let req = &r.graph.requests()[0];
    assert_eq!(req.path, format!("/{API_VERSION}/{NUMBER}/messages"));
    assert_eq!(req.body["recipient_type"], "individual");
    assert!(req.authorized);
    // Only WhatsApp's own ids are quoted.
    r.adapter
        .send(&r.to_ada("plain", Some("not-a-wamid")))
        .await
        .unwrap();
    assert_eq!(r.graph.sent()[1].context, None);
    assert_eq!(
        r.adapter.limits().max_len,
        MAX_TEXT_CHARS,
        "WhatsApp's text limit"
    );
}

#[tokio::test]
async fn graph_errors_are_mapped_for_the_ledger() {
    let r = start_with(|s| WhatsappSettings {
        rate_limit_retries: 1,
        ..s
    })
    .await;
    let hi = r.to_ada("hi", None);
    let send = || r.adapter.send(&hi);

    r.graph.fail_next_send(Failure::outside_window());
    let window = send().await.unwrap_err();
    assert!(
        matches!(&window, SendError::Rejected(m)
            if m.contains("24 hours") && m.contains("write to the bot first") && m.contains("template")),
        "{window:?}"
    );

    // One rate limit is waited out and the send goes through.
    r.graph.fail_next_send(Failure::rate_limited(131056));
    send().await.unwrap();
    // More than the retries allow is reported.
    for code in [130429, 131056, 80007] {
        r.graph.fail_next_send(Failure::rate_limited(code));
        r.graph.fail_next_send(Failure::rate_limited(code));
        assert!(
            matches!(send().await, Err(SendError::RateLimited(_))),
            "{code}"
        );
    }
    r.graph.fail_next_send(Failure::TooManyRequests {
        retry_after: Some(0),
    });
    r.graph.fail_next_send(Failure::TooManyRequests {
        retry_after: Some(0),
    });
    assert!(matches!(send().await, Err(SendError::RateLimited(_))));

    r.graph.fail_next_send(Failure::server_error());
    assert!(matches!(send().await, Err(SendError::Transient(_))));
    r.graph
        .fail_next_send(Failure::graph(400, 100, "(#100) Invalid parameter"));
    assert!(matches!(send().await, Err(SendError::Rejected(m)) if m.contains("Invalid parameter")));

    r.graph.fail_next_send(Failure::token_expired());
    let expired = send().await.unwrap_err();
    assert!(
        matches!(&expired, SendError::Unavailable(m) if m.contains("WHATSAPP_CLOUD_TOKEN")),
        "{expired:?}"
    );
    assert!(!format!("{expired:?}").contains(TOKEN));

    // A closed window for one user, as Graph reports it for real.
    r.graph.close_window(ADA);
    assert!(matches!(send().await, Err(SendError::Rejected(m)) if m.contains("131047")));
    r.graph.expire_token();
    assert!(matches!(send().await, Err(SendError::Unavailable(_))));
}

#[tokio::test]
async fn a_wrong_token_or_an_unreachable_graph_is_unavailable() {
    let r = start_with(|s| WhatsappSettings {
        token: Secret::new("EAAG-some-other-token"),
        ..s
    })
    .await;
    let err = r.adapter.send(&r.to_ada("hi", None)).await.unwrap_err();
    assert!(matches!(err, SendError::Unavailable(_)), "{err:?}");
    assert!(r.graph.sent().is_empty());

    let gone = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        format!("http://{}", l.local_addr().unwrap())
    };
    let r = start_with(|s| WhatsappSettings {
        graph_base: gone,
        ..s
    })
    .await;
    let err = r.adapter.send(&r.to_ada("hi", None)).await.unwrap_err();
    assert!(matches!(err, SendError::Unavailable(_)), "{err:?}");
}

#[tokio::test]
async fn typing_marks_the_last_message_read_once_per_window() {
    let mut r = start().await;
    // Nothing known from this chat yet: nothing to mark.
    r.adapter.typing(ADA, None).await.unwrap();
    assert!(r.graph.requests().is_empty());
    assert_eq!(
        r.meta
            .deliver(&one_text(ADA, "wamid.T1", "hello"))
            .await
            .status,
        200
    );
    r.next().await;
    r.adapter.typing(ADA, None).await.unwrap();
    r.adapter.typing(ADA, None).await.unwrap();
    let reads = r.graph.reads();
    assert_eq!(reads.len(), 1, "{reads:?}");
    assert_eq!(reads[0].message_id, "wamid.T1");
    assert!(reads[0].typing);
    // A new message gets its own receipt.
    r.meta.deliver(&one_text(ADA, "wamid.T2", "again")).await;
    r.next().await;
    r.adapter.typing(ADA, None).await.unwrap();
    assert_eq!(r.graph.reads()[1].message_id, "wamid.T2");
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

/// The first Ogg page of an Opus stream: the page header and `OpusHead`
/// (nothing here decodes audio, so the header alone is enough).
fn ogg_opus() -> Vec<u8> {
    let mut page = b"OggS".to_vec();
    page.extend([0, 2]); // version, beginning of stream
    page.extend([0; 8]); // granule position
    page.extend([1, 0, 0, 0]); // serial
    page.extend([0; 4]); // page sequence
    page.extend([0; 4]); // checksum
    page.extend([1, 19]); // one segment of 19 bytes
    page.extend(b"OpusHead");
    page.extend([1, 1, 0x38, 0x01, 0x80, 0xbb, 0, 0, 0, 0, 0]);
    page
}

const PDF: &[u8] = b"%PDF-1.4\n1 0 obj<<>>endobj\ntrailer<<>>\n%%EOF\n";

async fn read_all(download: talaria_adapter::Download) -> Vec<u8> {
    use tokio::io::AsyncReadExt;
    let mut reader = download.reader;
    let mut bytes = Vec::new();
    reader.read_to_end(&mut bytes).await.unwrap();
    bytes
}

fn outbound(
    dir: &std::path::Path,
    name: &str,
    bytes: &[u8],
    kind: talaria_adapter::MediaKind,
    mime: &str,
    caption: Option<&str>,
) -> talaria_adapter::OutboundFile {
    let path = dir.join(name);
    std::fs::write(&path, bytes).unwrap();
    talaria_adapter::OutboundFile {
        chat_id: ADA.to_owned(),
        thread_id: None,
        reply_to: Some("wamid.IN1".to_owned()),
        path,
        kind,
        mime: mime.to_owned(),
        name: name.to_owned(),
        caption: caption.map(str::to_owned),
    }
}

#[tokio::test]
async fn an_inbound_photo_voice_note_and_document_download_as_the_bytes_sent() {
    use talaria_adapter::{AttachmentSource, MediaKind};
    let mut r = start().await;
    let ogg = ogg_opus();
    let photo = r.graph.add_media(&PNG, "image/png");
    let voice = r.graph.add_media(&ogg, "audio/ogg; codecs=opus");
    let doc = r.graph.add_media(PDF, "application/pdf");
    let batch = delivery(
        NUMBER,
        &[(ADA, "Ada")],
        vec![
            message(
                ADA,
                "wamid.M1",
                "image",
                json!({"id": photo, "mime_type": "image/png"}),
            ),
            message(
                ADA,
                "wamid.M2",
                "audio",
                json!({"id": voice, "mime_type": "audio/ogg; codecs=opus", "voice": true}),
            ),
            message(
                ADA,
                "wamid.M3",
                "document",
                json!({"id": doc, "mime_type": "application/pdf", "filename": "q3.pdf"}),
            ),
        ],
        vec![],
    );
    assert_eq!(r.meta.deliver(&batch).await.status, 200);
    for (kind, want) in [
        (MediaKind::Image, PNG.to_vec()),
        (MediaKind::Voice, ogg.clone()),
        (MediaKind::Document, PDF.to_vec()),
    ] {
        let event = r.next().await;
        let [attachment] = event.attachments.as_slice() else {
            panic!("one attachment: {:?}", event.attachments)
        };
        assert_eq!(attachment.kind, kind);
        let AttachmentSource::Remote(locator) = &attachment.source else {
            panic!("a remote attachment: {attachment:?}")
        };
        let download = r.adapter.download(locator).await.unwrap();
        assert_eq!(download.length, Some(want.len() as u64));
        assert_eq!(read_all(download).await, want, "{kind:?}");
    }
    // Both steps carried the token: the lookup and the file itself.
    let requests = r.graph.requests();
    let fetches: Vec<_> = requests.iter().filter(|q| q.method == "GET").collect();
    assert_eq!(fetches.len(), 6, "{fetches:?}");
    assert!(fetches.iter().all(|q| q.authorized));
    assert!(
        fetches
            .iter()
            .any(|q| q.path.starts_with("/whatsapp_business/attachments/"))
    );
}

#[tokio::test]
async fn a_file_graph_no_longer_has_is_gone() {
    use talaria_adapter::DownloadError;
    let r = start().await;
    let id = r.graph.add_media(&PNG, "image/png");
    r.graph.expire_media(&id);
    let expired = r.adapter.download(&id).await.unwrap_err();
    assert!(
        matches!(&expired, DownloadError::Gone(m) if m.contains("404")),
        "{expired:?}"
    );
    let unknown = r.adapter.download("424242").await.unwrap_err();
    assert!(
        matches!(&unknown, DownloadError::Gone(m) if m.contains("100")),
        "{unknown:?}"
    );
    for e in [expired, unknown] {
        assert!(!e.to_string().contains(TOKEN), "{e}");
    }
    // Not a media id: nothing is asked.
    let before = r.graph.requests().len();
    assert!(matches!(
        r.adapter.download("../../me").await,
        Err(DownloadError::Gone(_))
    ));
    assert_eq!(r.graph.requests().len(), before);
}

#[tokio::test]
async fn a_media_url_on_a_foreign_host_is_never_fetched() {
    use talaria_adapter::DownloadError;
    let r = start().await;
    // Another server on the same address but another port: not the Graph
    // origin, so the token must not go there.
    let elsewhere = FakeGraph::start(TOKEN, NUMBER).await;
    let url = format!(
        "{}/whatsapp_business/attachments/?mid=1",
        elsewhere.base_url()
    );
    let id = r.graph.add_media_at(&url, "image/png");
    let err = r.adapter.download(&id).await.unwrap_err();
    assert!(
        matches!(&err, DownloadError::Gone(m) if m.contains("not a WhatsApp file address")),
        "{err:?}"
    );
    assert!(elsewhere.requests().is_empty());
}

#[tokio::test]
async fn files_are_uploaded_then_sent_as_the_type_that_carries_them() {
    use talaria_adapter::MediaKind;
    let r = start().await;
    let dir = tempfile::tempdir().unwrap();
    let ogg = ogg_opus();
    let files = [
        outbound(
            dir.path(),
            "chart.png",
            &PNG,
            MediaKind::Image,
            "image/png",
            Some("**Q3** sales"),
        ),
        outbound(
            dir.path(),
            "reply.ogg",
            &ogg,
            MediaKind::Voice,
            "audio/ogg",
            Some("said aloud"),
        ),
        outbound(
            dir.path(),
            "q3.pdf",
            PDF,
            MediaKind::Document,
            "application/pdf",
            None,
        ),
    ];
    let mut ids = Vec::new();
    for file in &files {
        let sent = r.adapter.send_file(file).await.unwrap();
        ids.push(sent.message_id.unwrap());
    }
    let uploads = r.graph.uploads();
    assert_eq!(uploads.len(), 3);
    for (upload, (file, bytes)) in uploads.iter().zip(files.iter().zip([&PNG[..], &ogg, PDF])) {
        assert_eq!(upload.messaging_product, "whatsapp");
        assert_eq!(upload.mime, file.mime);
        assert_eq!(upload.content_type.as_deref(), Some(file.mime.as_str()));
        assert_eq!(upload.file_name.as_deref(), Some(file.name.as_str()));
        assert_eq!(upload.bytes, bytes);
    }
    let sent = r.graph.sent_files();
    const IN: Option<&str> = Some("wamid.IN1");
    let shape: Vec<_> = sent
        .iter()
        .map(|s| {
            (
                s.kind.as_str(),
                s.media_id.as_str(),
                s.caption.as_deref(),
                s.filename.as_deref(),
                s.context.as_deref(),
            )
        })
        .collect();
    assert_eq!(
        shape,
        [
            (
                "image",
                uploads[0].id.as_str(),
                Some("*Q3* sales"),
                None,
                IN
            ),
            ("audio", uploads[1].id.as_str(), None, None, IN),
            ("document", uploads[2].id.as_str(), None, Some("q3.pdf"), IN),
        ]
    );
    assert!(sent.iter().all(|s| s.to == ADA));
    assert_eq!(ids, sent.iter().map(|s| s.id.clone()).collect::<Vec<_>>());
    // Audio shows no caption: it follows as a text.
    let texts = r.graph.sent();
    assert_eq!(texts.len(), 1);
    assert_eq!(texts[0].body, "said aloud");
}

#[tokio::test]
async fn file_sends_quote_wamids_and_map_graph_errors() {
    use talaria_adapter::MediaKind;
    let r = start().await;
    let dir = tempfile::tempdir().unwrap();
    let mut file = outbound(
        dir.path(),
        "a.png",
        &PNG,
        MediaKind::Image,
        "image/png",
        None,
    );
    file.reply_to = Some("wamid.QUOTED".to_owned());
    r.adapter.send_file(&file).await.unwrap();
    assert_eq!(
        r.graph.sent_files()[0].context.as_deref(),
        Some("wamid.QUOTED")
    );
    r.graph.close_window(ADA);
    let err = r.adapter.send_file(&file).await.unwrap_err();
    assert!(
        matches!(&err, SendError::Rejected(m) if m.contains("24 hours")),
        "{err:?}"
    );
    r.graph.expire_token();
    let err = r.adapter.send_file(&file).await.unwrap_err();
    assert!(
        matches!(&err, SendError::Unavailable(m) if m.contains("WHATSAPP_CLOUD_TOKEN")),
        "{err:?}"
    );
    let missing = talaria_adapter::OutboundFile {
        path: dir.path().join("absent.png"),
        ..file
    };
    assert!(matches!(
        r.adapter.send_file(&missing).await,
        Err(SendError::Rejected(_))
    ));
}

#[tokio::test]
async fn a_file_past_whatsapps_largest_goes_as_a_text_line() {
    use talaria_adapter::MediaKind;
    let r = start().await;
    let dir = tempfile::tempdir().unwrap();
    let file = outbound(
        dir.path(),
        "huge.pdf",
        b"",
        MediaKind::Document,
        "application/pdf",
        None,
    );
    // Sparse: 101 MiB on paper, nothing on disk, and never read.
    std::fs::File::options()
        .write(true)
        .open(&file.path)
        .unwrap()
        .set_len(101 * 1024 * 1024)
        .unwrap();
    r.adapter.send_file(&file).await.unwrap();
    assert!(r.graph.uploads().is_empty());
    let texts = r.graph.sent();
    assert_eq!(texts.len(), 1);
    assert!(
        texts[0]
            .body
            .contains("huge.pdf (application/pdf; whatsapp_cloud cannot carry this file)"),
        "{}",
        texts[0].body
    );
}
