//! Shared fixtures for the tool tests: a context over a temp home, a
//! scripted human, and an in-memory session store.
#![allow(dead_code)]

use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use talaria_agent::interaction::{ApprovalDecision, ApprovalRequest, ClarifyRequest, Interaction};
use talaria_agent::tools::{SessionState, ToolContext};
use talaria_core::{Config, Home, Message, Redactor, Role, Usage};
use talaria_store::{
    NewSession, SearchHit, SearchQuery, SessionFilter, SessionRecord, SessionStore, StoredMessage,
};
use tokio_util::sync::CancellationToken;

/// A human whose answers are scripted; records what it was asked.
#[derive(Default)]
pub struct Scripted {
    pub decisions: Mutex<VecDeque<ApprovalDecision>>,
    pub approvals: Mutex<Vec<ApprovalRequest>>,
    pub answer: Option<String>,
    pub questions: Mutex<Vec<ClarifyRequest>>,
    /// Sleep this long before answering an approval (to test timeouts).
    pub delay: Option<Duration>,
}

impl Scripted {
    pub fn with(decisions: &[ApprovalDecision]) -> Arc<Scripted> {
        Arc::new(Scripted {
            decisions: Mutex::new(decisions.iter().copied().collect()),
            ..Scripted::default()
        })
    }

    pub fn asked(&self) -> Vec<ApprovalRequest> {
        self.approvals.lock().unwrap().clone()
    }
}

#[async_trait]
impl Interaction for Scripted {
    async fn approve(&self, request: &ApprovalRequest) -> ApprovalDecision {
        self.approvals.lock().unwrap().push(request.clone());
        if let Some(d) = self.delay {
            tokio::time::sleep(d).await;
        }
        self.decisions
            .lock()
            .unwrap()
            .pop_front()
            .unwrap_or(ApprovalDecision::Deny)
    }

    async fn clarify(&self, request: &ClarifyRequest) -> Option<String> {
        self.questions.lock().unwrap().push(request.clone());
        self.answer.clone()
    }
}

/// A minimal in-memory store: enough for session_search's read paths.
#[derive(Default)]
pub struct MemStore {
    pub sessions: Mutex<Vec<SessionRecord>>,
    pub messages: Mutex<Vec<StoredMessage>>,
}

pub fn record(id: &str, source: &str, started_at: f64, parent: Option<&str>) -> SessionRecord {
    SessionRecord {
        id: id.into(),
        source: source.into(),
        session_key: None,
        chat_id: None,
        user_id: None,
        thread_id: None,
        title: Some(format!("title of {id}")),
        model: Some("m".into()),
        system_prompt: None,
        parent_session_id: parent.map(str::to_owned),
        started_at,
        ended_at: None,
        end_reason: None,
        message_count: 0,
        input_tokens: 0,
        output_tokens: 0,
        cache_read_tokens: 0,
        cache_write_tokens: 0,
        reasoning_tokens: 0,
        model_choice: None,
    }
}

impl MemStore {
    pub fn add_session(&self, rec: SessionRecord) {
        self.sessions.lock().unwrap().push(rec);
    }

    pub fn add_message(&self, session: &str, message: Message) -> i64 {
        let mut msgs = self.messages.lock().unwrap();
        let id = msgs.len() as i64 + 1;
        msgs.push(StoredMessage {
            id,
            session_id: session.into(),
            message,
            timestamp: id as f64,
            token_count: None,
            active: true,
        });
        id
    }
}

#[async_trait]
impl SessionStore for MemStore {
    async fn create_session(&self, s: NewSession) -> talaria_store::Result<()> {
        self.add_session(record(
            &s.id,
            &s.source,
            0.0,
            s.parent_session_id.as_deref(),
        ));
        Ok(())
    }
    async fn session(&self, id: &str) -> talaria_store::Result<Option<SessionRecord>> {
        Ok(self
            .sessions
            .lock()
            .unwrap()
            .iter()
            .find(|s| s.id == id)
            .cloned())
    }
    async fn set_title(&self, _: &str, _: &str) -> talaria_store::Result<()> {
        Ok(())
    }
    async fn set_system_prompt(&self, _: &str, _: &str) -> talaria_store::Result<()> {
        Ok(())
    }
    async fn set_model_choice(&self, _: &str, _: Option<&str>) -> talaria_store::Result<()> {
        Ok(())
    }
    async fn end_session(&self, _: &str, _: &str) -> talaria_store::Result<()> {
        Ok(())
    }
    async fn append_message(&self, session_id: &str, m: &Message) -> talaria_store::Result<i64> {
        Ok(self.add_message(session_id, m.clone()))
    }
    async fn add_usage(&self, _: &str, _: &Usage) -> talaria_store::Result<()> {
        Ok(())
    }
    async fn messages(&self, session_id: &str) -> talaria_store::Result<Vec<StoredMessage>> {
        Ok(self
            .messages
            .lock()
            .unwrap()
            .iter()
            .filter(|m| m.session_id == session_id && m.active)
            .cloned()
            .collect())
    }
    async fn message_window(
        &self,
        session_id: &str,
        around_id: i64,
        before: usize,
        after: usize,
    ) -> talaria_store::Result<Vec<StoredMessage>> {
        let all: Vec<StoredMessage> = self
            .messages
            .lock()
            .unwrap()
            .iter()
            .filter(|m| m.session_id == session_id)
            .cloned()
            .collect();
        let Some(pos) = all.iter().position(|m| m.id == around_id) else {
            return Ok(Vec::new());
        };
        let start = pos.saturating_sub(before);
        let end = (pos + after + 1).min(all.len());
        Ok(all[start..end].to_vec())
    }
    async fn replace_active(&self, _: &str, _: &[Message]) -> talaria_store::Result<()> {
        Ok(())
    }
    async fn list_sessions(&self, f: SessionFilter) -> talaria_store::Result<Vec<SessionRecord>> {
        let mut all = self.sessions.lock().unwrap().clone();
        all.sort_by(|a, b| b.started_at.total_cmp(&a.started_at));
        Ok(all
            .into_iter()
            .skip(f.offset)
            .take(f.limit.max(1))
            .collect())
    }
    async fn last_answered_session(
        &self,
        sources: &[&str],
    ) -> talaria_store::Result<Option<SessionRecord>> {
        let sessions = self.sessions.lock().unwrap();
        let messages = self.messages.lock().unwrap();
        Ok(messages
            .iter()
            .rev()
            .filter(|m| m.active && m.message.role == talaria_core::Role::Assistant)
            .find_map(|m| {
                sessions
                    .iter()
                    .find(|s| s.id == m.session_id && sources.contains(&s.source.as_str()))
            })
            .cloned())
    }
    async fn search(&self, q: SearchQuery) -> talaria_store::Result<Vec<SearchHit>> {
        let words: Vec<String> = q.text.split_whitespace().map(str::to_lowercase).collect();
        let sessions = self.sessions.lock().unwrap().clone();
        let mut hits: Vec<SearchHit> = Vec::new();
        for m in self.messages.lock().unwrap().iter() {
            if Some(&m.session_id) == q.exclude_session.as_ref()
                || hits.iter().any(|h| h.session.id == m.session_id)
            {
                continue;
            }
            let text = m.message.content.to_lowercase();
            if words.iter().all(|w| text.contains(w.as_str()))
                && let Some(s) = sessions.iter().find(|s| s.id == m.session_id)
            {
                hits.push(SearchHit {
                    session: s.clone(),
                    message_id: m.id,
                    role: m.message.role,
                    snippet: m.message.content.clone(),
                    rank: 0.0,
                });
            }
        }
        hits.truncate(q.limit);
        Ok(hits)
    }
}

/// A test environment: temp home and workdir, default config.
pub struct Env {
    pub dir: tempfile::TempDir,
    pub ctx: ToolContext,
    pub human: Arc<Scripted>,
    pub store: Arc<MemStore>,
}

impl Env {
    pub fn new() -> Env {
        Env::with(Config::default(), Scripted::with(&[]))
    }

    pub fn with(config: Config, human: Arc<Scripted>) -> Env {
        let dir = tempfile::tempdir().unwrap();
        let home = Home::at(dir.path().join("home"));
        home.ensure().unwrap();
        let workdir = dir.path().join("work");
        std::fs::create_dir_all(&workdir).unwrap();
        let store = Arc::new(MemStore::default());
        let ctx = ToolContext {
            session_id: "20260101_000000_aaaaaa".into(),
            home,
            workdir: workdir.clone(),
            config: Arc::new(config),
            store: store.clone(),
            interaction: human.clone(),
            session: Arc::new(SessionState::default()),
            redactor: Redactor::new(["super-secret-value-123".to_owned()]),
            cancel: CancellationToken::new(),
            execution: talaria_agent::Execution::local(workdir.clone()),
            tools: std::sync::Arc::new(talaria_agent::tools::Registry::new()),
            platform: None,
            progress: talaria_agent::Progress::none(),
        };
        Env {
            dir,
            ctx,
            human,
            store,
        }
    }

    pub fn work(&self) -> PathBuf {
        self.ctx.workdir.clone()
    }
}

/// Parses a tool's JSON output.
pub fn json(out: &str) -> serde_json::Value {
    serde_json::from_str(out).unwrap_or_else(|e| panic!("not JSON ({e}): {out}"))
}

pub fn user(text: &str) -> Message {
    Message::user(text)
}

pub fn assistant(text: &str) -> Message {
    Message::assistant(text)
}

pub fn is_role(m: &serde_json::Value, role: Role) -> bool {
    m["role"] == role.as_str()
}
