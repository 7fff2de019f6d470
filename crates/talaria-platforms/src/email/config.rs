//! `platforms.email`: E-mail's section of the configuration, its defaults, its
//! checks, and the environment variables that fill its keys.

use serde::{Deserialize, Serialize};
use talaria_core::Secret;
use talaria_core::config::PlatformSection;
use talaria_core::effective::{EnvKey, fills};

/// How a mail connection is secured.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MailTls {
    /// TLS from the first byte (IMAP on 993, SMTP on 465).
    Implicit,
    /// A plain connection upgraded with STARTTLS before logging in.
    Starttls,
    /// No encryption: refused for any host but a loopback address.
    None,
}

/// `platforms.email:`. The account may instead come from `EMAIL_ADDRESS`,
/// `EMAIL_PASSWORD`, `EMAIL_IMAP_HOST` and `EMAIL_SMTP_HOST` (each host
/// may carry a `:port`); an address, a password and both hosts enable the
/// platform unless `enabled: false`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct EmailConfig {
    /// `None` means "enabled when the account and both hosts are set".
    pub enabled: Option<bool>,
    /// The bot's address: the IMAP and SMTP login and the `From` of replies.
    pub address: Option<String>,
    /// The mailbox password; else `EMAIL_PASSWORD`.
    pub password: Option<Secret>,
    /// The IMAP server (a host, or `host:port`).
    pub imap_host: Option<String>,
    /// The IMAP server's port.
    pub imap_port: u16,
    /// How the IMAP connection is encrypted.
    pub imap_tls: MailTls,
    /// The SMTP submission server (a host, or `host:port`).
    pub smtp_host: Option<String>,
    /// The SMTP server's port.
    pub smtp_port: u16,
    /// How the SMTP connection is encrypted.
    pub smtp_tls: MailTls,
    /// The mailbox read for new mail.
    pub mailbox: String,
    /// Seconds between checks for new mail when the server cannot IDLE
    /// (and the longest an IDLE waits before it is renewed).
    pub poll_interval_secs: u64,
}

impl Default for EmailConfig {
    fn default() -> EmailConfig {
        EmailConfig {
            enabled: None,
            address: None,
            password: None,
            imap_host: None,
            imap_port: 993,
            imap_tls: MailTls::Implicit,
            smtp_host: None,
            smtp_port: 587,
            smtp_tls: MailTls::Starttls,
            mailbox: "INBOX".to_owned(),
            poll_interval_secs: 60,
        }
    }
}

impl PlatformSection for EmailConfig {
    const NAME: &'static str = super::PLATFORM;
}

/// The keys of `platforms.email` that environment variables fill when the
/// file leaves them empty.
pub const ENV: &[EnvKey] = &[
    fills("address", "EMAIL_ADDRESS"),
    fills("password", "EMAIL_PASSWORD"),
    fills("imap_host", "EMAIL_IMAP_HOST"),
    fills("smtp_host", "EMAIL_SMTP_HOST"),
];

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registry::read_section;

    #[test]
    fn email_settings_and_tls_modes_are_read() {
        // Moved from core's config tests.
        let (e, w, _) = read_section::<EmailConfig>(
            "platforms:\n  email:\n    address: bot@example.org\n    imap_host: imap.example.org\n    imap_tls: starttls\n    smtp_tls: none\n    poll_interval_secs: 30\n",
        )
        .unwrap();
        assert!(w.is_empty(), "{w:?}");
        assert_eq!(e.address.as_deref(), Some("bot@example.org"));
        assert_eq!(e.imap_tls, MailTls::Starttls);
        assert_eq!(e.smtp_tls, MailTls::None);
        assert_eq!((e.imap_port, e.smtp_port), (993, 587));
        assert_eq!(e.mailbox, "INBOX");
        assert_eq!(e.poll_interval_secs, 30);
        let err = read_section::<EmailConfig>("platforms:\n  email:\n    imap_tls: maybe\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("platforms.email.imap_tls"), "{err}");
    }
}
