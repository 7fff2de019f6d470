//! Which rooms are direct chats and which invites the bot takes: member
//! counts asked from the homeserver and kept in the cursor store, the
//! account's `m.direct` data, and the runner's rules for inviters.

use super::*;

impl MatrixAdapter {
    /// Whether `room_id` is a direct chat, asking the homeserver for its
    /// member count when it is not known. `Err` is a failure worth a retry
    /// of the whole batch (the homeserver is unreachable or busy): a guess
    /// would drop the messages for good.
    pub(super) async fn room_is_dm(
        &self,
        room_id: &str,
        ctx: &AdapterContext,
    ) -> Result<bool, ApiError> {
        if lock(&self.rooms).joined(room_id).is_some() {
            return Ok(lock(&self.rooms).is_dm(room_id));
        }
        let path = format!("/rooms/{}/joined_members", segment(room_id));
        let answer = tokio::select! {
            biased;
            _ = ctx.shutdown.cancelled() => return Ok(lock(&self.rooms).is_dm(room_id)),
            r = self.api.request::<Value>(Method::GET, &path, &[], None, REQUEST_TIMEOUT) => r,
        };
        let mut rooms = lock(&self.rooms);
        match answer {
            Ok(v) => match v.get("joined").and_then(Value::as_object) {
                Some(members) => {
                    rooms.set_joined(room_id, members.len() as u64);
                }
                None => {
                    tracing::warn!(room = %room_id, "joined_members answered without a member list")
                }
            },
            Err(e)
                if e.status().is_some_and(|s| (400..500).contains(&s))
                    && !api::is_rate_limit(&e)
                    && !api::is_bad_token(&e) =>
            {
                // Refused for good (the bot is no longer in the room, a
                // server without the endpoint): decide without the count.
                tracing::warn!(room = %room_id, "cannot ask the room's members: {e}");
            }
            Err(e) => return Err(e),
        }
        Ok(rooms.is_dm(room_id))
    }

    /// Reads the saved room record, once per process.
    pub(super) async fn load_rooms(&self, me: &Me) -> Result<(), AdapterError> {
        let saved = self
            .cursors
            .cursor(PLATFORM, &Rooms::record_name(&me.user_id))
            .await
            .map_err(|e| {
                AdapterError::Disconnected(format!("cannot read the saved Matrix rooms: {e}"))
            })?;
        if let Some(record) = saved {
            lock(&self.rooms).load(&record);
        }
        Ok(())
    }

    /// Asks for the account's `m.direct` data, which a sync with a token
    /// only carries when it changed. Best effort: the member counts decide
    /// first anyway.
    pub(super) async fn load_account_direct(&self, me: &Me) {
        let path = format!("/user/{}/account_data/m.direct", segment(&me.user_id));
        match self
            .api
            .request::<Value>(Method::GET, &path, &[], None, REQUEST_TIMEOUT)
            .await
        {
            Ok(content) => lock(&self.rooms).set_account_direct(&content),
            Err(e) if e.status() == Some(404) => {}
            Err(e) => tracing::debug!("cannot read the account's m.direct data: {e}"),
        }
    }

    /// Saves the room record when it changed.
    pub(super) async fn save_rooms(&self, me: &Me) {
        let Some(record) = lock(&self.rooms).record() else {
            return;
        };
        match self
            .cursors
            .set_cursor(PLATFORM, &Rooms::record_name(&me.user_id), &record)
            .await
        {
            Ok(()) => lock(&self.rooms).saved(),
            // Still dirty: the next batch tries again.
            Err(e) => tracing::warn!("cannot save what is known of the Matrix rooms: {e}"),
        }
    }

    /// Joins the rooms the bot was invited to by someone the runner would
    /// let in (or who could pair, in a direct chat).
    pub(super) async fn accept_invites(&self, sync: &Value, me: &Me, ctx: &AdapterContext) {
        let Some(invites) = sync.pointer("/rooms/invite").and_then(Value::as_object) else {
            return;
        };
        for (room_id, room) in invites {
            let invite = room
                .pointer("/invite_state/events")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .find(|e| {
                    e.get("type").and_then(Value::as_str) == Some("m.room.member")
                        && e.get("state_key").and_then(Value::as_str) == Some(me.user_id.as_str())
                });
            let inviter = invite
                .and_then(|e| e.get("sender"))
                .and_then(Value::as_str)
                .unwrap_or("");
            let is_direct = invite
                .and_then(|e| e.pointer("/content/is_direct"))
                .and_then(Value::as_bool)
                == Some(true);
            if !self.may_invite(room_id, inviter, is_direct) {
                tracing::info!(room = %room_id, inviter, "ignoring an invite from someone who may not use the bot");
                continue;
            }
            let path = format!("/join/{}", segment(room_id));
            let empty = json!({});
            let joined = tokio::select! {
                biased;
                _ = ctx.shutdown.cancelled() => return,
                r = self.api.request::<Value>(Method::POST, &path, &[], Some(&empty), REQUEST_TIMEOUT) => r,
            };
            match joined {
                Ok(_) => {
                    tracing::info!(room = %room_id, inviter, "joined a room on invite");
                    if is_direct {
                        lock(&self.rooms).set_direct(room_id);
                    }
                }
                Err(e) => tracing::warn!(room = %room_id, "cannot join the room: {e}"),
            }
        }
    }

    pub(super) fn may_invite(&self, room_id: &str, inviter: &str, is_direct: bool) -> bool {
        let Some(policy) = &self.invite_policy else {
            return true;
        };
        if inviter.is_empty() {
            return false;
        }
        let source = SessionSource {
            platform: PLATFORM.to_owned(),
            chat_id: room_id.to_owned(),
            chat_name: None,
            chat_type: if is_direct {
                ChatType::Dm
            } else {
                ChatType::Group
            },
            user_id: Some(inviter.to_owned()),
            user_name: None,
            thread_id: None,
            is_bot: false,
        };
        // A stranger who could pair must be able to reach the bot to get a
        // code; the runner still decides about every message.
        matches!(
            policy.decide(&source, &CAPABILITIES, false),
            Decision::Allow(_)
                | Decision::Deny {
                    offer_pairing: true
                }
        )
    }
}
