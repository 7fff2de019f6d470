//! The turn's tool batches: running the planned calls (parallel-safe
//! ones together), spilling oversized output, and storing a result row
//! for every call in the order the model listed them.

use std::collections::HashMap;

use futures::StreamExt;
use talaria_core::{Message, ToolCall};

use super::TurnRun;
use crate::dispatch::{self, Action, Planned};
use crate::error::AgentError;
use crate::spill;
use crate::tools::ToolContext;

/// How one tool call of a batch ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Status {
    Ok,
    Error,
    /// Never started because of the interrupt.
    Skipped,
}

/// A call's result text and how it ended.
type Done = (String, Status);

impl TurnRun<'_> {
    /// Runs one batch of tool calls and stores a result row for every call,
    /// in the order the model listed them.
    pub(super) async fn run_tools(&mut self, calls: &[ToolCall]) -> Result<(), AgentError> {
        let parts = self.parts;
        let plan = dispatch::plan(calls, &self.registry);
        let ctx = ToolContext {
            session_id: self.session.id.clone(),
            home: parts.home.clone(),
            workdir: parts.workdir.clone(),
            config: parts.config.clone(),
            store: parts.store.clone(),
            interaction: self.interaction.clone(),
            session: self.session.state.clone(),
            redactor: parts.redactor.clone(),
            cancel: self.cancel.clone(),
            execution: self.execution.clone(),
            tools: self.registry.clone(),
            platform: self.platform.clone(),
            progress: crate::observer::Progress::none(),
        };
        let mut results: HashMap<usize, Done> = HashMap::new();
        for group in dispatch::groups(&plan) {
            if group.len() == 1 {
                if let Some(&i) = group.first() {
                    let done = self.run_planned(&plan, i, &ctx, &results).await;
                    self.store_result(&plan[i].call, &done).await?;
                    results.insert(i, done);
                }
                continue;
            }
            // Parallel group: start up to MAX_PARALLEL at once, then store the
            // results in call order.
            let this = &*self;
            let finished: Vec<(usize, Done)> = futures::stream::iter(group.iter().copied())
                .filter(|i| std::future::ready(matches!(plan[*i].action, Action::Run { .. })))
                .map(|i| {
                    let ctx = &ctx;
                    let plan = &plan;
                    let results = &results;
                    async move { (i, this.run_planned(plan, i, ctx, results).await) }
                })
                .buffer_unordered(dispatch::MAX_PARALLEL)
                .collect()
                .await;
            results.extend(finished);
            for i in group {
                let done = match results.get(&i) {
                    Some(done) => done.clone(),
                    None => self.run_planned(&plan, i, &ctx, &results).await,
                };
                self.store_result(&plan[i].call, &done).await?;
                results.insert(i, done);
            }
        }
        Ok(())
    }

    /// The result of plan entry `i`: executes it, answers it directly, or
    /// copies its twin's. Entries reached after the interrupt are skipped.
    async fn run_planned(
        &self,
        plan: &[Planned],
        i: usize,
        ctx: &ToolContext,
        results: &HashMap<usize, Done>,
    ) -> Done {
        let entry = &plan[i];
        let name = &entry.call.name;
        match &entry.action {
            Action::Duplicate(first) => {
                if let Some(done) = results.get(first) {
                    return done.clone();
                }
                (dispatch::skipped(name), Status::Skipped)
            }
            _ if self.cancel.is_cancelled() => (dispatch::skipped(name), Status::Skipped),
            Action::Immediate(text) => {
                self.observer.tool_started(name, &entry.call.arguments);
                (text.clone(), Status::Error)
            }
            Action::Run {
                tool,
                args,
                repaired_from,
            } => {
                tracing::debug!(session = %self.session.id, tool = %name, "tool call");
                self.observer.tool_started(name, &entry.call.arguments);
                // Lines the call reports while it runs reach the observer
                // from here: the observer is borrowed for the turn, the
                // call's context is owned.
                let (tx, mut rx) = tokio::sync::mpsc::channel::<String>(64);
                let mut ctx = ctx.clone();
                ctx.progress = crate::observer::Progress::to(tx);
                let call = dispatch::execute(tool.clone(), args.clone(), ctx);
                tokio::pin!(call);
                let (output, ok) = loop {
                    tokio::select! {
                        done = &mut call => break done,
                        Some(line) = rx.recv() => self.observer.progress(&line),
                    }
                };
                while let Ok(line) = rx.try_recv() {
                    self.observer.progress(&line);
                }
                let status = if ok { Status::Ok } else { Status::Error };
                let output = self.spill(&entry.call, output).await;
                let output = match repaired_from {
                    Some(written) => dispatch::repaired_note(written, tool.name(), &output),
                    None => output,
                };
                (output, status)
            }
        }
    }

    /// Replaces oversized output with a preview and a file path.
    async fn spill(&self, call: &ToolCall, output: String) -> String {
        let parts = &self.parts;
        let max = parts.config.agent.tool_output_max_chars;
        // Byte length bounds the character count from above: skip the work
        // for the common small result.
        if output.len() <= max {
            return output;
        }
        let home = parts.home.clone();
        let session_id = self.session.id.clone();
        let call_id = call.id.clone();
        let fallback: String = output.chars().take(max).collect();
        tokio::task::spawn_blocking(move || {
            spill::spill_if_large(&home, &session_id, &call_id, output, max)
        })
        .await
        .unwrap_or(fallback)
    }

    async fn store_result(
        &mut self,
        call: &ToolCall,
        (content, status): &Done,
    ) -> Result<(), AgentError> {
        tracing::debug!(
            session = %self.session.id,
            tool = %call.name,
            status = ?status,
            result_chars = content.chars().count(),
            "tool call finished"
        );
        if *status != Status::Skipped {
            self.observer
                .tool_finished(&call.name, *status == Status::Ok, &preview(content, 200));
            // The name is the model's: one it made up counts as `unknown`,
            // so the metric's labels stay the registry's tools.
            let tool = if self.registry.get(&call.name).is_some() {
                call.name.as_str()
            } else {
                "unknown"
            };
            talaria_core::metrics::tool_finished(tool, *status == Status::Ok);
        }
        self.persist(Message::tool_result(&call.id, &call.name, content.as_str()))
            .await
    }
}

/// The first `max` characters of `text`, on one line.
fn preview(text: &str, max: usize) -> String {
    text.chars()
        .take(max)
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect()
}
