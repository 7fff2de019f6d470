//! Streaming previews: one message that grows while the answer streams, on
//! platforms that can edit messages and where the operator turned it on.
//!
//! A preview is a courtesy, not a delivery. The final answer still goes
//! through the ledger ([`crate::delivery::Delivery::deliver_reply`]), which
//! turns the preview into the final text by editing it; if the gateway dies
//! first, the sweep sends the answer as a new message. A preview whose send
//! or edit fails simply stops growing.
//!
//! The turn's observer must return at once (it runs inside the model's
//! stream), so it only appends to a shared buffer and wakes the editor task;
//! the editor sends or edits at most once per interval, whatever the token
//! rate.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::adapter::{Adapter, MessageLimits, OutboundMessage, SendError};
use crate::delivery::Address;

/// Shown after the text while it is still growing.
const CURSOR: &str = " ▍";

/// Shown where a preview longer than one message is cut.
const ELLIPSIS: &str = "…";

/// What the observer writes and the editor reads.
#[derive(Default)]
struct Buffer {
    text: String,
    /// Bumped on every change, so the editor skips edits that change
    /// nothing.
    version: u64,
    /// The next delta replaces the text instead of extending it: a tool
    /// ran, and the model's next words are a new message.
    replace_next: bool,
}

/// The observer's side: cheap, synchronous, never waits.
#[derive(Clone)]
pub struct PreviewSink {
    buffer: Arc<Mutex<Buffer>>,
    wake: Arc<Notify>,
}

impl PreviewSink {
    /// Appends streamed answer text.
    pub fn push(&self, delta: &str) {
        if delta.is_empty() {
            return;
        }
        {
            let mut b = lock(&self.buffer);
            if b.replace_next {
                b.text.clear();
                b.replace_next = false;
            }
            b.text.push_str(delta);
            b.version += 1;
        }
        self.wake.notify_one();
    }

    /// The text so far stays visible until the model writes again, which
    /// then starts over (called when a tool starts).
    pub fn replace_on_next(&self) {
        lock(&self.buffer).replace_next = true;
    }

    /// The text so far is void (a failed attempt that is being retried).
    pub fn clear(&self) {
        let mut b = lock(&self.buffer);
        b.text.clear();
        b.replace_next = false;
        b.version += 1;
    }
}

/// A running preview: the sink for the observer and the task that edits.
pub struct Preview {
    sink: PreviewSink,
    stop: CancellationToken,
    task: JoinHandle<Option<String>>,
    adapter: Arc<dyn Adapter>,
    chat_id: String,
}

impl Preview {
    /// Starts a preview of an answer going to `to`. Nothing is sent until
    /// the model streams some text.
    pub fn start(adapter: Arc<dyn Adapter>, to: Address, interval: Duration) -> Preview {
        let sink = PreviewSink {
            buffer: Arc::default(),
            wake: Arc::default(),
        };
        let stop = CancellationToken::new();
        let task = tokio::spawn(edit_loop(
            adapter.clone(),
            to.clone(),
            sink.clone(),
            stop.clone(),
            interval,
        ));
        Preview {
            sink,
            stop,
            task,
            adapter,
            chat_id: to.chat_id,
        }
    }

    /// The handle the turn's observer writes to.
    pub fn sink(&self) -> PreviewSink {
        self.sink.clone()
    }

    /// Stops editing and returns the preview message's id, if one was sent,
    /// so the final answer can replace its text. Waits for a send or edit
    /// already on the wire, so the id is not lost to a race.
    pub async fn finish(self) -> Option<String> {
        self.stop.cancel();
        self.task.await.ok().flatten()
    }

    /// Stops editing and leaves the preview showing what streamed, followed
    /// by `note` (the turn was interrupted or failed, so no final answer
    /// will replace it).
    pub async fn abandon(self, note: &str) {
        let text = lock(&self.sink.buffer).text.clone();
        let adapter = self.adapter.clone();
        let chat_id = self.chat_id.clone();
        let Some(id) = self.finish().await else {
            return;
        };
        let body = fit(
            &format!("{}\n\n{note}", text.trim_end()),
            adapter.limits(),
            "",
        );
        if let Err(e) = adapter.finish_preview(&chat_id, &id, &body, true).await {
            tracing::debug!(error = %e, "could not mark an abandoned preview");
        }
    }
}

/// Sends the preview once there is text, then edits it as the text grows,
/// at most once per `interval`. Returns the message id when stopped.
async fn edit_loop(
    adapter: Arc<dyn Adapter>,
    to: Address,
    sink: PreviewSink,
    stop: CancellationToken,
    interval: Duration,
) -> Option<String> {
    let limits = adapter.limits();
    let mut message_id: Option<String> = None;
    let mut shown = 0;
    loop {
        tokio::select! {
            _ = stop.cancelled() => return message_id,
            _ = sink.wake.notified() => {}
        }
        let (text, version) = {
            let b = lock(&sink.buffer);
            (b.text.clone(), b.version)
        };
        if version == shown || text.trim().is_empty() {
            continue;
        }
        let body = fit(&text, limits, CURSOR);
        match &message_id {
            None => {
                let first = OutboundMessage {
                    chat_id: to.chat_id.clone(),
                    thread_id: to.thread_id.clone(),
                    reply_to: to.reply_to.clone(),
                    text: body,
                    choices: Vec::new(),
                };
                match adapter.start_preview(&first).await {
                    Ok(sent) => match sent.message_id {
                        Some(id) => message_id = Some(id),
                        None => {
                            tracing::debug!("the platform gave no id for the preview; not editing");
                            return None;
                        }
                    },
                    Err(e) => {
                        tracing::debug!(error = %e, "could not send a streaming preview");
                        return None;
                    }
                }
            }
            Some(id) => match adapter.edit(&to.chat_id, id, &body).await {
                Ok(()) | Err(SendError::RateLimited(_)) => {}
                Err(e) => {
                    // Keep the id: the final answer may still replace the
                    // text, and is sent anew if that fails too.
                    tracing::debug!(error = %e, "could not edit a streaming preview; it stops here");
                    return message_id;
                }
            },
        }
        shown = version;
        tokio::select! {
            _ = stop.cancelled() => return message_id,
            _ = tokio::time::sleep(interval) => {}
        }
        // Text that arrived during the pause was announced while nobody
        // waited; the permit `notify_one` stored makes the next wait return
        // at once.
    }
}

/// `text` followed by `suffix`, cut (with an ellipsis) so the whole fits
/// one message.
fn fit(text: &str, limits: MessageLimits, suffix: &str) -> String {
    let unit = limits.unit;
    let total = unit.measure(text) + unit.measure(suffix);
    if total <= limits.max_len {
        return format!("{text}{suffix}");
    }
    let budget = limits
        .max_len
        .saturating_sub(unit.measure(suffix) + unit.measure(ELLIPSIS));
    let mut used = 0;
    let mut cut = String::new();
    for c in text.chars() {
        let len = unit.char_len(c);
        if used + len > budget {
            break;
        }
        used += len;
        cut.push(c);
    }
    format!("{cut}{ELLIPSIS}{suffix}")
}

fn lock(buffer: &Mutex<Buffer>) -> MutexGuard<'_, Buffer> {
    buffer.lock().unwrap_or_else(|p| p.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::adapter::LengthUnit;

    #[test]
    fn fit_keeps_short_text_and_cuts_long_text_to_the_limit() {
        let limits = MessageLimits {
            max_len: 10,
            unit: LengthUnit::Chars,
        };
        assert_eq!(fit("hello", limits, CURSOR), "hello ▍");
        let cut = fit("abcdefghijklmnop", limits, CURSOR);
        assert_eq!(cut, "abcdefg… ▍");
        assert_eq!(LengthUnit::Chars.measure(&cut), 10);
        let utf16 = MessageLimits {
            max_len: 6,
            unit: LengthUnit::Utf16,
        };
        // Each emoji is two UTF-16 units.
        let cut = fit("😀😀😀😀", utf16, "");
        assert_eq!(cut, "😀😀…");
        assert!(LengthUnit::Utf16.measure(&cut) <= 6);
    }

    #[test]
    fn a_tool_call_makes_the_next_text_start_over() {
        let sink = PreviewSink {
            buffer: Arc::default(),
            wake: Arc::default(),
        };
        sink.push("Let me look. ");
        sink.replace_on_next();
        assert_eq!(lock(&sink.buffer).text, "Let me look. ");
        sink.push("Found it");
        sink.push(": 42");
        assert_eq!(lock(&sink.buffer).text, "Found it: 42");
        sink.clear();
        assert_eq!(lock(&sink.buffer).text, "");
    }
}
