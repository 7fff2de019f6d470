//! `platforms.irc`: IRC's section of the configuration, its defaults, its
//! checks, and the environment variables that fill its keys (the names
//! the system this one descends from used).

use serde::{Deserialize, Serialize};
use talaria_core::Secret;
use talaria_core::config::{PlatformSection, SectionError};
use talaria_core::effective::{EnvKey, fills};

/// `platforms.irc:`, one nick on one IRC network. The server may instead
/// come from `IRC_SERVER` and the channels from `IRC_CHANNEL`; a server
/// set either way enables the platform unless `enabled: false`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct IrcConfig {
    /// `None` means "enabled when a server is set".
    pub enabled: Option<bool>,
    /// The server's host name, e.g. `irc.libera.chat`.
    pub server: Option<String>,
    /// The port: 6697 (TLS) by default, 6667 for plain connections.
    pub port: Option<u16>,
    /// Connect with TLS (the default). Plain text is allowed only to a
    /// loopback address.
    pub use_tls: Option<bool>,
    /// A PEM file of certificates to trust besides the public roots, for a
    /// server with a private certificate authority or a self-signed one.
    pub tls_ca_file: Option<String>,
    /// The bot's nick; `talaria_`, `talaria_1`, ... when it is taken.
    pub nickname: Option<String>,
    /// Channels to join, comma-separated (`#talaria,#ops`); the bot also
    /// answers private messages.
    pub channel: Option<String>,
    /// The connection password, sent as `PASS`.
    pub server_password: Option<Secret>,
    /// Identify to NickServ with this password (`IDENTIFY`) after
    /// connecting, when SASL is not configured.
    pub nickserv_password: Option<Secret>,
    /// The account for SASL PLAIN (defaults to the nick).
    pub sasl_username: Option<String>,
    /// Log in with SASL PLAIN before registering; the connection is refused
    /// when the server cannot or the password is wrong.
    pub sasl_password: Option<Secret>,
    /// In channels, answer only messages addressed to the bot
    /// (`talaria: ...`, `talaria, ...`, `@talaria ...`).
    pub require_mention: bool,
    /// The longest message the gateway hands over, in characters; longer
    /// answers come in numbered parts. Each part goes out as one or more
    /// lines within IRC's 512 bytes.
    pub max_message_length: usize,
    /// Lines the bot may send at once before it is paced.
    pub flood_burst: u32,
    /// Milliseconds between lines once the burst is spent.
    pub flood_interval_ms: u64,
    /// Seconds between the bot's own PINGs; a server silent for two of
    /// these is taken as gone and the connection is made again. While the
    /// nick is not the configured one, each ping also tries to take it
    /// back.
    pub ping_interval_secs: u64,
}

impl Default for IrcConfig {
    fn default() -> IrcConfig {
        IrcConfig {
            enabled: None,
            server: None,
            port: None,
            use_tls: None,
            tls_ca_file: None,
            nickname: None,
            channel: None,
            server_password: None,
            nickserv_password: None,
            sasl_username: None,
            sasl_password: None,
            require_mention: true,
            max_message_length: 450,
            flood_burst: 4,
            flood_interval_ms: 1000,
            ping_interval_secs: 60,
        }
    }
}

impl PlatformSection for IrcConfig {
    const NAME: &'static str = "irc";

    fn validate(&self) -> Result<(), SectionError> {
        if !(64..=4000).contains(&self.max_message_length) {
            return Err(SectionError::new(
                "max_message_length",
                "expected a length between 64 and 4000 characters",
            ));
        }
        if self.flood_burst == 0 {
            return Err(SectionError::new("flood_burst", "expected at least 1 line"));
        }
        if self.ping_interval_secs == 0 {
            return Err(SectionError::new(
                "ping_interval_secs",
                "expected at least 1 second",
            ));
        }
        if let Some(nick) = &self.nickname
            && !super::line::is_valid_nick(nick)
        {
            return Err(SectionError::new(
                "nickname",
                "expected a nick of letters, digits and []\\`_^{|}- that does not start with a digit or -",
            ));
        }
        Ok(())
    }
}

/// The keys of `platforms.irc` that environment variables fill when the
/// file leaves them empty.
pub const ENV: &[EnvKey] = &[
    fills("server", "IRC_SERVER"),
    fills("port", "IRC_PORT"),
    fills("use_tls", "IRC_USE_TLS"),
    fills("tls_ca_file", "IRC_TLS_CA_FILE"),
    fills("nickname", "IRC_NICKNAME"),
    fills("channel", "IRC_CHANNEL"),
    fills("server_password", "IRC_SERVER_PASSWORD"),
    fills("nickserv_password", "IRC_NICKSERV_PASSWORD"),
    fills("sasl_username", "IRC_SASL_USERNAME"),
    fills("sasl_password", "IRC_SASL_PASSWORD"),
];

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registry::read_section;
    use talaria_core::config::ConfigError;

    fn parse(text: &str) -> Result<IrcConfig, ConfigError> {
        read_section::<IrcConfig>(text).map(|(s, w, _)| {
            assert!(w.is_empty(), "{w:?}");
            s
        })
    }

    #[test]
    fn the_irc_section_is_read_and_checked() {
        let s = parse(
            "platforms:\n  irc:\n    server: irc.example.org\n    port: 6697\n    nickname: helper\n    channel: \"#a,#b\"\n    flood_burst: 2\n",
        )
        .unwrap();
        assert_eq!(s.server.as_deref(), Some("irc.example.org"));
        assert_eq!((s.port, s.flood_burst), (Some(6697), 2));
        assert_eq!(s.channel.as_deref(), Some("#a,#b"));
        assert_eq!(
            parse("platforms:\n  irc: {}\n").unwrap(),
            IrcConfig::default()
        );
        for (bad, key) in [
            ("nickname: 9lives", "nickname"),
            ("nickname: \"a b\"", "nickname"),
            ("max_message_length: 10", "max_message_length"),
            ("flood_burst: 0", "flood_burst"),
            ("ping_interval_secs: 0", "ping_interval_secs"),
        ] {
            match parse(&format!("platforms:\n  irc:\n    {bad}\n")) {
                Err(ConfigError::Invalid { key: k, line, .. }) => {
                    assert_eq!(k, format!("platforms.irc.{key}"));
                    assert_eq!(line, Some(3));
                }
                other => panic!("{bad}: {other:?}"),
            }
        }
    }
}
