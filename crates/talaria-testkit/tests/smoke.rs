//! Drives the mocks over raw HTTP/1.1 so the kit is tested without a client crate.

use std::time::Duration;

use talaria_testkit::wait::{WAIT, wait_for};
use talaria_testkit::{MockAnthropic, MockOpenAi, Reply, ToolCallReply};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

async fn post(addr: std::net::SocketAddr, path: &str, body: &str) -> String {
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let req = format!(
        "POST {path} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\nauthorization: Bearer k\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).await.unwrap();
    let mut out = Vec::new();
    s.read_to_end(&mut out).await.unwrap();
    String::from_utf8(out).unwrap()
}

#[tokio::test]
async fn openai_json_stream_and_errors() {
    let m = MockOpenAi::start().await;
    assert!(m.base_url().starts_with("http://127.0.0.1:") && m.base_url().ends_with("/v1"));
    m.push(Reply::text("hello world"));
    m.push(
        Reply::tool_calls(vec![ToolCallReply::new(
            "c1",
            "terminal",
            r#"{"command":"ls -la"}"#,
        )])
        .with_text("ok"),
    );
    m.push(Reply::error(429, r#"{"error":{"message":"slow down"}}"#).with_retry_after(1));
    let r = post(
        m.addr(),
        "/v1/chat/completions",
        r#"{"model":"m1","messages":[]}"#,
    )
    .await;
    assert!(r.starts_with("HTTP/1.1 200"), "{r}");
    assert!(r.contains(r#""content":"hello world""#), "{r}");
    let r = post(
        m.addr(),
        "/v1/chat/completions",
        r#"{"model":"m1","stream":true,"stream_options":{"include_usage":true}}"#,
    )
    .await;
    assert!(r.contains("text/event-stream"), "{r}");
    assert!(
        r.contains(r#""name":"terminal""#) && r.contains("data: [DONE]"),
        "{r}"
    );
    assert!(
        r.contains(r#""finish_reason":"tool_calls""#) && r.contains("prompt_tokens"),
        "{r}"
    );
    let r = post(m.addr(), "/v1/chat/completions", "{}").await;
    assert!(r.starts_with("HTTP/1.1 429"), "{r}");
    assert!(r.to_ascii_lowercase().contains("retry-after: 1"), "{r}");
    let r = post(m.addr(), "/v1/chat/completions", "{}").await;
    assert!(r.contains("(mock: script empty)"), "{r}");
    let reqs = m.requests();
    assert_eq!(reqs.len(), 4);
    assert_eq!(reqs[0].path, "/v1/chat/completions");
    assert_eq!(reqs[0].body["model"], "m1");
    assert_eq!(reqs[0].header("Authorization"), Some("Bearer k"));
}

#[tokio::test]
async fn anthropic_stream_has_the_real_event_types() {
    let m = MockAnthropic::start().await;
    assert!(!m.base_url().ends_with("/v1"));
    m.push(
        Reply::tool_calls(vec![ToolCallReply::new("tu1", "read", r#"{"path":"a"}"#)])
            .with_reasoning("hmm"),
    );
    m.push(Reply::text("hi"));
    let r = post(
        m.addr(),
        "/v1/messages",
        r#"{"model":"claude","stream":true}"#,
    )
    .await;
    for e in [
        "message_start",
        "content_block_start",
        "thinking_delta",
        "input_json_delta",
        "message_delta",
        "message_stop",
        r#""stop_reason":"tool_use""#,
    ] {
        assert!(r.contains(e), "{e} missing in {r}");
    }
    let r = post(m.addr(), "/v1/messages", r#"{"model":"claude"}"#).await;
    assert!(
        r.contains(r#""text":"hi""#) && r.contains("end_turn"),
        "{r}"
    );
}

#[tokio::test]
async fn stalled_stream_ends_on_shutdown() {
    let m = MockOpenAi::start().await;
    m.push(Reply::text("one two three four").stall_after(2));
    let addr = m.addr();
    let h =
        tokio::spawn(async move { post(addr, "/v1/chat/completions", r#"{"stream":true}"#).await });
    // Recorded before the reply is chosen: from here the stream is the
    // stalled one, whenever the shutdown comes.
    wait_for("the request at the mock", || async {
        if m.requests().is_empty() {
            Err("no request yet")
        } else {
            Ok(())
        }
    })
    .await;
    m.shutdown();
    let r = tokio::time::timeout(WAIT, h).await.unwrap().unwrap();
    assert!(r.contains("one t"), "the stream had begun: {r}");
    assert!(!r.contains("[DONE]"), "{r}");
    assert_eq!(
        m.hung_up(),
        0,
        "the server ended the stream, not the client"
    );
}

/// Writes one request and returns the open connection, unread.
async fn send_only(addr: std::net::SocketAddr, body: &str) -> tokio::net::TcpStream {
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let req = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).await.unwrap();
    s
}

#[tokio::test]
async fn a_client_that_hangs_up_on_a_held_reply_is_counted() {
    let m = MockOpenAi::start().await;
    let hung_up = |n: usize| {
        let m = &m;
        move || async move {
            let seen = m.hung_up();
            if seen == n { Ok(()) } else { Err(seen) }
        }
    };

    // Held back by a delay: the client leaves before it ends.
    m.push(Reply::text("too late").with_delay(Duration::from_secs(120)));
    let s = send_only(m.addr(), "{}").await;
    wait_for("the delayed request at the mock", || async {
        if m.requests().len() == 1 {
            Ok(())
        } else {
            Err(m.requests().len())
        }
    })
    .await;
    drop(s);
    wait_for("the delayed request hung up", hung_up(1)).await;

    // A stalled stream: the client reads its start, then leaves.
    m.push(Reply::text("one two three four").stall_after(1));
    let mut s = send_only(m.addr(), r#"{"stream":true}"#).await;
    let mut seen = Vec::new();
    let mut buf = [0u8; 1024];
    while !String::from_utf8_lossy(&seen).contains("one") {
        let n = tokio::time::timeout(WAIT, s.read(&mut buf))
            .await
            .unwrap()
            .unwrap();
        assert!(
            n > 0,
            "the stream ended: {}",
            String::from_utf8_lossy(&seen)
        );
        seen.extend_from_slice(&buf[..n]);
    }
    drop(s);
    wait_for("the stalled stream hung up", hung_up(2)).await;

    // Replies that went out whole are not counted: each is marked before
    // the client can have read it, so the count is final once it has.
    m.push(Reply::text("whole"));
    m.push(Reply::text("streamed whole"));
    assert!(
        post(m.addr(), "/v1/chat/completions", "{}")
            .await
            .contains("whole")
    );
    let r = post(m.addr(), "/v1/chat/completions", r#"{"stream":true}"#).await;
    assert!(r.contains("[DONE]"), "{r}");
    assert_eq!(m.hung_up(), 2);
}
