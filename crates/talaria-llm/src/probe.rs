//! Asking a model server what it is: which kind of server, how large a
//! context the model has, and whether it takes tool calls.
//!
//! A probe never fails: every question has a short timeout and a server
//! that does not answer (or answers something unexpected) simply leaves the
//! field unknown. The questions, by server:
//!
//! - any OpenAI-compatible server: `GET <base>/models` (`data[].id`); vLLM
//!   adds `max_model_len` to each entry and says `owned_by: "vllm"`;
//! - llama.cpp's `llama-server`: `GET /props`, whose
//!   `default_generation_settings.n_ctx` is the window the server was
//!   started with, and whose chat template tells whether tools can be
//!   rendered (`chat_template_caps.supports_tools` in newer builds, else the
//!   template mentioning `tools`);
//! - Ollama: `POST /api/show` with `{"model": name}`: `capabilities` lists
//!   `tools` when the model takes them, `model_info["<arch>.context_length"]`
//!   is the trained window, and a `num_ctx` line in `parameters` is the
//!   window Ollama actually runs it with;
//! - LM Studio: `GET /api/v0/models`, whose entries carry
//!   `max_context_length`.

use std::time::Duration;

use futures::future::join_all;
use serde_json::Value;

/// How long one probe may take in all.
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(2);
/// Largest answer read from one probe request (an Ollama `/api/show`
/// carries the license and template).
const MAX_BODY: usize = 4 * 1024 * 1024;

/// The kind of server behind a base URL.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ServerKind {
    /// llama.cpp's `llama-server`.
    LlamaCpp,
    /// vLLM's OpenAI-compatible server.
    Vllm,
    /// Ollama.
    Ollama,
    /// LM Studio.
    LmStudio,
    /// Something else that answers `GET /v1/models`.
    OpenAiCompatible,
    /// Nothing answered.
    Unknown,
}

impl ServerKind {
    /// The name shown to people.
    pub fn label(self) -> &'static str {
        match self {
            ServerKind::LlamaCpp => "llama.cpp",
            ServerKind::Vllm => "vLLM",
            ServerKind::Ollama => "Ollama",
            ServerKind::LmStudio => "LM Studio",
            ServerKind::OpenAiCompatible => "an OpenAI-compatible server",
            ServerKind::Unknown => "an unknown server",
        }
    }
}

/// What a probe learned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerInfo {
    /// The kind of server.
    pub kind: ServerKind,
    /// The model's context window in tokens, when the server said.
    pub context_length: Option<u64>,
    /// Whether the model takes tool calls, when the server said.
    pub tools: Option<bool>,
    /// The models the server offers (at most [`MAX_MODELS`]).
    pub models: Vec<String>,
}

/// Most model names kept from a listing.
pub const MAX_MODELS: usize = 50;

impl ServerInfo {
    fn unknown() -> ServerInfo {
        ServerInfo {
            kind: ServerKind::Unknown,
            context_length: None,
            tools: None,
            models: Vec::new(),
        }
    }
}

/// The server's root: `base_url` without a trailing `/v1` (llama.cpp's
/// `/props` and Ollama's `/api/...` live beside `/v1`, not under it).
fn server_root(base_url: &str) -> String {
    let trimmed = base_url.trim_end_matches('/');
    trimmed
        .strip_suffix("/v1")
        .unwrap_or(trimmed)
        .trim_end_matches('/')
        .to_owned()
}

/// The OpenAI-style root: `base_url` with `/v1` ensured.
fn v1_root(base_url: &str) -> String {
    format!("{}/v1", server_root(base_url))
}

async fn read_json(response: reqwest::Response) -> Option<Value> {
    if !response.status().is_success() {
        return None;
    }
    let mut response = response;
    let mut body = Vec::new();
    while let Ok(Some(chunk)) = response.chunk().await {
        if body.len() + chunk.len() > MAX_BODY {
            return None;
        }
        body.extend_from_slice(&chunk);
    }
    serde_json::from_slice(&body).ok()
}

async fn get(client: &reqwest::Client, url: String, key: Option<&str>) -> Option<Value> {
    let mut request = client.get(url);
    if let Some(k) = key {
        request = request.bearer_auth(k);
    }
    read_json(request.send().await.ok()?).await
}

fn client(timeout: Duration) -> Option<reqwest::Client> {
    reqwest::Client::builder()
        .timeout(timeout)
        .connect_timeout(timeout)
        // Local servers are addressed directly; a system proxy would only
        // turn "nothing there" into a slow error.
        .no_proxy()
        // Says in the server's log (and to test fakes) that this is a
        // probe, not a conversation.
        .user_agent(concat!("talaria-probe/", env!("CARGO_PKG_VERSION")))
        .build()
        .ok()
}

/// Reads a positive integer that may be written as a number or a string.
fn as_u64(v: &Value) -> Option<u64> {
    match v {
        Value::Number(n) => n.as_u64().or_else(|| n.as_f64().map(|f| f as u64)),
        Value::String(s) => s.trim().parse().ok(),
        _ => None,
    }
    .filter(|n| *n > 0)
}

/// The `data[]` ids of an OpenAI-style model list, and the entry for `model`
/// (else the only one).
fn model_entry<'a>(list: &'a Value, model: Option<&str>) -> (Vec<String>, Option<&'a Value>) {
    let Some(data) = list.get("data").and_then(Value::as_array) else {
        return (Vec::new(), None);
    };
    let ids = data
        .iter()
        .filter_map(|m| m.get("id").and_then(Value::as_str).map(str::to_owned))
        .take(MAX_MODELS)
        .collect();
    let entry = match model {
        Some(name) => data
            .iter()
            .find(|m| m.get("id").and_then(Value::as_str) == Some(name)),
        None => None,
    }
    .or_else(|| (data.len() == 1).then(|| &data[0]));
    (ids, entry)
}

/// Ollama's answer to `/api/show`: the window and whether tools work.
fn read_ollama_show(show: &Value) -> (Option<u64>, Option<bool>) {
    // A `num_ctx` the model was created with is what Ollama runs; the
    // architecture's context_length is only the trained maximum.
    let num_ctx = show
        .get("parameters")
        .and_then(Value::as_str)
        .and_then(|p| {
            p.lines().find_map(|line| {
                let mut words = line.split_whitespace();
                (words.next() == Some("num_ctx"))
                    .then(|| words.next().and_then(|n| n.parse::<u64>().ok()))
                    .flatten()
            })
        })
        .filter(|n| *n > 0);
    let info = show.get("model_info");
    let trained = info.and_then(|info| {
        let arch = info.get("general.architecture").and_then(Value::as_str);
        match arch {
            Some(a) => info.get(format!("{a}.context_length")).and_then(as_u64),
            // No architecture named: any `*.context_length` will do.
            None => info.as_object().and_then(|o| {
                o.iter()
                    .find(|(k, _)| k.ends_with(".context_length"))
                    .and_then(|(_, v)| as_u64(v))
            }),
        }
    });
    let tools = show
        .get("capabilities")
        .and_then(Value::as_array)
        .map(|caps| caps.iter().any(|c| c.as_str() == Some("tools")));
    (num_ctx.or(trained), tools)
}

/// llama.cpp's `/props`: the window and whether the template renders tools.
fn read_llama_props(props: &Value) -> (Option<u64>, Option<bool>) {
    let n_ctx = props
        .pointer("/default_generation_settings/n_ctx")
        .and_then(as_u64);
    let caps = props
        .pointer("/chat_template_caps/supports_tools")
        .and_then(Value::as_bool);
    let template = props
        .get("chat_template")
        .and_then(Value::as_str)
        .filter(|t| !t.is_empty())
        .map(|t| t.contains("tools"));
    (n_ctx, caps.or(template))
}

/// Asks the server at `base_url` (the `/v1` root the chat requests go to)
/// about `model`. Never fails and never takes much longer than `timeout`.
pub async fn probe(
    base_url: &str,
    model: Option<&str>,
    api_key: Option<&str>,
    timeout: Duration,
) -> ServerInfo {
    let Some(client) = client(timeout) else {
        return ServerInfo::unknown();
    };
    let root = server_root(base_url);
    let models_url = format!("{}/models", v1_root(base_url));
    let show = async {
        let name = model?;
        let mut request = client
            .post(format!("{root}/api/show"))
            .json(&serde_json::json!({ "model": name }));
        if let Some(k) = api_key {
            request = request.bearer_auth(k);
        }
        read_json(request.send().await.ok()?).await
    };
    // The four questions go out together: the slowest bounds the probe.
    let asked = async {
        tokio::join!(
            get(&client, models_url, api_key),
            get(&client, format!("{root}/props"), api_key),
            show,
            get(&client, format!("{root}/api/v0/models"), api_key),
        )
    };
    let Ok((models, props, show, lmstudio)) =
        tokio::time::timeout(timeout + Duration::from_millis(200), asked).await
    else {
        return ServerInfo::unknown();
    };
    let mut info = ServerInfo::unknown();
    let mut entry_owner = None;
    if let Some(list) = &models {
        let (ids, entry) = model_entry(list, model);
        info.models = ids;
        info.kind = ServerKind::OpenAiCompatible;
        if let Some(entry) = entry {
            entry_owner = entry.get("owned_by").and_then(Value::as_str);
            if let Some(n) = entry.get("max_model_len").and_then(as_u64) {
                info.kind = ServerKind::Vllm;
                info.context_length = Some(n);
            }
        }
        if entry_owner == Some("vllm") {
            info.kind = ServerKind::Vllm;
        }
    }
    if let Some(show) = show.as_ref().filter(|s| s.is_object()) {
        let (ctx, tools) = read_ollama_show(show);
        if ctx.is_some() || tools.is_some() {
            info.kind = ServerKind::Ollama;
            info.context_length = ctx.or(info.context_length);
            info.tools = tools;
            return info;
        }
    }
    if let Some(props) = &props {
        let (ctx, tools) = read_llama_props(props);
        if ctx.is_some() {
            info.kind = ServerKind::LlamaCpp;
            info.context_length = ctx;
            info.tools = tools;
            return info;
        }
    }
    if let Some(list) = &lmstudio {
        let (ids, entry) = model_entry(list, model);
        if let Some(entry) = entry
            && let Some(n) = entry.get("max_context_length").and_then(as_u64)
        {
            info.kind = ServerKind::LmStudio;
            info.context_length = Some(n);
            if let Some(caps) = entry.get("capabilities").and_then(Value::as_array) {
                info.tools = Some(caps.iter().any(|c| c.as_str() == Some("tool_use")));
            }
            if info.models.is_empty() {
                info.models = ids;
            }
        }
    }
    info
}

/// A model server found on this machine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocalServer {
    /// Its `/v1` root, ready for `model.base_url`.
    pub base_url: String,
    /// What it is.
    pub kind: ServerKind,
    /// The models it offers.
    pub models: Vec<String>,
}

/// The usual ports of local model servers: Ollama, llama.cpp, LM Studio,
/// vLLM.
pub const LOCAL_PORTS: [u16; 4] = [11434, 8080, 1234, 8000];

/// How long each local port is given to answer.
pub const LOCAL_TIMEOUT: Duration = Duration::from_millis(800);

/// Probes `127.0.0.1` on each of `ports` at once and returns the servers
/// that answered a model list, in the order of `ports`.
pub async fn detect_local(ports: &[u16], timeout: Duration) -> Vec<LocalServer> {
    let probes = ports.iter().map(|port| async move {
        let base_url = format!("http://127.0.0.1:{port}/v1");
        let info = probe(&base_url, None, None, timeout).await;
        // A server that does not list models is not one we can offer.
        (info.kind != ServerKind::Unknown).then_some(LocalServer {
            base_url,
            kind: match (info.kind, *port) {
                // /v1/models alone cannot tell these apart; the port can.
                (ServerKind::OpenAiCompatible, 11434) => ServerKind::Ollama,
                (ServerKind::OpenAiCompatible, 1234) => ServerKind::LmStudio,
                (kind, _) => kind,
            },
            models: info.models,
        })
    });
    join_all(probes).await.into_iter().flatten().collect()
}

/// The ports to look at: `TALARIA_LOCAL_PORTS` (comma-separated) when set,
/// else [`LOCAL_PORTS`]. Entries that are not port numbers are skipped.
pub fn local_ports(from_env: Option<&str>) -> Vec<u16> {
    match from_env {
        Some(list) => list
            .split(',')
            .filter_map(|p| p.trim().parse::<u16>().ok())
            .filter(|p| *p != 0)
            .take(16)
            .collect(),
        None => LOCAL_PORTS.to_vec(),
    }
}

/// One line naming a found server: "a local Ollama answers at
/// http://127.0.0.1:11434/v1 with models a, b".
pub fn describe_local(server: &LocalServer) -> String {
    let models = if server.models.is_empty() {
        "no models listed".to_owned()
    } else {
        let shown: Vec<&str> = server.models.iter().take(8).map(String::as_str).collect();
        let more = server.models.len().saturating_sub(shown.len());
        let extra = if more > 0 {
            format!(" and {more} more")
        } else {
            String::new()
        };
        format!("models {}{extra}", shown.join(", "))
    };
    // The generic kinds' labels are phrases of their own ("an
    // OpenAI-compatible server"), not names to put after "a local".
    let what = match server.kind {
        ServerKind::OpenAiCompatible | ServerKind::Unknown => "OpenAI-compatible server",
        kind => kind.label(),
    };
    format!(
        "a local {what} answers at {} with {models}",
        server.base_url
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roots_are_found_with_or_without_v1() {
        assert_eq!(server_root("http://h:8080/v1/"), "http://h:8080");
        assert_eq!(server_root("http://h:8080"), "http://h:8080");
        assert_eq!(v1_root("http://h:8080/"), "http://h:8080/v1");
    }

    #[test]
    fn ports_from_the_environment() {
        assert_eq!(local_ports(Some("1, x,0,65535")), vec![1, 65535]);
        assert_eq!(local_ports(None), LOCAL_PORTS.to_vec());
    }
}
