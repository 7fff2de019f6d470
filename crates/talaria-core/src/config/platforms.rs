//! The `platforms:` sections: one per platform the gateway connects, and
//! the API server's.

use super::*;

/// `platforms:`.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct PlatformsConfig {
    /// `platforms.telegram`.
    pub telegram: TelegramConfig,
    /// `platforms.discord`.
    pub discord: DiscordConfig,
    /// `platforms.mattermost`.
    pub mattermost: MattermostConfig,
    /// Slack over Socket Mode and the Web API.
    pub slack: SlackConfig,
    /// `platforms.api_server`: the OpenAI-compatible HTTP server.
    pub api_server: ApiServerConfig,
    /// Signed HTTP deliveries from other services (GitHub, GitLab, Svix, ...).
    pub webhook: WebhookConfig,
    /// A Matrix account, over the client-server API's `/sync`.
    pub matrix: MatrixConfig,
    /// A Signal account, through a signal-cli REST API server.
    pub signal: SignalConfig,
    /// The WhatsApp Cloud API: Meta's webhook in, the Graph API out.
    pub whatsapp_cloud: WhatsappCloudConfig,
    /// SMS through a Twilio phone number (webhook in, REST out).
    pub sms: SmsConfig,
    /// A mailbox: IMAP in, SMTP out.
    pub email: EmailConfig,
    /// Home Assistant: a conversation endpoint on the webhook listener,
    /// and the `ha_*` tools.
    pub homeassistant: HomeAssistantConfig,
}

/// `platforms.telegram:`. The token may instead come from
/// `TELEGRAM_BOT_TOKEN`; setting it either way enables the platform unless
/// `enabled: false`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct TelegramConfig {
    /// `None` means "enabled when a token is set".
    pub enabled: Option<bool>,
    /// The bot token from @BotFather; else `TELEGRAM_BOT_TOKEN`.
    pub token: Option<Secret>,
    /// The Bot API root; requests go to `{base_url}/bot{token}/{method}`.
    pub base_url: String,
    /// In groups, answer only messages that mention the bot or reply to it.
    pub require_mention: bool,
    /// Show the answer growing by editing one message while it streams.
    pub streaming_edits: bool,
    /// Seconds a `getUpdates` long poll waits on the server.
    pub poll_timeout_secs: u64,
}

impl Default for TelegramConfig {
    fn default() -> TelegramConfig {
        TelegramConfig {
            enabled: None,
            token: None,
            base_url: "https://api.telegram.org".to_owned(),
            require_mention: false,
            streaming_edits: false,
            poll_timeout_secs: 30,
        }
    }
}

/// `platforms.discord:`. The token may instead come from
/// `DISCORD_BOT_TOKEN`; setting it either way enables the platform unless
/// `enabled: false`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct DiscordConfig {
    /// `None` means "enabled when a token is set".
    pub enabled: Option<bool>,
    /// The bot token; else `DISCORD_BOT_TOKEN`.
    pub token: Option<Secret>,
    /// The REST API root (`{api_base}/channels/{id}/messages`, ...).
    pub api_base: String,
    /// The gateway WebSocket URL; `None` asks `{api_base}/gateway/bot`.
    pub gateway_url: Option<String>,
    /// In guild channels, answer only messages that mention the bot.
    pub require_mention: bool,
}

impl Default for DiscordConfig {
    fn default() -> DiscordConfig {
        DiscordConfig {
            enabled: None,
            token: None,
            api_base: "https://discord.com/api/v10".to_owned(),
            gateway_url: None,
            require_mention: true,
        }
    }
}

/// `platforms.mattermost:`. The server root may instead come from
/// `MATTERMOST_URL` and the token from `MATTERMOST_TOKEN`; a token set
/// either way enables the platform unless `enabled: false`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct MattermostConfig {
    /// `None` means "enabled when a token is set".
    pub enabled: Option<bool>,
    /// The server root, e.g. `https://chat.example.com` (no `/api/v4`).
    pub url: Option<String>,
    /// A bot account's or a personal access token.
    pub token: Option<Secret>,
    /// In channels and group messages, answer only posts that mention the
    /// bot (or continue a thread it answered in).
    pub require_mention: bool,
    /// Seconds between application-level pings on the WebSocket; a socket
    /// silent for two of these is rebuilt.
    pub ping_interval_secs: u64,
}

impl Default for MattermostConfig {
    fn default() -> MattermostConfig {
        MattermostConfig {
            enabled: None,
            url: None,
            token: None,
            require_mention: true,
            ping_interval_secs: 30,
        }
    }
}

/// `platforms.sms:`, text messages through a Twilio phone number. Each
/// value may instead come from the environment: `TWILIO_ACCOUNT_SID`,
/// `TWILIO_AUTH_TOKEN`, `TWILIO_PHONE_NUMBER` and `SMS_WEBHOOK_URL`. An
/// account SID and an auth token set either way enable the platform unless
/// `enabled: false`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct SmsConfig {
    /// `None` means "enabled when an account SID and an auth token are set".
    pub enabled: Option<bool>,
    /// The Twilio account SID (`AC...`).
    pub account_sid: Option<String>,
    /// The account's auth token: it authenticates sends and is the key
    /// Twilio signs webhooks with.
    pub auth_token: Option<Secret>,
    /// The Twilio number answers come from, in E.164 (`+15551234567`).
    pub phone_number: Option<String>,
    /// The public URL Twilio posts incoming messages to (as configured on
    /// the number in Twilio's console); signatures are computed over it.
    pub webhook_url: Option<String>,
    /// The REST API root; sends go to
    /// `{api_base}/2010-04-01/Accounts/{sid}/Messages.json`.
    pub api_base: String,
    /// The most segments one SMS may use; longer ones are shortened to
    /// fit. `None` (or 0) means no cap.
    pub max_segments: Option<u32>,
}

impl Default for SmsConfig {
    fn default() -> SmsConfig {
        SmsConfig {
            enabled: None,
            account_sid: None,
            auth_token: None,
            phone_number: None,
            webhook_url: None,
            api_base: "https://api.twilio.com".to_owned(),
            max_segments: None,
        }
    }
}

/// `platforms.matrix:`. The homeserver, access token and user id may
/// instead come from `MATRIX_HOMESERVER`, `MATRIX_ACCESS_TOKEN` and
/// `MATRIX_USER_ID`; a homeserver and a token enable the platform unless
/// `enabled: false`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct MatrixConfig {
    /// `None` means "enabled when a homeserver and a token are set".
    pub enabled: Option<bool>,
    /// The homeserver's client-server API root (`https://matrix.example.org`).
    pub homeserver: Option<String>,
    /// The account's access token; else `MATRIX_ACCESS_TOKEN`.
    pub access_token: Option<Secret>,
    /// The bot's own user id (`@talaria:example.org`); asked from the
    /// homeserver (`whoami`) when unset.
    pub user_id: Option<String>,
    /// In rooms with more than two members, answer only messages that
    /// mention the bot (or reply to it, or continue a thread it is in).
    pub require_mention: bool,
    /// Milliseconds a `/sync` long poll waits on the server.
    pub sync_timeout_ms: u64,
}

impl Default for MatrixConfig {
    fn default() -> MatrixConfig {
        MatrixConfig {
            enabled: None,
            homeserver: None,
            access_token: None,
            user_id: None,
            require_mention: true,
            sync_timeout_ms: 30_000,
        }
    }
}

/// `platforms.signal:`, a Signal account served by a signal-cli REST API
/// server (`bbernhard/signal-cli-rest-api`). The server root may instead
/// come from `SIGNAL_HTTP_URL` and the account from `SIGNAL_ACCOUNT`; both
/// set either way enable the platform unless `enabled: false`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct SignalConfig {
    /// `None` means "enabled when a server and an account are set".
    pub enabled: Option<bool>,
    /// The REST API root, e.g. `http://127.0.0.1:8080`.
    pub http_url: Option<String>,
    /// The bot's number as registered (or linked) on the server, in
    /// international format (`+4915112345678`). YAML reads an unquoted
    /// `+4915112345678` as a number; that is taken back as the number it
    /// was written as.
    #[serde(deserialize_with = "phone_number")]
    pub account: Option<String>,
    /// How messages are received: `websocket` (the server's `json-rpc`
    /// mode) or `poll` (its `normal` and `native` modes). When the server
    /// says which mode it runs in, that wins.
    pub receive_mode: SignalReceiveMode,
    /// Seconds between two receive calls that found nothing (`poll`).
    pub poll_interval_secs: u64,
    /// In groups, answer only messages that mention the bot or quote it.
    pub require_mention: bool,
}

impl Default for SignalConfig {
    fn default() -> SignalConfig {
        SignalConfig {
            enabled: None,
            http_url: None,
            account: None,
            receive_mode: SignalReceiveMode::Websocket,
            poll_interval_secs: 2,
            require_mention: true,
        }
    }
}

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

/// `platforms.homeassistant:`. The URL and token may instead come from
/// `HASS_URL` and `HASS_TOKEN` (they enable the `ha_*` tools), and the
/// conversation secret from `HASS_CONVERSATION_TOKEN` (it enables the
/// conversation endpoint); `enabled: false` turns both off.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct HomeAssistantConfig {
    /// `None` means "on when the credentials are set".
    pub enabled: Option<bool>,
    /// Home Assistant's root URL, e.g. `http://homeassistant.local:8123`.
    pub url: Option<String>,
    /// A long-lived access token (a user's profile page in Home Assistant).
    pub token: Option<Secret>,
    /// The bearer secret Home Assistant sends to
    /// `POST /homeassistant/conversation`.
    pub conversation_token: Option<Secret>,
    /// Services `ha_call_service` may call without asking, as
    /// `domain.service` patterns (`light.*`, `media_player.volume_set`);
    /// empty: every call asks.
    pub allowed_services: Vec<String>,
    /// How long a conversation request waits for the answer before it is
    /// answered "still working" (the answer then becomes a notification).
    pub reply_timeout_secs: u64,
}

impl Default for HomeAssistantConfig {
    fn default() -> HomeAssistantConfig {
        HomeAssistantConfig {
            enabled: None,
            url: None,
            token: None,
            conversation_token: None,
            allowed_services: Vec::new(),
            reply_timeout_secs: 60,
        }
    }
}

/// A phone number written as text or, unquoted in YAML, as an integer
/// (whose `+` the YAML reader dropped).
fn phone_number<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Number {
        Text(String),
        Integer(u64),
    }
    Ok(match Option::<Number>::deserialize(d)? {
        None => None,
        Some(Number::Text(t)) => Some(t),
        Some(Number::Integer(n)) => Some(format!("+{n}")),
    })
}

/// `platforms.signal.receive_mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SignalReceiveMode {
    /// `GET /v1/receive/{account}` as a WebSocket.
    Websocket,
    /// `GET /v1/receive/{account}` as plain requests, one after another.
    Poll,
}

/// `platforms.slack:`. The tokens may instead come from `SLACK_BOT_TOKEN`
/// (`xoxb-...`) and `SLACK_APP_TOKEN` (`xapp-...`, for Socket Mode);
/// setting both either way enables the platform unless `enabled: false`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct SlackConfig {
    /// `None` means "enabled when both tokens are set".
    pub enabled: Option<bool>,
    /// The bot token (`xoxb-...`), for the Web API.
    pub bot_token: Option<Secret>,
    /// The app-level token (`xapp-...`) with `connections:write`, for
    /// opening Socket Mode connections.
    pub app_token: Option<Secret>,
    /// The Web API root; requests go to `{api_base}/{method}`.
    pub api_base: String,
    /// In channels and group DMs, answer only messages that mention the bot.
    pub require_mention: bool,
    /// The reaction put on a message while its answer is being worked on
    /// (bots cannot show "typing" in Slack); empty for none.
    pub working_reaction: String,
    /// Milliseconds between WebSocket pings on the Socket Mode connection.
    pub ping_interval_ms: u64,
    /// Milliseconds without any answer to a ping after which the connection
    /// counts as dead and is rebuilt.
    pub ping_timeout_ms: u64,
}

impl Default for SlackConfig {
    fn default() -> SlackConfig {
        SlackConfig {
            enabled: None,
            bot_token: None,
            app_token: None,
            api_base: "https://slack.com/api".to_owned(),
            require_mention: true,
            working_reaction: "eyes".to_owned(),
            ping_interval_ms: 10_000,
            ping_timeout_ms: 30_000,
        }
    }
}

/// `platforms.api_server:`, the OpenAI-compatible HTTP endpoint. The key
/// may instead come from `API_SERVER_KEY`, host and port from
/// `API_SERVER_HOST` and `API_SERVER_PORT`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ApiServerConfig {
    /// `None` means "enabled when a key is set".
    pub enabled: Option<bool>,
    /// The address to listen on; else `API_SERVER_HOST`, then loopback.
    pub host: Option<String>,
    /// The port; else `API_SERVER_PORT`, then 8642.
    pub port: Option<u16>,
    /// The bearer key clients send; else `API_SERVER_KEY`.
    pub key: Option<Secret>,
    /// Turns running at once; more get 429. 0 means no cap.
    pub max_concurrent_runs: usize,
    /// Seconds a client may take to send a request head (also the most a
    /// kept-alive connection idles); then the connection is closed.
    pub header_timeout_secs: u64,
    /// Seconds a client may take to send a request body; then the
    /// request fails and the connection is closed.
    pub body_timeout_secs: u64,
}

impl Default for ApiServerConfig {
    fn default() -> ApiServerConfig {
        ApiServerConfig {
            enabled: None,
            host: None,
            port: None,
            key: None,
            max_concurrent_runs: 10,
            header_timeout_secs: 10,
            body_timeout_secs: 30,
        }
    }
}

/// `platforms.whatsapp_cloud:`, a WhatsApp Business number through Meta's
/// Cloud API. Each secret may instead come from `WHATSAPP_CLOUD_TOKEN`,
/// `WHATSAPP_CLOUD_PHONE_NUMBER_ID`, `WHATSAPP_CLOUD_APP_SECRET` and
/// `WHATSAPP_CLOUD_VERIFY_TOKEN`; setting any of them enables the platform
/// unless `enabled: false`, and then all four are required. Deliveries
/// arrive on the shared webhook listener (`platforms.webhook.host`/`port`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct WhatsappCloudConfig {
    /// `None` means "enabled when any of the four credentials is set".
    pub enabled: Option<bool>,
    /// A system user's access token with `whatsapp_business_messaging`.
    pub token: Option<Secret>,
    /// The business phone number's id (not the phone number itself).
    pub phone_number_id: Option<String>,
    /// The Meta app's secret, which signs every webhook delivery.
    pub app_secret: Option<Secret>,
    /// The token Meta echoes in the webhook verification handshake.
    pub verify_token: Option<Secret>,
    /// The Graph API root; sends go to
    /// `{graph_base}/{api_version}/{phone_number_id}/messages`.
    pub graph_base: String,
    /// The Graph API version, e.g. `v21.0`.
    pub api_version: String,
    /// Larger webhook bodies get 413 without being read further.
    pub max_body_bytes: usize,
}

impl Default for WhatsappCloudConfig {
    fn default() -> WhatsappCloudConfig {
        WhatsappCloudConfig {
            enabled: None,
            token: None,
            phone_number_id: None,
            app_secret: None,
            verify_token: None,
            graph_base: "https://graph.facebook.com".to_owned(),
            api_version: "v21.0".to_owned(),
            max_body_bytes: 1024 * 1024,
        }
    }
}

/// `platforms.webhook:`, the HTTP endpoint that turns signed deliveries
/// from other services into agent turns (`POST /webhooks/<route>`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct WebhookConfig {
    /// `None` means "enabled when at least one route is configured".
    pub enabled: Option<bool>,
    /// The interface to listen on. Loopback by default: put a reverse proxy
    /// with TLS in front rather than exposing the port directly.
    pub host: String,
    /// The shared webhook listener's port (8644 by default).
    pub port: u16,
    /// Larger request bodies get 413 without being read further.
    pub max_body_bytes: usize,
    /// Accepted deliveries per route in any 60 s; more get 429. 0 means no
    /// limit.
    pub rate_limit_per_minute: u32,
    /// Seconds a client may take to send a request head to the listener
    /// (also the most a kept-alive connection idles).
    pub header_timeout_secs: u64,
    /// Seconds a client may take to send a request body.
    pub body_timeout_secs: u64,
    /// The routes by name; each is served at `/webhooks/<name>`. Names pass
    /// the strict id validator, since they become part of a URL path and of
    /// session keys.
    #[serde(deserialize_with = "webhook_routes")]
    pub routes: BTreeMap<String, WebhookRouteConfig>,
}

impl Default for WebhookConfig {
    fn default() -> WebhookConfig {
        WebhookConfig {
            enabled: None,
            host: "127.0.0.1".to_owned(),
            port: 8644,
            max_body_bytes: 1024 * 1024,
            rate_limit_per_minute: 30,
            header_timeout_secs: 10,
            body_timeout_secs: 30,
            routes: BTreeMap::new(),
        }
    }
}

/// Which signature check a webhook route applies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum WebhookScheme {
    /// `X-Hub-Signature-256: sha256=<hex HMAC-SHA256 of the body>`.
    Github,
    /// `X-Gitlab-Token` equal to the secret.
    Gitlab,
    /// Svix / Standard Webhooks: `svix-id`, `svix-timestamp`,
    /// `svix-signature` (base64 HMAC-SHA256 of `id.timestamp.body`).
    Svix,
    /// `X-Webhook-Timestamp` and `X-Webhook-Signature: sha256=<hex
    /// HMAC-SHA256 of timestamp.body>`.
    Hmac,
}

/// One entry of `platforms.webhook.routes`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WebhookRouteConfig {
    /// The shared secret the sender signs with.
    #[serde(default)]
    pub secret: Option<Secret>,
    /// The environment variable holding the secret, instead of `secret`.
    #[serde(default)]
    pub secret_env: Option<String>,
    /// Which signature check applies; there is no default, so a route
    /// cannot end up checked by a scheme its sender does not use.
    pub scheme: WebhookScheme,
    /// The prompt template: `{payload.a.b}`, `{event_type}`, `{route}`,
    /// `{__raw__}`. Empty gives a default that shows the whole payload.
    #[serde(default)]
    pub prompt: String,
    /// Where the answer goes: `local`, `telegram` (its home channel) or
    /// `telegram:<chat_id>`.
    #[serde(default = "default_webhook_deliver")]
    pub deliver: String,
    /// Event types to act on; others are answered `ignored`. Empty means
    /// every event.
    #[serde(default)]
    pub events: Vec<String>,
    /// `false` answers every delivery with 403.
    #[serde(default = "default_true")]
    pub enabled: bool,
}

fn default_webhook_deliver() -> String {
    "local".to_owned()
}

fn default_true() -> bool {
    true
}

/// Reads the route map, refusing names that are not strict ids.
fn webhook_routes<'de, D: Deserializer<'de>>(
    d: D,
) -> Result<BTreeMap<String, WebhookRouteConfig>, D::Error> {
    let routes = BTreeMap::<String, WebhookRouteConfig>::deserialize(d)?;
    for name in routes.keys() {
        if let Err(e) = crate::ids::validate_path_component(name) {
            return Err(serde::de::Error::custom(format!(
                "route name `{name}` is not usable in a URL path ({e}); use letters, digits, \
                 `_`, `-` and `.`"
            )));
        }
    }
    Ok(routes)
}
