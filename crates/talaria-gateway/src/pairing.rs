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
//!
//! The code is shown with the stranger's user id on the platform, which is
//! what an allowlist (`TELEGRAM_ALLOWED_USERS`, ...) takes: an owner who
//! writes to their own bot learns their id this way. An approval (made by
//! `talaria pairing approve`, in another process, perhaps while no gateway
//! runs) is recorded in the store with the chat the code was shown in;
//! [`tell_approved`], a maintenance chore of every running gateway, takes
//! those notices from the store and says so in that chat.

use std::sync::Arc;

use rand::Rng;
use talaria_store::{
    ApprovalNotice, ApproveOutcome, OfferOutcome, PairingLimits, PairingStore, StoreError,
};

use crate::delivery::{Address, Delivery};

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

/// What a stranger is answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OfferReply {
    /// A fresh code, with their user id.
    Code(String),
    /// A refusal: too many requests, or approvals locked.
    Refusal(String),
}

impl OfferReply {
    /// The text to send back, whichever the kind.
    pub fn text(&self) -> &str {
        match self {
            OfferReply::Code(t) | OfferReply::Refusal(t) => t,
        }
    }
}

/// Pairing over a store.
#[derive(Clone)]
pub struct Pairing {
    store: Arc<dyn PairingStore>,
    limits: PairingLimits,
}

impl Pairing {
    /// Pairing over `store` with the default rate limits.
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

    /// What to tell a stranger who wrote in the DM `chat_id`, or `None` to
    /// stay silent (they were answered within the last ten minutes, with a
    /// code or a refusal: the store stamps both).
    pub async fn offer(
        &self,
        platform: &str,
        user_id: &str,
        user_name: Option<&str>,
        chat_id: &str,
    ) -> Result<Option<OfferReply>, StoreError> {
        let code = generate_code();
        let outcome = self
            .store
            .pairing_offer(platform, user_id, user_name, chat_id, &code, self.limits)
            .await?;
        Ok(match outcome {
            OfferOutcome::Created => Some(OfferReply::Code(format!(
                "Hi! I don't know you yet, so I can't answer you.\n\n\
                 Your pairing code: `{code}`\n\
                 Your {platform} user id: `{user_id}`\n\n\
                 Ask the owner of this bot to approve the code with:\n\
                 talaria pairing approve {platform} {code}\n\n\
                 The code is valid for one hour. If this is your own bot, you can \
                 instead put your user id in {allowlist} in the .env file of its \
                 Talaria home and restart the gateway.",
                allowlist = talaria_core::config::platform_var(platform, "ALLOWED_USERS"),
            ))),
            OfferOutcome::RateLimited => None,
            // The store stamped the refusal, so this is said once per
            // interval.
            OfferOutcome::TooManyPending | OfferOutcome::LockedOut => Some(OfferReply::Refusal(
                "Too many pairing requests right now. Please try again later.".to_owned(),
            )),
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

/// What an approved user is told.
pub const APPROVED_NOTICE: &str =
    "You have been approved: you can talk to me now. Send your message again if I missed it.";

/// Notices taken from the store in one run of [`tell_approved`].
const NOTICES_PER_RUN: usize = 20;

/// Tells users approved since the last run (by `talaria pairing approve`,
/// from any process) so, in the chat their code was shown in: a
/// maintenance chore of the gateway. Only platforms this gateway can send
/// on are asked about, so a notice waits for a gateway that can. Each
/// notice is taken from the store once (by one node, when several share
/// it) and sent through the delivery ledger, so a failed send is retried
/// by the ledger's sweep.
pub async fn tell_approved<S: PairingStore + ?Sized>(
    store: &S,
    delivery: &Delivery,
) -> Result<usize, StoreError> {
    let platforms = delivery.platforms();
    if platforms.is_empty() {
        return Ok(0);
    }
    let notices = store
        .pairing_take_notices(&platforms, NOTICES_PER_RUN)
        .await?;
    let told = notices.len();
    for notice in notices {
        tell_one(delivery, &notice).await;
    }
    Ok(told)
}

async fn tell_one(delivery: &Delivery, notice: &ApprovalNotice) {
    let to = Address {
        platform: notice.platform.clone(),
        chat_id: notice.chat_id.clone(),
        thread_id: None,
        reply_to: None,
    };
    match delivery.deliver_message(&to, APPROVED_NOTICE).await {
        Ok(()) => tracing::info!(
            platform = %notice.platform,
            user_id = %notice.user_id,
            "told an approved user they can talk to the bot now"
        ),
        // With the ledger on, the obligation stays and its sweep retries.
        Err(e) => tracing::warn!(
            platform = %notice.platform,
            user_id = %notice.user_id,
            error = %e,
            "cannot tell an approved user they were approved"
        ),
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
