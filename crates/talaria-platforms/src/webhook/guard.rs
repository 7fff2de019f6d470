//! The two bounded memories in front of the inbox: a per-route rate limit
//! and the cache of deliveries already accepted by this process (a fast
//! path: the gateway's inbound dedupe in the store is what survives a
//! restart, see `server`).
//!
//! Both take the time as an argument (unix seconds from the adapter's
//! clock), so tests move time instead of sleeping. Both hold their lock
//! only for a few map operations and never across an `await`.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;

/// The rate limit's window.
pub const WINDOW_SECS: i64 = 60;

/// A sliding-window limit: at most `limit` accepted deliveries per route in
/// any [`WINDOW_SECS`]. Memory is one timestamp per delivery inside the
/// window, so at most `limit` per route, and routes are fixed by config.
#[derive(Debug)]
pub struct RateLimiter {
    limit: usize,
    windows: Mutex<HashMap<String, VecDeque<i64>>>,
}

impl RateLimiter {
    /// A limiter allowing `limit` per minute per route; 0 means no limit.
    pub fn new(limit: u32) -> RateLimiter {
        RateLimiter {
            limit: usize::try_from(limit).unwrap_or(usize::MAX),
            windows: Mutex::new(HashMap::new()),
        }
    }

    /// Counts one delivery for `route`, or says how many seconds until the
    /// next one would be allowed.
    ///
    /// # Errors
    /// The seconds to wait, when the route's window is full.
    pub fn admit(&self, route: &str, now: i64) -> Result<(), u64> {
        if self.limit == 0 {
            return Ok(());
        }
        let mut windows = self.windows.lock().unwrap_or_else(|p| p.into_inner());
        let window = windows.entry(route.to_owned()).or_default();
        while window.front().is_some_and(|&t| t + WINDOW_SECS <= now) {
            window.pop_front();
        }
        if window.len() >= self.limit {
            let oldest = window.front().copied().unwrap_or(now);
            let wait = (oldest + WINDOW_SECS).saturating_sub(now).max(1);
            return Err(wait.unsigned_abs());
        }
        window.push_back(now);
        Ok(())
    }

    /// Gives back the unit a delivery admitted at `at` spent, when it did
    /// not become a turn after all (the gateway had taken it before, or did
    /// not take it): only turns count against a route's budget.
    pub fn refund(&self, route: &str, at: i64) {
        if self.limit == 0 {
            return;
        }
        let mut windows = self.windows.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(window) = windows.get_mut(route)
            && let Some(i) = window.iter().rposition(|&t| t == at)
        {
            window.remove(i);
        }
    }
}

/// Delivery ids seen in the last `ttl` seconds, at most `capacity` of them
/// (the oldest is forgotten first), so a flood of distinct ids cannot grow
/// memory without bound. Released ids do not count toward the capacity;
/// their leftover order entries are bounded by [`STALE_FACTOR`].
#[derive(Debug)]
pub struct ReplayCache {
    ttl: i64,
    capacity: usize,
    inner: Mutex<Seen>,
}

/// How many order entries per remembered id are tolerated before the stale
/// ones (left by released ids) are swept out. Sweeping costs one pass over
/// `order`, and afterwards at least `capacity` more claims are needed before
/// the next, so it is constant work per claim on average.
const STALE_FACTOR: usize = 2;

#[derive(Debug, Default)]
struct Seen {
    /// Key → (sequence number, when it was claimed).
    ids: HashMap<String, (u64, i64)>,
    /// Keys in claim order. An entry whose sequence number no longer
    /// matches `ids` was released or re-claimed and is skipped.
    order: VecDeque<(u64, String)>,
    next: u64,
}

impl Seen {
    /// Whether an order entry still stands for a remembered id.
    fn is_live(&self, seq: u64, key: &str) -> bool {
        self.ids.get(key).is_some_and(|&(s, _)| s == seq)
    }

    fn pop_oldest(&mut self) {
        if let Some((seq, key)) = self.order.pop_front()
            && self.is_live(seq, &key)
        {
            self.ids.remove(&key);
        }
    }

    /// Drops the order entries of released or re-claimed ids.
    fn sweep_stale(&mut self) {
        let mut order = std::mem::take(&mut self.order);
        order.retain(|(seq, key)| self.is_live(*seq, key));
        self.order = order;
    }
}

impl ReplayCache {
    /// A cache remembering ids for `ttl` seconds, at most `capacity` at once.
    pub fn new(ttl: i64, capacity: usize) -> ReplayCache {
        ReplayCache {
            ttl,
            capacity: capacity.max(1),
            inner: Mutex::new(Seen::default()),
        }
    }

    /// Remembers `key` and returns `true`, or returns `false` when it was
    /// claimed within the last `ttl` seconds (a replay or a retry).
    pub fn claim(&self, key: &str, now: i64) -> bool {
        let mut seen = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        // Forget what expired, oldest first; stale entries go on the way.
        while let Some((seq, k)) = seen.order.front() {
            let claimed_at = seen.ids.get(k).filter(|(s, _)| s == seq).map(|&(_, at)| at);
            match claimed_at {
                Some(at) if at + self.ttl > now => break,
                _ => seen.pop_oldest(),
            }
        }
        if seen.ids.contains_key(key) {
            return false;
        }
        // The capacity bounds the ids remembered, not the order entries:
        // counting a released id's leftover entry would forget a live id
        // early. Every live id has its entry, so this ends before `order`
        // is empty.
        while seen.ids.len() >= self.capacity && !seen.order.is_empty() {
            seen.pop_oldest();
        }
        if seen.order.len() >= self.capacity.saturating_mul(STALE_FACTOR) {
            seen.sweep_stale();
        }
        let seq = seen.next;
        seen.next += 1;
        seen.ids.insert(key.to_owned(), (seq, now));
        seen.order.push_back((seq, key.to_owned()));
        true
    }

    /// Forgets a claim whose delivery was not handed over after all, so the
    /// sender's retry is accepted instead of answered `duplicate`.
    pub fn release(&self, key: &str) {
        let mut seen = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        seen.ids.remove(key);
    }

    /// How many ids are remembered now.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.inner
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .ids
            .len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_window_slides() {
        let r = RateLimiter::new(2);
        assert_eq!(r.admit("a", 100), Ok(()));
        assert_eq!(r.admit("a", 130), Ok(()));
        assert_eq!(r.admit("a", 140), Err(20));
        // Routes are counted apart.
        assert_eq!(r.admit("b", 140), Ok(()));
        assert_eq!(r.admit("a", 160), Ok(()));
        assert_eq!(r.admit("a", 161), Err(29));
        assert_eq!(r.admit("a", 190), Ok(()));
    }

    #[test]
    fn a_refund_frees_the_unit_it_spent() {
        let r = RateLimiter::new(2);
        assert_eq!(r.admit("a", 100), Ok(()));
        assert_eq!(r.admit("a", 110), Ok(()));
        assert_eq!(r.admit("a", 120), Err(40));
        r.refund("a", 110);
        assert_eq!(r.admit("a", 120), Ok(()));
        assert_eq!(r.admit("a", 121), Err(39));
        // Refunding what was never spent changes nothing.
        r.refund("a", 5);
        r.refund("b", 100);
        assert_eq!(r.admit("a", 121), Err(39));
    }

    #[test]
    fn zero_means_no_limit() {
        let r = RateLimiter::new(0);
        for _ in 0..1000 {
            assert_eq!(r.admit("a", 1), Ok(()));
        }
    }

    #[test]
    fn ids_are_remembered_for_the_ttl() {
        let c = ReplayCache::new(3600, 100);
        assert!(c.claim("r:1", 0));
        assert!(!c.claim("r:1", 3599));
        assert!(c.claim("r:2", 10));
        assert!(c.claim("r:1", 3600));
        assert!(!c.claim("r:2", 3609));
        assert!(c.claim("r:2", 3610));
    }

    #[test]
    fn the_oldest_id_goes_first_when_full() {
        let c = ReplayCache::new(3600, 3);
        for id in ["a", "b", "c", "d"] {
            assert!(c.claim(id, 0));
        }
        assert_eq!(c.len(), 3);
        assert!(c.claim("a", 0), "a was evicted");
        assert!(!c.claim("d", 0));
        for i in 0..10_000 {
            c.claim(&i.to_string(), 1);
        }
        assert_eq!(c.len(), 3);
        assert!(c.inner.lock().unwrap().order.len() <= 3 * STALE_FACTOR);
    }

    #[test]
    fn a_released_id_can_be_claimed_again() {
        let c = ReplayCache::new(3600, 2);
        assert!(c.claim("x", 0));
        c.release("x");
        assert!(c.claim("x", 5));
        assert!(!c.claim("x", 6));
        // The stale order entry of the first claim does not evict the second.
        assert!(c.claim("y", 7));
        assert!(!c.claim("x", 8));
    }

    #[test]
    fn released_ids_do_not_count_toward_the_capacity() {
        let c = ReplayCache::new(3600, 3);
        assert!(c.claim("a", 0));
        assert!(c.claim("b", 0));
        c.release("b");
        assert!(c.claim("c", 0));
        assert!(c.claim("d", 0));
        // Three live ids fit: `a` is still remembered although four claims
        // were made, since `b`'s leftover entry does not count.
        assert_eq!(c.len(), 3);
        assert!(!c.claim("a", 1));
        // Many claims that are released again (503s) neither push out the
        // one id kept nor grow the order without bound.
        let c = ReplayCache::new(3600, 3);
        assert!(c.claim("keep", 0));
        for i in 0..10_000 {
            let key = format!("churn-{i}");
            assert!(c.claim(&key, 1));
            c.release(&key);
        }
        assert_eq!(c.len(), 1);
        assert!(c.inner.lock().unwrap().order.len() <= 3 * STALE_FACTOR);
        assert!(!c.claim("keep", 2), "keep was forgotten");
    }
}
