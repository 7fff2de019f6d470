//! A connector's resume state kept in the store ([`CursorStore`]), for the
//! adapters whose position changes with every event (a socket's sequence
//! number): read when a process starts its connection, written when it
//! changed but at most once per interval, so a busy connection costs a
//! write a second, not one per event.
//!
//! The owner counts its changes in a revision that only grows; what was
//! last written is remembered by that number, so asking whether a write is
//! due costs no serializing. A value that cannot be read or written is
//! logged and otherwise ignored: the worst it costs is events replayed
//! after a restart, which the gateway's inbound dedupe absorbs.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use talaria_store::CursorStore;
use tokio::time::Instant;

/// How long one read or write may take before it is given up (a store
/// that hangs must not hold a connection's event loop).
const STORE_WAIT: Duration = Duration::from_secs(5);

/// What was last written under one name.
#[derive(Debug, Clone, Copy, Default)]
struct Written {
    /// The owner's revision the store holds.
    revision: u64,
    /// When it was written; `None` when read, never written.
    at: Option<Instant>,
}

/// Values of one platform in the store, written at most once per `every`
/// each (see the module docs).
pub(crate) struct Kept {
    store: Arc<dyn CursorStore>,
    platform: &'static str,
    every: Duration,
    written: Mutex<HashMap<String, Written>>,
}

impl fmt::Debug for Kept {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Kept")
            .field("platform", &self.platform)
            .field("every", &self.every)
            .finish_non_exhaustive()
    }
}

impl Kept {
    /// Values under `platform` in `store`, each written at most once per
    /// `every`.
    pub(crate) fn new(
        store: Arc<dyn CursorStore>,
        platform: &'static str,
        every: Duration,
    ) -> Kept {
        Kept {
            store,
            platform,
            every,
            written: Mutex::new(HashMap::new()),
        }
    }

    fn written(&self) -> std::sync::MutexGuard<'_, HashMap<String, Written>> {
        self.written.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The value stored under `name`; `None` when there is none or it
    /// cannot be read (logged).
    pub(crate) async fn read(&self, name: &str) -> Option<String> {
        let read = tokio::time::timeout(STORE_WAIT, self.store.cursor(self.platform, name)).await;
        match read {
            Ok(Ok(value)) => value,
            Ok(Err(e)) => {
                tracing::warn!(platform = self.platform, error = %e, "cannot read the stored resume state");
                None
            }
            Err(_) => {
                tracing::warn!(
                    platform = self.platform,
                    "reading the stored resume state took too long"
                );
                None
            }
        }
    }

    /// Notes that the store holds the owner's `revision` under `name`
    /// (what was just read, taken as is), so it is not written back.
    pub(crate) fn holds(&self, name: &str, revision: u64) {
        self.written()
            .insert(name.to_owned(), Written { revision, at: None });
    }

    /// When `revision` should be written under `name`: `None` when the
    /// store holds it already, else at once or, when a write was made less
    /// than the interval ago, when the interval is over.
    pub(crate) fn due(&self, name: &str, revision: u64) -> Option<Instant> {
        let written = self.written().get(name).copied().unwrap_or_default();
        if written.revision == revision {
            return None;
        }
        let now = Instant::now();
        Some(written.at.map_or(now, |at| (at + self.every).max(now)))
    }

    /// Whether a write of `revision` under `name` is due now.
    pub(crate) fn due_now(&self, name: &str, revision: u64) -> bool {
        self.due(name, revision)
            .is_some_and(|at| at <= Instant::now())
    }

    /// Writes `value` as the owner's `revision` under `name`; `None`
    /// forgets what is there. A failure is logged and tried again after
    /// the interval.
    pub(crate) async fn write(&self, name: &str, revision: u64, value: Option<&str>) {
        let written = async {
            match value {
                Some(v) => self.store.set_cursor(self.platform, name, v).await,
                None => self
                    .store
                    .delete_cursor(self.platform, name)
                    .await
                    .map(drop),
            }
        };
        let result = tokio::time::timeout(STORE_WAIT, written).await;
        let now = Instant::now();
        let mut table = self.written();
        let entry = table.entry(name.to_owned()).or_default();
        match result {
            Ok(Ok(())) => {
                *entry = Written {
                    revision,
                    at: Some(now),
                };
            }
            Ok(Err(e)) => {
                entry.at = Some(now);
                tracing::warn!(platform = self.platform, error = %e, "cannot store the resume state");
            }
            Err(_) => {
                entry.at = Some(now);
                tracing::warn!(
                    platform = self.platform,
                    "storing the resume state took too long"
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use async_trait::async_trait;

    /// A store in memory that counts writes and can be made to fail.
    #[derive(Default)]
    struct Memory {
        values: Mutex<HashMap<(String, String), String>>,
        writes: Mutex<u32>,
        failing: Mutex<bool>,
    }

    #[async_trait]
    impl CursorStore for Memory {
        async fn cursor(
            &self,
            platform: &str,
            name: &str,
        ) -> talaria_store::Result<Option<String>> {
            let values = self.values.lock().unwrap();
            Ok(values.get(&(platform.into(), name.into())).cloned())
        }

        async fn set_cursor(
            &self,
            platform: &str,
            name: &str,
            value: &str,
        ) -> talaria_store::Result<()> {
            *self.writes.lock().unwrap() += 1;
            if *self.failing.lock().unwrap() {
                return Err(talaria_store::StoreError::Busy);
            }
            let mut values = self.values.lock().unwrap();
            values.insert((platform.into(), name.into()), value.into());
            Ok(())
        }

        async fn delete_cursor(&self, platform: &str, name: &str) -> talaria_store::Result<bool> {
            *self.writes.lock().unwrap() += 1;
            let mut values = self.values.lock().unwrap();
            Ok(values.remove(&(platform.into(), name.into())).is_some())
        }
    }

    #[tokio::test(start_paused = true)]
    async fn writes_are_due_at_once_then_at_most_once_per_interval() {
        let memory = Arc::new(Memory::default());
        let kept = Kept::new(memory.clone(), "p", Duration::from_secs(1));
        // Nothing changed yet: nothing to write.
        assert_eq!(kept.due("n", 0), None);
        // A first change is due at once.
        assert!(kept.due_now("n", 1));
        kept.write("n", 1, Some("one")).await;
        assert_eq!(kept.due("n", 1), None);
        assert_eq!(kept.read("n").await.as_deref(), Some("one"));
        // The next change waits out the interval.
        let at = kept.due("n", 2).unwrap();
        assert!(!kept.due_now("n", 2));
        assert_eq!(at - Instant::now(), Duration::from_secs(1));
        tokio::time::advance(Duration::from_secs(1)).await;
        assert!(kept.due_now("n", 2));
        kept.write("n", 2, None).await;
        assert_eq!(kept.read("n").await, None);
        assert_eq!(*memory.writes.lock().unwrap(), 2);
        // Names are apart.
        assert!(kept.due_now("m", 1));
    }

    #[tokio::test(start_paused = true)]
    async fn a_value_read_is_not_written_back_and_a_failed_write_is_tried_again() {
        let memory = Arc::new(Memory::default());
        let kept = Kept::new(memory.clone(), "p", Duration::from_secs(1));
        kept.holds("n", 7);
        assert_eq!(kept.due("n", 7), None);
        *memory.failing.lock().unwrap() = true;
        kept.write("n", 8, Some("eight")).await;
        // Still owed, after the interval.
        assert!(!kept.due_now("n", 8));
        tokio::time::advance(Duration::from_secs(1)).await;
        assert!(kept.due_now("n", 8));
        *memory.failing.lock().unwrap() = false;
        kept.write("n", 8, Some("eight")).await;
        assert_eq!(kept.due("n", 8), None);
        assert_eq!(kept.read("n").await.as_deref(), Some("eight"));
    }
}
