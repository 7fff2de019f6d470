//! The sources this binary stamps on the sessions it stores. The REPL's
//! commands and `talaria chat` both pick sessions by them, so they live
//! apart from either.

/// The source recorded for CLI sessions (`--continue` and `/sessions` look
/// for it).
pub(crate) const SOURCE: &str = "cli";

/// The source recorded for one-shot `-q` sessions: listed and resumable
/// by id, but not where `--continue` or a bare `/resume` goes back to.
pub(crate) const ONE_SHOT_SOURCE: &str = "cli-oneshot";
