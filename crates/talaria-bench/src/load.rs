//! The closed-loop client: each simulated user sends a one-line message,
//! waits for the whole answer, and sends the next.
//!
//! Users hold conversations of [`TURNS_PER_CONVERSATION`] turns (one
//! session id each), then start a new one: history grows as it does in
//! real chats, but never without bound, so figures do not drift with the
//! length of the run.
//!
//! A target made [`Target::without_header`] is driven as plain OpenAI
//! clients drive it: no session header; every conversation opens with the
//! same word ([`OPENING`]), and each request carries the whole history so
//! far, the server's answers included.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use serde_json::{Value, json};

use crate::mock::TOOL_MARKER;

/// Turns in one conversation before a user starts a new session.
pub const TURNS_PER_CONVERSATION: u64 = 10;

/// What the header path's users say in every text turn.
const MESSAGE: &str = "Please note that the build passed.";

/// How every header-less conversation opens.
pub const OPENING: &str = "hello";

/// What a turn asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// A whole `chat.completion` answer.
    Text,
    /// A streamed answer (server-sent events).
    Stream,
    /// A whole answer after one tool call.
    Tool,
    /// A photo (a 2400×1600 JPEG as a `data:` URL) and a question, for a
    /// model that sees images: decoded, downscaled and re-encoded by the
    /// gateway before the model gets it.
    Image,
    /// A voice note (five seconds of 16 kHz WAV as `input_audio`),
    /// transcribed by the mock's speech-to-text endpoint.
    Voice,
}

/// The photo and the voice note the media turns send, made once.
struct MediaPayloads {
    image_data_url: String,
    wav_base64: String,
}

static MEDIA: std::sync::LazyLock<MediaPayloads> = std::sync::LazyLock::new(|| {
    use base64::Engine as _;
    let b64 = |bytes: &[u8]| base64::engine::general_purpose::STANDARD.encode(bytes);
    MediaPayloads {
        image_data_url: format!("data:image/jpeg;base64,{}", b64(&photo_jpeg())),
        wav_base64: b64(&voice_wav()),
    }
});

/// A photo-sized JPEG with detail everywhere (gradients and a fine
/// pattern), so decoding and downscaling it costs what a real photo does.
fn photo_jpeg() -> Vec<u8> {
    let (w, h) = (2400u32, 1600u32);
    let img = image::RgbImage::from_fn(w, h, |x, y| {
        let n = (x.wrapping_mul(2_654_435_761) ^ y.wrapping_mul(40_503)) >> 24;
        image::Rgb([
            ((x * 255 / w) as u8).wrapping_add(n as u8 / 8),
            ((y * 255 / h) as u8).wrapping_add(n as u8 / 8),
            (((x + y) % 256) as u8) ^ (n as u8 / 4),
        ])
    });
    let mut out = Vec::new();
    let encoder = image::codecs::jpeg::JpegEncoder::new_with_quality(&mut out, 90);
    // Encoding our own buffer cannot fail.
    let _ = img.write_with_encoder(encoder);
    out
}

/// Five seconds of a 440 Hz tone as 16 kHz, 16-bit mono WAV.
fn voice_wav() -> Vec<u8> {
    let rate = 16_000u32;
    let samples: Vec<i16> = (0..rate * 5)
        .map(|i| ((i as f32 * 440.0 * std::f32::consts::TAU / rate as f32).sin() * 8000.0) as i16)
        .collect();
    let data_len = (samples.len() * 2) as u32;
    let mut out = Vec::with_capacity(44 + data_len as usize);
    out.extend_from_slice(b"RIFF");
    out.extend_from_slice(&(36 + data_len).to_le_bytes());
    out.extend_from_slice(b"WAVEfmt ");
    out.extend_from_slice(&16u32.to_le_bytes());
    out.extend_from_slice(&1u16.to_le_bytes());
    out.extend_from_slice(&1u16.to_le_bytes());
    out.extend_from_slice(&rate.to_le_bytes());
    out.extend_from_slice(&(rate * 2).to_le_bytes());
    out.extend_from_slice(&2u16.to_le_bytes());
    out.extend_from_slice(&16u16.to_le_bytes());
    out.extend_from_slice(b"data");
    out.extend_from_slice(&data_len.to_le_bytes());
    for s in samples {
        out.extend_from_slice(&s.to_le_bytes());
    }
    out
}

/// One finished turn.
#[derive(Debug, Clone, Copy)]
pub struct Turn {
    pub latency: Duration,
    /// Time to the first byte of the body (streamed turns).
    pub first_byte: Option<Duration>,
}

/// Where turns are sent: the gateway's API server or the mock itself.
#[derive(Clone)]
pub struct Target {
    http: reqwest::Client,
    url: String,
    key: Option<String>,
    /// For the mock alone: send the body a gateway would send (a system
    /// prompt and tools), not the client's one-liner.
    body_override: Option<Arc<Vec<u8>>>,
    /// No session header: the request's messages are the conversation.
    headerless: bool,
}

impl Target {
    /// The gateway's `/v1/chat/completions` at `base`.
    pub fn gateway(http: reqwest::Client, base: &str, key: &str) -> Target {
        Target {
            http,
            url: format!("{base}/v1/chat/completions"),
            key: Some(key.to_owned()),
            body_override: None,
            headerless: false,
        }
    }

    /// The same target driven without the session header, each request
    /// carrying its conversation's history.
    pub fn without_header(mut self) -> Target {
        self.headerless = true;
        self
    }

    /// The mock's own endpoint, sent `body` (a request as a gateway makes
    /// it) on every turn.
    pub fn mock(http: reqwest::Client, base_url: &str, body: Vec<u8>) -> Target {
        Target {
            http,
            url: format!("{base_url}/chat/completions"),
            key: None,
            body_override: Some(Arc::new(body)),
            headerless: false,
        }
    }

    /// Runs one turn in `session` and checks the answer.
    pub async fn turn(&self, session: &str, mode: Mode) -> anyhow::Result<Turn> {
        self.send(Some(session), None, mode)
            .await
            .map(|(turn, _)| turn)
    }

    /// One header-less turn: sends `history` (which ends with the new user
    /// message) and, on success, appends the answer to it.
    pub async fn turn_without_header(&self, history: &mut Vec<Value>) -> anyhow::Result<Turn> {
        let (turn, answer) = self
            .send(None, Some(history.as_slice()), Mode::Text)
            .await?;
        history.push(json!({"role": "assistant", "content": answer}));
        Ok(turn)
    }

    /// Sends one turn; returns it with the answer's text (whole answers).
    async fn send(
        &self,
        session: Option<&str>,
        history: Option<&[Value]>,
        mode: Mode,
    ) -> anyhow::Result<(Turn, String)> {
        let body = match &self.body_override {
            Some(b) => b.as_ref().clone(),
            // Serialized from the history in place: `json!` would copy
            // every resent message first, client work on the cores the
            // gateway is measured on.
            None if history.is_some() => serde_json::to_vec(&HistoryBody {
                model: "talaria",
                messages: history.unwrap_or_default(),
            })?,
            None => {
                let content = match mode {
                    Mode::Tool => {
                        json!(format!("Please note that the build passed. {TOOL_MARKER}"))
                    }
                    Mode::Image => json!([
                        {"type": "text", "text": "What is in this photo?"},
                        {"type": "image_url", "image_url": {"url": MEDIA.image_data_url}},
                    ]),
                    Mode::Voice => json!([
                        {"type": "input_audio", "input_audio": {"data": MEDIA.wav_base64, "format": "wav"}},
                    ]),
                    Mode::Text | Mode::Stream => json!(MESSAGE),
                };
                serde_json::to_vec(&json!({
                    "model": "talaria",
                    "messages": [{"role": "user", "content": content}],
                    "stream": mode == Mode::Stream,
                }))?
            }
        };
        let mut request = self
            .http
            .post(&self.url)
            .header("content-type", "application/json")
            .body(body);
        if let Some(session) = session {
            request = request.header("x-talaria-session-id", session);
        }
        if let Some(key) = &self.key {
            request = request.bearer_auth(key);
        }
        let started = Instant::now();
        let mut response = request.send().await.context("request failed")?;
        let status = response.status();
        let mut first_byte = None;
        let mut body = Vec::new();
        while let Some(chunk) = response.chunk().await.context("body failed")? {
            first_byte.get_or_insert_with(|| started.elapsed());
            body.extend_from_slice(&chunk);
        }
        let latency = started.elapsed();
        if !status.is_success() {
            bail!("HTTP {status}: {}", String::from_utf8_lossy(&body));
        }
        // The gateway streams from the model, so a replayed gateway request
        // gets a stream from the mock whatever the mode.
        let answer = check_answer(&body, body.starts_with(b"data:"))?;
        Ok((
            Turn {
                latency,
                first_byte,
            },
            answer,
        ))
    }
}

/// A header-less request: the history as the client resends it.
#[derive(serde::Serialize)]
struct HistoryBody<'a> {
    model: &'a str,
    messages: &'a [Value],
}

/// The answer must carry the mock's text; a 200 with an error inside does
/// not count as a turn. Returns the text of a whole answer (empty for a
/// stream, which is not read further).
fn check_answer(body: &[u8], streamed: bool) -> anyhow::Result<String> {
    let text = String::from_utf8_lossy(body);
    if streamed {
        if !text.contains("[DONE]") {
            bail!("the stream ended without [DONE]");
        }
        return Ok(String::new());
    }
    let v: Value = serde_json::from_slice(body).context("the answer is not JSON")?;
    match v["choices"][0]["message"]["content"].as_str() {
        Some(t) if !t.is_empty() => Ok(t.to_owned()),
        _ => bail!(
            "the answer has no text: {}",
            text.chars().take(300).collect::<String>()
        ),
    }
}

/// The session id for user `user`'s `turn`-th turn in a run tagged `tag`.
fn session_for(tag: &str, user: usize, turn: u64) -> String {
    format!("bench-{tag}-u{user}-c{}", turn / TURNS_PER_CONVERSATION)
}

/// What user `user` says next in a header-less run after `history`: the
/// same opening for everyone, then words of their own. As long as the
/// header path's message on average over a conversation, so both loads
/// store as much text per turn and differ only in how a turn finds its
/// session.
fn next_message(history: &[Value], user: usize, turn: u64) -> String {
    if history.is_empty() {
        return OPENING.to_owned();
    }
    format!("Please note that build {user}.{turn} passed.")
}

/// `n` turns one after another.
pub async fn sequential(
    target: &Target,
    tag: &str,
    n: u64,
    mode: Mode,
) -> anyhow::Result<Vec<Turn>> {
    let mut turns = Vec::with_capacity(n as usize);
    for i in 0..n {
        turns.push(target.turn(&session_for(tag, 0, i), mode).await?);
    }
    Ok(turns)
}

/// What a concurrent run measured.
#[derive(Debug, Clone)]
pub struct LoadResult {
    pub concurrency: usize,
    pub turns: Vec<Turn>,
    pub errors: u64,
    /// The first error seen, to say why.
    pub first_error: Option<String>,
    pub elapsed: Duration,
}

impl LoadResult {
    pub fn throughput(&self) -> f64 {
        self.turns.len() as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }
}

/// How a concurrent run ends.
#[derive(Debug, Clone, Copy)]
pub enum Stop {
    /// After this long.
    After(Duration),
    /// After this many turns in all.
    Turns(u64),
}

/// `users` closed-loop users until `stop`.
pub async fn concurrent(
    target: &Target,
    tag: &str,
    users: usize,
    mode: Mode,
    stop: Stop,
) -> LoadResult {
    let done = Arc::new(AtomicBool::new(false));
    let started_turns = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let mut tasks = Vec::with_capacity(users);
    for user in 0..users {
        let (target, tag, done, count) = (
            target.clone(),
            tag.to_owned(),
            done.clone(),
            started_turns.clone(),
        );
        tasks.push(tokio::spawn(async move {
            let mut turns = Vec::new();
            let mut errors = 0u64;
            let mut first_error = None;
            let mut i = 0u64;
            let mut history: Vec<Value> = Vec::new();
            loop {
                let over = match stop {
                    Stop::After(d) => started.elapsed() >= d,
                    Stop::Turns(n) => count.fetch_add(1, Ordering::Relaxed) >= n,
                };
                if over || done.load(Ordering::Relaxed) {
                    break;
                }
                let result = if target.headerless {
                    if i.is_multiple_of(TURNS_PER_CONVERSATION) {
                        history.clear();
                    }
                    history
                        .push(json!({"role": "user", "content": next_message(&history, user, i)}));
                    let result = target.turn_without_header(&mut history).await;
                    if result.is_err() {
                        // A failed turn leaves no answer to resend: the
                        // next turn opens a new conversation.
                        history.clear();
                    }
                    result
                } else {
                    target.turn(&session_for(&tag, user, i), mode).await
                };
                match result {
                    Ok(t) => turns.push(t),
                    Err(e) => {
                        errors += 1;
                        first_error.get_or_insert_with(|| format!("{e:#}"));
                    }
                }
                i += 1;
            }
            (turns, errors, first_error)
        }));
    }
    let mut result = LoadResult {
        concurrency: users,
        turns: Vec::new(),
        errors: 0,
        first_error: None,
        elapsed: Duration::ZERO,
    };
    for task in tasks {
        match task.await {
            Ok((turns, errors, first)) => {
                result.turns.extend(turns);
                result.errors += errors;
                if result.first_error.is_none() {
                    result.first_error = first;
                }
            }
            Err(e) => {
                result.errors += 1;
                result.first_error.get_or_insert_with(|| e.to_string());
            }
        }
    }
    done.store(true, Ordering::Relaxed);
    result.elapsed = started.elapsed();
    result
}

/// The `q` quantile (0..=1) of `values`, by nearest rank.
pub fn quantile(values: &mut [Duration], q: f64) -> Duration {
    if values.is_empty() {
        return Duration::ZERO;
    }
    values.sort_unstable();
    let rank = ((q * values.len() as f64).ceil() as usize).clamp(1, values.len());
    values[rank - 1]
}

/// p50 and p99 of the turns' latencies.
pub fn latency_percentiles(turns: &[Turn]) -> (Duration, Duration) {
    let mut l: Vec<Duration> = turns.iter().map(|t| t.latency).collect();
    (quantile(&mut l, 0.50), quantile(&mut l, 0.99))
}

/// The median of `values` (the middle one; the lower middle for an even
/// count).
pub fn median(values: &[f64]) -> f64 {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    v.get(v.len().saturating_sub(1) / 2).copied().unwrap_or(0.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(v: u64) -> Duration {
        Duration::from_millis(v)
    }

    #[test]
    fn quantiles_are_nearest_rank() {
        let mut v: Vec<Duration> = (1..=100).rev().map(ms).collect();
        assert_eq!(quantile(&mut v, 0.5), ms(50));
        assert_eq!(quantile(&mut v, 0.99), ms(99));
        assert_eq!(quantile(&mut v, 1.0), ms(100));
        assert_eq!(quantile(&mut [], 0.5), Duration::ZERO);
        assert_eq!(quantile(&mut [ms(7)], 0.99), ms(7));
    }

    #[test]
    fn medians_pick_the_middle() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), 2.0);
        assert_eq!(median(&[]), 0.0);
    }

    #[test]
    fn conversations_rotate_every_ten_turns() {
        assert_eq!(session_for("t", 3, 0), session_for("t", 3, 9));
        assert_ne!(session_for("t", 3, 9), session_for("t", 3, 10));
        assert_ne!(session_for("t", 3, 0), session_for("t", 4, 0));
    }

    #[test]
    fn headerless_conversations_open_alike_then_diverge() {
        let said = [json!({"role": "user", "content": OPENING})];
        assert_eq!(next_message(&[], 0, 0), OPENING);
        assert_eq!(next_message(&[], 5, 10), OPENING);
        assert_ne!(next_message(&said, 0, 1), next_message(&said, 1, 1));
        assert_ne!(next_message(&said, 0, 1), next_message(&said, 0, 2));
        // A conversation of the 32nd user late in a run stores about as
        // much text as the header path's (within a tenth).
        let text: usize = (0..TURNS_PER_CONVERSATION)
            .map(|t| {
                let history = if t == 0 { &[][..] } else { &said[..] };
                next_message(history, 31, 990 + t).len()
            })
            .sum();
        let header = MESSAGE.len() * TURNS_PER_CONVERSATION as usize;
        assert!(
            text.abs_diff(header) * 10 <= header,
            "{text} against {header}"
        );
    }

    #[test]
    fn answers_without_text_are_errors() {
        assert_eq!(
            check_answer(br#"{"choices":[{"message":{"content":"hi"}}]}"#, false).ok(),
            Some("hi".to_owned())
        );
        assert!(check_answer(br#"{"error":{"message":"boom"}}"#, false).is_err());
        assert!(check_answer(b"data: {}\n\ndata: [DONE]\n\n", true).is_ok());
        assert!(check_answer(b"data: {}\n\n", true).is_err());
    }
}
