//! A bounded set of ids already handed over, forgetting the oldest first:
//! the adapters that see a delivery repeated (a replayed stream, an
//! unacknowledged event sent again) drop the repeat before the runner,
//! with memory bounded whatever arrives.

use std::collections::{HashSet, VecDeque};

/// A bounded set of ids seen, forgetting the oldest first.
#[derive(Debug)]
pub(crate) struct Seen {
    set: HashSet<String>,
    order: VecDeque<String>,
    cap: usize,
}

impl Seen {
    pub(crate) fn new(cap: usize) -> Seen {
        Seen {
            set: HashSet::new(),
            order: VecDeque::new(),
            cap: cap.max(1),
        }
    }

    /// Records `id`; `false` when it was seen already.
    pub(crate) fn first(&mut self, id: &str) -> bool {
        if self.set.contains(id) {
            return false;
        }
        if self.order.len() >= self.cap
            && let Some(old) = self.order.pop_front()
        {
            self.set.remove(&old);
        }
        self.set.insert(id.to_owned());
        self.order.push_back(id.to_owned());
        true
    }
}

impl Seen {
    /// Forgets `id`, so its next delivery is taken.
    pub(crate) fn forget(&mut self, id: &str) {
        if self.set.remove(id) {
            self.order.retain(|o| o != id);
        }
    }
}

impl Seen {
    /// Whether `id` is in the set.
    pub(crate) fn contains(&self, id: &str) -> bool {
        self.set.contains(id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seen_is_bounded_and_forgets_the_oldest() {
        let mut s = Seen::new(2);
        assert!(s.first("a"));
        assert!(!s.first("a"));
        assert!(s.first("b"));
        assert!(s.first("c"));
        assert!(s.first("a"), "a was forgotten");
        assert!(!s.first("c"));
        assert!(s.set.len() <= 2);
    }
}
