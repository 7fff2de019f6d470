use super::*;
use crate::http::Failure;

fn settings(bot: &str, app: &str, base: &str) -> SlackSettings {
    SlackSettings {
        bot_token: bot.into(),
        app_token: app.into(),
        api_base: base.into(),
        require_mention: true,
        working_reaction: Some("eyes".into()),
        ping_interval: Duration::from_secs(1),
        ping_timeout: Duration::from_secs(3),
    }
}

#[test]
fn from_config_needs_both_tokens() {
    let empty = Env::from_pairs(Vec::<(String, String)>::new());
    let both = Env::from_pairs([
        ("SLACK_BOT_TOKEN", "xoxb-env"),
        ("SLACK_APP_TOKEN", "xapp-env"),
    ]);
    let mut cfg = SlackConfig::default();
    assert!(SlackSettings::from_config(&cfg, &empty).is_none());
    assert!(
        SlackSettings::from_config(&cfg, &Env::from_pairs([("SLACK_BOT_TOKEN", "xoxb-1")]))
            .is_none()
    );
    let s = SlackSettings::from_config(&cfg, &both).unwrap();
    assert_eq!(s.bot_token, "xoxb-env");
    assert_eq!(s.app_token, "xapp-env");
    assert_eq!(s.api_base, "https://slack.com/api");
    assert!(s.require_mention);
    assert_eq!(s.working_reaction.as_deref(), Some("eyes"));
    cfg.bot_token = Some(talaria_core::Secret::new("xoxb-cfg"));
    cfg.working_reaction = String::new();
    let s = SlackSettings::from_config(&cfg, &both).unwrap();
    assert_eq!(s.bot_token, "xoxb-cfg");
    assert_eq!(s.working_reaction, None);
    let off = Env::from_pairs([
        ("SLACK_BOT_TOKEN", "xoxb-env"),
        ("SLACK_APP_TOKEN", "xapp-env"),
        ("SLACK_REQUIRE_MENTION", "false"),
    ]);
    assert!(
        !SlackSettings::from_config(&cfg, &off)
            .unwrap()
            .require_mention
    );
    cfg.enabled = Some(false);
    assert!(SlackSettings::from_config(&cfg, &both).is_none());
}

#[test]
fn new_validates_and_debug_hides_tokens() {
    let ok = settings(
        "xoxb-SECRETSECRET1",
        "xapp-SECRETSECRET2",
        "http://127.0.0.1:1",
    );
    assert!(!format!("{ok:?}").contains("SECRETSECRET"));
    let a = SlackAdapter::new(ok).unwrap();
    assert!(!format!("{a:?}").contains("SECRETSECRET"));
    assert_eq!(
        a.credential(),
        Some(("slack-app-token", "xapp-SECRETSECRET2".to_owned()))
    );
    assert_eq!(
        SlackAdapter::new(settings("", "xapp-1", "http://x")).err(),
        Some(SlackError::BadBotToken)
    );
    assert_eq!(
        SlackAdapter::new(settings("xoxb-a b", "xapp-1", "http://x")).err(),
        Some(SlackError::BadBotToken)
    );
    assert_eq!(
        SlackAdapter::new(settings("xoxb-1", "xoxb-2", "http://x")).err(),
        Some(SlackError::BadAppToken)
    );
    assert!(matches!(
        SlackAdapter::new(settings("xoxb-1", "xapp-1", "ftp://x")),
        Err(SlackError::BadApiBase(_))
    ));
}

#[test]
fn errors_are_classified() {
    let failed = |failure| ApiError::new(api::SLACK, failure);
    let answered = |status, error: Option<&str>, retry_after: Option<u64>| {
        failed(Failure::Status {
            status,
            code: error.map(str::to_owned),
            message: String::new(),
            retry_after: retry_after.map(Duration::from_secs),
        })
    };
    let slack = |e: &str| answered(200, Some(e), None);
    assert_eq!(
        classify(slack("channel_not_found")),
        SendError::Rejected("channel_not_found".into())
    );
    assert!(matches!(
        classify(slack("not_in_channel")),
        SendError::Rejected(_)
    ));
    assert!(matches!(
        classify(slack("invalid_auth")),
        SendError::Rejected(_)
    ));
    assert!(matches!(
        classify(slack("internal_error")),
        SendError::Transient(_)
    ));
    assert!(matches!(
        classify(answered(503, None, None)),
        SendError::Transient(_)
    ));
    assert!(matches!(
        classify(failed(Failure::Connect("x".into()))),
        SendError::Unavailable(_)
    ));
    assert!(matches!(
        classify(failed(Failure::Timeout("x".into()))),
        SendError::Ambiguous(_)
    ));
    assert_eq!(api::rate_limit(&slack("ratelimited")), Some(None));
    assert_eq!(
        api::rate_limit(&answered(429, None, Some(3))),
        Some(Some(Duration::from_secs(3)))
    );
    assert!(api::is_auth(&slack("invalid_auth")));
    assert!(!api::is_auth(&slack("channel_not_found")));
}
