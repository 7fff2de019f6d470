//! The operator's routes end to end over real HTTP on 127.0.0.1: the log
//! tail (`/api/logs`, `/api/logs/files`) over real files in the home's
//! `logs/`, and `/api/config`'s answer without a gateway. The
//! configuration report itself is tested through the binary
//! (`talaria-cli/tests/api_rest.rs`), where the checks live.

use crate::api_support;

use std::io::Write;
use std::path::PathBuf;

use api_support::{KEY, Rig, rig};
use reqwest::StatusCode;
use serde_json::Value;

fn logs_dir(rig: &Rig) -> PathBuf {
    rig.agent.parts().home.logs_dir()
}

async fn get(rig: &Rig, path: &str) -> (StatusCode, Value) {
    let resp = rig
        .client
        .get(rig.url(path))
        .bearer_auth(KEY)
        .send()
        .await
        .unwrap();
    let status = resp.status();
    let text = resp.text().await.unwrap();
    (
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

fn lines(body: &Value) -> Vec<&str> {
    body["lines"]
        .as_array()
        .unwrap_or_else(|| panic!("no lines in {body}"))
        .iter()
        .map(|l| l.as_str().unwrap())
        .collect()
}

fn code(body: &Value) -> &str {
    body["error"]["code"].as_str().unwrap_or_default()
}

/// A gateway log as tracing writes it (no colours, no target), with a
/// two-line message.
const GATEWAY_LOG: &str = "\
2026-12-06T10:00:00.000001Z  INFO gateway starting
2026-12-06T10:00:01.000001Z DEBUG polling telegram
2026-12-06T10:00:02.000001Z  WARN Telegram answered 429; retrying in 2 s
2026-12-06T10:00:03.000001Z ERROR delivery failed: the chat is gone
  caused by: Bad Request
2026-12-06T10:00:04.000001Z  INFO turn finished
2026-12-06T10:00:05.000001Z  INFO API server listening
";

#[tokio::test(flavor = "multi_thread")]
async fn the_tail_is_filtered_by_text_and_level_and_capped() {
    let rig = rig(0).await;
    let dir = logs_dir(&rig);
    std::fs::write(dir.join("gateway.log"), GATEWAY_LOG).unwrap();
    std::fs::write(dir.join("talaria.log"), "2026-12-06T09:00:00Z  INFO chat\n").unwrap();

    // By default: all of gateway.log, oldest first.
    let (status, body) = get(&rig, "/api/logs").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["file"], "gateway.log");
    assert_eq!(body["truncated"], false);
    assert_eq!(lines(&body), GATEWAY_LOG.lines().collect::<Vec<_>>());
    assert_eq!(body["size"], GATEWAY_LOG.len());

    // The last two lines, and the answer says there were more.
    let (_, body) = get(&rig, "/api/logs?lines=2").await;
    assert_eq!(
        lines(&body),
        [
            "2026-12-06T10:00:04.000001Z  INFO turn finished",
            "2026-12-06T10:00:05.000001Z  INFO API server listening"
        ]
    );
    assert_eq!(body["truncated"], true);

    // Text in any case.
    let (_, body) = get(&rig, "/api/logs?filter=TELEGRAM").await;
    assert_eq!(
        lines(&body),
        [
            "2026-12-06T10:00:01.000001Z DEBUG polling telegram",
            "2026-12-06T10:00:02.000001Z  WARN Telegram answered 429; retrying in 2 s"
        ]
    );

    // Warnings and errors; a message's second line goes with its first.
    let (_, body) = get(&rig, "/api/logs?level=warn").await;
    assert_eq!(
        lines(&body),
        [
            "2026-12-06T10:00:02.000001Z  WARN Telegram answered 429; retrying in 2 s",
            "2026-12-06T10:00:03.000001Z ERROR delivery failed: the chat is gone",
            "  caused by: Bad Request"
        ]
    );
    let (_, body) = get(&rig, "/api/logs?level=ERROR&filter=failed").await;
    assert_eq!(
        lines(&body),
        ["2026-12-06T10:00:03.000001Z ERROR delivery failed: the chat is gone"]
    );

    // Another file by name.
    let (status, body) = get(&rig, "/api/logs?file=talaria.log").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(lines(&body), ["2026-12-06T09:00:00Z  INFO chat"]);

    // The cap: 1000 is allowed, more is refused, and so is a level no
    // log has.
    let (status, _) = get(&rig, "/api/logs?lines=1000").await;
    assert_eq!(status, 200);
    let (status, body) = get(&rig, "/api/logs?lines=1001").await;
    assert_eq!(status, 400, "{body}");
    assert_eq!(code(&body), "invalid_query");
    let (status, body) = get(&rig, "/api/logs?level=loud").await;
    assert_eq!(status, 400, "{body}");
    assert_eq!(code(&body), "invalid_query");
    let (status, body) = get(&rig, "/api/logs?lines=0").await;
    assert_eq!(status, 200);
    assert!(lines(&body).is_empty());

    // The files, by name, with their sizes.
    let (status, files) = get(&rig, "/api/logs/files").await;
    assert_eq!(status, 200, "{files}");
    let data = files["data"].as_array().unwrap();
    let names: Vec<&str> = data.iter().map(|f| f["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["gateway.log", "talaria.log"]);
    assert_eq!(data[0]["size"], GATEWAY_LOG.len());
    rig.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn only_plain_files_inside_the_logs_directory_are_read() {
    let rig = rig(0).await;
    let dir = logs_dir(&rig);
    let home = rig.agent.parts().home.root().to_path_buf();
    std::fs::write(
        home.join("config.yaml"),
        "model:\n  default: secret-model\n",
    )
    .unwrap();
    std::fs::write(dir.join("gateway.log"), GATEWAY_LOG).unwrap();
    // A link inside logs/ that points out of it.
    std::os::unix::fs::symlink(home.join("config.yaml"), dir.join("linked.log")).unwrap();

    for name in [
        "../config.yaml",
        "/etc/passwd",
        "..",
        ".",
        "..%2Fconfig.yaml",
        "sub/gateway.log",
        ".env",
        "linked.log",
    ] {
        let (status, body) = get(&rig, &format!("/api/logs?file={name}")).await;
        assert_eq!(status, 400, "{name}: {body}");
        assert_eq!(code(&body), "invalid_log_file", "{name}: {body}");
        assert!(!body.to_string().contains("secret-model"), "{name}: {body}");
        assert!(!body.to_string().contains("root:"), "{name}: {body}");
    }
    let (status, body) = get(&rig, "/api/logs?file=missing.log").await;
    assert_eq!(status, 404, "{body}");
    assert_eq!(code(&body), "log_not_found");

    // The link is not listed either.
    let (_, files) = get(&rig, "/api/logs/files").await;
    let names: Vec<&str> = files["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["gateway.log"]);
    rig.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_log_of_twenty_megabytes_gives_its_last_lines_within_the_read_limit() {
    let rig = rig(0).await;
    let path = logs_dir(&rig).join("gateway.log");
    // 20 MB of numbered lines, a rare word only on the first line and on
    // one line near the end.
    let mut file = std::io::BufWriter::new(std::fs::File::create(&path).unwrap());
    let padding = "x".repeat(80);
    let mut n = 0u64;
    let mut written = 0usize;
    while written < 20 * 1024 * 1024 {
        let word = if n == 0 { " needle" } else { "" };
        let line = format!("2026-12-06T10:00:00Z  INFO line {n:08} {padding}{word}\n");
        written += line.len();
        file.write_all(line.as_bytes()).unwrap();
        n += 1;
    }
    let last = n - 1;
    file.write_all(b"2026-12-06T10:00:01Z ERROR late needle\n")
        .unwrap();
    file.write_all(b"2026-12-06T10:00:02Z  INFO the end\n")
        .unwrap();
    file.flush().unwrap();
    drop(file);

    let (status, body) = get(&rig, "/api/logs?lines=1000").await;
    assert_eq!(status, 200, "{body}");
    let got = lines(&body);
    assert_eq!(got.len(), 1000);
    assert_eq!(got[999], "2026-12-06T10:00:02Z  INFO the end");
    assert_eq!(got[998], "2026-12-06T10:00:01Z ERROR late needle");
    assert!(
        got[997].contains(&format!("line {last:08} ")),
        "{}",
        got[997]
    );
    assert!(
        got[0].contains(&format!("line {:08} ", last - 997)),
        "{}",
        got[0]
    );
    assert_eq!(body["truncated"], true);

    // A search stops at the read limit: the needle near the end is found,
    // the one at the start of the file is not read, and the answer says
    // so.
    let (status, body) = get(&rig, "/api/logs?filter=needle").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(lines(&body), ["2026-12-06T10:00:01Z ERROR late needle"]);
    assert_eq!(body["truncated"], true);
    rig.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn without_a_logs_directory_there_is_nothing_to_show_and_no_error() {
    let rig = rig(0).await;
    std::fs::remove_dir_all(logs_dir(&rig)).unwrap();
    let (status, files) = get(&rig, "/api/logs/files").await;
    assert_eq!(status, 200, "{files}");
    assert_eq!(files["data"], Value::Array(vec![]));
    let (status, body) = get(&rig, "/api/logs").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["file"], Value::Null);
    assert!(lines(&body).is_empty());
    assert_eq!(body["truncated"], false);
    let (status, body) = get(&rig, "/api/logs?file=gateway.log").await;
    assert_eq!(status, 404, "{body}");

    // Without gateway.log the default is the log written last.
    std::fs::create_dir_all(logs_dir(&rig)).unwrap();
    std::fs::write(logs_dir(&rig).join("talaria.log"), "one\ntwo\n").unwrap();
    let (_, body) = get(&rig, "/api/logs").await;
    assert_eq!(body["file"], "talaria.log");
    assert_eq!(lines(&body), ["one", "two"]);
    rig.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn the_operators_routes_need_the_key_and_the_config_needs_a_gateway() {
    let rig = rig(0).await;
    std::fs::write(logs_dir(&rig).join("gateway.log"), GATEWAY_LOG).unwrap();
    for path in ["/api/logs", "/api/logs/files", "/api/config"] {
        let resp = rig.client.get(rig.url(path)).send().await.unwrap();
        assert_eq!(resp.status(), 401, "{path}");
        let text = resp.text().await.unwrap();
        assert!(!text.contains("gateway starting"), "{path}: {text}");
        let resp = rig
            .client
            .get(rig.url(path))
            .bearer_auth("wrong-key-0123456789abcdef")
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 401, "{path}");
    }
    // The configuration report comes from the gateway's binary.
    let (status, body) = get(&rig, "/api/config").await;
    assert_eq!(status, 503, "{body}");
    assert_eq!(code(&body), "gateway_unavailable");
    rig.stop().await;
}
