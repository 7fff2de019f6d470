//! The Anthropic Messages API provider.

use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};

use async_trait::async_trait;
use serde_json::{Value, json};
use talaria_core::config::{CacheTtl, PromptCachingConfig};
use talaria_core::{Endpoint, Message, ProviderKind, Role, Secret, ThinkingBlock, ToolCall, Usage};
use tokio_util::sync::CancellationToken;

use crate::classify::classify_anthropic_error_type;
use crate::http::{Http, HttpOptions, join_url, rejects_streaming};
use crate::media::{Attachments, ImagePart, text_with_placeholders};
use crate::repair::repair_json;
use crate::sse::SseParser;
use crate::{ChatRequest, ChatResponse, ErrorKind, EventSink, LlmError, Provider, StreamEvent};

/// The API version this adapter speaks.
pub const ANTHROPIC_VERSION: &str = "2023-06-01";
/// The largest image file sent, in bytes: the API refuses an image whose
/// base64 is over 5 MB, and base64 is four characters for three bytes.
pub const MAX_IMAGE_BYTES: u64 = 5_000_000 / 4 * 3;
/// `max_tokens` is mandatory on this API; used when nothing else sets it.
pub const DEFAULT_MAX_TOKENS: u32 = 4096;
/// The most `cache_control` breakpoints the API accepts in one request.
pub const MAX_CACHE_BREAKPOINTS: usize = 4;
/// How many of the newest messages get a breakpoint (the ancestor's
/// `system_and_3` layout: the system prompt, then these).
const CACHED_TAIL_MESSAGES: usize = 3;

/// A Messages API endpoint.
pub struct AnthropicProvider {
    kind: ProviderKind,
    model: String,
    url: String,
    key: Option<Secret>,
    http: Http,
    stream: AtomicBool,
    /// Whether user rows' images go out as image blocks (`model.vision`).
    sees_images: bool,
}

impl AnthropicProvider {
    /// A provider for this endpoint (`base_url` without `/v1`).
    pub fn new(endpoint: &Endpoint, opts: HttpOptions) -> AnthropicProvider {
        let label = format!("{}:{}", endpoint.provider.as_str(), endpoint.model);
        let stream = opts.stream;
        let base = &endpoint.base_url;
        let (head, query) = base.split_at(base.find(['?', '#']).unwrap_or(base.len()));
        let head = head.trim_end_matches('/');
        // Tolerate a base URL written with the version suffix.
        let head = head.strip_suffix("/v1").unwrap_or(head);
        let url = join_url(&format!("{head}{query}"), "/v1/messages");
        let sees_images = crate::vision::sees_images(opts.vision, &endpoint.model);
        AnthropicProvider {
            kind: endpoint.provider,
            model: endpoint.model.clone(),
            url,
            key: endpoint.api_key.clone(),
            http: Http::new(label, endpoint.api_key.as_ref(), &endpoint.base_url, opts),
            stream: AtomicBool::new(stream),
            sees_images,
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
    /// text; see [`AnthropicProvider::request_body_with`]).
    pub fn request_body(&self, req: &ChatRequest, stream: bool) -> Value {
        self.request_body_with(req, &Attachments::none(), stream)
    }

    /// The JSON body sent for `req`, with the images `images` holds for
    /// its user rows as image blocks.
    pub fn request_body_with(
        &self,
        req: &ChatRequest,
        images: &Attachments,
        stream: bool,
    ) -> Value {
        let (system, messages) = to_anthropic_messages_with(&req.messages, images);
        let max_tokens = req
            .max_tokens
            .or(self.http.opts.default_max_tokens)
            .unwrap_or(DEFAULT_MAX_TOKENS);
        let caching = self.http.opts.prompt_caching;
        let mut messages = messages;
        let mut tools: Vec<Value> = req
            .tools
            .iter()
            .map(|t| json!({"name": t.name, "description": t.description, "input_schema": t.parameters}))
            .collect();
        let mut system = system.map(|s| {
            if caching.enabled {
                // Only a block list can carry a breakpoint.
                json!([{"type": "text", "text": s}])
            } else {
                json!(s)
            }
        });
        if caching.enabled {
            place_cache_breakpoints(caching, &mut tools, system.as_mut(), &mut messages);
        }
        let mut body = json!({"model": self.model, "max_tokens": max_tokens, "messages": messages});
        if let Some(s) = system {
            body["system"] = s;
        }
        if !tools.is_empty() {
            body["tools"] = Value::Array(tools);
        }
        if let Some(t) = req.temperature.or(self.http.opts.default_temperature) {
            body["temperature"] = json!(t);
        }
        if stream {
            body["stream"] = json!(true);
        }
        body
    }

    async fn run(&self, req: &ChatRequest, sink: EventSink<'_>) -> Result<ChatResponse, LlmError> {
        let client = self.http.client()?;
        let mut stream = self.is_streaming();
        // Read once per request; the bytes live until the answer is in.
        let images = Attachments::load(&req.messages, self.sees_images, MAX_IMAGE_BYTES).await;
        loop {
            let mut rb = client
                .post(&self.url)
                .header("anthropic-version", ANTHROPIC_VERSION)
                .json(&self.request_body_with(req, &images, stream));
            if let Some(k) = &self.key {
                rb = rb.header("x-api-key", k.expose());
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
            let event_stream = resp
                .headers()
                .get(reqwest::header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .is_some_and(|v| v.to_ascii_lowercase().contains("text/event-stream"));
            let acc = if event_stream {
                self.read_stream(resp, sink).await?
            } else {
                if stream {
                    tracing::warn!(provider = %self.http.label, "server answered a streaming request with plain JSON; using non-streaming requests from now on");
                    self.stream.store(false, Ordering::Relaxed);
                }
                let v = self.http.json(resp).await?;
                if v.get("type").and_then(Value::as_str) == Some("error") {
                    return Err(self.event_error(&v));
                }
                Accumulator::from_message(&v, sink)
            };
            let (message, usage) = acc
                .into_response()
                .map_err(|(kind, m)| self.http.error(kind, None, &m))?;
            return Ok(ChatResponse {
                message,
                usage,
                provider: self.kind.as_str().to_owned(),
                model: self.model.clone(),
            });
        }
    }

    fn event_error(&self, v: &Value) -> LlmError {
        let kind = v
            .pointer("/error/type")
            .and_then(Value::as_str)
            .unwrap_or("");
        let msg = v
            .pointer("/error/message")
            .and_then(Value::as_str)
            .unwrap_or("the server reported an error");
        self.http.error(
            classify_anthropic_error_type(kind, msg),
            None,
            &format!("{msg} ({kind})"),
        )
    }

    async fn read_stream(
        &self,
        resp: reqwest::Response,
        sink: EventSink<'_>,
    ) -> Result<Accumulator, LlmError> {
        let mut body = resp.bytes_stream();
        let mut parser = SseParser::new();
        let mut acc = Accumulator::default();
        loop {
            let (events, end) = match self.http.next_chunk(&mut body).await? {
                Some(bytes) => (parser.push(&bytes), false),
                None => (parser.finish(), true),
            };
            for ev in events {
                let v: Value = match serde_json::from_str(&ev.data) {
                    Ok(v) => v,
                    Err(e) => {
                        tracing::debug!(provider = %self.http.label, "skipping an unparsable stream event: {e}");
                        continue;
                    }
                };
                let kind = v
                    .get("type")
                    .and_then(Value::as_str)
                    .map(str::to_owned)
                    .or(ev.event)
                    .unwrap_or_default();
                if kind == "error" {
                    return Err(self.event_error(&v));
                }
                acc.apply(&kind, &v, sink);
            }
            if end || acc.done {
                break;
            }
        }
        Ok(acc)
    }
}

#[async_trait]
impl Provider for AnthropicProvider {
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
        tokio::select! {
            biased;
            _ = cancel.cancelled() => Err(self.http.interrupted()),
            r = self.run(request, sink) => r,
        }
    }
}

/// Tool arguments as a JSON object; anything else becomes `{}` because the
/// API only accepts an object as `input`.
fn input_object(arguments: &str) -> Value {
    match repair_json(arguments).and_then(|s| serde_json::from_str::<Value>(&s).ok()) {
        Some(v @ Value::Object(_)) => v,
        _ => json!({}),
    }
}

/// The `cache_control` marker for `caching`'s lifetime. The five-minute
/// default is sent without `ttl`, the form every API version accepts.
pub fn cache_marker(caching: PromptCachingConfig) -> Value {
    match caching.ttl {
        CacheTtl::FiveMinutes => json!({"type": "ephemeral"}),
        CacheTtl::OneHour => json!({"type": "ephemeral", "ttl": "1h"}),
    }
}

/// Marks prompt-cache breakpoints, at most [`MAX_CACHE_BREAKPOINTS`]:
/// one at the end of the system prompt, and one on the last block of each
/// of the newest three messages.
///
/// The API builds its prefix in the order tools, system, messages, so the
/// system breakpoint caches the tool definitions too; only when there is
/// no system prompt does the last tool carry that breakpoint instead. The
/// tail breakpoints move forward as the conversation grows; the API looks
/// back from each for the longest prefix it already holds, so the
/// previous request's entries are still read.
pub fn place_cache_breakpoints(
    caching: PromptCachingConfig,
    tools: &mut [Value],
    system: Option<&mut Value>,
    messages: &mut [Value],
) {
    let marker = cache_marker(caching);
    let mut placed = 0;
    let head = match system.and_then(Value::as_array_mut) {
        Some(blocks) => blocks.last_mut(),
        None => tools.last_mut(),
    };
    if let Some(block) = head.and_then(Value::as_object_mut) {
        block.insert("cache_control".to_owned(), marker.clone());
        placed += 1;
    }
    let tail = messages.len().saturating_sub(CACHED_TAIL_MESSAGES);
    for message in &mut messages[tail..] {
        if placed >= MAX_CACHE_BREAKPOINTS {
            break;
        }
        let Some(blocks) = message.get_mut("content").and_then(Value::as_array_mut) else {
            continue;
        };
        // Reasoning blocks cannot carry a breakpoint (the API refuses
        // it); the last other block closes the same prefix or a longer one.
        let target = blocks
            .iter_mut()
            .rev()
            .find(|b| !is_thinking(b))
            .and_then(Value::as_object_mut);
        if let Some(block) = target {
            block.insert("cache_control".to_owned(), marker.clone());
            placed += 1;
        }
    }
}

/// Whether `block` is a reasoning block (signed or redacted).
fn is_thinking(block: &Value) -> bool {
    matches!(
        block.get("type").and_then(Value::as_str),
        Some("thinking" | "redacted_thinking")
    )
}

/// Converts the transcript to the Messages API: the system text (joined)
/// and the alternating user/assistant list, each row as its text (images
/// are read only for a request; see [`to_anthropic_messages_with`]).
pub fn to_anthropic_messages(messages: &[Message]) -> (Option<String>, Vec<Value>) {
    to_anthropic_messages_with(messages, &Attachments::none())
}

/// [`to_anthropic_messages`] with the images `images` holds for the user
/// rows: an `image` block per image sent, before the row's text (the
/// order Anthropic recommends), and placeholders in the text.
pub fn to_anthropic_messages_with(
    messages: &[Message],
    images: &Attachments,
) -> (Option<String>, Vec<Value>) {
    let mut system: Vec<&str> = Vec::new();
    let mut rows: Vec<(&'static str, Vec<Value>)> = Vec::new();
    for (i, m) in messages.iter().enumerate() {
        let (role, blocks) = match m.role {
            Role::System => {
                if !m.content.is_empty() {
                    system.push(&m.content);
                }
                continue;
            }
            Role::User => ("user", user_blocks(&m.content, images.row(i))),
            Role::Assistant => {
                // Signed reasoning goes first and unchanged: the API checks
                // the signature of the turn it belongs to.
                let mut b: Vec<Value> = m
                    .thinking
                    .iter()
                    .filter_map(|t| serde_json::to_value(t).ok())
                    .collect();
                b.extend(text_blocks(&m.content));
                b.extend(m.tool_calls.iter().map(|c| {
                    json!({"type": "tool_use", "id": c.id, "name": c.name, "input": input_object(&c.arguments)})
                }));
                ("assistant", b)
            }
            Role::Tool => {
                let content = if m.content.is_empty() {
                    "(no output)"
                } else {
                    m.content.as_str()
                };
                let id = m.tool_call_id.clone().unwrap_or_default();
                (
                    "user",
                    vec![json!({"type": "tool_result", "tool_use_id": id, "content": content})],
                )
            }
        };
        rows.push((role, blocks));
    }
    // The API rejects a tool_use without its result and a result without its
    // call (both appear after compression cuts a transcript), so orphans go.
    let ids = |kind: &str, field: &str| -> HashSet<String> {
        rows.iter()
            .flat_map(|(_, b)| b.iter())
            .filter(|b| b.get("type").and_then(Value::as_str) == Some(kind))
            .filter_map(|b| b.get(field).and_then(Value::as_str).map(str::to_owned))
            .collect()
    };
    let uses = ids("tool_use", "id");
    let results = ids("tool_result", "tool_use_id");
    let mut out: Vec<(&'static str, Vec<Value>)> = Vec::new();
    for (role, blocks) in rows {
        let blocks: Vec<Value> = blocks
            .into_iter()
            .filter(|b| match b.get("type").and_then(Value::as_str) {
                Some("tool_use") => b
                    .get("id")
                    .and_then(Value::as_str)
                    .is_some_and(|i| results.contains(i)),
                Some("tool_result") => b
                    .get("tool_use_id")
                    .and_then(Value::as_str)
                    .is_some_and(|i| uses.contains(i)),
                _ => true,
            })
            .collect();
        // Reasoning alone is not a turn (its calls were dropped above).
        if blocks.iter().all(is_thinking) {
            continue;
        }
        // Roles must alternate: same-role neighbours are merged.
        match out.last_mut() {
            Some((r, b)) if *r == role => b.extend(blocks),
            _ => out.push((role, blocks)),
        }
    }
    if out.first().is_some_and(|(r, _)| *r == "assistant") {
        out.insert(0, ("user", text_blocks("(conversation continues)")));
    }
    let system = (!system.is_empty()).then(|| system.join("\n\n"));
    let messages = out
        .into_iter()
        .map(|(role, content)| json!({"role": role, "content": content}))
        .collect();
    (system, messages)
}

/// A user row's blocks: its images, then its text with any placeholders.
fn user_blocks(text: &str, parts: &[ImagePart]) -> Vec<Value> {
    let mut blocks: Vec<Value> = parts
        .iter()
        .filter_map(|p| match p {
            ImagePart::Image { mime, bytes } => Some(json!({
                "type": "image",
                "source": {"type": "base64", "media_type": mime, "data": crate::media::base64(bytes)},
            })),
            ImagePart::Placeholder(_) => None,
        })
        .collect();
    blocks.extend(text_blocks(&text_with_placeholders(text, parts)));
    blocks
}

fn text_blocks(text: &str) -> Vec<Value> {
    // Empty text blocks are rejected by the API.
    if text.is_empty() {
        Vec::new()
    } else {
        vec![json!({"type": "text", "text": text})]
    }
}

/// A string field of a content block, or empty.
fn str_field(block: &Value, key: &str) -> String {
    block
        .get(key)
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned()
}

/// Maps a Messages API stop reason to the transcript's finish reason.
pub fn map_stop_reason(s: &str) -> String {
    match s {
        "end_turn" | "stop_sequence" => "stop",
        "tool_use" => "tool_calls",
        "max_tokens" => "length",
        other => other,
    }
    .to_owned()
}

#[derive(Debug)]
enum Block {
    Text,
    Thinking {
        text: String,
        signature: String,
    },
    RedactedThinking {
        data: String,
    },
    ToolUse {
        id: String,
        name: String,
        json: String,
    },
    Other,
}

/// Assembles Messages API output, streamed or whole.
#[derive(Debug, Default)]
struct Accumulator {
    blocks: BTreeMap<u64, Block>,
    text: String,
    reasoning: String,
    stop_reason: Option<String>,
    usage: Usage,
    started: bool,
    done: bool,
}

fn usage_into(u: &Value, usage: &mut Usage) {
    let n = |k: &str| u.get(k).and_then(Value::as_u64);
    if let Some(v) = n("input_tokens") {
        usage.input_tokens = v;
    }
    if let Some(v) = n("output_tokens") {
        usage.output_tokens = v;
    }
    if let Some(v) = n("cache_read_input_tokens") {
        usage.cache_read_tokens = v;
    }
    if let Some(v) = n("cache_creation_input_tokens") {
        usage.cache_write_tokens = v;
    }
}

impl Accumulator {
    fn apply(&mut self, kind: &str, v: &Value, sink: EventSink<'_>) {
        let index = v.get("index").and_then(Value::as_u64).unwrap_or(0);
        match kind {
            "message_start" => {
                self.started = true;
                if let Some(u) = v.pointer("/message/usage") {
                    usage_into(u, &mut self.usage);
                }
            }
            "content_block_start" => {
                let b = v.get("content_block").cloned().unwrap_or(Value::Null);
                let block = match b.get("type").and_then(Value::as_str) {
                    Some("text") => {
                        if let Some(t) = b.get("text").and_then(Value::as_str) {
                            self.push_text(t, sink);
                        }
                        Block::Text
                    }
                    Some("thinking") => {
                        let text = str_field(&b, "thinking");
                        self.push_reasoning(&text, sink);
                        Block::Thinking {
                            text,
                            signature: str_field(&b, "signature"),
                        }
                    }
                    Some("redacted_thinking") => Block::RedactedThinking {
                        data: str_field(&b, "data"),
                    },
                    Some("tool_use") => {
                        let name = b
                            .get("name")
                            .and_then(Value::as_str)
                            .unwrap_or_default()
                            .to_owned();
                        sink(StreamEvent::ToolCallStarted { name: name.clone() });
                        // Input normally streams as deltas; a non-empty
                        // starting object is kept in case it does not.
                        let json = match b.get("input") {
                            Some(Value::Object(o)) if !o.is_empty() => {
                                Value::Object(o.clone()).to_string()
                            }
                            _ => String::new(),
                        };
                        Block::ToolUse {
                            id: b
                                .get("id")
                                .and_then(Value::as_str)
                                .unwrap_or_default()
                                .to_owned(),
                            name,
                            json,
                        }
                    }
                    _ => Block::Other,
                };
                self.blocks.insert(index, block);
            }
            "content_block_delta" => {
                let d = v.get("delta").cloned().unwrap_or(Value::Null);
                match d.get("type").and_then(Value::as_str) {
                    Some("text_delta") => {
                        let t = d.get("text").and_then(Value::as_str).unwrap_or_default();
                        self.push_text(t, sink);
                    }
                    Some("thinking_delta") => {
                        let t = d
                            .get("thinking")
                            .and_then(Value::as_str)
                            .unwrap_or_default();
                        self.push_reasoning(t, sink);
                        if let Some(Block::Thinking { text, .. }) = self.blocks.get_mut(&index) {
                            text.push_str(t);
                        }
                    }
                    Some("signature_delta") => {
                        let p = d
                            .get("signature")
                            .and_then(Value::as_str)
                            .unwrap_or_default();
                        if let Some(Block::Thinking { signature, .. }) = self.blocks.get_mut(&index)
                        {
                            signature.push_str(p);
                        }
                    }
                    Some("input_json_delta") => {
                        let p = d
                            .get("partial_json")
                            .and_then(Value::as_str)
                            .unwrap_or_default();
                        if let Some(Block::ToolUse { json, .. }) = self.blocks.get_mut(&index) {
                            json.push_str(p);
                        }
                    }
                    _ => {}
                }
            }
            "message_delta" => {
                if let Some(s) = v.pointer("/delta/stop_reason").and_then(Value::as_str) {
                    self.stop_reason = Some(s.to_owned());
                }
                if let Some(u) = v.get("usage") {
                    usage_into(u, &mut self.usage);
                }
            }
            "message_stop" => self.done = true,
            _ => {}
        }
    }

    fn push_text(&mut self, t: &str, sink: EventSink<'_>) {
        if !t.is_empty() {
            self.text.push_str(t);
            sink(StreamEvent::Text(t.to_owned()));
        }
    }

    fn push_reasoning(&mut self, t: &str, sink: EventSink<'_>) {
        if !t.is_empty() {
            self.reasoning.push_str(t);
            sink(StreamEvent::Reasoning(t.to_owned()));
        }
    }

    /// A whole (non-streamed) message, replayed through the same path.
    fn from_message(v: &Value, sink: EventSink<'_>) -> Accumulator {
        let mut acc = Accumulator {
            started: true,
            done: true,
            ..Accumulator::default()
        };
        if let Some(u) = v.get("usage") {
            usage_into(u, &mut acc.usage);
        }
        for (i, b) in v
            .get("content")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .enumerate()
        {
            let i = i as u64;
            match b.get("type").and_then(Value::as_str) {
                Some("text") => {
                    acc.blocks.insert(i, Block::Text);
                    acc.push_text(
                        b.get("text").and_then(Value::as_str).unwrap_or_default(),
                        sink,
                    );
                }
                Some("thinking") => {
                    let text = str_field(b, "thinking");
                    acc.push_reasoning(&text, sink);
                    acc.blocks.insert(
                        i,
                        Block::Thinking {
                            text,
                            signature: str_field(b, "signature"),
                        },
                    );
                }
                Some("redacted_thinking") => {
                    acc.blocks.insert(
                        i,
                        Block::RedactedThinking {
                            data: str_field(b, "data"),
                        },
                    );
                }
                Some("tool_use") => {
                    let name = b
                        .get("name")
                        .and_then(Value::as_str)
                        .unwrap_or_default()
                        .to_owned();
                    sink(StreamEvent::ToolCallStarted { name: name.clone() });
                    acc.blocks.insert(
                        i,
                        Block::ToolUse {
                            id: b
                                .get("id")
                                .and_then(Value::as_str)
                                .unwrap_or_default()
                                .to_owned(),
                            name,
                            json: b.get("input").map(Value::to_string).unwrap_or_default(),
                        },
                    );
                }
                _ => {
                    acc.blocks.insert(i, Block::Other);
                }
            }
        }
        acc.stop_reason = v
            .get("stop_reason")
            .and_then(Value::as_str)
            .map(str::to_owned);
        acc
    }

    fn into_response(self) -> Result<(Message, Usage), (ErrorKind, String)> {
        let has_tools = self
            .blocks
            .values()
            .any(|b| matches!(b, Block::ToolUse { .. }));
        if self.text.is_empty()
            && self.reasoning.is_empty()
            && !has_tools
            && self.stop_reason.is_none()
        {
            return Err((
                ErrorKind::ServerError,
                "the response ended without any content".to_owned(),
            ));
        }
        let mut calls = Vec::new();
        let mut broken = Vec::new();
        let mut thinking = Vec::new();
        for (i, b) in self.blocks {
            match b {
                // Unsigned reasoning (a stream cut before its signature, a
                // server that signs nothing) would be refused if sent back;
                // its text is kept in `reasoning` either way.
                Block::Thinking { text, signature } if !signature.is_empty() => {
                    thinking.push(ThinkingBlock::Thinking {
                        thinking: text,
                        signature,
                    });
                }
                Block::RedactedThinking { data } if !data.is_empty() => {
                    thinking.push(ThinkingBlock::RedactedThinking { data });
                }
                Block::ToolUse { id, name, json } => {
                    let arguments = if json.trim().is_empty() {
                        "{}".to_owned()
                    } else if let Some(fixed) = repair_json(&json) {
                        fixed
                    } else {
                        broken.push(name.clone());
                        json
                    };
                    calls.push(ToolCall {
                        id: if id.is_empty() {
                            format!("toolu_{i}")
                        } else {
                            id
                        },
                        name,
                        arguments,
                    });
                }
                _ => {}
            }
        }
        if !broken.is_empty() && !self.done && self.stop_reason.is_none() {
            return Err((
                ErrorKind::Network,
                format!(
                    "the stream dropped while writing tool call(s): {}",
                    broken.join(", ")
                ),
            ));
        }
        let mut message = Message::assistant_tool_calls(self.text, calls);
        message.reasoning = (!self.reasoning.is_empty()).then_some(self.reasoning);
        message.finish_reason = self.stop_reason.as_deref().map(map_stop_reason);
        message.thinking = thinking;
        Ok((message, self.usage))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transcript_conversion() {
        let msgs = vec![
            Message::system("be brief"),
            Message::system("and kind"),
            Message::user("list files"),
            Message::assistant_tool_calls(
                "checking",
                vec![
                    ToolCall {
                        id: "t1".into(),
                        name: "ls".into(),
                        arguments: r#"{"path":"."}"#.into(),
                    },
                    ToolCall {
                        id: "t2".into(),
                        name: "cat".into(),
                        arguments: "not json".into(),
                    },
                ],
            ),
            Message::tool_result("t1", "ls", "a b"),
            Message::tool_result("t2", "cat", ""),
            Message::user("thanks"),
            Message::user("again"),
            Message::tool_result("orphan", "x", "dropped"),
        ];
        let (system, out) = to_anthropic_messages(&msgs);
        assert_eq!(system.as_deref(), Some("be brief\n\nand kind"));
        assert_eq!(out.len(), 3, "{out:#?}");
        assert_eq!(out[1]["content"][1]["type"], "tool_use");
        assert_eq!(out[1]["content"][1]["input"]["path"], ".");
        assert_eq!(out[1]["content"][2]["input"], json!({}));
        let user = &out[2]["content"];
        assert_eq!(user[0]["type"], "tool_result");
        assert_eq!(user[1]["content"], "(no output)");
        assert_eq!(user[2]["text"], "thanks");
        assert_eq!(user[3]["text"], "again");
        assert_eq!(user.as_array().map(Vec::len), Some(4));
    }

    #[test]
    fn stop_reasons() {
        assert_eq!(map_stop_reason("end_turn"), "stop");
        assert_eq!(map_stop_reason("tool_use"), "tool_calls");
        assert_eq!(map_stop_reason("max_tokens"), "length");
        assert_eq!(map_stop_reason("refusal"), "refusal");
    }
}
