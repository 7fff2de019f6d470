//! `talaria sessions list | show | search | rename | delete | prune |
//! stats`; `export` is in [`crate::sessions_export`].

use std::io::{BufRead, IsTerminal, Write};
use std::process::ExitCode;

use anyhow::bail;
use talaria_core::Role;
use talaria_store::{IdleDeletion, SearchQuery, SessionFilter, SessionPage, SessionRecord};

use crate::runtime::Runtime;

/// A stored timestamp as local `YYYY-MM-DD HH:MM`, for listings: the
/// form the chat commands' `/sessions` uses too.
pub(crate) use talaria_gateway::slash::when;

pub(crate) fn one_line(text: &str, max: usize) -> String {
    let flat: String = text
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    let flat = flat.trim();
    if flat.chars().count() <= max {
        flat.to_owned()
    } else {
        let cut: String = flat.chars().take(max.saturating_sub(1)).collect();
        format!("{cut}…")
    }
}

pub(crate) fn title(s: &SessionRecord) -> String {
    s.title.clone().unwrap_or_else(|| "(untitled)".to_owned())
}

pub async fn list(rt: &Runtime, limit: usize, source: Option<String>) -> anyhow::Result<ExitCode> {
    let sessions = rt
        .store
        .list_sessions(SessionFilter {
            source: source.clone(),
            limit,
            ..SessionFilter::default()
        })
        .await?;
    if sessions.is_empty() {
        println!("{}", nothing_listed(rt, source.as_deref()).await?);
        return Ok(ExitCode::SUCCESS);
    }
    let ids: Vec<String> = sessions.iter().map(|s| s.id.clone()).collect();
    let counts = rt.store.active_message_counts(&ids).await?;
    let mut rows = vec![
        ["ID", "STARTED", "MESSAGES", "SOURCE", "TITLE"]
            .map(str::to_owned)
            .to_vec(),
    ];
    rows.extend(sessions.iter().zip(counts).map(|(s, count)| {
        vec![
            s.id.clone(),
            when(s.started_at),
            count.to_string(),
            s.source.clone(),
            one_line(&title(s), 60),
        ]
    }));
    print!("{}", crate::columns(&rows));
    Ok(ExitCode::SUCCESS)
}

/// What an empty listing says: nothing stored at all, or nothing from the
/// source asked for (naming the sources there are, in case of a typo).
pub(crate) async fn nothing_listed(rt: &Runtime, source: Option<&str>) -> anyhow::Result<String> {
    let Some(source) = source else {
        return Ok("No sessions yet. `talaria chat` starts one.".to_owned());
    };
    let known = rt.store.session_sources().await?;
    if known.is_empty() {
        return Ok(format!(
            "No sessions from `{source}`: there are no sessions yet."
        ));
    }
    let names: Vec<String> = known
        .iter()
        .map(|(name, n)| format!("{name} ({n})"))
        .collect();
    Ok(format!(
        "No sessions from `{source}`. Sessions come from: {}.",
        names.join(", ")
    ))
}

/// How many recent sessions a title is looked for among.
const TITLE_DEPTH: usize = 500;

/// The session `wanted` names: its id, or else the title of one of the
/// most recent sessions (ignoring case), as `chat --resume` takes them.
/// A title two of them share is refused, with their ids.
pub(crate) async fn find(rt: &Runtime, wanted: &str) -> anyhow::Result<Option<SessionRecord>> {
    let wanted = wanted.trim();
    if let Some(session) = rt.store.session(wanted).await? {
        return Ok(Some(session));
    }
    let lower = wanted.to_lowercase();
    let mut titled: Vec<SessionRecord> = rt
        .store
        .list_sessions(SessionFilter {
            limit: TITLE_DEPTH,
            ..Default::default()
        })
        .await?
        .into_iter()
        .filter(|s| {
            s.title
                .as_deref()
                .is_some_and(|t| t.to_lowercase() == lower)
        })
        .collect();
    if titled.len() > 1 {
        let ids: Vec<&str> = titled.iter().map(|s| s.id.as_str()).collect();
        bail!(
            "{} recent sessions are titled `{wanted}` ({}): give the id",
            titled.len(),
            ids.join(", ")
        );
    }
    Ok(titled.pop())
}

/// What a command says when `wanted` names no session.
pub(crate) fn not_found(wanted: &str) -> ExitCode {
    eprintln!("no session has the id or title `{wanted}` (see `talaria sessions list`)");
    ExitCode::FAILURE
}

pub async fn show(rt: &Runtime, wanted: &str) -> anyhow::Result<ExitCode> {
    let Some(session) = find(rt, wanted).await? else {
        return Ok(not_found(wanted));
    };
    let id = session.id.as_str();
    println!(
        "session {}  {}  {}  model {}",
        session.id,
        when(session.started_at),
        session.source,
        session.model.as_deref().unwrap_or("?")
    );
    println!(
        "tokens: {} in, {} out",
        session.input_tokens, session.output_tokens
    );
    for m in rt.store.messages(id).await? {
        let msg = &m.message;
        match msg.role {
            Role::System => {}
            Role::User => println!("\n> {}", msg.content),
            Role::Assistant => {
                if !msg.content.is_empty() {
                    println!("\n{}", msg.content);
                }
                for c in &msg.tool_calls {
                    println!("  ⚙ {}({})", c.name, one_line(&c.arguments, 100));
                }
            }
            Role::Tool => println!(
                "  ↳ {}: {}",
                msg.tool_name.as_deref().unwrap_or("tool"),
                one_line(&msg.content, 100)
            ),
        }
    }
    Ok(ExitCode::SUCCESS)
}

pub async fn search(rt: &Runtime, query: &str, limit: usize) -> anyhow::Result<ExitCode> {
    let hits = rt
        .store
        .search(SearchQuery {
            text: query.to_owned(),
            sources: Vec::new(),
            exclude_session: None,
            limit,
        })
        .await?;
    if hits.is_empty() {
        println!("no matches");
    }
    for h in hits {
        println!(
            "{}  {}  {}\n    {}: {}",
            h.session.id,
            when(h.session.started_at),
            one_line(&title(&h.session), 60),
            h.role.as_str(),
            one_line(&h.snippet, 120)
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// How many sessions `prune` reads at a time: its memory stays the same
/// however many sessions there are.
const PRUNE_PAGE: usize = 200;

/// Seconds in a day, for `--older-than DAYS`.
const DAY: f64 = 86_400.0;

pub async fn rename(rt: &Runtime, wanted: &str, words: &[String]) -> anyhow::Result<ExitCode> {
    let Some(title) = talaria_gateway::slash::clean_title(&words.join(" ")) else {
        bail!("a title needs at least one visible character");
    };
    let Some(session) = find(rt, wanted).await? else {
        return Ok(not_found(wanted));
    };
    let id = session.id.as_str();
    rt.store.set_title(id, &title).await?;
    match session.title {
        Some(old) if old != title => println!("renamed {id}: {old} -> {title}"),
        _ => println!("titled {id}: {title}"),
    }
    Ok(ExitCode::SUCCESS)
}

pub async fn delete(rt: &Runtime, wanted: &str, yes: bool) -> anyhow::Result<ExitCode> {
    let Some(session) = find(rt, wanted).await? else {
        return Ok(not_found(wanted));
    };
    let id = session.id.as_str();
    let messages = rt
        .store
        .active_message_counts(std::slice::from_ref(&session.id))
        .await?
        .first()
        .copied()
        .unwrap_or(0);
    let what = format!(
        "session {id} ({}, {}, {}, started {})",
        one_line(&title(&session), 60),
        crate::count(messages as usize, "message", "messages"),
        session.source,
        when(session.started_at)
    );
    if !confirm(&format!("Delete {what}? This cannot be undone."), yes)? {
        eprintln!("nothing deleted");
        return Ok(ExitCode::FAILURE);
    }
    if rt.store.delete_session(id).await? {
        println!("deleted {what}");
        Ok(ExitCode::SUCCESS)
    } else {
        // Deleted by someone else between the question and the answer.
        eprintln!("session `{id}` was already gone");
        Ok(ExitCode::FAILURE)
    }
}

/// Asks `question` on the terminal unless `yes`. Without a terminal there
/// is nobody to ask, so the command is refused rather than guessed.
fn confirm(question: &str, yes: bool) -> anyhow::Result<bool> {
    if yes {
        return Ok(true);
    }
    let stdin = std::io::stdin();
    if !stdin.is_terminal() {
        bail!("this deletes data and there is no terminal to ask on: add --yes to go ahead");
    }
    eprint!("{question} [y/N] ");
    std::io::stderr().flush()?;
    let mut answer = String::new();
    stdin.lock().read_line(&mut answer)?;
    Ok(matches!(
        answer.trim().to_ascii_lowercase().as_str(),
        "y" | "yes"
    ))
}

/// What `prune` works on.
pub struct Prune {
    pub older_than: u32,
    pub source: Option<String>,
    pub dry_run: bool,
    pub yes: bool,
}

pub async fn prune(rt: &Runtime, args: Prune) -> anyhow::Result<ExitCode> {
    let cutoff = talaria_core::unix_now() - f64::from(args.older_than) * DAY;
    let from = args
        .source
        .as_ref()
        .map(|s| format!(" from `{s}`"))
        .unwrap_or_default();
    let before = format!(
        "last active before {} ({} ago)",
        when(cutoff),
        crate::count(args.older_than as usize, "day", "days")
    );
    // First pass: what would go, listed (dry run) or counted, a page at a
    // time.
    let mut found = 0usize;
    let mut messages = 0u64;
    let mut owed = 0usize;
    let mut after: Option<String> = None;
    loop {
        let page = idle_page(rt, &args.source, cutoff, after.take()).await?;
        let Some(last) = page.last() else { break };
        after = Some(last.session.id.clone());
        let ids: Vec<String> = page.iter().map(|a| a.session.id.clone()).collect();
        let counts = rt.store.active_message_counts(&ids).await?;
        for (a, n) in page.iter().zip(&counts) {
            if a.turn_owed {
                owed += 1;
                continue;
            }
            if args.dry_run {
                if found == 0 {
                    println!("sessions{from} {before}:");
                }
                println!(
                    "{}  {}  {:>5}  {:<12}  {}",
                    a.session.id,
                    when(a.last_active),
                    n,
                    a.session.source,
                    one_line(&title(&a.session), 60)
                );
            }
            found += 1;
            messages += n;
        }
    }
    if owed > 0 {
        println!(
            "{} idle that long {} kept: a running gateway owes {} an answer",
            crate::count(owed, "session", "sessions"),
            if owed == 1 { "is" } else { "are" },
            if owed == 1 { "it" } else { "them" },
        );
    }
    if found == 0 {
        let known = rt.store.session_sources().await?;
        match &args.source {
            Some(source) if !known.iter().any(|(s, _)| s == source) => {
                println!("{}", nothing_listed(rt, Some(source)).await?);
            }
            _ => println!("no sessions{from} {before}: nothing to delete"),
        }
        return Ok(ExitCode::SUCCESS);
    }
    let summary = format!(
        "{} ({}){from} {before}",
        crate::count(found, "session", "sessions"),
        crate::count(messages as usize, "message", "messages"),
    );
    if args.dry_run {
        println!("dry run: {summary} would be deleted; nothing was changed");
        return Ok(ExitCode::SUCCESS);
    }
    if !confirm(
        &format!("Delete {summary}? This cannot be undone."),
        args.yes,
    )? {
        eprintln!("nothing deleted");
        return Ok(ExitCode::FAILURE);
    }
    // Second pass: each session is checked again as it is deleted, so
    // one used since the first pass, or with a turn running now, stays.
    let (mut deleted, mut used, mut running) = (0usize, 0usize, 0usize);
    let mut after: Option<String> = None;
    loop {
        let page = idle_page(rt, &args.source, cutoff, after.take()).await?;
        let Some(last) = page.last() else { break };
        after = Some(last.session.id.clone());
        for a in &page {
            match rt
                .store
                .delete_session_if_idle(&a.session.id, cutoff)
                .await?
            {
                IdleDeletion::Deleted => deleted += 1,
                IdleDeletion::ActiveSince(_) => used += 1,
                IdleDeletion::TurnRunning => running += 1,
                IdleDeletion::Missing => {}
            }
        }
    }
    println!("deleted {}", crate::count(deleted, "session", "sessions"));
    if used > 0 {
        println!(
            "kept {} used since the list was made",
            crate::count(used, "session", "sessions")
        );
    }
    if running > 0 {
        println!(
            "kept {} a running gateway still owes an answer",
            crate::count(running, "session", "sessions")
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// The next page of sessions from `source` idle since `cutoff`.
async fn idle_page(
    rt: &Runtime,
    source: &Option<String>,
    cutoff: f64,
    after: Option<String>,
) -> anyhow::Result<Vec<talaria_store::SessionActivity>> {
    Ok(rt
        .store
        .session_page(SessionPage {
            source: source.clone(),
            idle_before: Some(cutoff),
            after_id: after,
            limit: PRUNE_PAGE,
        })
        .await?)
}

pub async fn stats(rt: &Runtime, json: bool) -> anyhow::Result<ExitCode> {
    let stats = rt.store.session_stats().await?;
    let total = stats.total();
    if json {
        let source = |s: &talaria_store::SourceStats| {
            serde_json::json!({
                "source": s.source,
                "sessions": s.sessions,
                "messages": s.messages,
                "rows": s.rows,
                "first_started": s.first_started,
                "last_active": s.last_active,
            })
        };
        let out = serde_json::json!({
            "sources": stats.sources.iter().map(source).collect::<Vec<_>>(),
            "total": source(&total),
            "size": stats.size.as_ref().map(|size| serde_json::json!({
                "what": size.what,
                "bytes": size.bytes,
                "log_bytes": size.log_bytes,
            })),
        });
        println!("{}", serde_json::to_string_pretty(&out)?);
        return Ok(ExitCode::SUCCESS);
    }
    match &stats.size {
        Some(size) => println!(
            "database: {}, {}{}",
            size.what,
            crate::human_bytes(size.bytes),
            size.log_bytes
                .filter(|&n| n > 0)
                .map(|n| format!(" (and {} of write-ahead log)", crate::human_bytes(n)))
                .unwrap_or_default()
        ),
        None => println!("database: size unknown"),
    }
    if stats.sources.is_empty() {
        println!("No sessions yet. `talaria chat` starts one.");
        return Ok(ExitCode::SUCCESS);
    }
    let at = |t: Option<f64>| t.map_or_else(|| "-".to_owned(), when);
    let mut rows = vec![
        [
            "SOURCE",
            "SESSIONS",
            "MESSAGES",
            "ROWS STORED",
            "FIRST STARTED",
            "LAST ACTIVE",
        ]
        .map(str::to_owned)
        .to_vec(),
    ];
    for s in stats.sources.iter().chain(std::iter::once(&total)) {
        rows.push(vec![
            s.source.clone(),
            s.sessions.to_string(),
            s.messages.to_string(),
            s.rows.to_string(),
            at(s.first_started),
            at(s.last_active),
        ]);
    }
    print!("{}", crate::columns(&rows));
    println!(
        "(messages: the conversations as they stand; rows stored: with those replaced by /undo, /retry or compression)"
    );
    Ok(ExitCode::SUCCESS)
}
