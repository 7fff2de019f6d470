//! The WeCom adapters against the fake WeCom in talaria-testkit.
//!
//! The self-built app (`wecom_callback`): callbacks posted to the shared
//! listener on 127.0.0.1 as WeCom posts them, their ciphertexts made by the
//! `openssl` command line and their signatures checked against Python's
//! `hashlib` (never the adapter's own code), and sends to the fake server
//! API.
#![cfg(feature = "wecom")]

use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use talaria_adapter::{AttachmentSource, DownloadError, MediaKind, OutboundFile};
use talaria_core::Secret;
use talaria_gateway::{
    Adapter, AdapterContext, AdapterError, Inbox, Liveness, LivenessReporter, MessageEvent,
    OutboundMessage, SendError,
};
use talaria_platforms::ingress::Ingress;
use talaria_platforms::wecom::callback::{
    DEFAULT_PATH, MessageFormat, WecomCallbackAdapter, WecomCallbackSettings,
};
use talaria_testkit::FakeWecom;
use talaria_testkit::wecom::{
    Callback, Failure, encrypt, media_xml, now_secs, signature, text_xml,
};
use tokio::io::AsyncReadExt;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_util::sync::{CancellationToken, DropGuard};

const CORP: &str = "ww0a1b2c3d4e5f6a7b";
const SECRET: &str = "wecom-corp-secret-0123456789";
const AGENT: i64 = 1000002;
const TOKEN: &str = "cbTokenForTests";
const AES_KEY: &str = "abcdefghijklmnopqrstuvwxyz0123456789ABCDEFG";
const WAIT: Duration = Duration::from_secs(10);

fn settings(fake: &FakeWecom) -> WecomCallbackSettings {
    WecomCallbackSettings {
        corp_id: CORP.into(),
        corp_secret: Secret::new(SECRET),
        agent_id: AGENT.to_string(),
        token: Secret::new(TOKEN),
        encoding_aes_key: Secret::new(AES_KEY),
        path: DEFAULT_PATH.into(),
        api_base: fake.base_url(),
        message_format: MessageFormat::Text,
        rate_limit_wait: Duration::from_millis(300),
        max_clock_skew: Duration::from_secs(300),
        send_timeout: Duration::from_secs(5),
    }
}

fn callback() -> Callback {
    Callback {
        corp_id: CORP.into(),
        agent_id: AGENT,
        token: TOKEN.into(),
        encoding_aes_key: AES_KEY.into(),
    }
}

struct Running {
    fake: FakeWecom,
    adapter: Arc<WecomCallbackAdapter>,
    url: String,
    http: reqwest::Client,
    events: mpsc::Receiver<MessageEvent>,
    _task: JoinHandle<Result<(), AdapterError>>,
    _stop: DropGuard,
    _server: DropGuard,
}

async fn start_with(configure: impl FnOnce(&mut WecomCallbackSettings)) -> Running {
    let fake = FakeWecom::start(CORP, SECRET, AGENT);
    let mut s = settings(&fake);
    configure(&mut s);
    let adapter = Arc::new(WecomCallbackAdapter::new(s).unwrap());
    let mut ingress = Ingress::bind("127.0.0.1", 0).await.unwrap();
    ingress.mount(adapter.mount());
    let url = format!("http://{}{DEFAULT_PATH}", ingress.local_addr());
    let server = CancellationToken::new();
    tokio::spawn(ingress.serve(server.clone()));
    let (inbox, events) = Inbox::channel(16);
    let (reporter, mut liveness) = LivenessReporter::new();
    let stop = CancellationToken::new();
    let ctx = AdapterContext {
        inbox,
        liveness: reporter,
        shutdown: stop.clone(),
    };
    let a = adapter.clone();
    let task = tokio::spawn(async move { a.run(ctx).await });
    tokio::time::timeout(WAIT, liveness.wait_for(|l| *l == Liveness::Live))
        .await
        .expect("never live")
        .expect("the reporter is kept");
    Running {
        fake,
        adapter,
        url,
        http: reqwest::Client::new(),
        events,
        _task: task,
        _stop: stop.drop_guard(),
        _server: server.drop_guard(),
    }
}

async fn start() -> Running {
    start_with(|_| {}).await
}

impl Running {
    async fn post(&self, query: &str, body: String) -> (u16, String) {
        let r = self
            .http
            .post(format!("{}?{query}", self.url))
            .header("content-type", "text/xml")
            .body(body)
            .send()
            .await
            .unwrap();
        (r.status().as_u16(), r.text().await.unwrap())
    }

    async fn post_message(&self, xml: &str, nonce: &str) -> (u16, String) {
        let cb = callback();
        let signed = cb.seal(xml, nonce);
        self.post(&signed.query(), cb.envelope(&signed)).await
    }

    async fn next_event(&mut self) -> MessageEvent {
        tokio::time::timeout(WAIT, self.events.recv())
            .await
            .expect("no event")
            .expect("inbox open")
    }

    async fn no_event(&mut self) {
        assert!(
            tokio::time::timeout(Duration::from_millis(300), self.events.recv())
                .await
                .is_err(),
            "an event was handed over"
        );
    }
}

/// SHA-1 of the sorted parts by Python's `hashlib`.
fn python_signature(parts: [&str; 4]) -> String {
    let out = Command::new("python3")
        .args([
            "-c",
            "import hashlib,sys; print(hashlib.sha1(''.join(sorted(sys.argv[1:])).encode()).hexdigest())",
        ])
        .args(parts)
        .output()
        .expect("python3 runs");
    assert!(out.status.success());
    String::from_utf8(out.stdout).unwrap().trim().to_owned()
}

/// A message of `len` bytes whose plaintext (16 + 4 + len + corp id)
/// fills whole 32-byte blocks, so the padding is one whole block of 32s.
fn whole_block_len(min: usize) -> usize {
    let mut len = min;
    while !(16 + 4 + len + CORP.len()).is_multiple_of(32) {
        len += 1;
    }
    len
}

#[test]
fn the_kits_signature_agrees_with_pythons_hashlib() {
    for parts in [
        [TOKEN, "1700000000", "nonce1", "c2VhbGVk"],
        ["中文token", "1", "z", "A+/="],
    ] {
        assert_eq!(
            signature(parts[0], parts[1], parts[2], parts[3]),
            python_signature(parts)
        );
    }
}

#[tokio::test]
async fn url_verification_answers_the_plaintext_raw_and_refuses_a_bad_signature() {
    let r = start().await;
    // 32 pad bytes: the whole last block is padding.
    let echo_len = whole_block_len(10);
    let echo: String = "e".repeat(echo_len - 4) + "1234";
    let signed = callback().seal(&echo, "n-verify");
    assert_eq!(
        signed.msg_signature,
        python_signature([TOKEN, &signed.timestamp, "n-verify", &signed.encrypted])
    );
    let got = r
        .http
        .get(format!("{}?{}", r.url, signed.verify_query()))
        .send()
        .await
        .unwrap();
    assert_eq!(got.status(), 200);
    assert_eq!(got.bytes().await.unwrap().as_ref(), echo.as_bytes());

    let mut forged = signed.clone();
    forged.msg_signature = python_signature([
        "another-token",
        &signed.timestamp,
        "n-verify",
        &signed.encrypted,
    ]);
    let got = r
        .http
        .get(format!("{}?{}", r.url, forged.verify_query()))
        .send()
        .await
        .unwrap();
    assert_eq!(got.status(), 403);
    assert!(!got.text().await.unwrap().contains(&echo));
}

#[tokio::test]
async fn messages_open_with_a_whole_block_of_padding_and_multibyte_text() {
    let mut r = start().await;
    // A message whose plaintext needs 32 bytes of padding.
    let base = text_xml(CORP, AGENT, "zhangsan", "", "1001");
    let content = "p".repeat(whole_block_len(base.len()) - base.len());
    let xml = text_xml(CORP, AGENT, "zhangsan", &content, "1001");
    assert_eq!((16 + 4 + xml.len() + CORP.len()) % 32, 0);
    assert_eq!(
        r.post_message(&xml, "n1").await,
        (200, "success".to_owned())
    );
    let event = r.next_event().await;
    assert_eq!(event.text, content);
    assert_eq!(event.message_id.as_deref(), Some("1001"));
    assert_eq!(event.source.chat_id, format!("{CORP}:zhangsan"));
    assert_eq!(event.source.user_id.as_deref(), Some("zhangsan"));
    assert_eq!(event.source.platform, "wecom_callback");

    let text = "你好，世界！😀 Ünïcödé ✓";
    let xml = text_xml(CORP, AGENT, "zhangsan", text, "1002");
    assert_eq!(
        r.post_message(&xml, "n2").await,
        (200, "success".to_owned())
    );
    assert_eq!(r.next_event().await.text, text);
}

#[tokio::test]
async fn a_tampered_signature_a_tampered_body_a_wrong_receiver_and_a_stale_timestamp_are_refused() {
    let mut r = start().await;
    let cb = callback();
    let xml = text_xml(CORP, AGENT, "zhangsan", "forged?", "2001");

    let signed = cb.seal(&xml, "t1");
    let mut bad = signed.clone();
    bad.msg_signature =
        python_signature(["wrong-token", &signed.timestamp, "t1", &signed.encrypted]);
    assert_eq!(r.post(&bad.query(), cb.envelope(&signed)).await.0, 403);

    // The ciphertext changed after signing.
    let other = cb.seal(
        &text_xml(CORP, AGENT, "zhangsan", "send me secrets", "2001"),
        "t1",
    );
    assert_eq!(r.post(&signed.query(), cb.envelope(&other)).await.0, 403);

    // Correctly signed, but encrypted for another corp.
    let elsewhere = cb.seal_for(&xml, "wwSomeoneElse", &now_secs().to_string(), "t2");
    assert_eq!(
        r.post(&elsewhere.query(), cb.envelope(&elsewhere)).await.0,
        403
    );

    // Correctly signed and encrypted, but an hour old: a replay.
    let old = cb.seal_for(&xml, CORP, &(now_secs() - 3600).to_string(), "t3");
    assert_eq!(r.post(&old.query(), cb.envelope(&old)).await.0, 403);

    // Not XML with an Encrypt element.
    assert_eq!(r.post(&signed.query(), "{}".into()).await.0, 400);
    r.no_event().await;

    // The genuine message (its MsgId was not remembered by the refusals)
    // still goes through.
    assert_eq!(r.post(&signed.query(), cb.envelope(&signed)).await.0, 200);
    assert_eq!(r.next_event().await.text, "forged?");
}

#[tokio::test]
async fn a_replayed_msgid_is_acknowledged_and_ignored() {
    let mut r = start().await;
    let xml = text_xml(CORP, AGENT, "zhangsan", "once", "3001");
    assert_eq!(r.post_message(&xml, "a").await.0, 200);
    r.next_event().await;
    // WeCom's retry and an attacker's replay: new nonce and timestamp,
    // same MsgId.
    assert_eq!(r.post_message(&xml, "b").await, (200, "success".to_owned()));
    r.no_event().await;
    let xml = text_xml(CORP, AGENT, "zhangsan", "once", "3002");
    assert_eq!(r.post_message(&xml, "c").await.0, 200);
    assert_eq!(r.next_event().await.message_id.as_deref(), Some("3002"));
}

#[tokio::test]
async fn events_other_agents_and_oversized_bodies_start_nothing() {
    let mut r = start().await;
    let event = format!(
        "<xml><ToUserName><![CDATA[{CORP}]]></ToUserName><FromUserName><![CDATA[zhangsan]]></FromUserName>\
         <CreateTime>{}</CreateTime><MsgType><![CDATA[event]]></MsgType><Event><![CDATA[enter_agent]]></Event>\
         <AgentID>{AGENT}</AgentID></xml>",
        now_secs()
    );
    assert_eq!(
        r.post_message(&event, "e1").await,
        (200, "success".to_owned())
    );
    let other = text_xml(CORP, 999, "zhangsan", "not for us", "4001");
    assert_eq!(
        r.post_message(&other, "e2").await,
        (200, "success".to_owned())
    );
    let huge = "x".repeat(70 * 1024);
    assert_eq!(
        r.post("msg_signature=a&timestamp=1&nonce=n", huge).await.0,
        413
    );
    r.no_event().await;
}

fn dm(text: &str) -> OutboundMessage {
    OutboundMessage {
        chat_id: format!("{CORP}:zhangsan"),
        thread_id: None,
        reply_to: None,
        text: text.into(),
        choices: Vec::new(),
    }
}

#[tokio::test]
async fn long_text_is_cut_by_utf8_bytes_and_the_token_is_cached() {
    let r = start().await;
    let text = "汉字".repeat(600); // 3600 bytes, 1200 characters
    r.adapter.send(&dm(&text)).await.unwrap();
    let sent = r.fake.sent();
    assert_eq!(sent.len(), 2);
    assert!(
        sent.iter()
            .all(|s| s.content.len() <= 2048 && s.touser == "zhangsan")
    );
    assert_eq!(
        sent.iter().map(|s| s.content.as_str()).collect::<String>(),
        text
    );
    assert!(sent.iter().all(|s| s.msgtype == "text"));
    assert_eq!(
        r.fake.tokens_issued(),
        1,
        "one token for the run and both sends"
    );
}

#[tokio::test]
async fn an_expired_token_is_refreshed_and_the_send_retried_once() {
    let r = start().await;
    r.fake.expire_tokens();
    let sent = r.adapter.send(&dm("after expiry")).await.unwrap();
    assert!(sent.message_id.is_some());
    assert_eq!(r.fake.tokens_issued(), 2);
    assert_eq!(r.fake.send_attempts().len(), 2);
    assert_eq!(r.fake.sent()[0].content, "after expiry");
}

#[tokio::test]
async fn an_untrusted_ip_is_a_clear_error_and_rate_limits_are_waited_out() {
    let r = start().await;
    r.fake.fail_next_send(Failure::Code(60020));
    let e = r.adapter.send(&dm("x")).await.unwrap_err();
    assert!(
        matches!(&e, SendError::Unavailable(m) if m.contains("trusted IP") && !m.contains(SECRET)),
        "{e:?}"
    );

    r.fake.fail_next_send(Failure::Code(45009));
    r.adapter.send(&dm("after the wait")).await.unwrap();
    let attempts = r.fake.send_attempts();
    let n = attempts.len();
    let gap = attempts[n - 1].at.duration_since(attempts[n - 2].at);
    assert!(gap >= Duration::from_millis(300), "retried after {gap:?}");

    for _ in 0..3 {
        r.fake.fail_next_send(Failure::Code(45009));
    }
    let e = r.adapter.send(&dm("never")).await.unwrap_err();
    assert!(matches!(e, SendError::RateLimited(_)), "{e:?}");
}

#[tokio::test]
async fn markdown_format_sends_markdown_messages() {
    let r = start_with(|s| s.message_format = MessageFormat::Markdown).await;
    r.adapter.send(&dm("**bold**")).await.unwrap();
    let sent = r.fake.sent();
    assert_eq!(sent[0].msgtype, "markdown");
    assert_eq!(sent[0].content, "**bold**");
}

#[tokio::test]
async fn wrong_credentials_stop_the_run_with_a_clear_error() {
    let fake = FakeWecom::start(CORP, "the-real-secret", AGENT);
    let adapter = WecomCallbackAdapter::new(settings(&fake)).unwrap();
    let (inbox, _events) = Inbox::channel(1);
    let (reporter, _l) = LivenessReporter::new();
    let e = adapter
        .run(AdapterContext {
            inbox,
            liveness: reporter,
            shutdown: CancellationToken::new(),
        })
        .await
        .unwrap_err();
    match e {
        AdapterError::Fatal(m) => {
            assert!(
                m.contains("WECOM_CALLBACK_CORP_SECRET") && !m.contains(SECRET),
                "{m}"
            )
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn the_kits_openssl_ciphertext_has_wecoms_layout() {
    // Decrypted again by openssl on its own, the plaintext shows the
    // layout: 16 random bytes, the length, the message, the corp id, and
    // 32-byte-block padding.
    let sealed = encrypt(AES_KEY, [9; 16], b"hello", CORP);
    let key = base64_decode(&format!("{AES_KEY}="));
    let hex = |b: &[u8]| b.iter().map(|x| format!("{x:02x}")).collect::<String>();
    let out = Command::new("sh")
        .args([
            "-c",
            &format!(
                "printf %s '{sealed}' | openssl base64 -d -A | openssl enc -d -aes-256-cbc -nopad -K {} -iv {}",
                hex(&key),
                hex(&key[..16])
            ),
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let plain = out.stdout;
    assert_eq!(plain.len() % 32, 0);
    assert_eq!(&plain[..16], &[9; 16]);
    assert_eq!(&plain[16..20], &5u32.to_be_bytes());
    assert_eq!(&plain[20..25], b"hello");
    assert_eq!(&plain[25..25 + CORP.len()], CORP.as_bytes());
    let pad = *plain.last().unwrap() as usize;
    assert_eq!(25 + CORP.len() + pad, plain.len());
}

fn base64_decode(s: &str) -> Vec<u8> {
    use base64::Engine;
    base64::engine::GeneralPurpose::new(
        &base64::alphabet::STANDARD,
        base64::engine::GeneralPurposeConfig::new().with_decode_allow_trailing_bits(true),
    )
    .decode(s)
    .unwrap()
}

async fn read_all(r: &Running, locator: &str) -> Vec<u8> {
    let mut download = r.adapter.download(locator).await.unwrap();
    let mut bytes = Vec::new();
    download.reader.read_to_end(&mut bytes).await.unwrap();
    bytes
}

fn locator(event: &MessageEvent) -> String {
    match &event.attachments[0].source {
        AttachmentSource::Remote(l) => l.clone(),
        other => panic!("not fetched later: {other:?}"),
    }
}

#[tokio::test]
async fn media_messages_are_attachments_fetched_by_media_id_with_a_fresh_token() {
    let mut r = start().await;
    let png = b"\x89PNG\r\n\x1a\n a picture".to_vec();
    let media = r.fake.add_media("image", "image/png", &png);
    let extra = "<PicUrl><![CDATA[http://127.0.0.1:9/elsewhere.png]]></PicUrl>";
    let xml = media_xml(CORP, AGENT, "zhangsan", "image", &media, extra, "5001");
    assert_eq!(
        r.post_message(&xml, "m1").await,
        (200, "success".to_owned())
    );
    let event = r.next_event().await;
    assert_eq!(event.attachments.len(), 1);
    assert_eq!(event.attachments[0].kind, MediaKind::Image);
    assert_eq!(locator(&event), media);
    // The token expired meanwhile: refused once, fetched anew, retried.
    r.fake.expire_tokens();
    assert_eq!(read_all(&r, &locator(&event)).await, png);
    let fetches = r.fake.media_fetches();
    assert_eq!(fetches.len(), 2, "{fetches:?}");
    assert_eq!(r.fake.tokens_issued(), 2);
    // A voice message's transcript is its text; the recording comes too.
    let voice = r.fake.add_media("voice", "audio/amr", b"#!AMR\n0123456789");
    let extra =
        "<Format><![CDATA[amr]]></Format><Recognition><![CDATA[明天十点开会]]></Recognition>";
    let xml = media_xml(CORP, AGENT, "zhangsan", "voice", &voice, extra, "5002");
    assert_eq!(r.post_message(&xml, "m2").await.0, 200);
    let event = r.next_event().await;
    assert_eq!(event.text, "明天十点开会");
    assert_eq!(event.attachments[0].kind, MediaKind::Voice);
    assert_eq!(read_all(&r, &voice).await, b"#!AMR\n0123456789");
}

#[tokio::test]
async fn an_unknown_media_id_is_gone_and_a_malformed_one_is_never_asked_for() {
    let r = start().await;
    let gone = r.adapter.download("1-no-such-media").await.unwrap_err();
    assert!(
        matches!(&gone, DownloadError::Gone(m) if m.contains("40007")),
        "{gone:?}"
    );
    let before = r.fake.media_fetches().len();
    let bad = r.adapter.download("a b&media_id=x").await.unwrap_err();
    assert!(matches!(bad, DownloadError::Gone(_)), "{bad:?}");
    assert_eq!(r.fake.media_fetches().len(), before);
}

fn outbound(path: &std::path::Path, kind: MediaKind, mime: &str) -> OutboundFile {
    OutboundFile {
        chat_id: format!("{CORP}:zhangsan"),
        thread_id: None,
        reply_to: None,
        path: path.to_owned(),
        kind,
        mime: mime.into(),
        name: path.file_name().unwrap().to_string_lossy().into_owned(),
        caption: None,
    }
}

#[tokio::test]
async fn files_go_out_as_their_kind_a_large_image_as_a_file_and_too_large_is_refused() {
    let r = start().await;
    let dir = tempfile::tempdir().unwrap();
    let small = dir.path().join("chart.png");
    std::fs::write(&small, b"\x89PNG\r\n\x1a\n small chart").unwrap();
    r.adapter
        .send_file(&outbound(&small, MediaKind::Image, "image/png"))
        .await
        .unwrap();
    // Over the image limit (10 MB), within a file's (20 MB).
    let large = dir.path().join("poster.png");
    std::fs::File::create(&large)
        .unwrap()
        .set_len(11 * 1024 * 1024)
        .unwrap();
    r.adapter
        .send_file(&outbound(&large, MediaKind::Image, "image/png"))
        .await
        .unwrap();
    let sent = r.fake.sent();
    let kinds: Vec<&str> = sent.iter().map(|s| s.msgtype.as_str()).collect();
    assert_eq!(kinds, ["image", "file"]);
    let uploads = r.fake.uploads();
    assert_eq!(uploads.len(), 2);
    assert_eq!(uploads[0].kind, "image");
    assert_eq!(uploads[0].bytes, std::fs::read(&small).unwrap());
    assert_eq!(
        (uploads[1].kind.as_str(), uploads[1].bytes.len()),
        ("file", 11 * 1024 * 1024)
    );
    assert_eq!(sent[1].content, uploads[1].media_id);
    // Past 20 MB nothing is uploaded, and the error says why.
    let huge = dir.path().join("archive.zip");
    std::fs::File::create(&huge)
        .unwrap()
        .set_len(21 * 1024 * 1024)
        .unwrap();
    let e = r
        .adapter
        .send_file(&outbound(&huge, MediaKind::Document, "application/zip"))
        .await
        .unwrap_err();
    assert!(
        matches!(&e, SendError::Rejected(m) if m.contains("20 MB")),
        "{e:?}"
    );
    assert_eq!(r.fake.uploads().len(), 2);
}
