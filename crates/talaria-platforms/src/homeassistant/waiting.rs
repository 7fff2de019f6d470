//! The requests waiting for their answer, the answers given (for retries),
//! and the parts of split answers being put back together.
//!
//! A conversation request is keyed by its chat and its message id (the
//! body's `id`, the `Idempotency-Key`, or one minted): the runner anchors
//! the first part of every message it sends for that event with
//! `reply_to` = that id, so an answer finds its request exactly, even when
//! two requests of one conversation overlap. Later parts carry no
//! `reply_to`; they belong to the split answer open in the same chat.
//!
//! Everything here is bounded: at most [`MAX_WAITING`] requests wait at
//! once, at most [`MAX_REMEMBERED`] finished ones are remembered, and at
//! most [`MAX_ASSEMBLING`] chats have a split answer open.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;

use tokio::sync::watch;
use tokio::time::Instant;

/// Requests waiting at once; more are refused (503) rather than queued.
pub const MAX_WAITING: usize = 64;
/// Finished requests whose answer a retry gets again.
pub const MAX_REMEMBERED: usize = 256;
/// Chats with a split answer being collected.
const MAX_ASSEMBLING: usize = 256;

/// A request's key: its chat and its message id.
pub type Key = (String, String);

/// Where a request stands.
#[derive(Debug, Clone)]
pub enum Standing {
    /// Waiting for its answer until `deadline`; `answer` turns `Some`.
    Running {
        answer: watch::Receiver<Option<String>>,
        deadline: Instant,
    },
    /// Answered with this text.
    Done(String),
    /// Nobody waited any more when the answer came (or will come): it goes
    /// (or went) to a notification.
    TimedOut,
}

/// What [`Waiting::begin`] found.
#[derive(Debug)]
pub enum Begun {
    /// A new request: submit its event, then wait on the receiver.
    New {
        answer: watch::Receiver<Option<String>>,
        deadline: Instant,
    },
    /// A retry of a request seen before.
    Seen(Standing),
    /// Too many requests are waiting.
    Full,
}

/// One split answer being collected.
#[derive(Debug)]
struct Assembly {
    reply_to: Option<String>,
    total: usize,
    parts: Vec<String>,
}

#[derive(Default)]
struct Book {
    /// The senders of the requests still waiting.
    senders: HashMap<Key, watch::Sender<Option<String>>>,
    /// Every request remembered, running or finished.
    requests: HashMap<Key, Standing>,
    /// Finished keys, oldest first, for eviction.
    finished: VecDeque<Key>,
    /// Per chat, the split answer being collected.
    assembling: HashMap<String, Assembly>,
    /// Chats in `assembling`, oldest first.
    assembling_order: VecDeque<String>,
}

/// The shared state (see the module docs).
#[derive(Default)]
pub struct Waiting {
    book: Mutex<Book>,
}

/// What a sent part amounts to.
#[derive(Debug, PartialEq, Eq)]
pub enum Part {
    /// More parts are to come; nothing to do yet.
    Collected,
    /// A whole message for this chat, answering `reply_to` if given;
    /// `assembled` when it was joined from the chat's open split answer
    /// (which [`Waiting::close`] or [`Waiting::reopen_last`] then settles).
    Whole {
        reply_to: Option<String>,
        text: String,
        assembled: bool,
    },
}

impl Waiting {
    fn book(&self) -> std::sync::MutexGuard<'_, Book> {
        self.book.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Registers a request, or says what became of it when it was seen.
    pub fn begin(&self, key: &Key, deadline: Instant) -> Begun {
        let mut book = self.book();
        if let Some(standing) = book.requests.get(key) {
            return Begun::Seen(standing.clone());
        }
        if book.senders.len() >= MAX_WAITING {
            book.forget_abandoned();
        }
        if book.senders.len() >= MAX_WAITING {
            return Begun::Full;
        }
        let (tx, rx) = watch::channel(None);
        book.senders.insert(key.clone(), tx);
        book.requests.insert(
            key.clone(),
            Standing::Running {
                answer: rx.clone(),
                deadline,
            },
        );
        Begun::New {
            answer: rx,
            deadline,
        }
    }

    /// Forgets a request whose event the gateway did not take, so its
    /// retry starts afresh.
    pub fn abandon(&self, key: &Key) {
        let mut book = self.book();
        book.senders.remove(key);
        book.requests.remove(key);
    }

    /// Stops waiting for `key`: its answer, when it comes, goes to a
    /// notification. Returns the answer when it came meanwhile.
    pub fn time_out(&self, key: &Key) -> Option<String> {
        let mut book = self.book();
        if let Some(Standing::Done(text)) = book.requests.get(key) {
            return Some(text.clone());
        }
        if book.senders.remove(key).is_some() {
            book.finish(key.clone(), Standing::TimedOut);
        }
        None
    }

    /// Hands `text` to the request `(chat, reply_to)` if it waits; `false`
    /// when none does.
    pub fn answer(&self, chat: &str, reply_to: Option<&str>, text: &str) -> bool {
        let Some(reply_to) = reply_to else {
            return false;
        };
        let key = (chat.to_owned(), reply_to.to_owned());
        let mut book = self.book();
        let Some(tx) = book.senders.remove(&key) else {
            return false;
        };
        if !has_listeners(&tx) {
            // Home Assistant hung up (its own timeout): nobody would read
            // the answer here.
            book.finish(key, Standing::TimedOut);
            return false;
        }
        let _ = tx.send(Some(text.to_owned()));
        book.finish(key, Standing::Done(text.to_owned()));
        true
    }

    /// Takes one sent part: `number` is what
    /// [`talaria_adapter::split::part_number`] read from it.
    pub fn part(
        &self,
        chat: &str,
        reply_to: Option<&str>,
        text: &str,
        number: Option<(usize, usize)>,
    ) -> Part {
        let mut book = self.book();
        match number {
            None => Part::Whole {
                reply_to: reply_to.map(str::to_owned),
                text: text.to_owned(),
                assembled: false,
            },
            // A first part starts a new answer in this chat; one left open
            // (a retried reply starts again from its first part) is dropped.
            Some((1, total)) => {
                book.open(
                    chat,
                    Assembly {
                        reply_to: reply_to.map(str::to_owned),
                        total,
                        parts: vec![text.to_owned()],
                    },
                );
                Part::Collected
            }
            Some((i, total)) => {
                let fits = book
                    .assembling
                    .get(chat)
                    .is_some_and(|a| a.total == total && a.parts.len() + 1 == i);
                if !fits {
                    // A stray part (its first part went elsewhere): passed
                    // on alone rather than lost.
                    return Part::Whole {
                        reply_to: None,
                        text: text.to_owned(),
                        assembled: false,
                    };
                }
                let Some(assembly) = book.assembling.get_mut(chat) else {
                    return Part::Collected;
                };
                assembly.parts.push(text.to_owned());
                if i < total {
                    return Part::Collected;
                }
                let joined = talaria_adapter::split::join_parts(&assembly.parts)
                    .unwrap_or_else(|| assembly.parts.concat());
                Part::Whole {
                    reply_to: assembly.reply_to.clone(),
                    text: joined,
                    assembled: true,
                }
            }
        }
    }

    /// The whole message of a chat's split answer was passed on: forget it.
    pub fn close(&self, chat: &str) {
        let mut book = self.book();
        book.assembling.remove(chat);
        book.assembling_order.retain(|c| c != chat);
    }

    /// Passing the whole message on failed: the last part will be sent
    /// again (the gateway retries it), so it is taken back.
    pub fn reopen_last(&self, chat: &str) {
        if let Some(a) = self.book().assembling.get_mut(chat) {
            a.parts.pop();
        }
    }
}

/// Whether a request handler still holds a receiver: the book keeps one
/// of its own (in [`Standing::Running`], for retries to clone).
fn has_listeners(tx: &watch::Sender<Option<String>>) -> bool {
    tx.receiver_count() > 1
}

impl Book {
    /// Stops waiting for requests whose callers all went away, so they
    /// neither hold a place nor swallow their answer.
    fn forget_abandoned(&mut self) {
        let gone: Vec<Key> = self
            .senders
            .iter()
            .filter(|(_, tx)| !has_listeners(tx))
            .map(|(k, _)| k.clone())
            .collect();
        for key in gone {
            self.senders.remove(&key);
            self.finish(key, Standing::TimedOut);
        }
    }

    fn finish(&mut self, key: Key, standing: Standing) {
        self.requests.insert(key.clone(), standing);
        self.finished.push_back(key);
        while self.finished.len() > MAX_REMEMBERED {
            if let Some(old) = self.finished.pop_front() {
                self.requests.remove(&old);
            }
        }
    }

    fn open(&mut self, chat: &str, assembly: Assembly) {
        if self.assembling.insert(chat.to_owned(), assembly).is_none() {
            self.assembling_order.push_back(chat.to_owned());
        }
        while self.assembling_order.len() > MAX_ASSEMBLING {
            if let Some(old) = self.assembling_order.pop_front() {
                self.assembling.remove(&old);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn key(chat: &str, id: &str) -> Key {
        (chat.to_owned(), id.to_owned())
    }

    fn later() -> Instant {
        Instant::now() + Duration::from_secs(60)
    }

    #[test]
    fn an_answer_finds_its_request_and_is_remembered() {
        let w = Waiting::default();
        let Begun::New { answer, .. } = w.begin(&key("c", "m1"), later()) else {
            panic!("new")
        };
        assert!(!w.answer("c", Some("other"), "no"));
        assert!(!w.answer("c", None, "no"));
        assert!(w.answer("c", Some("m1"), "yes"));
        assert_eq!(answer.borrow().as_deref(), Some("yes"));
        assert!(matches!(
            w.begin(&key("c", "m1"), later()),
            Begun::Seen(Standing::Done(t)) if t == "yes"
        ));
        // Only once: a second message for the same event goes elsewhere.
        assert!(!w.answer("c", Some("m1"), "again"));
    }

    #[test]
    fn a_timed_out_request_takes_no_answer() {
        let w = Waiting::default();
        let k = key("c", "m");
        let Begun::New { answer: _held, .. } = w.begin(&k, later()) else {
            panic!("new")
        };
        assert_eq!(w.time_out(&k), None);
        assert!(!w.answer("c", Some("m"), "late"));
        assert!(matches!(
            w.begin(&k, later()),
            Begun::Seen(Standing::TimedOut)
        ));
        w.abandon(&k);
        assert!(matches!(w.begin(&k, later()), Begun::New { .. }));
    }

    #[test]
    fn waiting_is_bounded() {
        let w = Waiting::default();
        let mut held = Vec::new();
        for i in 0..MAX_WAITING {
            let Begun::New { answer, .. } = w.begin(&key("c", &i.to_string()), later()) else {
                panic!("new")
            };
            held.push(answer);
        }
        assert!(matches!(w.begin(&key("c", "x"), later()), Begun::Full));
        // A caller that went away frees its place, and its answer is for
        // nobody here.
        held.pop();
        assert!(matches!(
            w.begin(&key("c", "x"), later()),
            Begun::New { .. }
        ));
        assert!(!w.answer("c", Some(&(MAX_WAITING - 1).to_string()), "late"));
        for i in 0..MAX_REMEMBERED + 10 {
            let k = key("d", &format!("f{i}"));
            w.book().senders.clear();
            let Begun::New { answer: _held, .. } = w.begin(&k, later()) else {
                panic!("new")
            };
            assert!(w.answer("d", Some(&format!("f{i}")), "a"));
        }
        assert!(w.book().requests.len() <= MAX_REMEMBERED + MAX_WAITING);
    }

    #[test]
    fn split_parts_come_back_whole() {
        let text = "word ".repeat(60);
        let limits = talaria_adapter::MessageLimits {
            max_len: 50,
            unit: talaria_adapter::LengthUnit::Chars,
        };
        let parts = talaria_adapter::split::split_message(&text, limits);
        assert!(parts.len() > 2);
        let w = Waiting::default();
        let mut result = None;
        for (i, p) in parts.iter().enumerate() {
            let reply_to = (i == 0).then_some("m");
            let got = w.part("c", reply_to, p, talaria_adapter::split::part_number(p));
            if i + 1 < parts.len() {
                assert_eq!(got, Part::Collected);
            } else {
                result = Some(got);
            }
        }
        assert_eq!(
            result,
            Some(Part::Whole {
                reply_to: Some("m".into()),
                text: text.clone(),
                assembled: true,
            })
        );
        // A stray later part passes alone.
        w.close("c");
        assert!(matches!(
            w.part("c", None, &parts[1], Some((2, parts.len()))),
            Part::Whole {
                reply_to: None,
                assembled: false,
                ..
            }
        ));
    }
}
