//! The scenarios every adapter runs (see the module docs of `contract`).
//! Each asserts what holds for every platform; what a kit can observe
//! beyond that (typing, a quoted reply) it checks where the kit says so.

use std::time::Duration;

use talaria_adapter::contract::LengthUnit;
use talaria_testkit::Reply;
use talaria_testkit::kit::{Who, long_answer, part_count};

use super::{AdapterKit, Rig, Skip};

/// How long the fake asks the adapter to wait after a 429.
const RATE_LIMIT: Duration = Duration::from_secs(1);

/// A friend's DM is answered in the DM, the model saw the text, the
/// bot showed it was typing (where the fake can tell) and the ledger
/// records the answer delivered.
pub async fn dm_turn<K: AdapterKit>() {
    let rig = Rig::<K>::started(&[], |_| {}).await;
    rig.llm.push(Reply::text("Hello from Talaria."));
    let asked = rig.kit.push_dm(Who::Friend, "hi there");
    let sent = rig.sent(1).await;
    let chat = rig.kit.dm_chat(Who::Friend);
    assert_eq!(sent[0].chat, chat);
    assert_eq!(sent[0].text, "Hello from Talaria.");
    assert_eq!(sent[0].thread, None, "a DM is answered inline");
    if K::DM_REPLY_QUOTES {
        assert_eq!(sent[0].reply_to.as_deref(), Some(asked.as_str()));
    }
    assert_eq!(rig.user_messages(0).last().unwrap(), "hi there");
    if let Some(typed) = rig.kit.typed_in(&chat) {
        assert!(typed, "no typing indicator in {chat}");
    }
    rig.wait_for_delivered(1).await;
}

/// A message in a thread is answered in that thread, once (platforms that
/// send a mention twice included), and the speaker is named to the model
/// as in every shared chat.
pub async fn thread_reply<K: AdapterKit>() {
    let rig = Rig::<K>::started(&[], |_| {}).await;
    rig.llm.push(Reply::text("thread answer"));
    let asked = rig.kit.push_in_thread("in the thread");
    let sent = rig.wait_for_text("thread answer").await;
    let reply = sent.iter().find(|o| o.text == "thread answer").unwrap();
    assert_eq!(reply.chat, asked.chat);
    assert_eq!(reply.thread, asked.thread);
    let asked_text = rig.user_messages(0);
    assert!(
        asked_text.last().unwrap().ends_with("] in the thread"),
        "{asked_text:?}"
    );
    if let Some(typed) = rig.kit.typed_in(&asked.chat) {
        assert!(typed, "no typing indicator in {}", asked.chat);
    }
    // A second copy of the mention was decided on before the marker.
    rig.barrier().await;
    assert_eq!(
        rig.llm.requests().len(),
        2,
        "one turn for the message, one for the marker"
    );
    assert_eq!(rig.kit.sent().len(), 2, "{:?}", rig.kit.sent());
}

/// In a shared chat a friend's message that does not address the bot
/// starts no turn, and one that mentions it is answered in that chat (in
/// its thread, where the platform answers there), once, with the speaker
/// named to the model. The platform's require-mention switch is set by
/// its environment variable (the ancestor's `<PLATFORM>_REQUIRE_MENTION`),
/// for the platforms where it defaults off. The unaddressed message goes
/// first, so the answer to the mention is the barrier after which its
/// absence is observed.
pub async fn group_mention<K: AdapterKit>() {
    let switch = talaria_core::config::platform_var(K::NAME, "REQUIRE_MENTION");
    let rig = Rig::<K>::started(&[(switch.as_str(), "true")], |_| {}).await;
    rig.kit.push_in_group("chatting among ourselves", false);
    rig.llm.push(Reply::text("group answer"));
    let asked = rig.kit.push_in_group("what is the time", true);
    let sent = rig.wait_for_text("group answer").await;
    let reply = sent.iter().find(|o| o.text == "group answer").unwrap();
    assert_eq!(reply.chat, asked.chat);
    assert_eq!(reply.thread, asked.thread);
    rig.wait_for_delivered(1).await;
    assert_eq!(rig.llm.requests().len(), 1, "one turn, for the mention");
    let asked_text = rig.user_messages(0);
    // Named as in every shared chat; the mention itself may stay in.
    let last = asked_text.last().unwrap();
    assert!(
        last.starts_with('[') && last.ends_with("what is the time"),
        "{asked_text:?}"
    );
    assert!(
        asked_text.iter().all(|m| !m.contains("chatting among")),
        "the unaddressed message reached the model: {asked_text:?}"
    );
    assert_eq!(rig.kit.sent().len(), 1, "{:?}", rig.kit.sent());
}

/// An answer several times the platform's limit arrives in numbered parts,
/// each under the limit in the platform's unit, that reassemble to it
/// exactly; only the first names the question where replies quote.
pub async fn long_answer_split<K: AdapterKit>() {
    let rig = Rig::<K>::started(&[], |_| {}).await;
    let limits = rig.capabilities().limits;
    let answer = long_answer(limits.max_len * 2 + 500);
    rig.llm.push(Reply::text(answer.clone()));
    rig.kit.push_dm(Who::Friend, "write a lot");
    let first = rig.sent(1).await;
    let total = part_count(&first[0].text).expect("the first part carries (1/n)");
    // Twice the limit and a bit: at least three parts, and exactly as many
    // as the gateway cut (the splitter fills each part to within a line of
    // the limit, which is three where a line is short beside the limit).
    let cut = talaria_adapter::split::split_message(&answer, limits).len();
    assert!(total >= 3, "{total} parts");
    assert_eq!(total, cut, "{total} parts arrived of the {cut} cut");
    let sent = rig.sent(total).await;
    let mut joined = String::new();
    let chat = rig.kit.dm_chat(Who::Friend);
    for (i, part) in sent.iter().enumerate() {
        assert_eq!(part.chat, chat, "part {i} went elsewhere");
        let len = limits.unit.measure(&part.wire);
        assert!(len <= limits.max_len, "part {i} is {len} long");
        let suffix = format!(" ({}/{total})", i + 1);
        joined.push_str(part.text.strip_suffix(&suffix).expect("numbered part"));
    }
    assert_eq!(joined, answer);
    if K::DM_REPLY_QUOTES {
        assert!(sent[0].reply_to.is_some());
        assert!(sent[1..].iter().all(|s| s.reply_to.is_none()));
    }
    // Guard against a unit the suite does not know how to measure.
    assert!(matches!(limits.unit, LengthUnit::Chars | LengthUnit::Utf16));
}

/// The same event delivered again never starts a second turn; a new
/// message with the same text does.
pub async fn redelivery<K: AdapterKit>() {
    let rig = Rig::<K>::started(&[], |_| {}).await;
    rig.llm.push(Reply::text("First answer."));
    let id = rig.kit.push_dm(Who::Friend, "only once");
    rig.sent(1).await;
    // The turn is over once its answer is delivered, so the next message
    // is not met by a busy notice.
    rig.wait_for_delivered(1).await;
    rig.kit.redeliver(&id, "only once");
    rig.llm.push(Reply::text("Second answer."));
    let second = rig.kit.push_dm(Who::Friend, "only once");
    let sent = rig.sent(2).await;
    assert_eq!(sent[1].text, "Second answer.");
    if K::DM_REPLY_QUOTES {
        // Had the repeat started a turn, it would have run first and the
        // answer would quote the old message.
        assert_eq!(sent[1].reply_to.as_deref(), Some(second.as_str()));
    }
    // The marker follows in the same chat once the second turn is over.
    rig.wait_for_delivered(2).await;
    rig.barrier().await;
    assert_eq!(rig.llm.requests().len(), 3, "the repeat started a turn");
    assert_eq!(rig.kit.sent().len(), 3, "{:?}", rig.kit.sent());
    rig.wait_for_delivered(3).await;
}

/// A dropped connection is re-established; what arrived meanwhile is
/// answered, nothing is answered twice, and the conversation goes on.
pub async fn dropped_connection<K: AdapterKit>() {
    let rig = Rig::<K>::started(&[], |_| {}).await;
    rig.llm.push(Reply::text("first answer"));
    rig.kit.push_dm(Who::Friend, "before the drop");
    rig.wait_for_text("first answer").await;
    let seen = rig.kit.connections();
    rig.kit.drop_connection().await;
    // Sent while the bot is away: the platform keeps it for the next
    // connection.
    rig.llm.push(Reply::text("second answer"));
    rig.kit.push_dm(Who::Friend, "during the outage");
    rig.kit.wait_connected(seen + 1).await;
    if let Some(resumed) = rig.kit.last_connection_resumed() {
        assert!(resumed, "the connection was started afresh, not resumed");
    }
    rig.wait_for_text("second answer").await;
    // Everything the platform handed over, before and after the drop, was
    // acknowledged: nothing is left for it to deliver again.
    rig.kit.wait_acknowledged().await;
    // A message delivered twice across the drop was decided on before the
    // marker, which follows once the second turn is over.
    rig.wait_for_delivered(2).await;
    rig.barrier().await;
    assert_eq!(rig.kit.sent().len(), 3, "{:?}", rig.kit.sent());
    assert_eq!(rig.llm.requests().len(), 3);
    let asked = rig.user_messages(1);
    if K::DMS_CONTINUE {
        assert_eq!(asked, vec!["before the drop", "during the outage"]);
    } else {
        assert_eq!(asked, vec!["during the outage"]);
    }
}

/// A send refused as rate-limited is retried no sooner than the platform
/// asked, and the answer arrives once.
pub async fn rate_limit<K: AdapterKit>() {
    let rig = Rig::<K>::started(&[], |_| {}).await;
    rig.kit.rate_limit_next_send(RATE_LIMIT);
    rig.llm.push(Reply::text("worth the wait"));
    rig.kit.push_dm(Who::Friend, "hello");
    let sent = rig.sent(1).await;
    assert_eq!(sent[0].text, "worth the wait");
    let attempts = rig.kit.send_attempts();
    assert_eq!(attempts.len(), 2, "one refused send, one retry");
    let gap = attempts[1].duration_since(attempts[0]);
    assert!(gap >= RATE_LIMIT, "retried after {gap:?}");
    // Delivered is the ledger's last word on the answer: nothing sends it
    // again after that, and the marker comes later still.
    rig.wait_for_delivered(1).await;
    rig.barrier().await;
    let sent = rig.kit.sent();
    assert_eq!(
        sent.len(),
        2,
        "the answer arrived once, then the marker: {sent:?}"
    );
    assert_eq!(sent[0].text, "worth the wait");
    assert_eq!(rig.kit.send_attempts().len(), 3);
    rig.wait_for_delivered(2).await;
}

/// A stranger is ignored in a DM and in a shared chat, even with the
/// global allow-all flag once an allowlist exists: no answer, no pairing
/// offer, no turn. The friend is still answered.
pub async fn unauthorized<K: AdapterKit>() {
    let rig = Rig::<K>::started(&[("GATEWAY_ALLOW_ALL_USERS", "true")], |_| {}).await;
    rig.kit.push_dm(Who::Stranger, "let me in");
    rig.kit.push_stranger_in_group("hello");
    if rig.kit.reactions().is_some() {
        // Only platforms that acknowledge show reactions here, so once
        // both messages are handed over a reaction put on receipt is on
        // (one put by a turn would come with the turn, which the barrier
        // below rules out).
        rig.kit.wait_handed_over().await;
        assert_eq!(
            rig.kit.reactions(),
            Some(0),
            "no working indicator for a stranger"
        );
    }
    rig.barrier().await;
    let sent = rig.kit.sent();
    assert_eq!(sent.len(), 1, "no answer, no pairing offer: {sent:?}");
    assert_eq!(sent[0].chat, rig.kit.dm_chat(Who::Friend));
    assert_eq!(rig.llm.requests().len(), 1, "only the marker's turn");

    rig.llm.push(Reply::text("Welcome back."));
    rig.kit.push_dm(Who::Friend, "it's me");
    let sent = rig.sent(2).await;
    assert_eq!(sent[1].text, "Welcome back.");
    assert_eq!(sent[1].chat, rig.kit.dm_chat(Who::Friend));
    assert_eq!(rig.llm.requests().len(), 2);
}

/// Every scenario is run or skipped, never both or neither, and a skip
/// the capabilities can speak to agrees with them.
pub async fn check_declaration<K: AdapterKit>(run: &[&str], skipped: &[(&str, Skip)]) {
    const ALL: &[&str] = &[
        "dm_turn",
        "group_mention",
        "thread_reply",
        "long_answer_split",
        "redelivery",
        "dropped_connection",
        "rate_limit",
        "unauthorized",
        "media_in",
        "media_out",
    ];
    for name in ALL {
        let ran = run.contains(name);
        let skip = skipped.iter().any(|(s, _)| s == name);
        assert!(
            ran != skip,
            "{}: {name} must be run or skipped, once",
            K::NAME
        );
    }
    let rig = Rig::<K>::new(&[], |_| {}).await;
    let caps = rig.capabilities();
    assert_eq!(
        skipped.iter().any(|(_, why)| *why == Skip::Threadless),
        !caps.threads,
        "{}: a thread scenario is skipped exactly when the adapter has no threads",
        K::NAME
    );
    assert_eq!(
        skipped.iter().any(|(_, why)| *why == Skip::ReceivesNoFiles),
        caps.receives.is_empty(),
        "{}: media_in is skipped exactly when the adapter receives no files",
        K::NAME
    );
    assert_eq!(
        skipped.iter().any(|(_, why)| *why == Skip::SendsNoFiles),
        caps.sends.is_empty(),
        "{}: media_out is skipped exactly when the adapter sends no files",
        K::NAME
    );
    assert_eq!(
        skipped.iter().any(|(_, why)| *why == Skip::NotAChat),
        !caps.chat,
        "{}: a scenario is skipped as not a chat exactly when the adapter is none",
        K::NAME
    );
}

/// A photo, a voice note and a PDF sent in a DM: each is fetched through
/// the platform's own download, and the model gets what it is for (an
/// image part for a model that sees, the transcript from the speech-to-
/// text server, the document's text).
pub async fn media_in<K: AdapterKit>() {
    use talaria_adapter::MediaKind;
    use talaria_testkit::openai_media::{FakeOpenAiMedia, MediaReply};
    let stt = FakeOpenAiMedia::start().await;
    let stt_url = stt.base_url();
    let rig = Rig::<K>::started(&[], |c| {
        c.model.vision = talaria_core::config::VisionMode::On;
        c.stt.provider = Some(talaria_core::config::SttProvider::Openai);
        c.stt.base_url = Some(stt_url);
        c.stt.api_key = Some(talaria_core::Secret::new("sk-stt-contract"));
    })
    .await;
    let receives = rig.capabilities().receives;
    let mut turn = 0;
    if receives.contains(&MediaKind::Image) {
        rig.llm.push(Reply::text("a photo, seen"));
        rig.kit
            .push_dm_file(Who::Friend, &media::photo(), "what is in it?");
        rig.wait_for_text("a photo, seen").await;
        let user = media::last_user(&rig, turn);
        assert!(
            media::image_part(&user).is_some(),
            "{}: no image part: {user}",
            K::NAME
        );
        turn += 1;
    }
    if receives.contains(&MediaKind::Voice) {
        stt.push(MediaReply::transcript("remind me to call mum"));
        rig.llm.push(Reply::text("a voice, heard"));
        rig.kit.push_dm_file(Who::Friend, &media::voice(), "");
        rig.wait_for_text("a voice, heard").await;
        let text = media::text_of(&media::last_user(&rig, turn));
        assert!(
            text.contains("remind me to call mum"),
            "{}: {text}",
            K::NAME
        );
        turn += 1;
    }
    if receives.contains(&MediaKind::Document) {
        rig.llm.push(Reply::text("a document, read"));
        rig.kit.push_dm_file(Who::Friend, &media::pdf_file(), "");
        rig.wait_for_text("a document, read").await;
        let text = media::text_of(&media::last_user(&rig, turn));
        assert!(
            text.contains("Quarterly revenue grew twelve percent"),
            "{}: {text}",
            K::NAME
        );
    }
}

/// An answer naming a file in a `MEDIA:` line delivers the text and then
/// the file, as the kind the platform shows it as.
pub async fn media_out<K: AdapterKit>() {
    use talaria_adapter::MediaKind;
    let rig = Rig::<K>::started(&[], |_| {}).await;
    let photo = media::photo();
    std::fs::write(rig.dir.path().join("chart.png"), &photo.bytes).unwrap();
    rig.llm
        .push(Reply::text("Here is the chart.\nMEDIA:chart.png"));
    rig.kit.push_dm(Who::Friend, "send the chart");
    rig.wait_for_text("Here is the chart.").await;
    let uploads = talaria_testkit::wait::wait_for("the chart uploaded", || async {
        let up = rig.kit.uploads();
        if up.is_empty() { Err(up) } else { Ok(up) }
    })
    .await;
    assert_eq!(uploads[0].bytes, photo.bytes, "{}", K::NAME);
    let sends = rig.capabilities().sends;
    let expected = if sends.contains(&MediaKind::Image) {
        MediaKind::Image
    } else {
        MediaKind::Document
    };
    assert_eq!(uploads[0].kind, expected, "{}", K::NAME);
    rig.wait_for_delivered(1).await;
}

/// The files and readings the media scenarios share.
pub mod media {
    use serde_json::Value;
    use talaria_adapter::MediaKind;
    use talaria_testkit::kit::KitFile;

    use crate::contract::{AdapterKit, Rig};

    /// A small PNG photo.
    pub fn photo() -> KitFile {
        let img =
            image::RgbImage::from_fn(64, 48, |x, y| image::Rgb([x as u8 * 3, y as u8 * 5, 90]));
        let mut out = std::io::Cursor::new(Vec::new());
        img.write_to(&mut out, image::ImageFormat::Png).unwrap();
        KitFile {
            kind: MediaKind::Image,
            name: Some("photo.png".into()),
            mime: "image/png".into(),
            bytes: out.into_inner(),
        }
    }

    /// The first page of an OGG/Opus voice note.
    pub fn voice() -> KitFile {
        let mut bytes = b"OggS\0\x02".to_vec();
        bytes.extend_from_slice(&[0u8; 20]);
        bytes.extend_from_slice(&[1, 19]);
        bytes.extend_from_slice(b"OpusHead\x01\x01\x38\x01\x80\xbb\0\0\0\0\0");
        bytes.extend_from_slice(&[0u8; 64]);
        KitFile {
            kind: MediaKind::Voice,
            name: None,
            mime: "audio/ogg".into(),
            bytes,
        }
    }

    /// A one-page PDF saying "Quarterly revenue grew twelve percent".
    pub fn pdf_file() -> KitFile {
        KitFile {
            kind: MediaKind::Document,
            name: Some("q3.pdf".into()),
            mime: "application/pdf".into(),
            bytes: pdf("Quarterly revenue grew twelve percent"),
        }
    }

    /// A one-page PDF whose text is `words` (offsets counted here).
    pub fn pdf(words: &str) -> Vec<u8> {
        let stream = format!("BT /F1 12 Tf 72 720 Td ({words}) Tj ET");
        let objects = [
            "<< /Type /Catalog /Pages 2 0 R >>".to_owned(),
            "<< /Type /Pages /Kids [3 0 R] /Count 1 >>".to_owned(),
            "<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents 4 0 R /Resources << /Font << /F1 5 0 R >> >> >>".to_owned(),
            format!("<< /Length {} >>\nstream\n{stream}\nendstream", stream.len()),
            "<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>".to_owned(),
        ];
        let mut out = b"%PDF-1.4\n".to_vec();
        let mut offsets = Vec::new();
        for (i, body) in objects.iter().enumerate() {
            offsets.push(out.len());
            out.extend_from_slice(format!("{} 0 obj\n{body}\nendobj\n", i + 1).as_bytes());
        }
        let xref = out.len();
        out.extend_from_slice(
            format!("xref\n0 {}\n0000000000 65535 f \n", objects.len() + 1).as_bytes(),
        );
        for o in offsets {
            out.extend_from_slice(format!("{o:010} 00000 n \n").as_bytes());
        }
        out.extend_from_slice(
            format!(
                "trailer\n<< /Size {} /Root 1 0 R >>\nstartxref\n{xref}\n%%EOF\n",
                objects.len() + 1
            )
            .as_bytes(),
        );
        out
    }

    /// The last user message of LLM request `i`.
    pub fn last_user<K: AdapterKit>(rig: &Rig<K>, i: usize) -> Value {
        rig.llm.requests()[i].body["messages"]
            .as_array()
            .unwrap()
            .iter()
            .rev()
            .find(|m| m["role"] == "user")
            .cloned()
            .unwrap()
    }

    /// The `image_url` part of a message, if any.
    pub fn image_part(message: &Value) -> Option<&Value> {
        message["content"]
            .as_array()?
            .iter()
            .find(|p| p["type"] == "image_url")
    }

    /// The text of a message's content, a string or its text parts.
    pub fn text_of(message: &Value) -> String {
        match &message["content"] {
            Value::String(s) => s.clone(),
            Value::Array(parts) => parts
                .iter()
                .filter_map(|p| p["text"].as_str())
                .collect::<Vec<_>>()
                .join("\n"),
            _ => String::new(),
        }
    }
}
