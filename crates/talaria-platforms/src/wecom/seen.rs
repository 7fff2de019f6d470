//! A bounded, expiring set of message ids already taken, so a delivery
//! WeCom repeats (its callback retries, the robot's re-sends) or an
//! attacker replays starts no second turn. The runner dedupes on the
//! message id as well; this catches repeats before anything is handed
//! over, and keeps memory bounded whatever arrives.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The ids seen within `ttl`, at most `capacity` of them (the oldest
/// forgotten first).
pub(crate) struct Seen {
    inner: Mutex<Inner>,
    capacity: usize,
    ttl: Duration,
}

struct Inner {
    at: HashMap<String, Instant>,
    order: VecDeque<(String, Instant)>,
}

impl Seen {
    pub(crate) fn new(capacity: usize, ttl: Duration) -> Seen {
        Seen {
            inner: Mutex::new(Inner {
                at: HashMap::new(),
                order: VecDeque::new(),
            }),
            capacity: capacity.max(1),
            ttl,
        }
    }

    /// Records `id`; `false` when it was already there (a repeat).
    pub(crate) fn insert(&self, id: &str) -> bool {
        let now = Instant::now();
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        inner.expire(now, self.ttl);
        if inner.at.contains_key(id) {
            return false;
        }
        while inner.order.len() >= self.capacity {
            inner.pop_oldest();
        }
        inner.at.insert(id.to_owned(), now);
        inner.order.push_back((id.to_owned(), now));
        true
    }

    /// Forgets `id` (its delivery was not taken after all, so a retry must
    /// get through).
    pub(crate) fn remove(&self, id: &str) {
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        inner.at.remove(id);
        inner.order.retain(|(k, _)| k != id);
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.inner.lock().unwrap().order.len()
    }
}

impl Inner {
    fn expire(&mut self, now: Instant, ttl: Duration) {
        while self
            .order
            .front()
            .is_some_and(|(_, at)| now.duration_since(*at) >= ttl)
        {
            self.pop_oldest();
        }
    }

    fn pop_oldest(&mut self) {
        if let Some((id, at)) = self.order.pop_front()
            && self.at.get(&id) == Some(&at)
        {
            self.at.remove(&id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repeats_are_caught_and_memory_is_bounded() {
        let seen = Seen::new(3, Duration::from_secs(60));
        assert!(seen.insert("a"));
        assert!(!seen.insert("a"));
        for id in ["b", "c", "d"] {
            assert!(seen.insert(id));
        }
        assert_eq!(seen.len(), 3);
        // "a" was the oldest and is forgotten.
        assert!(seen.insert("a"));
        seen.remove("a");
        assert!(seen.insert("a"));
    }

    #[test]
    fn ids_expire() {
        let seen = Seen::new(10, Duration::ZERO);
        assert!(seen.insert("a"));
        assert!(seen.insert("a"));
        assert_eq!(seen.len(), 1);
    }
}
