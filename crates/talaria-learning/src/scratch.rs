//! A session store in memory, for the background review: its turns run
//! like any other, but nothing of them reaches `state.db`, so reviews never
//! show up in session lists or searches. It holds one review's session and
//! is dropped with it.

use std::sync::Mutex;

use async_trait::async_trait;
use talaria_core::{Message, Usage};
use talaria_store::{
    NewSession, Result, SearchHit, SearchQuery, SessionFilter, SessionRecord, SessionStore,
    StoreError, StoredMessage,
};

#[derive(Default)]
struct Inner {
    sessions: Vec<SessionRecord>,
    messages: Vec<StoredMessage>,
}

/// Sessions and messages kept in memory.
#[derive(Default)]
pub struct ScratchStore {
    inner: Mutex<Inner>,
    /// The real store and session that pay for the model calls: the
    /// review's cost is the reviewed conversation's, and counts against
    /// its budgets.
    billed_to: Option<(std::sync::Arc<dyn SessionStore>, String)>,
}

impl ScratchStore {
    /// A scratch store whose model calls are recorded (as `review` calls)
    /// on `session_id` in `store`, and whose spend is `store`'s.
    pub fn billed_to(store: std::sync::Arc<dyn SessionStore>, session_id: &str) -> ScratchStore {
        ScratchStore {
            inner: Mutex::default(),
            billed_to: Some((store, session_id.to_owned())),
        }
    }

    /// Records `calls` on the paying session, if there is one.
    async fn bill(&self, calls: &[talaria_store::ModelCall]) -> Result<()> {
        let Some((store, session)) = &self.billed_to else {
            return Ok(());
        };
        let calls: Vec<talaria_store::ModelCall> = calls
            .iter()
            .map(|c| talaria_store::ModelCall {
                kind: "review".to_owned(),
                starts_turn: false,
                ..c.clone()
            })
            .collect();
        store.add_calls(session, &calls).await
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Changes the session `id`, which must exist.
    fn change(&self, id: &str, f: impl FnOnce(&mut SessionRecord)) -> Result<()> {
        let mut inner = self.lock();
        let record = inner
            .sessions
            .iter_mut()
            .find(|r| r.id == id)
            .ok_or_else(|| missing(id))?;
        f(record);
        Ok(())
    }
}

fn missing(id: &str) -> StoreError {
    StoreError::NoSuchSession(id.to_owned())
}

#[async_trait]
impl SessionStore for ScratchStore {
    async fn create_session(&self, s: NewSession) -> Result<()> {
        let mut inner = self.lock();
        if inner.sessions.iter().any(|r| r.id == s.id) {
            return Err(StoreError::Conflict(format!("session {} exists", s.id)));
        }
        inner.sessions.push(SessionRecord {
            id: s.id,
            source: s.source,
            session_key: s.session_key,
            chat_id: s.chat_id,
            user_id: s.user_id,
            thread_id: s.thread_id,
            title: None,
            model: s.model,
            system_prompt: s.system_prompt,
            parent_session_id: s.parent_session_id,
            started_at: talaria_core::unix_now(),
            ended_at: None,
            end_reason: None,
            message_count: 0,
            input_tokens: 0,
            output_tokens: 0,
            cache_read_tokens: 0,
            cache_write_tokens: 0,
            reasoning_tokens: 0,
            model_choice: None,
        });
        Ok(())
    }

    async fn session(&self, id: &str) -> Result<Option<SessionRecord>> {
        Ok(self.lock().sessions.iter().find(|r| r.id == id).cloned())
    }

    async fn set_title(&self, id: &str, title: &str) -> Result<()> {
        self.change(id, |r| {
            r.title = Some(title.to_owned());
        })
    }

    async fn set_system_prompt(&self, id: &str, prompt: &str) -> Result<()> {
        self.change(id, |r| {
            r.system_prompt = Some(prompt.to_owned());
        })
    }

    async fn set_model_choice(&self, id: &str, choice: Option<&str>) -> Result<()> {
        self.change(id, |r| {
            r.model_choice = choice.map(str::to_owned);
        })
    }

    async fn end_session(&self, id: &str, reason: &str) -> Result<()> {
        self.change(id, |r| {
            r.ended_at = Some(talaria_core::unix_now());
            r.end_reason = Some(reason.to_owned());
        })
    }

    async fn append_message(&self, session_id: &str, message: &Message) -> Result<i64> {
        let mut inner = self.lock();
        let r = inner
            .sessions
            .iter_mut()
            .find(|r| r.id == session_id)
            .ok_or_else(|| missing(session_id))?;
        r.message_count += 1;
        let id = inner.messages.len() as i64 + 1;
        inner.messages.push(StoredMessage {
            id,
            session_id: session_id.to_owned(),
            message: message.clone(),
            timestamp: talaria_core::unix_now(),
            token_count: None,
            active: true,
        });
        Ok(id)
    }

    async fn add_usage(&self, session_id: &str, usage: &Usage) -> Result<()> {
        self.change(session_id, |r| {
            r.input_tokens += usage.input_tokens;
            r.output_tokens += usage.output_tokens;
        })
    }

    async fn add_calls(&self, session_id: &str, calls: &[talaria_store::ModelCall]) -> Result<()> {
        self.add_usage(session_id, &talaria_store::ModelCall::total_usage(calls))
            .await?;
        self.bill(calls).await
    }

    async fn append_message_with_calls(
        &self,
        session_id: &str,
        message: &Message,
        calls: &[talaria_store::ModelCall],
    ) -> Result<i64> {
        let row = self.append_message(session_id, message).await?;
        self.add_calls(session_id, calls).await?;
        Ok(row)
    }

    async fn spend_since(&self, since: f64, scope: &talaria_store::SpendScope) -> Result<u64> {
        match &self.billed_to {
            Some((store, _)) => store.spend_since(since, scope).await,
            None => Ok(0),
        }
    }

    async fn messages(&self, session_id: &str) -> Result<Vec<StoredMessage>> {
        Ok(self
            .lock()
            .messages
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
    ) -> Result<Vec<StoredMessage>> {
        let all: Vec<StoredMessage> = self
            .lock()
            .messages
            .iter()
            .filter(|m| m.session_id == session_id)
            .cloned()
            .collect();
        let at = all.iter().position(|m| m.id == around_id).unwrap_or(0);
        let start = at.saturating_sub(before);
        let end = (at + after + 1).min(all.len());
        Ok(all[start..end].to_vec())
    }

    async fn replace_active(&self, session_id: &str, replacement: &[Message]) -> Result<()> {
        {
            let mut inner = self.lock();
            for m in inner
                .messages
                .iter_mut()
                .filter(|m| m.session_id == session_id)
            {
                m.active = false;
            }
        }
        for message in replacement {
            self.append_message(session_id, message).await?;
        }
        Ok(())
    }

    async fn list_sessions(&self, filter: SessionFilter) -> Result<Vec<SessionRecord>> {
        let mut out: Vec<SessionRecord> = self
            .lock()
            .sessions
            .iter()
            .filter(|r| filter.source.as_ref().is_none_or(|s| &r.source == s))
            .cloned()
            .collect();
        out.reverse();
        Ok(out)
    }

    async fn last_answered_session(&self, sources: &[&str]) -> Result<Option<SessionRecord>> {
        let inner = self.lock();
        let answered = inner
            .messages
            .iter()
            .rev()
            .filter(|m| m.active && m.message.role == talaria_core::Role::Assistant)
            .find_map(|m| {
                inner
                    .sessions
                    .iter()
                    .find(|r| r.id == m.session_id && sources.contains(&r.source.as_str()))
            });
        Ok(answered.cloned())
    }

    async fn search(&self, _query: SearchQuery) -> Result<Vec<SearchHit>> {
        // A review has no past to search.
        Ok(Vec::new())
    }

    /// The paying store's: what a review saves to memory or to a skill
    /// reaches every node, like any other write.
    fn shared_files(&self) -> Option<&dyn talaria_store::SharedFileStore> {
        self.billed_to
            .as_ref()
            .and_then(|(store, _)| store.shared_files())
    }
}
