//! The gateway's side of the agent's `send_message` tool: targets resolved
//! against the connected adapters and home channels, every message owed
//! through the delivery ledger.

use std::sync::{Arc, OnceLock};

use async_trait::async_trait;
use talaria_agent::tools::send_message::{Messenger, TargetInfo};
use talaria_store::SessionStore;

use crate::delivery::{Address, Delivery, LOCAL};
use crate::target::Target;

/// Sends for the agent through a gateway's [`Delivery`].
///
/// The agent (and its tool registry) is built before the gateway that owns
/// the delivery, so the delivery is bound afterwards with
/// [`GatewayMessenger::bind`]; a send before that is refused clearly.
pub struct GatewayMessenger {
    delivery: OnceLock<Delivery>,
    /// To find where a session's messages come from (`origin`).
    store: Arc<dyn SessionStore>,
}

impl GatewayMessenger {
    /// A messenger that finds sessions' origins in `store`; it can send
    /// only once the gateway has bound its delivery.
    pub fn new(store: Arc<dyn SessionStore>) -> Arc<GatewayMessenger> {
        Arc::new(GatewayMessenger {
            delivery: OnceLock::new(),
            store,
        })
    }

    /// A messenger already bound to `delivery` (a one-off send).
    pub fn bound(store: Arc<dyn SessionStore>, delivery: Delivery) -> Arc<GatewayMessenger> {
        let m = GatewayMessenger::new(store);
        m.bind(delivery);
        m
    }

    /// Binds the delivery sends go through; later calls change nothing.
    pub fn bind(&self, delivery: Delivery) {
        let _ = self.delivery.set(delivery);
    }

    fn delivery(&self) -> Result<&Delivery, String> {
        self.delivery
            .get()
            .ok_or_else(|| "the gateway is still starting; try again in a moment".to_owned())
    }
}

/// Where `session_id`'s messages came from, when that is a chat on a
/// platform `delivery` is connected to.
pub async fn session_chat(
    store: &dyn SessionStore,
    delivery: &Delivery,
    session_id: &str,
) -> Option<Address> {
    let session = store.session(session_id).await.ok().flatten()?;
    let chat_id = session.chat_id?;
    delivery.adapter(&session.source)?;
    Some(Address {
        platform: session.source,
        chat_id,
        thread_id: session.thread_id,
        reply_to: None,
    })
}

/// Says a line in the chat a session belongs to, on a task of its own (the
/// background review's notices); sessions of no chat are skipped.
pub fn session_notifier(
    store: Arc<dyn SessionStore>,
    delivery: Delivery,
) -> talaria_learning::review::Notify {
    Arc::new(move |session: &str, line: &str| {
        let (store, delivery) = (store.clone(), delivery.clone());
        let (session, line) = (session.to_owned(), line.to_owned());
        tokio::spawn(async move {
            if let Some(to) = session_chat(store.as_ref(), &delivery, &session).await {
                delivery.notify(&to, &line).await;
            }
        });
    })
}

/// How a destination reads in a tool result or on the command line.
pub fn describe(to: &Address) -> String {
    if to.platform == LOCAL {
        return "a local file (cron/output)".to_owned();
    }
    match &to.thread_id {
        Some(thread) => format!("{}:{}:{thread}", to.platform, to.chat_id),
        None => format!("{}:{}", to.platform, to.chat_id),
    }
}

/// Sends `text` to the delivery target `target` through `delivery` and its
/// ledger, `origin` being where the request came from (none: `local`).
/// Returns where it went, or why it did not; the one path shared by the
/// `send_message` tool and the control socket.
pub async fn send_to_target(
    delivery: &Delivery,
    target: &str,
    origin: Option<&Address>,
    text: &str,
) -> Result<String, String> {
    if text.trim().is_empty() {
        return Err("the message is empty".to_owned());
    }
    let target: Target = target.parse().map_err(|e| format!("{e}"))?;
    let to = delivery
        .resolve(&target, origin)
        .map_err(|e| e.to_string())?;
    delivery
        .deliver_message(&to, text)
        .await
        .map_err(|e| format!("could not send to {}: {e}", describe(&to)))?;
    Ok(format!("sent to {}", describe(&to)))
}

/// Where `delivery` can send for any caller: each connected platform's
/// home channel, and `local`. A platform is listed only when
/// [`Delivery::resolve`], the check every send makes, takes it, so a
/// listed target is never refused for where it points (a platform with no
/// home channel is reached as `<platform>:<chat_id>`, not by its name).
/// `origin` is not here: only a caller in a conversation has one.
pub fn delivery_targets(delivery: &Delivery) -> Vec<TargetInfo> {
    let mut out: Vec<TargetInfo> = delivery
        .platforms()
        .into_iter()
        .filter_map(|platform| {
            let to = delivery
                .resolve(
                    &Target::Home {
                        platform: platform.clone(),
                    },
                    None,
                )
                .ok()?;
            Some(TargetInfo {
                description: format!("{platform}'s home channel ({})", describe(&to)),
                target: platform,
            })
        })
        .collect();
    out.push(TargetInfo {
        target: "local".into(),
        description: "a file under cron/output in the Talaria home".into(),
    });
    out
}

#[async_trait]
impl Messenger for GatewayMessenger {
    async fn send(&self, target: &str, message: &str, session_id: &str) -> Result<String, String> {
        let delivery = self.delivery()?;
        // Only `origin` needs the session's chat; skip the lookup otherwise.
        let origin = match target.parse::<Target>() {
            Ok(Target::Origin) => session_chat(self.store.as_ref(), delivery, session_id).await,
            _ => None,
        };
        send_to_target(delivery, target, origin.as_ref(), message).await
    }

    async fn targets(&self) -> Result<Vec<TargetInfo>, String> {
        let mut out = delivery_targets(self.delivery()?);
        // The agent calls from a conversation, so it has an origin.
        out.push(TargetInfo {
            target: "origin".into(),
            description: "the chat this conversation is in".into(),
        });
        Ok(out)
    }
}
