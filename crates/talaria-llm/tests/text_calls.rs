//! Tool calls written as text: the parsers against samples in the shapes
//! those model families' chat templates produce, and the OpenAI-compatible
//! provider against the mock model server, streamed and not.

use crate::common;

use common::{Events, endpoint, opts, request};
use serde_json::{Value, json};
use talaria_core::ProviderKind;
use talaria_core::config::ToolCallParser;
use talaria_llm::text_calls::TextCalls;
use talaria_llm::{ChatRequest, HttpOptions, OpenAiProvider, Provider, StreamEvent, ToolSpec};
use talaria_testkit::{MockOpenAi, Reply};
use tokio_util::sync::CancellationToken;

fn spec(name: &str) -> ToolSpec {
    ToolSpec {
        name: name.to_owned(),
        description: format!("the {name} tool"),
        parameters: json!({"type": "object"}),
    }
}

/// The tools every sample may call.
fn offered() -> Vec<ToolSpec> {
    [
        "get_stock_fundamentals",
        "get_current_temperature",
        "get_temperature_date",
        "get_current_conditions",
        "get_current_weather",
        "read_file",
    ]
    .into_iter()
    .map(spec)
    .collect()
}

/// Hermes 2 Pro writes the arguments first.
const HERMES: &str = "<tool_call>\n{\"arguments\": {\"symbol\": \"TSLA\"}, \"name\": \"get_stock_fundamentals\"}\n</tool_call>";
/// Qwen 2.5 with two parallel calls, one block each.
const QWEN_TWO: &str = "<tool_call>\n{\"name\": \"get_current_temperature\", \"arguments\": {\"location\": \"San Francisco, CA, USA\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_temperature_date\", \"arguments\": {\"location\": \"San Francisco, CA, USA\", \"date\": \"2024-10-01\"}}\n</tool_call>";
/// Llama 3.1's custom-tool JSON, the whole answer.
const LLAMA_JSON: &str = "{\"name\": \"get_current_conditions\", \"parameters\": {\"location\": \"San Francisco, CA\", \"unit\": \"Fahrenheit\"}}";
/// The same after `<|python_tag|>`, with the end-of-message token left in.
const LLAMA_TAG: &str = "<|python_tag|>{\"name\": \"get_current_conditions\", \"parameters\": {\"location\": \"San Francisco, CA\", \"unit\": \"Fahrenheit\"}}<|eom_id|>";
/// Mistral 7B v0.3's list form.
const MISTRAL_LIST: &str = "[TOOL_CALLS] [{\"name\": \"get_current_weather\", \"arguments\": {\"location\": \"Paris, France\", \"format\": \"celsius\"}}]";
/// The newer Mistral tokenizer's `name[ARGS]{...}` form.
const MISTRAL_ARGS: &str = "[TOOL_CALLS]get_current_weather[ARGS]{\"location\": \"Paris, France\", \"format\": \"celsius\"}";
/// A fenced bare JSON object with prose before and after it is not at the
/// start; this one is.
const FENCED: &str =
    "```json\n{\"name\": \"read_file\", \"arguments\": {\"path\": \"notes.txt\"}}\n```";

struct Case {
    what: &'static str,
    mode: ToolCallParser,
    text: &'static str,
    /// `None`: stays text. Else the remaining content and the calls.
    want: Option<(&'static str, Vec<(&'static str, Value)>)>,
}

fn cases() -> Vec<Case> {
    use ToolCallParser::{Auto, Hermes, Json, Llama3, Mistral, Off, Qwen};
    let weather = json!({"location": "Paris, France", "format": "celsius"});
    let conditions = json!({"location": "San Francisco, CA", "unit": "Fahrenheit"});
    vec![
        Case {
            what: "hermes 2 pro",
            mode: Hermes,
            text: HERMES,
            want: Some((
                "",
                vec![("get_stock_fundamentals", json!({"symbol": "TSLA"}))],
            )),
        },
        Case {
            what: "hermes under auto",
            mode: Auto,
            text: HERMES,
            want: Some((
                "",
                vec![("get_stock_fundamentals", json!({"symbol": "TSLA"}))],
            )),
        },
        Case {
            what: "qwen 2.5, two calls",
            mode: Qwen,
            text: QWEN_TWO,
            want: Some((
                "",
                vec![
                    (
                        "get_current_temperature",
                        json!({"location": "San Francisco, CA, USA"}),
                    ),
                    (
                        "get_temperature_date",
                        json!({"location": "San Francisco, CA, USA", "date": "2024-10-01"}),
                    ),
                ],
            )),
        },
        Case {
            what: "prose around a hermes call stays",
            mode: Auto,
            text: "I'll look that up.\n<tool_call>\n{\"name\": \"read_file\", \"arguments\": {\"path\": \"a.md\"}}\n</tool_call>\nOne moment.",
            want: Some((
                "I'll look that up.\n\nOne moment.",
                vec![("read_file", json!({"path": "a.md"}))],
            )),
        },
        Case {
            what: "arguments given as a JSON string",
            mode: Auto,
            text: "<tool_call>{\"name\": \"read_file\", \"arguments\": \"{\\\"path\\\": \\\"b\\\"}\"}</tool_call>",
            want: Some(("", vec![("read_file", json!({"path": "b"}))])),
        },
        Case {
            what: "unclosed block at the end of the answer",
            mode: Auto,
            text: "<tool_call>\n{\"name\": \"read_file\", \"arguments\": {\"path\": \"c\"}}\n",
            want: Some(("", vec![("read_file", json!({"path": "c"}))])),
        },
        Case {
            what: "llama 3.1 bare json",
            mode: Llama3,
            text: LLAMA_JSON,
            want: Some(("", vec![("get_current_conditions", conditions.clone())])),
        },
        Case {
            what: "llama 3.1 bare json under auto",
            mode: Auto,
            text: LLAMA_JSON,
            want: Some(("", vec![("get_current_conditions", conditions.clone())])),
        },
        Case {
            what: "llama 3.1 python_tag",
            mode: Llama3,
            text: LLAMA_TAG,
            want: Some(("", vec![("get_current_conditions", conditions.clone())])),
        },
        Case {
            what: "llama built-in tool python syntax is not json",
            mode: Llama3,
            text: "<|python_tag|>brave_search.call(query=\"weather in Paris\")<|eom_id|>",
            want: None,
        },
        Case {
            what: "mistral list",
            mode: Mistral,
            text: MISTRAL_LIST,
            want: Some(("", vec![("get_current_weather", weather.clone())])),
        },
        Case {
            what: "mistral name[ARGS]",
            mode: Mistral,
            text: MISTRAL_ARGS,
            want: Some(("", vec![("get_current_weather", weather.clone())])),
        },
        Case {
            what: "mistral list with special tokens stripped by the server",
            mode: Mistral,
            text: "[{\"name\": \"get_current_weather\", \"arguments\": {\"location\": \"Paris, France\", \"format\": \"celsius\"}}]",
            want: Some(("", vec![("get_current_weather", weather.clone())])),
        },
        Case {
            what: "mistral, two calls in the newer form",
            mode: Auto,
            text: "[TOOL_CALLS]get_current_weather[ARGS]{\"location\": \"Paris, France\", \"format\": \"celsius\"}[TOOL_CALLS]read_file[ARGS]{\"path\": \"x\"}",
            want: Some((
                "",
                vec![
                    ("get_current_weather", weather.clone()),
                    ("read_file", json!({"path": "x"})),
                ],
            )),
        },
        Case {
            what: "fenced json",
            mode: Json,
            text: FENCED,
            want: Some(("", vec![("read_file", json!({"path": "notes.txt"}))])),
        },
        Case {
            what: "openai-shaped object",
            mode: Json,
            text: "{\"type\": \"function\", \"function\": {\"name\": \"read_file\", \"arguments\": {\"path\": \"d\"}}}",
            want: Some(("", vec![("read_file", json!({"path": "d"}))])),
        },
        Case {
            what: "malformed json stays text",
            mode: Auto,
            text: "<tool_call>\n{\"name\": \"read_file\", \"arguments\": {\"path\": \"a\"\n</tool_call>",
            want: None,
        },
        Case {
            what: "one malformed block of two leaves all as text",
            mode: Hermes,
            text: "<tool_call>{\"name\": \"read_file\", \"arguments\": {}}</tool_call><tool_call>{name: read_file}</tool_call>",
            want: None,
        },
        Case {
            what: "unknown tool stays text under auto",
            mode: Auto,
            text: "<tool_call>\n{\"name\": \"launch_rocket\", \"arguments\": {}}\n</tool_call>",
            want: None,
        },
        Case {
            what: "one unknown of two stays text under auto",
            mode: Auto,
            text: "<tool_call>{\"name\": \"read_file\", \"arguments\": {}}</tool_call><tool_call>{\"name\": \"launch_rocket\", \"arguments\": {}}</tool_call>",
            want: None,
        },
        Case {
            what: "a named parser passes an unknown name on for repair",
            mode: Hermes,
            text: "<tool_call>{\"name\": \"ReadFile\", \"arguments\": {\"path\": \"e\"}}</tool_call>",
            want: Some(("", vec![("ReadFile", json!({"path": "e"}))])),
        },
        Case {
            what: "json data that is not a call stays text",
            mode: Auto,
            text: "{\"city\": \"Paris\", \"temperature\": 21}",
            want: None,
        },
        Case {
            what: "a name without arguments is not a call",
            mode: Json,
            text: "{\"name\": \"read_file\"}",
            want: None,
        },
        Case {
            what: "json later in prose is not searched",
            mode: Json,
            text: "Here is the call I would make: {\"name\": \"read_file\", \"arguments\": {}}",
            want: None,
        },
        Case {
            what: "off",
            mode: Off,
            text: HERMES,
            want: None,
        },
        Case {
            what: "hermes parser ignores mistral",
            mode: Hermes,
            text: MISTRAL_ARGS,
            want: None,
        },
    ]
}

#[test]
fn each_parser_against_its_samples() {
    let tools = offered();
    for case in cases() {
        let got = TextCalls::new(case.mode, &tools).extract(case.text);
        match (&case.want, got) {
            (None, None) => {}
            (None, Some(g)) => panic!("{}: expected text, parsed {g:?}", case.what),
            (Some(_), None) => panic!("{}: expected calls, got text", case.what),
            (Some((content, calls)), Some(g)) => {
                assert_eq!(g.content, *content, "{}", case.what);
                let got: Vec<(String, Value)> = g
                    .calls
                    .iter()
                    .map(|c| {
                        (
                            c.name.clone(),
                            serde_json::from_str(&c.arguments).expect("arguments are JSON"),
                        )
                    })
                    .collect();
                let want: Vec<(String, Value)> = calls
                    .iter()
                    .map(|(n, a)| ((*n).to_owned(), a.clone()))
                    .collect();
                assert_eq!(got, want, "{}", case.what);
                assert!(
                    g.calls.iter().all(|c| c.id.starts_with("call_")),
                    "{}",
                    case.what
                );
            }
        }
    }
}

#[test]
fn nothing_is_a_call_when_no_tools_are_offered() {
    for mode in [
        ToolCallParser::Auto,
        ToolCallParser::Hermes,
        ToolCallParser::Llama3,
        ToolCallParser::Json,
    ] {
        for text in [HERMES, LLAMA_JSON, FENCED, MISTRAL_LIST] {
            assert!(
                TextCalls::new(mode, &[]).extract(text).is_none(),
                "{mode:?} {text}"
            );
        }
    }
}

fn provider(mock: &MockOpenAi, stream: bool, mode: ToolCallParser) -> OpenAiProvider {
    OpenAiProvider::new(
        &endpoint(ProviderKind::Custom, "local-1", mock.base_url(), None),
        HttpOptions {
            tool_call_parser: mode,
            ..opts(stream)
        },
    )
}

fn with_tools() -> ChatRequest {
    ChatRequest {
        tools: offered(),
        ..request()
    }
}

const MARKERS: [&str; 5] = [
    "<tool_call>",
    "<|python_tag|>",
    "[TOOL_CALLS]",
    "\"name\"",
    "```",
];

/// What the user was shown, and the tools the stream announced.
fn shown(ev: &Events) -> (String, Vec<String>) {
    let started = ev
        .all()
        .into_iter()
        .filter_map(|e| match e {
            StreamEvent::ToolCallStarted { name } => Some(name),
            _ => None,
        })
        .collect();
    (ev.text(), started)
}

#[tokio::test]
async fn every_format_streamed_becomes_calls_and_never_reaches_the_screen() {
    let mock = MockOpenAi::start().await;
    let samples = [
        ("Let me check.\n", HERMES, vec!["get_stock_fundamentals"]),
        (
            "",
            QWEN_TWO,
            vec!["get_current_temperature", "get_temperature_date"],
        ),
        ("", LLAMA_JSON, vec!["get_current_conditions"]),
        ("Checking: ", LLAMA_TAG, vec!["get_current_conditions"]),
        ("", MISTRAL_LIST, vec!["get_current_weather"]),
        ("", MISTRAL_ARGS, vec!["get_current_weather"]),
        ("", FENCED, vec!["read_file"]),
    ];
    for (prose, call, names) in samples {
        let text = format!("{prose}{call}");
        mock.push(Reply::text(text.clone()));
        let p = provider(&mock, true, ToolCallParser::Auto);
        let ev = Events::default();
        let r = p
            .chat(&with_tools(), &|e| ev.push(e), &CancellationToken::new())
            .await
            .unwrap();
        let got: Vec<&str> = r
            .message
            .tool_calls
            .iter()
            .map(|c| c.name.as_str())
            .collect();
        assert_eq!(got, names, "{text}");
        assert_eq!(
            r.message.finish_reason.as_deref(),
            Some("tool_calls"),
            "{text}"
        );
        assert_eq!(r.message.content, prose.trim(), "{text}");
        let (seen, started) = shown(&ev);
        for m in MARKERS {
            assert!(!seen.contains(m), "{m} shown for {text}: {seen:?}");
        }
        assert_eq!(seen.trim(), prose.trim(), "{text}");
        assert_eq!(started, names, "{text}");
    }
}

#[tokio::test]
async fn a_call_split_into_tiny_chunks_is_still_hidden() {
    let mock = MockOpenAi::start().await;
    let text = format!("Reading it now. {HERMES} Done soon.");
    // Three bytes per chunk, so markers are cut everywhere.
    let chunk = |delta: Value, finish: Option<&str>| {
        json!({"id": "c", "object": "chat.completion.chunk", "created": 0, "model": "local-1",
               "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})
        .to_string()
    };
    let bytes = text.as_bytes();
    let mut events: Vec<String> = bytes
        .chunks(3)
        .map(|c| chunk(json!({"content": String::from_utf8_lossy(c)}), None))
        .collect();
    events.push(chunk(json!({}), Some("stop")));
    mock.push(Reply::raw_sse(events));
    let p = provider(&mock, true, ToolCallParser::Hermes);
    let ev = Events::default();
    let r = p
        .chat(&with_tools(), &|e| ev.push(e), &CancellationToken::new())
        .await
        .unwrap();
    assert_eq!(r.message.tool_calls.len(), 1);
    assert_eq!(r.message.tool_calls[0].name, "get_stock_fundamentals");
    assert_eq!(r.message.content, "Reading it now.  Done soon.");
    let (seen, _) = shown(&ev);
    assert!(!seen.contains("<tool"), "{seen:?}");
    assert!(!seen.contains("TSLA"), "{seen:?}");
    assert!(seen.starts_with("Reading it now."), "{seen:?}");
    assert!(seen.ends_with("Done soon."), "{seen:?}");
    assert!(
        ev.count_text() > 3,
        "the prose before the call streams as it comes"
    );
}

#[tokio::test]
async fn non_streamed_answer_with_a_text_call() {
    let mock = MockOpenAi::start().await;
    mock.push(Reply::text(format!("Sure.\n{QWEN_TWO}")));
    let p = provider(&mock, false, ToolCallParser::Auto);
    let ev = Events::default();
    let r = p
        .chat(&with_tools(), &|e| ev.push(e), &CancellationToken::new())
        .await
        .unwrap();
    assert_eq!(mock.requests()[0].body.get("stream"), None);
    assert_eq!(r.message.tool_calls.len(), 2);
    assert_eq!(r.message.tool_calls[1].name, "get_temperature_date");
    let args: Value = serde_json::from_str(&r.message.tool_calls[1].arguments).unwrap();
    assert_eq!(args["date"], "2024-10-01");
    assert_eq!(r.message.content, "Sure.");
    assert_eq!(r.message.finish_reason.as_deref(), Some("tool_calls"));
    let (seen, started) = shown(&ev);
    assert_eq!(seen, "Sure.");
    assert_eq!(started.len(), 2);
}

#[tokio::test]
async fn json_without_tools_offered_stays_text_streamed_and_not() {
    let mock = MockOpenAi::start().await;
    for stream in [true, false] {
        mock.push(Reply::text(LLAMA_JSON));
        let p = provider(&mock, stream, ToolCallParser::Auto);
        let ev = Events::default();
        let r = p
            .chat(&request(), &|e| ev.push(e), &CancellationToken::new())
            .await
            .unwrap();
        assert!(r.message.tool_calls.is_empty());
        assert_eq!(r.message.content, LLAMA_JSON);
        assert_eq!(r.message.finish_reason.as_deref(), Some("stop"));
        assert_eq!(ev.text(), LLAMA_JSON);
    }
}

#[tokio::test]
async fn unknown_tool_and_off_stay_text_and_are_shown_whole() {
    let mock = MockOpenAi::start().await;
    let unknown = "<tool_call>{\"name\": \"launch_rocket\", \"arguments\": {}}</tool_call>";
    for (mode, text) in [
        (ToolCallParser::Auto, unknown),
        (ToolCallParser::Off, HERMES),
    ] {
        mock.push(Reply::text(text));
        let p = provider(&mock, true, mode);
        let ev = Events::default();
        let r = p
            .chat(&with_tools(), &|e| ev.push(e), &CancellationToken::new())
            .await
            .unwrap();
        assert!(r.message.tool_calls.is_empty(), "{mode:?}");
        assert_eq!(r.message.content, text);
        assert_eq!(ev.text(), text, "{mode:?}");
    }
}
