//! An adapter that connects nowhere and records what it is asked to send,
//! for tests of the gateway's own logic (commands, delivery, the ledger)
//! where no platform's behaviour is under test.

use std::sync::Mutex;

use async_trait::async_trait;
use talaria_adapter::{
    Adapter, AdapterContext, AdapterError, Capabilities, LengthUnit, MessageLimits,
    OutboundMessage, SendError, SentMessage,
};

/// A chat platform named `platform` (so its allowlists and home channel
/// are that platform's) that sends into a list.
#[derive(Debug)]
pub struct Recorder {
    platform: &'static str,
    sent: Mutex<Vec<OutboundMessage>>,
}

impl Recorder {
    /// A recorder that calls itself `platform`.
    pub fn new(platform: &'static str) -> Recorder {
        Recorder {
            platform,
            sent: Mutex::new(Vec::new()),
        }
    }

    /// Every message sent so far, in order.
    pub fn sent(&self) -> Vec<OutboundMessage> {
        self.sent.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

#[async_trait]
impl Adapter for Recorder {
    fn platform(&self) -> &'static str {
        self.platform
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::chat(MessageLimits {
            max_len: 4096,
            unit: LengthUnit::Chars,
        })
    }

    /// Nothing arrives: it waits for the shutdown.
    async fn run(&self, ctx: AdapterContext) -> Result<(), AdapterError> {
        ctx.shutdown.cancelled().await;
        Ok(())
    }

    async fn send(&self, message: &OutboundMessage) -> Result<SentMessage, SendError> {
        self.sent
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(message.clone());
        Ok(SentMessage::default())
    }
}
