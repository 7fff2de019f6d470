//! DM pairing: how a stranger becomes a user without editing allowlists.
//!
//! A stranger who writes to the bot in a DM (on a platform without an
//! allowlist) is given a one-hour code; the operator approves it with
//! `talaria pairing approve <platform> <code>`. Codes are drawn from a
//! CSPRNG and stored only as salted hashes (the store's job); the limits
//! (pending codes, offer interval, lockout after failed approvals) are
//! applied by the store in one transaction, so two gateways sharing a
//! database cannot exceed them together. The store also keeps one code per
//! user (a new offer replaces it) and normalises codes itself
//! ([`talaria_store::gateway::normalize_pairing_code`]), so nothing here
//! does.
//!
//! Neither limit can be used to shut a genuine user out (see
//! [`talaria_store::PairingStore`]): a full platform drops its oldest
//! pending code for a newcomer rather than refusing them, and a platform
//! locked after wrong codes still approves a correct one (the lock stops
//! guessing; its budget of wrong codes is what bounds it).

use std::sync::Arc;

use rand::Rng;
use talaria_store::{ApproveOutcome, OfferOutcome, PairingLimits, PairingStore, StoreError};

/// Letters and digits that cannot be mistaken for each other (no 0/O, 1/I).
pub const CODE_ALPHABET: &[u8] = b"ABCDEFGHJKLMNPQRSTUVWXYZ23456789";

/// Characters in a code.
pub const CODE_LEN: usize = 8;

/// A fresh pairing code.
///
/// `rand::rng()` is a ChaCha-based CSPRNG seeded from the operating system,
/// so codes cannot be predicted from earlier ones.
pub fn generate_code() -> String {
    let mut rng = rand::rng();
    (0..CODE_LEN)
        .map(|_| char::from(CODE_ALPHABET[rng.random_range(0..CODE_ALPHABET.len())]))
        .collect()
}

/// Pairing over a store.
#[derive(Clone)]
pub struct Pairing {
    store: Arc<dyn PairingStore>,
    limits: PairingLimits,
}

impl Pairing {
    pub fn new(store: Arc<dyn PairingStore>) -> Pairing {
        Pairing {
            store,
            limits: PairingLimits::default(),
        }
    }

    /// With non-default limits (tests).
    pub fn with_limits(store: Arc<dyn PairingStore>, limits: PairingLimits) -> Pairing {
        Pairing { store, limits }
    }

    /// Whether an operator approved this user.
    pub async fn is_approved(&self, platform: &str, user_id: &str) -> Result<bool, StoreError> {
        self.store.pairing_is_approved(platform, user_id).await
    }

    /// What to tell a stranger who wrote in a DM, or `None` to stay silent
    /// (they were answered within the last ten minutes, with a code or a
    /// refusal: the store stamps both).
    pub async fn offer(
        &self,
        platform: &str,
        user_id: &str,
        user_name: Option<&str>,
    ) -> Result<Option<String>, StoreError> {
        let code = generate_code();
        let outcome = self
            .store
            .pairing_offer(platform, user_id, user_name, &code, self.limits)
            .await?;
        Ok(match outcome {
            OfferOutcome::Created => Some(format!(
                "Hi! I don't know you yet, so I can't answer you.\n\n\
                 Your pairing code: `{code}`\n\n\
                 Ask the owner of this bot to approve it with:\n\
                 talaria pairing approve {platform} {code}\n\n\
                 The code is valid for one hour."
            )),
            OfferOutcome::RateLimited => None,
            // The store stamped the refusal, so this is said once per
            // interval.
            OfferOutcome::TooManyPending | OfferOutcome::LockedOut => {
                Some("Too many pairing requests right now. Please try again later.".to_owned())
            }
        })
    }

    /// Approves the user holding `code` on `platform` (case-insensitive:
    /// the store normalises the code).
    pub async fn approve(&self, platform: &str, code: &str) -> Result<ApproveOutcome, StoreError> {
        self.store
            .pairing_approve(platform, code, self.limits)
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use talaria_store::gateway::normalize_pairing_code;

    #[test]
    fn codes_use_the_alphabet_and_differ() {
        let a = generate_code();
        assert_eq!(a.len(), CODE_LEN);
        assert!(a.bytes().all(|b| CODE_ALPHABET.contains(&b)), "{a}");
        let distinct: std::collections::HashSet<String> =
            (0..200).map(|_| generate_code()).collect();
        assert_eq!(distinct.len(), 200);
        // Generated codes are already in the form the store compares.
        assert_eq!(normalize_pairing_code(&a), a);
        assert_eq!(normalize_pairing_code("  abcd2345 "), "ABCD2345");
    }
}
