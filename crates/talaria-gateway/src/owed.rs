//! Owed turns: a message accepted by the runner is owed an answer until
//! one is stored, or the user is told it failed or it was lost.
//!
//! The runner records each message that starts a turn (with the inbound
//! dedupe, in one store step) before the adapter may acknowledge it to its
//! platform. The turn's answer settles it in the outbox transaction that
//! stores the answer and its ledger row, so an answered message is never
//! run again; a failure notice, `/stop` or `/new` settle it too. When the
//! node running it dies (SIGKILL, a crash, a stop that outlasted the drain)
//! the row outlives it, and [`Runner::recover_owed`](crate::runner::Runner::recover_owed)
//! on the next node to sweep (this one after a restart, or another of the
//! deployment) runs the turn again, or, when it has been tried too often
//! or is too old to matter, tells the user it was lost.

use std::time::Duration;

use rand::Rng;

/// A node takes a turn over at most this many times; the next time, the
/// user is told the message was lost. A message whose turn itself kills
/// the process (a tool that exhausts memory, say) would otherwise be run
/// again on every restart.
pub const MAX_CLAIMS: u32 = 3;

/// Older than this, a message is not answered any more but said lost: an
/// answer a day late to a question nobody remembers is worse than a note.
pub const MAX_AGE: Duration = Duration::from_secs(24 * 3600);

/// Most owed turns one sweep takes over.
pub const CLAIM_LIMIT: usize = 256;

/// The owed turn's id: the platform with its inbound id when the message
/// has one (unique, and the same on every node), else a random one.
pub fn turn_id(platform: &str, inbound_id: Option<&str>) -> String {
    match inbound_id {
        Some(id) => format!("{platform}\u{1f}{id}"),
        None => {
            let n: u128 = rand::rng().random();
            format!("{platform}\u{1f}~{n:032x}")
        }
    }
}

/// What the user reads when a message of theirs was lost.
pub fn lost_notice(text: &str) -> String {
    let mut quoted: String = text.chars().take(80).collect();
    if quoted.len() < text.len() {
        quoted.push('…');
    }
    format!(
        "⚠️ I lost your message “{quoted}” while restarting and could not answer it. Please send it again."
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_stable_with_an_inbound_id_and_unique_without() {
        assert_eq!(
            turn_id("telegram", Some("42\u{1f}7")),
            turn_id("telegram", Some("42\u{1f}7"))
        );
        assert_ne!(
            turn_id("telegram", Some("1")),
            turn_id("discord", Some("1"))
        );
        assert_ne!(turn_id("api", None), turn_id("api", None));
    }

    #[test]
    fn the_notice_quotes_a_short_start_of_the_message() {
        let long = "é".repeat(200);
        let notice = lost_notice(&long);
        assert!(notice.contains(&"é".repeat(80)));
        assert!(!notice.contains(&"é".repeat(81)));
        assert!(notice.contains('…'));
        assert!(lost_notice("hi").contains("“hi”"));
    }
}
