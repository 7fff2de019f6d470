//! `talaria sessions list | show | search`.

use std::process::ExitCode;

use talaria_core::Role;
use talaria_store::{SearchQuery, SessionFilter, SessionRecord};

use crate::runtime::Runtime;

/// A stored timestamp as local `YYYY-MM-DD HH:MM`, for listings.
pub(crate) fn when(ts: f64) -> String {
    chrono::DateTime::from_timestamp(ts as i64, 0)
        .map(|t| {
            t.with_timezone(&chrono::Local)
                .format("%Y-%m-%d %H:%M")
                .to_string()
        })
        .unwrap_or_else(|| "?".to_owned())
}

fn one_line(text: &str, max: usize) -> String {
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

fn title(s: &SessionRecord) -> String {
    s.title.clone().unwrap_or_else(|| "(untitled)".to_owned())
}

pub async fn list(rt: &Runtime, limit: usize, source: Option<String>) -> anyhow::Result<ExitCode> {
    let sessions = rt
        .store
        .list_sessions(SessionFilter {
            source,
            limit,
            ..SessionFilter::default()
        })
        .await?;
    if sessions.is_empty() {
        println!("no sessions yet");
    }
    for s in sessions {
        println!(
            "{}  {}  {:>4} msgs  {:<8} {}",
            s.id,
            when(s.started_at),
            s.message_count,
            s.source,
            one_line(&title(&s), 60)
        );
    }
    Ok(ExitCode::SUCCESS)
}

pub async fn show(rt: &Runtime, id: &str) -> anyhow::Result<ExitCode> {
    let Some(session) = rt.store.session(id).await? else {
        eprintln!("no session `{id}` (see `talaria sessions list`)");
        return Ok(ExitCode::FAILURE);
    };
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
