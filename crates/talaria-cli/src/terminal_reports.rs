//! The terminal's side of work that outlives a turn (see
//! [`talaria_agent::background`]): in `talaria chat` the person is right
//! here, so a background command's notices are printed as they come. Nothing
//! is owed across a restart: the work ends with the chat.

use async_trait::async_trait;
use talaria_agent::background::{JobReport, JobStart, Reports};

/// Prints reports on stderr, beside the conversation.
#[derive(Debug, Clone, Copy, Default)]
pub struct TerminalReports;

#[async_trait]
impl Reports for TerminalReports {
    async fn opened(&self, _job: &JobStart) -> Result<(), String> {
        Ok(())
    }

    async fn progress(&self, _job: &JobStart, text: &str) {
        eprintln!("\n  {text}");
    }

    async fn closed(&self, _job: &JobStart, report: JobReport) {
        eprintln!("\n{}", report.text);
    }

    async fn dropped(&self, _job: &JobStart) {}
}
