//! Taking an event: its session key, the sender's authorization (and a
//! pairing code for strangers), deduplication of re-deliveries, the
//! owed-turn record, and where it goes next: a command, the answer to a
//! waiting question, or its lane.

use std::sync::atomic::Ordering;

use crate::adapter::{Admission, AdmitReply};
use crate::auth::Decision;
use crate::delivery::Address;
use crate::event::MessageEvent;
use crate::hooks::events;
use crate::key::SessionKey;
use crate::pairing::OfferReply;
use talaria_adapter::{Capabilities, LengthUnit, MessageLimits};

use super::Runner;
use super::lane::Queued;

/// How an event is judged whose platform has no adapter in this gateway
/// (only tests hand the runner such events): a chat with opaque sender ids.
pub(crate) const UNREGISTERED: Capabilities = Capabilities::chat(MessageLimits {
    max_len: 4096,
    unit: LengthUnit::Chars,
});

impl Runner {
    /// Handles one inbound event: answers `reply` once the event is taken
    /// (or refused, or known), then runs its command or hands it to its
    /// lane. Returns once the event is routed: turns run on their own
    /// tasks.
    pub(super) async fn accept(&self, event: MessageEvent, reply: AdmitReply) {
        let inner = &self.inner;
        if inner.draining.load(Ordering::SeqCst) {
            // Not taken: the adapter does not acknowledge it, and the
            // platform delivers it again to whichever process runs next.
            tracing::info!(platform = %event.source.platform, "gateway stopping; message not taken");
            return;
        }
        let key = match SessionKey::for_source(&event.source, inner.policy) {
            Ok(k) => k,
            Err(e) => {
                tracing::warn!(platform = %event.source.platform, error = %e, "message with an unusable chat id dropped");
                reply.send(Admission::Refused);
                return;
            }
        };
        // The message's life at debug: ids and sizes, never the words.
        tracing::debug!(
            platform = %event.source.platform,
            key = %key,
            chars = event.text.chars().count(),
            "message received"
        );
        let verified = inner
            .delivery
            .adapter(&event.source.platform)
            .is_some_and(|a| a.verifies_senders());
        if !verified && !self.authorized(&event).await {
            reply.send(Admission::Refused);
            return;
        }
        tracing::debug!(
            key = %key,
            by = if verified { "the platform" } else { "the allowlist or pairing" },
            "sender authorized"
        );
        // A message that will start a turn is recorded as owed before the
        // adapter may acknowledge it; commands and answers to a waiting
        // question are only deduplicated.
        let starts_turn = event.command().is_none()
            && inner.lanes().get(&key).is_none_or(|l| l.clarify.is_none());
        let owed = if starts_turn {
            match self.take_owed(&key, &event).await {
                Some(owed) => owed,
                None => {
                    talaria_core::metrics::duplicate_dropped(&event.source.platform);
                    reply.send(Admission::Duplicate);
                    return;
                }
            }
        } else {
            if !self.first_delivery(&event).await {
                talaria_core::metrics::duplicate_dropped(&event.source.platform);
                reply.send(Admission::Duplicate);
                return;
            }
            Vec::new()
        };
        reply.send(Admission::Accepted);
        let s = &event.source;
        inner.hooks.fire(&events::MessageReceived {
            platform: &s.platform,
            chat_type: s.chat_type.as_str(),
            chat_id: &s.chat_id,
            user_id: s.user_id.as_deref(),
            session_key: key.as_str(),
            text: &event.text,
            is_command: event.command().is_some(),
        });
        if event.command().is_some() {
            self.command(&key, &event).await;
            return;
        }
        if !starts_turn
            && let Some(answer) = inner.lanes().get_mut(&key).and_then(|l| l.clarify.take())
        {
            // The answer to a question the agent asked: it goes to the
            // waiting tool, not into a new turn.
            let _ = answer.send(event.text.clone());
            return;
        }
        self.submit(
            key,
            Queued {
                event,
                mergeable: true,
                owed,
            },
        );
    }

    /// Records a message that will start a turn as owed (and, when it has
    /// an id, as seen, in the same step). `None` for a repeat; otherwise
    /// the owed turn's id, or none when the store cannot record it (the
    /// message is taken anyway, as [`Runner::first_delivery`] does).
    async fn take_owed(&self, key: &SessionKey, event: &MessageEvent) -> Option<Vec<String>> {
        let inner = &self.inner;
        let source = &event.source;
        let inbound_id = inbound_id(event);
        let serialized = match serde_json::to_string(event) {
            Ok(json) => json,
            Err(e) => {
                tracing::warn!(platform = %source.platform, error = %e, "cannot record a message as owed; taking it anyway");
                return self.first_delivery(event).await.then(Vec::new);
            }
        };
        let id = crate::owed::turn_id(&source.platform, inbound_id.as_deref());
        let turn = talaria_store::NewOwedTurn {
            id: id.clone(),
            session_key: key.as_str().to_owned(),
            platform: source.platform.clone(),
            event: serialized,
            owner: inner.node.clone(),
        };
        match inner.store.accept_turn(inbound_id.as_deref(), turn).await {
            Ok(true) => Some(vec![id]),
            Ok(false) => {
                tracing::info!(platform = %source.platform, "re-delivered message ignored");
                None
            }
            Err(e) => {
                tracing::warn!(platform = %source.platform, error = %e, "cannot record a message as owed; taking it anyway");
                Some(Vec::new())
            }
        }
    }

    /// Whether this is the first time the event arrives. Platforms
    /// re-deliver what they think was missed (an unacknowledged envelope, a
    /// replayed sync, a resumed stream); a repeat is dropped here, before
    /// it can start a second turn. Message ids are unique per chat on most
    /// platforms, so the chat is part of the id. When the store cannot
    /// answer, the event goes through: a rare duplicate answer is better
    /// than a lost message.
    async fn first_delivery(&self, event: &MessageEvent) -> bool {
        let Some(inbound_id) = inbound_id(event) else {
            return true;
        };
        let (source, message_id) = (&event.source, &inbound_id);
        match self
            .inner
            .store
            .first_delivery(&source.platform, &inbound_id)
            .await
        {
            Ok(true) => true,
            Ok(false) => {
                tracing::info!(platform = %source.platform, message_id = %message_id, "re-delivered message ignored");
                false
            }
            Err(e) => {
                tracing::warn!(platform = %source.platform, error = %e, "cannot check for a re-delivered message; taking it");
                true
            }
        }
    }

    /// Applies authorization; strangers in DMs may be offered a code.
    async fn authorized(&self, event: &MessageEvent) -> bool {
        let inner = &self.inner;
        let source = &event.source;
        // Pairing can only turn a denial into an approval, so the store is
        // read only for senders the configuration alone does not admit:
        // allowlisted users cost no query per message (the auth proptest
        // `pairing_admits_humans_with_an_id_only` holds this equivalence).
        // Bots are never admitted by pairing, so they cost no query either.
        let caps = self.capabilities(&source.platform);
        let mut decision = inner.auth.decide(source, &caps, false);
        if matches!(decision, Decision::Deny { .. })
            && !source.is_bot
            && let Some(user) = &source.user_id
        {
            match inner.pairing.is_approved(&source.platform, user).await {
                Ok(true) => decision = inner.auth.decide(source, &caps, true),
                Ok(false) => {}
                Err(e) => {
                    // Unknown is not "unpaired": offering a fresh code to a
                    // user who may well be approved would only confuse.
                    tracing::warn!(platform = %source.platform, error = %e, "cannot read pairing approvals; message dropped");
                    return false;
                }
            }
        }
        match decision {
            Decision::Allow(_) => true,
            Decision::Deny { offer_pairing } => {
                // The user id is logged so an owner who wrote to their own
                // bot can find what to put in its allowlist.
                let user = source.user_id.as_deref().unwrap_or("-");
                if !(offer_pairing && source.user_id.is_some()) {
                    tracing::info!(
                        platform = %source.platform,
                        chat_type = %source.chat_type,
                        user_id = %user,
                        "message from an unauthorized sender dropped (to let them in, add their user id to the platform's allowlist)"
                    );
                    return false;
                }
                match inner
                    .pairing
                    .offer(
                        &source.platform,
                        user,
                        source.user_name.as_deref(),
                        &source.chat_id,
                    )
                    .await
                {
                    Ok(Some(reply)) => {
                        match &reply {
                            OfferReply::Code(_) => tracing::info!(
                                platform = %source.platform,
                                user_id = %user,
                                "an unknown sender was sent a pairing code (approve it with `talaria pairing approve`)"
                            ),
                            OfferReply::Refusal(_) => tracing::info!(
                                platform = %source.platform,
                                user_id = %user,
                                "an unknown sender was told to try pairing later: too many requests, or approvals are locked"
                            ),
                        }
                        inner
                            .delivery
                            .notify(&Address::reply_to(event), reply.text())
                            .await;
                    }
                    Ok(None) => tracing::info!(
                        platform = %source.platform,
                        user_id = %user,
                        "message from an unknown sender dropped: they were answered with a pairing code within the last minutes"
                    ),
                    Err(e) => {
                        tracing::warn!(platform = %source.platform, user_id = %user, error = %e, "cannot offer a pairing code; message dropped");
                    }
                }
                false
            }
        }
    }
}

/// The id an event is deduplicated (and its owed turn named) by: message
/// ids are unique per chat on most platforms, so the chat is part of it.
fn inbound_id(event: &MessageEvent) -> Option<String> {
    let id = event.message_id.as_ref()?;
    Some(format!("{}\u{1f}{id}", event.source.chat_id))
}
