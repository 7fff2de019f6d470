//! `talaria sessions export`: sessions with their transcripts, written out
//! one session at a time, so memory follows the largest session and not
//! the number stored.
//!
//! JSONL holds one object per line and session: `{"version": 1,
//! "session": {...}, "messages": [...]}`, the session as the store
//! records it and every transcript row in order, each with its `id`,
//! `timestamp`, `token_count` and `active` (false for rows `/undo`,
//! `/retry` or a compression replaced) beside the message's own fields.
//! Markdown shows each conversation as it stands, for reading.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, bail};
use serde::Serialize;
use talaria_core::{Message, Role};
use talaria_store::{SessionPage, SessionRecord, StoreError, StoredMessage};

use crate::cli::ExportFormat;
use crate::runtime::Runtime;
use crate::sessions_cmd::{one_line, title, when};

/// Sessions read per page with `--all`.
const SESSION_PAGE: usize = 100;

/// Transcript rows read per query.
const ROW_PAGE: usize = 500;

/// What `export` was asked for.
pub struct Export {
    pub id: Option<String>,
    pub source: Option<String>,
    pub format: ExportFormat,
    pub output: Option<PathBuf>,
}

/// The version of the JSONL layout, for readers to check.
const VERSION: u32 = 1;

#[derive(Serialize)]
struct Line<'a> {
    version: u32,
    session: &'a SessionRecord,
    messages: Vec<Row<'a>>,
}

#[derive(Serialize)]
struct Row<'a> {
    id: i64,
    timestamp: f64,
    token_count: Option<u64>,
    active: bool,
    #[serde(flatten)]
    message: &'a Message,
}

pub async fn export(rt: &Runtime, args: Export) -> anyhow::Result<ExitCode> {
    let mut out = Sink::open(args.output.as_deref())?;
    let mut written = 0usize;
    match &args.id {
        Some(wanted) => {
            let Some(session) = crate::sessions_cmd::find(rt, wanted).await? else {
                return Ok(crate::sessions_cmd::not_found(wanted));
            };
            let id = session.id.as_str();
            let Some(rows) = transcript(rt, id).await? else {
                bail!("session `{id}` was deleted while it was being read");
            };
            out.write_all(render(args.format, &session, &rows, true)?.as_bytes())?;
            written = 1;
        }
        None => {
            let mut after: Option<String> = None;
            loop {
                let page = rt
                    .store
                    .session_page(SessionPage {
                        source: args.source.clone(),
                        after_id: after.take(),
                        limit: SESSION_PAGE,
                        ..SessionPage::default()
                    })
                    .await?;
                let Some(last) = page.last() else { break };
                after = Some(last.session.id.clone());
                for a in &page {
                    // A session deleted since its page was read is left
                    // out, as it would be had the export started later.
                    let Some(rows) = transcript(rt, &a.session.id).await? else {
                        continue;
                    };
                    let text = render(args.format, &a.session, &rows, written == 0)?;
                    out.write_all(text.as_bytes())?;
                    written += 1;
                }
            }
        }
    }
    let target = out.finish()?;
    let what = crate::count(written, "session", "sessions");
    match target {
        Some(path) => eprintln!("exported {what} to {}", path.display()),
        None if written == 0 => eprintln!(
            "{}",
            crate::sessions_cmd::nothing_listed(rt, args.source.as_deref()).await?
        ),
        None => {}
    }
    Ok(ExitCode::SUCCESS)
}

/// Every row of session `id` in order, replaced ones included; `None`
/// when the session is gone.
async fn transcript(rt: &Runtime, id: &str) -> anyhow::Result<Option<Vec<StoredMessage>>> {
    let mut rows: Vec<StoredMessage> = Vec::new();
    loop {
        let next = rows.last().map_or(0, |r| r.id) + 1;
        // The window from `next` on with nothing before it is the next
        // page of rows, active or not.
        let page = match rt
            .store
            .message_window(id, next, 0, ROW_PAGE.saturating_sub(1))
            .await
        {
            Ok(page) => page,
            Err(StoreError::NoSuchSession(_)) => return Ok(None),
            Err(e) => return Err(e.into()),
        };
        let full = page.len() >= ROW_PAGE;
        rows.extend(page);
        if !full {
            return Ok(Some(rows));
        }
    }
}

/// One session in `format`; `first` says whether it opens the output.
fn render(
    format: ExportFormat,
    session: &SessionRecord,
    rows: &[StoredMessage],
    first: bool,
) -> anyhow::Result<String> {
    match format {
        ExportFormat::Jsonl => {
            let line = Line {
                version: VERSION,
                session,
                messages: rows
                    .iter()
                    .map(|r| Row {
                        id: r.id,
                        timestamp: r.timestamp,
                        token_count: r.token_count,
                        active: r.active,
                        message: &r.message,
                    })
                    .collect(),
            };
            let mut text = serde_json::to_string(&line)?;
            text.push('\n');
            Ok(text)
        }
        ExportFormat::Markdown => {
            let mut text = String::new();
            if !first {
                text.push_str("\n---\n\n");
            }
            text.push_str(&markdown(session, rows));
            Ok(text)
        }
    }
}

/// A conversation as it stands, for reading.
fn markdown(session: &SessionRecord, rows: &[StoredMessage]) -> String {
    let mut md = format!("# {}\n\n", one_line(&title(session), 200));
    let mut facts = vec![
        format!("- id: `{}`", session.id),
        format!("- source: {}", session.source),
        format!("- started: {}", when(session.started_at)),
    ];
    if let Some(ended) = session.ended_at {
        facts.push(format!(
            "- ended: {}{}",
            when(ended),
            session
                .end_reason
                .as_deref()
                .map(|r| format!(" ({r})"))
                .unwrap_or_default()
        ));
    }
    for (name, value) in [
        ("chat", &session.chat_id),
        ("user", &session.user_id),
        ("thread", &session.thread_id),
        ("model", &session.model),
        ("continues", &session.parent_session_id),
    ] {
        if let Some(value) = value {
            facts.push(format!("- {name}: {value}"));
        }
    }
    facts.push(format!(
        "- tokens: {} in, {} out",
        session.input_tokens, session.output_tokens
    ));
    let replaced = rows.iter().filter(|r| !r.active).count();
    if replaced > 0 {
        facts.push(format!(
            "- {} replaced by /undo, /retry or compression are left out here (the JSONL export keeps them)",
            crate::count(replaced, "row", "rows")
        ));
    }
    md.push_str(&facts.join("\n"));
    md.push('\n');
    for row in rows.iter().filter(|r| r.active) {
        let m = &row.message;
        match m.role {
            Role::System => {}
            Role::User => {
                md.push_str(&format!("\n## User · {}\n\n", when(row.timestamp)));
                md.push_str(&paragraph(&m.content));
                for media in &m.media {
                    md.push_str(&format!(
                        "\n*(attached: {}, {})*\n",
                        media.mime,
                        media.path.display()
                    ));
                }
            }
            Role::Assistant => {
                md.push_str(&format!("\n## Assistant · {}\n\n", when(row.timestamp)));
                if !m.content.is_empty() {
                    md.push_str(&paragraph(&m.content));
                }
                for call in &m.tool_calls {
                    md.push_str(&format!(
                        "\n**Tool call** `{}`:\n\n{}",
                        call.name,
                        fenced(&call.arguments, "json")
                    ));
                }
            }
            Role::Tool => {
                md.push_str(&format!(
                    "\n**Result** of `{}`:\n\n{}",
                    m.tool_name.as_deref().unwrap_or("tool"),
                    fenced(&m.content, "text")
                ));
            }
        }
    }
    md
}

/// `text` as a paragraph, ending in a newline.
fn paragraph(text: &str) -> String {
    let mut p = text.trim_end().to_owned();
    p.push('\n');
    p
}

/// `text` in a code block whose fence no run of backticks in it can close.
fn fenced(text: &str, lang: &str) -> String {
    let mut longest = 0;
    let mut run = 0;
    for c in text.chars() {
        if c == '`' {
            run += 1;
            longest = longest.max(run);
        } else {
            run = 0;
        }
    }
    let fence = "`".repeat((longest + 1).max(3));
    format!("{fence}{lang}\n{}\n{fence}\n", text.trim_end_matches('\n'))
}

/// Where the export goes: standard output, or a new file that appears
/// only once it is complete.
enum Sink {
    Stdout(BufWriter<std::io::Stdout>),
    File {
        temp: BufWriter<tempfile::NamedTempFile>,
        path: PathBuf,
    },
}

impl Sink {
    fn open(path: Option<&Path>) -> anyhow::Result<Sink> {
        let Some(path) = path else {
            return Ok(Sink::Stdout(BufWriter::new(std::io::stdout())));
        };
        if path.exists() {
            bail!(
                "{} exists; choose a new file (an export never replaces one)",
                path.display()
            );
        }
        let dir = match path.parent() {
            Some(dir) if !dir.as_os_str().is_empty() => dir,
            _ => Path::new("."),
        };
        // A temporary file beside the target (0600, as it holds
        // conversations), renamed into place at the end: an export that
        // fails leaves nothing that looks complete.
        let temp = tempfile::Builder::new()
            .prefix(".talaria-export-")
            .tempfile_in(dir)
            .with_context(|| format!("cannot write in {}", dir.display()))?;
        Ok(Sink::File {
            temp: BufWriter::new(temp),
            path: path.to_owned(),
        })
    }

    fn write_all(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        match self {
            Sink::Stdout(out) => out.write_all(bytes),
            Sink::File { temp, .. } => temp.write_all(bytes),
        }
    }

    /// Flushes, and puts a file in place; the file written, if any.
    fn finish(self) -> anyhow::Result<Option<PathBuf>> {
        match self {
            Sink::Stdout(mut out) => {
                out.flush()?;
                Ok(None)
            }
            Sink::File { temp, path } => {
                let temp = temp
                    .into_inner()
                    .map_err(|e| e.into_error())
                    .context("cannot write the export")?;
                temp.as_file()
                    .sync_all()
                    .context("cannot write the export")?;
                let file: File = temp
                    .persist_noclobber(&path)
                    .map_err(|e| e.error)
                    .with_context(|| format!("cannot create {}", path.display()))?;
                drop(file);
                Ok(Some(path))
            }
        }
    }
}
