use super::*;
use reply::MAX_REFERENCES;

struct NoCursors;
#[async_trait]
impl CursorStore for NoCursors {
    async fn cursor(&self, _: &str, _: &str) -> talaria_store::Result<Option<String>> {
        Ok(None)
    }
    async fn set_cursor(&self, _: &str, _: &str, _: &str) -> talaria_store::Result<()> {
        Ok(())
    }
    async fn delete_cursor(&self, _: &str, _: &str) -> talaria_store::Result<bool> {
        Ok(false)
    }
}

fn settings(imap_host: &str, tls: MailTls) -> EmailSettings {
    let env = Env::from_pairs([
        ("EMAIL_ADDRESS", "bot@example.test"),
        ("EMAIL_PASSWORD", "SECRETSECRETSECRET"),
        ("EMAIL_IMAP_HOST", imap_host),
        ("EMAIL_SMTP_HOST", "127.0.0.1:2525"),
    ]);
    let config = EmailConfig {
        imap_tls: tls,
        smtp_tls: MailTls::None,
        ..EmailConfig::default()
    };
    EmailSettings::from_config(&config, &env).unwrap()
}

#[test]
fn from_config_reads_config_then_environment() {
    let empty = Env::from_pairs(Vec::<(String, String)>::new());
    let mut cfg = EmailConfig::default();
    assert!(EmailSettings::from_config(&cfg, &empty).is_none());
    let s = settings("imap.example.test", MailTls::Implicit);
    assert_eq!(s.address, "bot@example.test");
    assert_eq!(s.imap.host, "imap.example.test");
    assert_eq!(s.imap.port, 993);
    assert_eq!(s.smtp.host, "127.0.0.1");
    assert_eq!(s.smtp.port, 2525);
    assert_eq!(s.mailbox, "INBOX");
    assert_eq!(s.poll_interval, Duration::from_secs(60));
    assert!(!format!("{s:?}").contains("SECRETSECRET"));
    let env = Env::from_pairs([
        ("EMAIL_ADDRESS", "env@example.test"),
        ("EMAIL_PASSWORD", "pw"),
        ("EMAIL_IMAP_HOST", "[::1]:1143"),
        ("EMAIL_SMTP_HOST", "smtp.example.test"),
    ]);
    cfg.address = Some("cfg@example.test".into());
    let s = EmailSettings::from_config(&cfg, &env).unwrap();
    assert_eq!(s.address, "cfg@example.test");
    assert_eq!((s.imap.host.as_str(), s.imap.port), ("::1", 1143));
    assert_eq!(
        (s.smtp.host.as_str(), s.smtp.port),
        ("smtp.example.test", 587)
    );
    cfg.enabled = Some(false);
    assert!(EmailSettings::from_config(&cfg, &env).is_none());
}

#[test]
fn plain_connections_only_on_loopback() {
    assert!(
        EmailAdapter::new(
            settings("127.0.0.1:1143", MailTls::None),
            Arc::new(NoCursors)
        )
        .is_ok()
    );
    assert!(EmailAdapter::new(settings("localhost", MailTls::None), Arc::new(NoCursors)).is_ok());
    let err = EmailAdapter::new(
        settings("imap.example.test", MailTls::None),
        Arc::new(NoCursors),
    )
    .unwrap_err();
    assert_eq!(
        err,
        EmailError::InsecureTls("imap", "imap.example.test".into())
    );
    assert!(err.to_string().contains("loopback"), "{err}");
    let mut s = settings("imap.example.test", MailTls::Starttls);
    s.address = "not an address".into();
    assert!(matches!(
        EmailAdapter::new(s, Arc::new(NoCursors)),
        Err(EmailError::BadAddress(_))
    ));
}

#[test]
fn references_keep_the_root_and_the_newest() {
    let c = ReplyContext {
        message_id: Some("m30".into()),
        references: (0..30).map(|i| format!("m{i}")).collect(),
        subject: String::new(),
    };
    let refs = c.reply_references();
    assert_eq!(refs.len(), MAX_REFERENCES);
    assert_eq!(refs[0], "m0");
    assert_eq!(refs.last().unwrap(), "m30");
    let c = ReplyContext {
        message_id: Some("b".into()),
        references: vec!["a".into()],
        subject: String::new(),
    };
    assert_eq!(c.reply_references(), vec!["a", "b"]);
}

#[test]
fn positions_round_trip() {
    let p = Position {
        validity: 17,
        last_uid: 4,
    };
    assert_eq!(Position::parse(&p.render()), Some(p));
    assert_eq!(Position::parse("x:1"), None);
}
