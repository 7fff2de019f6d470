//! The base every in-process fake server is built on.
//!
//! A fake keeps what it saw and what it will do next in a *book* of its own
//! type. [`Core`] holds that book behind a mutex together with the three
//! things every fake needs the same way:
//!
//! - **Changes.** Every change goes through [`Core::change`], whose guard
//!   wakes the waiters when it is dropped, after the lock is released. A
//!   test waiting on the book therefore cannot miss a change, and no fake
//!   has a bump of its own to forget.
//! - **The request log.** [`Core::record`] logs every request, refused and
//!   hung ones too. A fake logs a request as it arrives, before an injected
//!   failure or hang decides its answer (the WhatsApp fake, which never
//!   hangs, logs it once answered, as it always did); the waits
//!   ([`Core::wait_requests`]) count the entries that match.
//! - **Fault injection.** A [`Faults`] queue in the book holds the failures
//!   the next requests of one kind take, in order; the hang switch
//!   ([`Core::set_hang`], [`Core::held`]) keeps requests unanswered until
//!   it is cleared or the server stops.
//!
//! The server itself runs on its own thread ([`Core::serve`]) and stops
//! when the core is told to ([`Core::stop`]), which each fake does when it
//! is dropped.

use std::collections::VecDeque;
use std::fmt::Debug;
use std::net::{SocketAddr, TcpListener};
use std::ops::{Deref, DerefMut};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use axum::Router;
use tokio::sync::watch;

use crate::lock;
use crate::wait::Changes;

/// Binds 127.0.0.1 on an ephemeral port, ready for [`Core::serve`].
pub(crate) fn bind() -> std::io::Result<(TcpListener, SocketAddr)> {
    let listener = TcpListener::bind(("127.0.0.1", 0))?;
    listener.set_nonblocking(true)?;
    let addr = listener.local_addr()?;
    Ok((listener, addr))
}

/// The fake `try_start` started, or a panic naming `what` could not start
/// (no local port: a broken test environment).
#[track_caller]
pub(crate) fn started<F>(what: &str, fake: std::io::Result<F>) -> F {
    match fake {
        Ok(f) => f,
        Err(e) => panic!("cannot start {what} on 127.0.0.1: {e}"),
    }
}

/// A fake's book `B`, its log of requests `R`, its waiters, its hang
/// switch and its stop signal (see the module docs).
pub(crate) struct Core<B, R = ()> {
    book: Mutex<B>,
    log: Mutex<Vec<R>>,
    changes: Changes,
    hang: watch::Sender<bool>,
    stop: watch::Sender<bool>,
}

impl<B, R: Clone + Debug> Core<B, R> {
    /// A core starting from `book`, with an empty log, not hanging.
    pub(crate) fn new(book: B) -> Core<B, R> {
        Core {
            book: Mutex::new(book),
            log: Mutex::new(Vec::new()),
            changes: Changes::default(),
            hang: watch::channel(false).0,
            stop: watch::channel(false).0,
        }
    }

    /// Serves `app` on `listener` from its own thread until [`Self::stop`].
    pub(crate) fn serve(
        &self,
        name: &str,
        listener: TcpListener,
        app: Router,
    ) -> std::io::Result<()> {
        crate::serve_on_own_thread(name, listener, app, self.stop.subscribe())
    }

    /// The book, to look at. Nothing is woken: use [`Self::change`] to
    /// change it.
    pub(crate) fn read(&self) -> Look<'_, B> {
        Look(lock(&self.book))
    }

    /// The book, to change; the waiters wake when the guard is dropped.
    pub(crate) fn change(&self) -> Change<'_, B> {
        Change {
            guard: Some(lock(&self.book)),
            changes: &self.changes,
        }
    }

    /// The counter a server-side wait (a long poll) subscribes to.
    pub(crate) fn changes(&self) -> &Changes {
        &self.changes
    }

    /// Waits until `probe` answers from the book, and returns its answer.
    ///
    /// # Panics
    /// When `timeout` passes first; the message names `what` and shows what
    /// `seen` finds in the book then.
    pub(crate) async fn wait<T, S: Debug>(
        &self,
        what: &str,
        timeout: Duration,
        mut probe: impl FnMut(&B) -> Option<T>,
        seen: impl FnOnce(&B) -> S,
    ) -> T {
        self.changes
            .expect(
                what,
                timeout,
                || probe(&lock(&self.book)),
                || seen(&lock(&self.book)),
            )
            .await
    }

    /// Waits until the list `list` picks from the book holds at least `n`
    /// entries (`items` says what they are: "sent messages"), and returns
    /// them all.
    ///
    /// # Panics
    /// When `timeout` passes first (the message shows the list then).
    pub(crate) async fn wait_len<T: Clone + Debug>(
        &self,
        items: &str,
        n: usize,
        timeout: Duration,
        list: impl Fn(&B) -> &Vec<T>,
    ) -> Vec<T> {
        let probe = |b: &B| {
            let got = list(b);
            (got.len() >= n).then(|| got.clone())
        };
        let what = format!("{n} {items}");
        self.wait(&what, timeout, probe, |b| list(b).clone()).await
    }

    /// Logs a request and wakes the waiters.
    pub(crate) fn record(&self, request: R) {
        lock(&self.log).push(request);
        self.changes.bump();
    }

    /// Every request logged so far, in arrival order.
    pub(crate) fn requests(&self) -> Vec<R> {
        lock(&self.log).clone()
    }

    /// The logged requests `matches` accepts, in arrival order.
    pub(crate) fn requests_where(&self, matches: impl Fn(&R) -> bool) -> Vec<R> {
        lock(&self.log)
            .iter()
            .filter(|r| matches(r))
            .cloned()
            .collect()
    }

    /// Waits until at least `n` logged requests match (`items` says what
    /// they are: "send attempts"), and returns those that do.
    ///
    /// # Panics
    /// When `timeout` passes first (the message shows the matches then).
    pub(crate) async fn wait_requests(
        &self,
        items: &str,
        n: usize,
        timeout: Duration,
        matches: impl Fn(&R) -> bool,
    ) -> Vec<R> {
        self.changes
            .expect(
                &format!("{n} {items}"),
                timeout,
                || {
                    let got = self.requests_where(&matches);
                    (got.len() >= n).then_some(got)
                },
                || self.requests_where(&matches),
            )
            .await
    }

    /// Turns the hang switch on or off; turning it off releases every
    /// request [`Self::held`] keeps.
    pub(crate) fn set_hang(&self, on: bool) {
        self.hang.send_replace(on);
    }

    /// Whether the hang switch is on. A handler asks before it logs the
    /// request, so a test that sees the request and then clears the switch
    /// finds it hung.
    pub(crate) fn hanging(&self) -> bool {
        *self.hang.borrow()
    }

    /// Resolves once the hang switch is off or the server stops: how long
    /// a hung request stays unanswered.
    pub(crate) async fn held(&self) {
        let mut hang = self.hang.subscribe();
        tokio::select! {
            _ = hang.wait_for(|on| !*on) => {}
            () = self.stopped() => {}
        }
    }

    /// Stops the server: open connections and waiting requests are cut.
    pub(crate) fn stop(&self) {
        self.stop.send_replace(true);
    }

    /// Resolves once the server stops.
    pub(crate) async fn stopped(&self) {
        let mut stop = self.stop.subscribe();
        // The guard `wait_for` returns is dropped at once: it is not Send.
        let _ = stop.wait_for(|s| *s).await;
    }
}

/// The book, locked to look at (see [`Core::read`]).
pub(crate) struct Look<'a, B>(MutexGuard<'a, B>);

impl<B> Deref for Look<'_, B> {
    type Target = B;

    fn deref(&self) -> &B {
        &self.0
    }
}

/// The book, locked to change; wakes the waiters once unlocked (see
/// [`Core::change`]).
pub(crate) struct Change<'a, B> {
    /// Always `Some` until the drop takes it, to unlock before waking.
    guard: Option<MutexGuard<'a, B>>,
    changes: &'a Changes,
}

impl<B> Deref for Change<'_, B> {
    type Target = B;

    fn deref(&self) -> &B {
        match &self.guard {
            Some(g) => g,
            None => unreachable!("the guard is only taken on drop"),
        }
    }
}

impl<B> DerefMut for Change<'_, B> {
    fn deref_mut(&mut self) -> &mut B {
        match &mut self.guard {
            Some(g) => g,
            None => unreachable!("the guard is only taken on drop"),
        }
    }
}

impl<B> Drop for Change<'_, B> {
    fn drop(&mut self) {
        // Unlock first: a woken waiter locks the book at once.
        drop(self.guard.take());
        self.changes.bump();
    }
}

/// The failures the next requests of one kind take, first queued first
/// taken. Kept in the book, so a handler takes its failure under the same
/// lock as the rest of its decision.
#[derive(Debug)]
pub(crate) struct Faults<F>(VecDeque<F>);

impl<F> Default for Faults<F> {
    fn default() -> Faults<F> {
        Faults(VecDeque::new())
    }
}

impl<F> Faults<F> {
    /// Queues one failure after those already queued.
    pub(crate) fn push(&mut self, failure: F) {
        self.0.push_back(failure);
    }

    /// The next failure, if any is queued.
    pub(crate) fn take(&mut self) -> Option<F> {
        self.0.pop_front()
    }

    /// The first queued failure `applies` accepts, taken out of the queue.
    pub(crate) fn take_first(&mut self, applies: impl Fn(&F) -> bool) -> Option<F> {
        let at = self.0.iter().position(applies)?;
        self.0.remove(at)
    }

    /// How many queued failures `applies` accepts.
    pub(crate) fn count(&self, applies: impl Fn(&F) -> bool) -> usize {
        self.0.iter().filter(|f| applies(f)).count()
    }

    /// Keeps only the queued failures `keep` accepts, in their order.
    pub(crate) fn retain(&mut self, keep: impl Fn(&F) -> bool) {
        self.0.retain(|f| keep(f));
    }
}

impl Faults<()> {
    /// Replaces the queue with `n` failures: the next `n` requests fail.
    pub(crate) fn arm(&mut self, n: usize) {
        self.0 = std::iter::repeat_n((), n).collect();
    }

    /// Takes one failure, answering whether there was one.
    pub(crate) fn fire(&mut self) -> bool {
        self.take().is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Default)]
    struct Book {
        seen: Vec<u32>,
    }

    #[tokio::test]
    async fn a_change_wakes_a_waiter_and_the_log_counts_matches() {
        let core = std::sync::Arc::new(Core::<Book, &'static str>::new(Book::default()));
        let waiter = {
            let core = core.clone();
            tokio::spawn(async move {
                core.wait_len("entries", 2, Duration::from_secs(5), |b| &b.seen)
                    .await
            })
        };
        core.change().seen.push(1);
        core.change().seen.push(2);
        assert_eq!(waiter.await.ok(), Some(vec![1, 2]));

        core.record("send");
        core.record("poll");
        core.record("send");
        let sends = core
            .wait_requests("sends", 2, Duration::from_secs(5), |r| *r == "send")
            .await;
        assert_eq!(sends, vec!["send", "send"]);
        assert_eq!(core.requests().len(), 3);
    }

    #[tokio::test]
    #[should_panic(expected = "waited")]
    async fn a_wait_that_never_comes_true_panics() {
        let core = Core::<Book>::new(Book::default());
        core.wait_len("entries", 1, Duration::from_millis(50), |b| &b.seen)
            .await;
    }

    #[tokio::test]
    async fn a_held_request_is_released_by_the_switch_or_the_stop() {
        let core = std::sync::Arc::new(Core::<Book>::new(Book::default()));
        core.set_hang(true);
        assert!(core.hanging());
        let mut held = Box::pin(core.held());
        // Polled once: it looked at the switch and is parked on it, so only
        // a change can end it (no wait for it to show it is stuck).
        tokio::select! {
            biased;
            () = &mut held => panic!("a held request went through with the switch on"),
            () = std::future::ready(()) => {}
        }
        core.set_hang(false);
        assert!(
            tokio::time::timeout(Duration::from_secs(5), held)
                .await
                .is_ok()
        );

        core.set_hang(true);
        let held = {
            let core = core.clone();
            tokio::spawn(async move { core.held().await })
        };
        core.stop();
        assert!(
            tokio::time::timeout(Duration::from_secs(5), held)
                .await
                .is_ok()
        );
    }

    #[test]
    fn faults_are_taken_in_order() {
        let mut f = Faults::default();
        f.push(("/a", 1));
        f.push(("/b", 2));
        f.push(("/a", 3));
        assert_eq!(f.take_first(|(p, _)| *p == "/b"), Some(("/b", 2)));
        assert_eq!(f.take(), Some(("/a", 1)));
        assert_eq!(f.take(), Some(("/a", 3)));
        assert_eq!(f.take(), None);

        let mut n = Faults::default();
        n.arm(2);
        assert!(n.fire());
        assert!(n.fire());
        assert!(!n.fire());
    }
}
