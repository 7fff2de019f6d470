//! Background maintenance: the gateway's periodic chores (pruning the
//! delivery ledger, ending expired sessions, ...) as supervised tasks.
//!
//! A [`PeriodicTask`] is a name, an interval, an optional delay before its
//! first run, and a body: an async function run once per interval. Hand
//! the tasks to [`Maintenance::start`], and [`Maintenance::stop`] them when
//! the gateway stops.
//!
//! # Supervision
//!
//! Each task loops: run the body, sleep the interval, repeat.
//!
//! - A body that returns an error is logged with the task's name; the task
//!   runs again at the next interval, as if it had succeeded.
//! - A body that panics is caught (each run is its own tokio task, so a
//!   panic surfaces as a `JoinError` instead of taking the loop down),
//!   logged, and run again after a backoff of min(60 s, 2^n s) for the n-th
//!   consecutive panic, without waiting for the interval. After
//!   [`MAX_RAPID_PANICS`] consecutive panics within [`RAPID_WINDOW`] the task
//!   gives up with an error log: a chore that dies on every run is broken,
//!   and retrying it forever would only fill the log. Any run that returns,
//!   well or with an error, resets the count; a panic later than
//!   [`RAPID_WINDOW`] after the first of a streak starts a new streak.
//!
//! # Stopping
//!
//! [`Maintenance::stop`] cancels every task at once, mid-sleep included, and
//! waits for them. A body that is running then is left to finish (and
//! awaited): bodies are short, and one cut off halfway (a prune, a session
//! half-ended) would gain nothing.

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::BoxFuture;
use tokio::task::{JoinError, JoinHandle};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// Consecutive rapid panics after which a task gives up.
pub const MAX_RAPID_PANICS: u32 = 5;

/// How close together panics must come to count as one streak.
pub const RAPID_WINDOW: Duration = Duration::from_secs(600);

/// The longest wait before a panicked body runs again.
pub const MAX_BACKOFF: Duration = Duration::from_secs(60);

/// What one run of a body returns: an error is logged and the task goes
/// on.
pub type RunResult = Result<(), String>;

type Body = Arc<dyn Fn() -> BoxFuture<'static, RunResult> + Send + Sync>;

/// A chore run every `interval` until the gateway stops.
pub struct PeriodicTask {
    name: String,
    interval: Duration,
    initial_delay: Duration,
    body: Body,
}

impl PeriodicTask {
    /// A task whose first run is at once. `body` is called for each run;
    /// the future it returns is spawned, so it must own what it uses.
    pub fn new<F, Fut>(name: impl Into<String>, interval: Duration, body: F) -> PeriodicTask
    where
        F: Fn() -> Fut + Send + Sync + 'static,
        Fut: Future<Output = RunResult> + Send + 'static,
    {
        PeriodicTask {
            name: name.into(),
            interval,
            initial_delay: Duration::ZERO,
            body: Arc::new(move || Box::pin(body())),
        }
    }

    /// Delays the first run by `delay` (later runs keep the interval).
    pub fn first_run_after(mut self, delay: Duration) -> PeriodicTask {
        self.initial_delay = delay;
        self
    }
}

impl std::fmt::Debug for PeriodicTask {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PeriodicTask")
            .field("name", &self.name)
            .field("interval", &self.interval)
            .field("initial_delay", &self.initial_delay)
            .finish_non_exhaustive()
    }
}

/// How a task has been doing, for status displays.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TaskStatus {
    /// The task's name, as shown in status displays.
    pub name: String,
    /// Runs that returned (well or not); panicked runs are not counted.
    pub runs: u64,
    /// When the last run ended, panicked or not (Unix seconds).
    pub last_run_at: Option<f64>,
    /// The last run's error or panic message; `None` after a good run.
    pub last_error: Option<String>,
    /// Panics in the current streak.
    pub consecutive_panics: u32,
    /// The task stopped for good after too many rapid panics.
    pub given_up: bool,
}

/// Running maintenance tasks; stop them with [`Maintenance::stop`].
/// Dropping it without stopping leaves the tasks running until the
/// runtime ends.
pub struct Maintenance {
    stop: CancellationToken,
    tasks: Vec<(Arc<Mutex<TaskStatus>>, JoinHandle<()>)>,
}

impl Maintenance {
    /// Spawns a supervisor for each task. Must be called inside a tokio
    /// runtime.
    pub fn start(tasks: Vec<PeriodicTask>) -> Maintenance {
        let stop = CancellationToken::new();
        let tasks = tasks
            .into_iter()
            .map(|task| {
                let status = Arc::new(Mutex::new(TaskStatus {
                    name: task.name.clone(),
                    ..TaskStatus::default()
                }));
                let handle = tokio::spawn(supervise(task, status.clone(), stop.clone()));
                (status, handle)
            })
            .collect();
        Maintenance { stop, tasks }
    }

    /// Each task's status, in the order the tasks were given.
    pub fn status(&self) -> Vec<TaskStatus> {
        self.tasks.iter().map(|(status, _)| read(status)).collect()
    }

    /// Stops every task, interrupting sleeps and letting running bodies
    /// finish, and waits until all have returned.
    pub async fn stop(self) {
        self.stop.cancel();
        for (status, handle) in self.tasks {
            if let Err(e) = handle.await {
                // The supervisor itself only awaits and sleeps; if it ever
                // dies, say so rather than hide it.
                tracing::error!(task = %read(&status).name, error = %e, "maintenance supervisor died");
            }
        }
    }
}

fn read(status: &Mutex<TaskStatus>) -> TaskStatus {
    status.lock().unwrap_or_else(|p| p.into_inner()).clone()
}

fn update(status: &Mutex<TaskStatus>, change: impl FnOnce(&mut TaskStatus)) {
    change(&mut status.lock().unwrap_or_else(|p| p.into_inner()));
}

/// Sleeps `duration` unless `stop` fires first; returns whether to go on.
async fn pause(duration: Duration, stop: &CancellationToken) -> bool {
    if duration.is_zero() {
        return !stop.is_cancelled();
    }
    tokio::select! {
        _ = stop.cancelled() => false,
        _ = tokio::time::sleep(duration) => true,
    }
}

/// The wait before running again after the `n`-th consecutive panic.
fn backoff(n: u32) -> Duration {
    // 2^6 s already exceeds the cap; clamping the exponent avoids overflow.
    Duration::from_secs(1u64 << n.min(6)).min(MAX_BACKOFF)
}

/// The panic's message, when it carried text.
fn panic_message(error: JoinError) -> String {
    match error.try_into_panic() {
        Ok(payload) => payload
            .downcast_ref::<&str>()
            .map(|s| (*s).to_owned())
            .or_else(|| payload.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "panic without a message".to_owned()),
        Err(e) => e.to_string(),
    }
}

async fn supervise(task: PeriodicTask, status: Arc<Mutex<TaskStatus>>, stop: CancellationToken) {
    let name = task.name.as_str();
    if !pause(task.initial_delay, &stop).await {
        return;
    }
    let mut panics: u32 = 0;
    let mut streak_started = Instant::now();
    loop {
        // Awaited even when a stop comes meanwhile: see the module docs.
        let outcome = tokio::spawn((task.body)()).await;
        let finished = talaria_core::unix_now();
        let wait = match outcome {
            Ok(result) => {
                panics = 0;
                if let Err(e) = &result {
                    tracing::warn!(task = name, error = %e, "maintenance task failed; it runs again at the next interval");
                }
                update(&status, |s| {
                    s.runs += 1;
                    s.last_run_at = Some(finished);
                    s.last_error = result.err();
                    s.consecutive_panics = 0;
                });
                task.interval
            }
            Err(e) => {
                let now = Instant::now();
                if panics == 0 || now.duration_since(streak_started) > RAPID_WINDOW {
                    panics = 0;
                    streak_started = now;
                }
                panics += 1;
                let message = panic_message(e);
                let given_up = panics >= MAX_RAPID_PANICS;
                update(&status, |s| {
                    s.last_run_at = Some(finished);
                    s.last_error = Some(format!("panicked: {message}"));
                    s.consecutive_panics = panics;
                    s.given_up = given_up;
                });
                if given_up {
                    tracing::error!(task = name, panics, error = %message, "maintenance task keeps panicking; giving up on it until the gateway restarts");
                    return;
                }
                let wait = backoff(panics);
                tracing::error!(task = name, panics, error = %message, retry_in_secs = wait.as_secs(), "maintenance task panicked; restarting it");
                wait
            }
        };
        if !pause(wait, &stop).await {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};

    /// Runs of a body, by when they started (paused tokio time).
    #[derive(Clone, Default)]
    struct Calls(Arc<Mutex<Vec<Instant>>>);

    impl Calls {
        fn record(&self) -> usize {
            let mut calls = self.0.lock().unwrap();
            calls.push(Instant::now());
            calls.len()
        }

        fn count(&self) -> usize {
            self.0.lock().unwrap().len()
        }

        /// The time between consecutive runs, in whole seconds.
        fn gaps(&self) -> Vec<u64> {
            let calls = self.0.lock().unwrap();
            calls.windows(2).map(|w| (w[1] - w[0]).as_secs()).collect()
        }
    }

    /// Sleeps paused time in one-second steps until `done` holds, for at
    /// most `limit`.
    async fn until(limit: Duration, mut done: impl FnMut() -> bool) {
        let deadline = Instant::now() + limit;
        while !done() {
            assert!(Instant::now() < deadline, "condition not reached in time");
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    }

    #[test]
    fn backoff_doubles_up_to_a_minute() {
        let secs: Vec<u64> = (1..=8).map(|n| backoff(n).as_secs()).collect();
        assert_eq!(secs, [2, 4, 8, 16, 32, 60, 60, 60]);
        assert_eq!(backoff(u32::MAX), MAX_BACKOFF);
    }

    #[tokio::test(start_paused = true)]
    async fn runs_at_once_then_every_interval() {
        let calls = Calls::default();
        let c = calls.clone();
        let m = Maintenance::start(vec![PeriodicTask::new(
            "tick",
            Duration::from_secs(10),
            move || {
                c.record();
                async { Ok(()) }
            },
        )]);
        until(Duration::from_secs(60), || calls.count() >= 4).await;
        assert_eq!(calls.gaps()[..3], [10, 10, 10]);
        let status = &m.status()[0];
        assert_eq!(status.name, "tick");
        assert!(status.runs >= 3);
        assert!(status.last_run_at.is_some());
        assert_eq!(status.last_error, None);
        m.stop().await;
    }

    #[tokio::test(start_paused = true)]
    async fn the_first_run_waits_for_the_initial_delay() {
        let started = Instant::now();
        let calls = Calls::default();
        let c = calls.clone();
        let m = Maintenance::start(vec![
            PeriodicTask::new("late", Duration::from_secs(300), move || {
                c.record();
                async { Ok(()) }
            })
            .first_run_after(Duration::from_secs(60)),
        ]);
        until(Duration::from_secs(400), || calls.count() >= 2).await;
        let first = calls.0.lock().unwrap()[0];
        assert_eq!((first - started).as_secs(), 60);
        assert_eq!(calls.gaps(), [300]);
        m.stop().await;
    }

    #[tokio::test(start_paused = true)]
    async fn an_error_is_recorded_and_the_loop_goes_on() {
        let calls = Calls::default();
        let c = calls.clone();
        let m = Maintenance::start(vec![PeriodicTask::new(
            "flaky",
            Duration::from_secs(5),
            move || {
                let n = c.record();
                async move {
                    if n % 2 == 1 {
                        Err(format!("failure {n}"))
                    } else {
                        Ok(())
                    }
                }
            },
        )]);
        until(Duration::from_secs(30), || calls.count() >= 3).await;
        // Errors do not change the cadence: no backoff, no giving up.
        assert_eq!(calls.gaps()[..2], [5, 5]);
        let status = &m.status()[0];
        assert!(!status.given_up);
        assert_eq!(status.consecutive_panics, 0);
        assert_eq!(status.last_error.as_deref(), Some("failure 3"));
        until(Duration::from_secs(30), || calls.count() >= 4).await;
        assert_eq!(m.status()[0].last_error, None);
        m.stop().await;
    }

    #[tokio::test(start_paused = true)]
    async fn a_panicking_body_is_restarted_with_backoff_and_given_up_after_five() {
        let calls = Calls::default();
        let c = calls.clone();
        let m = Maintenance::start(vec![PeriodicTask::new(
            "doomed",
            Duration::from_secs(3600),
            move || {
                c.record();
                async { panic!("boom") }
            },
        )]);
        until(Duration::from_secs(120), || m.status()[0].given_up).await;
        assert_eq!(calls.count(), 5);
        // Restarts come after the backoff, not after the hour's interval.
        assert_eq!(calls.gaps(), [2, 4, 8, 16]);
        let status = &m.status()[0];
        assert_eq!(status.consecutive_panics, 5);
        assert_eq!(status.last_error.as_deref(), Some("panicked: boom"));
        // Given up means no more runs, however long we wait.
        tokio::time::sleep(Duration::from_secs(7200)).await;
        assert_eq!(calls.count(), 5);
        m.stop().await;
    }

    #[tokio::test(start_paused = true)]
    async fn a_good_run_resets_the_panic_count() {
        let calls = Calls::default();
        let c = calls.clone();
        // Four panics, one good run, then panics for ever.
        let m = Maintenance::start(vec![PeriodicTask::new(
            "wobbly",
            Duration::from_secs(100),
            move || {
                let n = c.record();
                async move { if n == 5 { Ok(()) } else { panic!("run {n}") } }
            },
        )]);
        until(Duration::from_secs(600), || m.status()[0].given_up).await;
        // Without the reset it would have given up at the sixth run.
        assert_eq!(calls.count(), 10);
        assert_eq!(calls.gaps(), [2, 4, 8, 16, 100, 2, 4, 8, 16]);
        m.stop().await;
    }

    #[tokio::test(start_paused = true)]
    async fn panics_far_apart_do_not_add_up() {
        let runs = Arc::new(AtomicU32::new(0));
        let r = runs.clone();
        // Every run panics after working past the rapid window, so no two
        // panics fall in one streak.
        let m = Maintenance::start(vec![PeriodicTask::new(
            "slow",
            Duration::from_secs(60),
            move || {
                r.fetch_add(1, Ordering::SeqCst);
                async {
                    tokio::time::sleep(RAPID_WINDOW + Duration::from_secs(1)).await;
                    panic!("late")
                }
            },
        )]);
        until(Duration::from_secs(601 * 8), || {
            runs.load(Ordering::SeqCst) >= 7
        })
        .await;
        let status = &m.status()[0];
        assert!(!status.given_up);
        assert_eq!(status.consecutive_panics, 1);
        m.stop().await;
    }

    #[tokio::test(start_paused = true)]
    async fn stop_interrupts_a_sleep() {
        let calls = Calls::default();
        let c = calls.clone();
        let m = Maintenance::start(vec![PeriodicTask::new(
            "hourly",
            Duration::from_secs(3600),
            move || {
                c.record();
                async { Ok(()) }
            },
        )]);
        until(Duration::from_secs(5), || calls.count() == 1).await;
        let asked = Instant::now();
        m.stop().await;
        // Paused time only moves when something waits on it: an hour's
        // sleep not interrupted would show up here as an hour.
        assert!(Instant::now() - asked < Duration::from_secs(1));
        assert_eq!(calls.count(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn stop_during_the_initial_delay_runs_nothing() {
        let calls = Calls::default();
        let c = calls.clone();
        let m = Maintenance::start(vec![
            PeriodicTask::new("never", Duration::from_secs(300), move || {
                c.record();
                async { Ok(()) }
            })
            .first_run_after(Duration::from_secs(60)),
        ]);
        tokio::time::sleep(Duration::from_secs(30)).await;
        let asked = Instant::now();
        m.stop().await;
        assert!(Instant::now() - asked < Duration::from_secs(1));
        assert_eq!(calls.count(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn stop_lets_a_running_body_finish() {
        let finished = Arc::new(AtomicU32::new(0));
        let calls = Calls::default();
        let (f, c) = (finished.clone(), calls.clone());
        let m = Maintenance::start(vec![PeriodicTask::new(
            "busy",
            Duration::from_secs(3600),
            move || {
                c.record();
                let f = f.clone();
                async move {
                    tokio::time::sleep(Duration::from_secs(10)).await;
                    f.fetch_add(1, Ordering::SeqCst);
                    Ok(())
                }
            },
        )]);
        until(Duration::from_secs(5), || calls.count() == 1).await;
        assert_eq!(finished.load(Ordering::SeqCst), 0);
        m.stop().await;
        assert_eq!(finished.load(Ordering::SeqCst), 1);
        assert_eq!(calls.count(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn tasks_are_independent() {
        let (good, bad) = (Calls::default(), Calls::default());
        let (g, b) = (good.clone(), bad.clone());
        let m = Maintenance::start(vec![
            PeriodicTask::new("good", Duration::from_secs(10), move || {
                g.record();
                async { Ok(()) }
            }),
            PeriodicTask::new("bad", Duration::from_secs(10), move || {
                b.record();
                async { panic!("nope") }
            }),
        ]);
        until(Duration::from_secs(200), || good.count() >= 10).await;
        let status = m.status();
        assert_eq!(status[0].name, "good");
        assert!(!status[0].given_up);
        assert!(status[1].given_up);
        assert_eq!(bad.count(), 5);
        m.stop().await;
    }
}
