//! The OpenAI-compatible Chat Completions provider (OpenAI, OpenRouter,
//! llama.cpp, vLLM, Ollama, LM Studio, ...).

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};

use async_trait::async_trait;
use serde::{Serialize, Serializer};
use serde_json::Value;
use talaria_core::config::OpenRouterRouting;
use talaria_core::{Endpoint, Message, ProviderKind, Role, Secret, ToolCall, Usage};
use tokio_util::sync::CancellationToken;

use crate::http::{Http, HttpOptions, join_url, rejects_streaming};
use crate::media::{Attachments, DataUrl, ImagePart, MAX_IMAGE_BYTES, text_with_placeholders};
use crate::repair::repair_json;
use crate::sse::SseParser;
use crate::text_calls::{Scrubber, TextCalls};
use crate::{
    ChatRequest, ChatResponse, ErrorKind, EventSink, LlmError, Provider, StreamEvent, ToolSpec,
};

/// A Chat Completions endpoint.
pub struct OpenAiProvider {
    kind: ProviderKind,
    model: String,
    url: String,
    key: Option<Secret>,
    http: Http,
    /// Cleared for good once the server shows it cannot stream.
    stream: AtomicBool,
    /// Whether user rows' images go out as image parts (`model.vision`).
    sees_images: bool,
    /// The `cache_control` marker for content parts, when requests go to
    /// a Claude model through OpenRouter with caching on.
    cache_marker: Option<Value>,
}

/// Whether `model` on a provider of `kind` is a Claude model behind
/// OpenRouter, which takes Anthropic's `cache_control` breakpoints in
/// content parts and passes them on.
pub fn openrouter_claude(kind: ProviderKind, model: &str) -> bool {
    let model = model.to_ascii_lowercase();
    kind == ProviderKind::Openrouter
        && (model.starts_with("anthropic/") || model.contains("claude"))
}

impl OpenAiProvider {
    /// A provider for this endpoint (`base_url` is the `/v1` root).
    pub fn new(endpoint: &Endpoint, opts: HttpOptions) -> OpenAiProvider {
        let label = format!("{}:{}", endpoint.provider.as_str(), endpoint.model);
        let stream = opts.stream;
        let sees_images = crate::vision::sees_images(opts.vision, &endpoint.model);
        let cache_marker = (opts.prompt_caching.enabled
            && openrouter_claude(endpoint.provider, &endpoint.model))
        .then(|| crate::anthropic::cache_marker(opts.prompt_caching));
        OpenAiProvider {
            kind: endpoint.provider,
            model: endpoint.model.clone(),
            url: join_url(&endpoint.base_url, "/chat/completions"),
            key: endpoint.api_key.clone(),
            http: Http::new(label, endpoint.api_key.as_ref(), &endpoint.base_url, opts),
            stream: AtomicBool::new(stream),
            sees_images,
            cache_marker,
        }
    }

    /// Whether this provider sends images to its model.
    pub fn sees_images(&self) -> bool {
        self.sees_images
    }

    /// Whether requests currently ask for a streamed answer.
    pub fn is_streaming(&self) -> bool {
        self.stream.load(Ordering::Relaxed)
    }

    /// The JSON body sent for `req` without its images (every row as its
    /// text; see [`OpenAiProvider::request_body_with`]).
    pub fn request_body<'a>(&'a self, req: &'a ChatRequest, stream: bool) -> RequestBody<'a> {
        static NO_IMAGES: Attachments = Attachments::none();
        self.request_body_with(req, &NO_IMAGES, stream)
    }

    /// The JSON body sent for `req` with the images `images` holds for its
    /// user rows, borrowing from both: serializing it copies neither the
    /// transcript nor the tool schemas, which a turn would otherwise do once
    /// per model call, and writes each image's base64 straight into the
    /// body.
    pub fn request_body_with<'a>(
        &'a self,
        req: &'a ChatRequest,
        images: &'a Attachments,
        stream: bool,
    ) -> RequestBody<'a> {
        RequestBody {
            model: &self.model,
            messages: OpenAiMessages {
                messages: &req.messages,
                images,
                cache_marker: self.cache_marker.as_ref(),
            },
            tools: OpenAiTools(&req.tools),
            max_tokens: req.max_tokens.or(self.http.opts.default_max_tokens),
            temperature: req.temperature.or(self.http.opts.default_temperature),
            stream,
            stream_options: stream.then_some(StreamOptions {
                include_usage: true,
            }),
            // Only OpenRouter reads it; another server could refuse it.
            provider: match self.kind {
                ProviderKind::Openrouter => self.http.opts.openrouter.provider.as_ref(),
                _ => None,
            },
        }
    }

    async fn run(&self, req: &ChatRequest, sink: EventSink<'_>) -> Result<ChatResponse, LlmError> {
        let client = self.http.client()?;
        let mut stream = self.is_streaming();
        // Read once per request; the bytes live until the answer is in.
        let images = Attachments::load(&req.messages, self.sees_images, MAX_IMAGE_BYTES).await;
        let text_calls = TextCalls::new(self.http.opts.tool_call_parser, &req.tools);
        loop {
            let mut rb = client
                .post(&self.url)
                .json(&self.request_body_with(req, &images, stream));
            if let Some(k) = &self.key {
                rb = rb.bearer_auth(k.expose());
            }
            let resp = self.http.send(rb, stream).await?;
            if !resp.status().is_success() {
                let err = self.http.status_error(resp).await;
                if stream && rejects_streaming(&err) {
                    tracing::warn!(provider = %self.http.label, "server rejected streaming; using non-streaming requests from now on");
                    self.stream.store(false, Ordering::Relaxed);
                    stream = false;
                    continue;
                }
                return Err(err);
            }
            let (message, usage) = if is_event_stream(&resp) {
                self.read_stream(resp, sink, &text_calls).await?
            } else {
                if stream {
                    tracing::warn!(provider = %self.http.label, "server answered a streaming request with plain JSON; using non-streaming requests from now on");
                    self.stream.store(false, Ordering::Relaxed);
                }
                let v = self.http.json(resp).await?;
                parse_completion_with(&v, sink, &text_calls)
                    .map_err(|m| self.http.error(ErrorKind::FormatError, None, &m))?
            };
            return Ok(ChatResponse {
                message,
                usage,
                provider: self.kind.as_str().to_owned(),
                model: self.model.clone(),
            });
        }
    }

    /// An `{"error": ...}` object sent inside an otherwise successful stream.
    fn stream_error(&self, err: &Value) -> LlmError {
        let text = err
            .get("message")
            .and_then(Value::as_str)
            .unwrap_or("the server sent an error inside the stream");
        let status = err
            .get("code")
            .and_then(Value::as_u64)
            .and_then(|c| u16::try_from(c).ok());
        let kind = status.map_or(ErrorKind::ServerError, |s| {
            crate::classify::classify(s, text)
        });
        self.http.error(kind, status, text)
    }

    async fn read_stream(
        &self,
        resp: reqwest::Response,
        sink: EventSink<'_>,
        text_calls: &TextCalls,
    ) -> Result<(Message, Usage), LlmError> {
        let mut body = resp.bytes_stream();
        let mut parser = SseParser::new();
        let mut acc = ChunkAccumulator::with_text_calls(text_calls.clone());
        loop {
            let (events, end) = match self.http.next_chunk(&mut body).await? {
                Some(bytes) => (parser.push(&bytes), false),
                None => (parser.finish(), true),
            };
            for ev in events {
                if ev.data.trim() == "[DONE]" {
                    acc.done = true;
                    break;
                }
                let chunk: Value = match serde_json::from_str(&ev.data) {
                    Ok(v) => v,
                    Err(e) => {
                        tracing::debug!(provider = %self.http.label, "skipping an unparsable stream event: {e}");
                        continue;
                    }
                };
                if let Some(err) = chunk.get("error") {
                    return Err(self.stream_error(err));
                }
                acc.apply(&chunk, sink);
            }
            // Stop at [DONE] rather than waiting for the server to close.
            if end || acc.done {
                break;
            }
        }
        acc.into_response_with(sink)
            .map_err(|(kind, m)| self.http.error(kind, None, &m))
    }
}

fn is_event_stream(resp: &reqwest::Response) -> bool {
    resp.headers()
        .get(reqwest::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.to_ascii_lowercase().contains("text/event-stream"))
}

#[async_trait]
impl Provider for OpenAiProvider {
    fn describe(&self) -> String {
        self.http.label.clone()
    }

    fn model(&self) -> &str {
        &self.model
    }

    async fn chat(
        &self,
        request: &ChatRequest,
        sink: EventSink<'_>,
        cancel: &CancellationToken,
    ) -> Result<ChatResponse, LlmError> {
        // Dropping the request future closes the connection, which is what
        // stops a server from generating into the void.
        tokio::select! {
            biased;
            _ = cancel.cancelled() => Err(self.http.interrupted()),
            r = self.run(request, sink) => r,
        }
    }
}

/// A Chat Completions request body (see [`OpenAiProvider::request_body`]).
#[derive(Debug, Serialize)]
pub struct RequestBody<'a> {
    model: &'a str,
    messages: OpenAiMessages<'a>,
    #[serde(skip_serializing_if = "OpenAiTools::is_empty")]
    tools: OpenAiTools<'a>,
    #[serde(skip_serializing_if = "Option::is_none")]
    max_tokens: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    temperature: Option<f32>,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    stream: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    stream_options: Option<StreamOptions>,
    /// OpenRouter's provider routing (`model.openrouter.provider`).
    #[serde(skip_serializing_if = "Option::is_none")]
    provider: Option<&'a OpenRouterRouting>,
}

#[derive(Debug, Serialize)]
struct StreamOptions {
    include_usage: bool,
}

/// The transcript as Chat Completions messages, serialized in place.
#[derive(Debug)]
struct OpenAiMessages<'a> {
    messages: &'a [Message],
    images: &'a Attachments,
    /// Breakpoints to place (see [`cached_rows`]), when caching applies.
    cache_marker: Option<&'a Value>,
}

impl Serialize for OpenAiMessages<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let marked = match self.cache_marker {
            Some(_) => cached_rows(self.messages),
            None => Vec::new(),
        };
        s.collect_seq(self.messages.iter().enumerate().map(|(i, m)| {
            let plain = openai_message(m, self.images.row(i));
            match self.cache_marker {
                Some(marker) if marked.contains(&i) => with_breakpoint(plain, marker),
                _ => Row::Plain(plain),
            }
        }))
    }
}

/// A row as sent: as built, or rebuilt with a breakpoint in its content.
#[derive(Serialize)]
#[serde(untagged)]
enum Row<'a> {
    Plain(OpenAiMessage<'a>),
    Marked(Value),
}

/// The rows that get a breakpoint, as the Anthropic adapter places them
/// (the ancestor's `system_and_3`): the last system row and the newest
/// three others; four at most, Anthropic's limit.
fn cached_rows(messages: &[Message]) -> Vec<usize> {
    let mut rows: Vec<usize> = messages
        .iter()
        .rposition(|m| m.role == Role::System)
        .into_iter()
        .collect();
    rows.extend(
        messages
            .iter()
            .enumerate()
            .rev()
            .filter(|(_, m)| m.role != Role::System)
            .take(3)
            .map(|(i, _)| i),
    );
    rows
}

/// `row` with its content as parts and `marker` on the last part, the
/// form OpenRouter documents for Anthropic's `cache_control`. A row with
/// no content to mark (an assistant row that is only tool calls) goes
/// out unchanged.
fn with_breakpoint<'a>(row: OpenAiMessage<'a>, marker: &Value) -> Row<'a> {
    let Ok(mut v) = serde_json::to_value(&row) else {
        return Row::Plain(row);
    };
    let parts = match v.get_mut("content") {
        Some(Value::String(text)) if !text.is_empty() => {
            let text = std::mem::take(text);
            Some(vec![serde_json::json!({"type": "text", "text": text})])
        }
        Some(Value::Array(parts)) => Some(std::mem::take(parts)),
        _ => None,
    };
    let Some(mut parts) = parts else {
        return Row::Plain(row);
    };
    if let Some(Value::Object(last)) = parts.last_mut() {
        last.insert("cache_control".to_owned(), marker.clone());
    }
    v["content"] = Value::Array(parts);
    Row::Marked(v)
}

/// One message in the Chat Completions shape. Reasoning is not sent back:
/// most servers reject or ignore it.
#[derive(Serialize)]
#[serde(tag = "role", rename_all = "lowercase")]
enum OpenAiMessage<'a> {
    System {
        content: &'a str,
    },
    User {
        content: UserContent<'a>,
    },
    Assistant {
        /// `null` when the message is only tool calls.
        content: Option<&'a str>,
        #[serde(skip_serializing_if = "<[_]>::is_empty")]
        tool_calls: Vec<OpenAiToolCall<'a>>,
    },
    Tool {
        tool_call_id: &'a str,
        content: &'a str,
    },
}

/// A user row's content: a plain string, as every row without images is
/// sent, or text and image parts.
#[derive(Serialize)]
#[serde(untagged)]
enum UserContent<'a> {
    Text(Cow<'a, str>),
    Parts(Vec<UserPart<'a>>),
}

/// One content part of a user row.
#[derive(Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum UserPart<'a> {
    Text { text: Cow<'a, str> },
    ImageUrl { image_url: ImageUrl<'a> },
}

#[derive(Serialize)]
struct ImageUrl<'a> {
    url: DataUrl<'a>,
}

/// A user row's content with the row's images (`parts`): the text first,
/// then an `image_url` part per image sent; placeholders join the text.
fn user_content<'a>(content: &'a str, parts: &'a [ImagePart]) -> UserContent<'a> {
    let text = text_with_placeholders(content, parts);
    let images: Vec<UserPart<'a>> = parts
        .iter()
        .filter_map(|p| match p {
            ImagePart::Image { mime, bytes } => Some(UserPart::ImageUrl {
                image_url: ImageUrl {
                    url: DataUrl { mime, bytes },
                },
            }),
            ImagePart::Placeholder(_) => None,
        })
        .collect();
    if images.is_empty() {
        return UserContent::Text(text);
    }
    let mut all = Vec::with_capacity(images.len() + 1);
    // Some servers refuse an empty text part; a photo alone needs none.
    if !text.is_empty() {
        all.push(UserPart::Text { text });
    }
    all.extend(images);
    UserContent::Parts(all)
}

/// One transcript row in the Chat Completions shape, with the images of a
/// user row (`parts`, empty for the others).
fn openai_message<'a>(m: &'a Message, parts: &'a [ImagePart]) -> OpenAiMessage<'a> {
    let content = m.content.as_str();
    match m.role {
        Role::System => OpenAiMessage::System { content },
        Role::User => OpenAiMessage::User {
            content: user_content(content, parts),
        },
        Role::Assistant => OpenAiMessage::Assistant {
            content: (!(m.has_tool_calls() && content.is_empty())).then_some(content),
            tool_calls: m
                .tool_calls
                .iter()
                .map(|c| OpenAiToolCall {
                    id: &c.id,
                    kind: "function",
                    function: OpenAiFunctionCall {
                        name: &c.name,
                        arguments: &c.arguments,
                    },
                })
                .collect(),
        },
        Role::Tool => OpenAiMessage::Tool {
            tool_call_id: m.tool_call_id.as_deref().unwrap_or_default(),
            content,
        },
    }
}

#[derive(Serialize)]
struct OpenAiToolCall<'a> {
    id: &'a str,
    #[serde(rename = "type")]
    kind: &'static str,
    function: OpenAiFunctionCall<'a>,
}

#[derive(Serialize)]
struct OpenAiFunctionCall<'a> {
    name: &'a str,
    arguments: &'a str,
}

/// The offered tools, serialized in place.
#[derive(Debug)]
struct OpenAiTools<'a>(&'a [ToolSpec]);

impl OpenAiTools<'_> {
    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl Serialize for OpenAiTools<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        #[derive(Serialize)]
        struct Tool<'a> {
            #[serde(rename = "type")]
            kind: &'static str,
            function: Function<'a>,
        }
        #[derive(Serialize)]
        struct Function<'a> {
            name: &'a str,
            description: &'a str,
            parameters: &'a Value,
        }
        s.collect_seq(self.0.iter().map(|t| Tool {
            kind: "function",
            function: Function {
                name: &t.name,
                description: &t.description,
                parameters: &t.parameters,
            },
        }))
    }
}

/// Converts the transcript to Chat Completions messages, as values, each
/// row as its text (images are read only for a request).
pub fn to_openai_messages(messages: &[Message]) -> Vec<Value> {
    messages
        .iter()
        .map(|m| serde_json::to_value(openai_message(m, &[])).unwrap_or(Value::Null))
        .collect()
}

/// Token usage from an OpenAI `usage` object.
pub fn parse_usage(u: &Value) -> Usage {
    let n = |p: &str| u.pointer(p).and_then(Value::as_u64).unwrap_or(0);
    let prompt = n("/prompt_tokens");
    let cached = n("/prompt_tokens_details/cached_tokens");
    let cache_write = n("/prompt_tokens_details/cache_write_tokens");
    Usage {
        input_tokens: prompt.saturating_sub(cached).saturating_sub(cache_write),
        output_tokens: n("/completion_tokens"),
        cache_read_tokens: cached,
        cache_write_tokens: cache_write,
        reasoning_tokens: n("/completion_tokens_details/reasoning_tokens"),
    }
}

fn id_text(v: Option<&Value>) -> Option<String> {
    match v? {
        Value::String(s) if !s.is_empty() => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        _ => None,
    }
}

/// Text from a `content` that is a string or (some servers) a list of parts.
fn content_text(v: Option<&Value>) -> String {
    match v {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(parts)) => parts
            .iter()
            .filter_map(|p| p.get("text").and_then(Value::as_str))
            .collect(),
        _ => String::new(),
    }
}

/// Final argument text: empty becomes `{}`, broken JSON is lightly repaired,
/// hopeless JSON is kept raw so the agent can show the model its mistake.
fn finish_arguments(raw: String) -> (String, bool) {
    if raw.trim().is_empty() {
        return ("{}".to_owned(), true);
    }
    match repair_json(&raw) {
        Some(fixed) => (fixed, true),
        None => (raw, false),
    }
}

/// Parses a non-streaming completion, reporting its parts to `sink` so
/// consumers see the same events in both modes. Text tool calls are left
/// as text (see [`parse_completion_with`]).
pub fn parse_completion(v: &Value, sink: EventSink<'_>) -> Result<(Message, Usage), String> {
    parse_completion_with(v, sink, &TextCalls::off())
}

/// [`parse_completion`], turning tool calls written in the answer text into
/// real calls as `text_calls` allows when the response has no native ones.
pub fn parse_completion_with(
    v: &Value,
    sink: EventSink<'_>,
    text_calls: &TextCalls,
) -> Result<(Message, Usage), String> {
    let choice = v.pointer("/choices/0").ok_or_else(|| {
        format!(
            "the response has no choices: {}",
            crate::http::truncate(&v.to_string(), 300)
        )
    })?;
    let msg = choice.get("message").cloned().unwrap_or(Value::Null);
    let mut content = content_text(msg.get("content"));
    let reasoning = msg
        .get("reasoning_content")
        .or_else(|| msg.get("reasoning"))
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned();
    let mut finish_reason = choice
        .get("finish_reason")
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
        .map(str::to_owned);
    let mut calls = Vec::new();
    for (i, c) in msg
        .get("tool_calls")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .enumerate()
    {
        let name = c
            .pointer("/function/name")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned();
        let raw = match c.pointer("/function/arguments") {
            Some(Value::String(s)) => s.clone(),
            Some(Value::Null) | None => String::new(),
            Some(other) => other.to_string(),
        };
        calls.push(ToolCall {
            id: id_text(c.get("id")).unwrap_or_else(|| format!("call_{i}")),
            name,
            arguments: finish_arguments(raw).0,
        });
    }
    if calls.is_empty()
        && let Some(found) = text_calls.extract(&content)
    {
        content = found.content;
        calls = found.calls;
        finish_reason = Some("tool_calls".to_owned());
    }
    if !reasoning.is_empty() {
        sink(StreamEvent::Reasoning(reasoning.clone()));
    }
    if !content.is_empty() {
        sink(StreamEvent::Text(content.clone()));
    }
    for c in &calls {
        sink(StreamEvent::ToolCallStarted {
            name: c.name.clone(),
        });
    }
    let mut message = Message::assistant_tool_calls(content, calls);
    message.reasoning = (!reasoning.is_empty()).then_some(reasoning);
    message.finish_reason = finish_reason;
    let usage = v.get("usage").map(parse_usage).unwrap_or_default();
    Ok((message, usage))
}

#[derive(Debug, Default)]
struct Slot {
    id: String,
    name: String,
    arguments: String,
}

/// Assembles streamed `chat.completion.chunk`s into one message, following
/// the quirks real servers exhibit (see the module tests).
#[derive(Debug, Default)]
pub struct ChunkAccumulator {
    content: String,
    reasoning: String,
    slots: BTreeMap<usize, Slot>,
    /// Raw `index` → slot; a raw index is remapped when a server reuses it
    /// for a different call.
    by_raw: HashMap<i64, usize>,
    finish_reason: Option<String>,
    usage: Option<Usage>,
    /// `data: [DONE]` arrived.
    pub done: bool,
    /// Which tool calls written as text become real calls.
    text_calls: TextCalls,
    /// Holds back answer text that may be such a call.
    scrubber: Scrubber,
}

impl ChunkAccumulator {
    /// An empty accumulator.
    pub fn new() -> ChunkAccumulator {
        ChunkAccumulator::default()
    }

    /// An empty accumulator that turns tool calls written in the answer
    /// text into real calls as `text_calls` allows, and never forwards the
    /// text of such a call to the sink.
    pub fn with_text_calls(text_calls: TextCalls) -> ChunkAccumulator {
        ChunkAccumulator {
            scrubber: text_calls.scrubber(),
            text_calls,
            ..ChunkAccumulator::default()
        }
    }

    /// Applies one chunk, forwarding visible progress to `sink`.
    pub fn apply(&mut self, chunk: &Value, sink: EventSink<'_>) {
        if let Some(u) = chunk.get("usage").filter(|u| u.is_object()) {
            self.usage = Some(parse_usage(u));
        }
        let Some(choices) = chunk.get("choices").and_then(Value::as_array) else {
            return;
        };
        for choice in choices {
            if let Some(f) = choice.get("finish_reason").and_then(Value::as_str)
                && !f.is_empty()
            {
                self.finish_reason = Some(f.to_owned());
            }
            let Some(delta) = choice.get("delta") else {
                continue;
            };
            for key in ["reasoning_content", "reasoning"] {
                if let Some(r) = delta.get(key).and_then(Value::as_str)
                    && !r.is_empty()
                {
                    self.reasoning.push_str(r);
                    sink(StreamEvent::Reasoning(r.to_owned()));
                    break;
                }
            }
            let text = content_text(delta.get("content"));
            if !text.is_empty() {
                self.content.push_str(&text);
                let shown = self.scrubber.advance(&self.content);
                if !shown.is_empty() {
                    sink(StreamEvent::Text(shown.to_owned()));
                }
            }
            for tc in delta
                .get("tool_calls")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                self.apply_tool_delta(tc, sink);
            }
        }
    }

    fn apply_tool_delta(&mut self, tc: &Value, sink: EventSink<'_>) {
        let raw = tc.get("index").and_then(Value::as_i64).unwrap_or(0);
        let id = id_text(tc.get("id"));
        let next_free =
            |slots: &BTreeMap<usize, Slot>| slots.keys().next_back().map_or(0, |k| k + 1);
        let slot = match self.by_raw.get(&raw).copied() {
            // Ollama reuses index 0 for every call; a new id means a new call.
            Some(s)
                if id.as_ref().is_some_and(|new| {
                    self.slots
                        .get(&s)
                        .is_some_and(|old| !old.id.is_empty() && &old.id != new)
                }) =>
            {
                let s = next_free(&self.slots);
                self.by_raw.insert(raw, s);
                s
            }
            Some(s) => s,
            None => {
                let s = usize::try_from(raw)
                    .ok()
                    .filter(|s| !self.slots.contains_key(s))
                    .unwrap_or_else(|| next_free(&self.slots));
                self.by_raw.insert(raw, s);
                s
            }
        };
        let entry = self.slots.entry(slot).or_default();
        if let Some(id) = id {
            entry.id = id;
        }
        let f = tc.get("function");
        if let Some(name) = f.and_then(|f| f.get("name")).and_then(Value::as_str)
            && !name.is_empty()
        {
            let first = entry.name.is_empty();
            // Assigned, not appended: some servers resend the whole name.
            entry.name = name.to_owned();
            if first {
                sink(StreamEvent::ToolCallStarted {
                    name: name.to_owned(),
                });
            }
        }
        match f.and_then(|f| f.get("arguments")) {
            Some(Value::String(s)) => entry.arguments.push_str(s),
            Some(Value::Null) | None => {}
            Some(other) => entry.arguments.push_str(&other.to_string()),
        }
    }

    /// Whether nothing at all arrived (no text, reasoning, calls or finish).
    pub fn is_empty(&self) -> bool {
        self.content.is_empty()
            && self.reasoning.is_empty()
            && self.slots.is_empty()
            && self.finish_reason.is_none()
    }

    /// The assembled message and usage, or why the stream is unusable.
    pub fn into_response(self) -> Result<(Message, Usage), (ErrorKind, String)> {
        self.into_response_with(&|_| {})
    }

    /// [`ChunkAccumulator::into_response`], telling `sink` the answer text
    /// held back while it might have been a tool call, and the calls found
    /// in it.
    pub fn into_response_with(
        mut self,
        sink: EventSink<'_>,
    ) -> Result<(Message, Usage), (ErrorKind, String)> {
        if self.is_empty() {
            return Err((
                ErrorKind::ServerError,
                "the stream ended without any content".to_owned(),
            ));
        }
        let mut calls = Vec::new();
        let mut broken = Vec::new();
        for (slot, s) in self.slots {
            let (arguments, ok) = finish_arguments(s.arguments);
            if !ok {
                broken.push(s.name.clone());
            }
            calls.push(ToolCall {
                id: if s.id.is_empty() {
                    format!("call_{slot}")
                } else {
                    s.id
                },
                name: s.name,
                arguments,
            });
        }
        if !broken.is_empty() && self.finish_reason.is_none() && !self.done {
            // Unfinished arguments and no end marker: the connection dropped
            // mid-call, so asking again is the right move, not running a
            // truncated command.
            return Err((
                ErrorKind::Network,
                format!(
                    "the stream dropped while writing tool call(s): {}",
                    broken.join(", ")
                ),
            ));
        }
        // Text calls count only when the server sent no native ones.
        let found = if calls.is_empty() {
            self.text_calls.extract(&self.content)
        } else {
            None
        };
        let held = self
            .scrubber
            .finish(&self.content, found.as_ref().map(|f| f.content.as_str()));
        if !held.is_empty() {
            sink(StreamEvent::Text(held));
        }
        let mut content = self.content;
        if let Some(found) = found {
            for c in &found.calls {
                sink(StreamEvent::ToolCallStarted {
                    name: c.name.clone(),
                });
            }
            content = found.content;
            calls = found.calls;
            self.finish_reason = Some("tool_calls".to_owned());
        }
        let mut message = Message::assistant_tool_calls(content, calls);
        message.reasoning = (!self.reasoning.is_empty()).then_some(self.reasoning);
        message.finish_reason = self.finish_reason;
        Ok((message, self.usage.unwrap_or_default()))
    }
}

#[cfg(test)]
mod tests;
