//! Inbound mail: from raw RFC 5322 bytes to what the gateway needs, with
//! the loop guards that keep the bot from answering machines (or itself).

use mail_parser::{HeaderValue, MessageParser, MimeHeaders};

/// One inbound mail, reduced to what the gateway and a reply need.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Inbound {
    /// The sender's address, lower-cased.
    pub from: String,
    /// The sender's display name, when the `From` header has one.
    pub from_name: Option<String>,
    /// The subject as decoded (encoded words resolved), possibly empty.
    pub subject: String,
    /// The mail's own `Message-ID`, without angle brackets.
    pub message_id: Option<String>,
    /// `In-Reply-To`, without angle brackets.
    pub in_reply_to: Option<String>,
    /// `References`, oldest first, without angle brackets.
    pub references: Vec<String>,
    /// The body as plain text (HTML converted when there is no plain
    /// part), with trailing quoted history and the signature trimmed.
    pub body: String,
    /// Every attached file, with its bytes (the whole mail is in memory
    /// already: IMAP hands it over in one piece).
    pub attachments: Vec<MailPart>,
}

/// One attached file of an inbound mail.
#[derive(Clone, PartialEq, Eq)]
pub struct MailPart {
    /// Its file name as sent, when it has one.
    pub name: Option<String>,
    /// The type the mail claims (type/subtype), when it says.
    pub mime: Option<String>,
    /// Its bytes, transfer-decoded.
    pub bytes: Vec<u8>,
}

impl std::fmt::Debug for MailPart {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MailPart")
            .field("name", &self.name)
            .field("mime", &self.mime)
            .field("bytes", &self.bytes.len())
            .finish()
    }
}

impl Inbound {
    /// The Message-ID that names this mail's thread: the first of
    /// `References`, else `In-Reply-To`, else the mail's own.
    pub fn thread_root(&self) -> Option<&str> {
        self.references
            .first()
            .or(self.in_reply_to.as_ref())
            .or(self.message_id.as_ref())
            .map(String::as_str)
    }

    /// Whether this mail answers an earlier one.
    pub fn is_reply(&self) -> bool {
        self.in_reply_to.is_some() || !self.references.is_empty()
    }
}

/// Why a mail is not handed to the gateway.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Skip {
    /// Not a message the MIME parser can read.
    #[error("the mail cannot be parsed")]
    Unparseable,
    /// No `From` address, or one that is not a plain mailbox to answer.
    #[error("the mail has no usable sender address")]
    NoSender,
    /// Sent from the bot's own address: answering would loop.
    #[error("the mail comes from the bot's own address")]
    OwnMail,
    /// An out-of-office or other machine-sent mail; the string names the
    /// header that gave it away.
    #[error("the mail is an automatic reply ({0})")]
    Automatic(String),
    /// A bounce or delivery status notification.
    #[error("the mail is a bounce or delivery report")]
    Bounce,
}

/// Parses `raw` and applies the loop guards. `own` is the bot's address.
pub fn parse(raw: &[u8], own: &str) -> Result<Inbound, Skip> {
    let message = MessageParser::default()
        .parse(raw)
        .ok_or(Skip::Unparseable)?;

    let (from, from_name) = message
        .from()
        .and_then(|a| a.first())
        .and_then(|a| {
            let address = a.address()?.trim().to_lowercase();
            Some((address, a.name().map(|n| n.trim().to_owned())))
        })
        .ok_or(Skip::NoSender)?;
    if !is_plain_address(&from) {
        return Err(Skip::NoSender);
    }
    if from == own.trim().to_lowercase() {
        return Err(Skip::OwnMail);
    }

    // RFC 3834: anything but `no` was sent by a machine.
    if let Some(v) = header_text(&message, "Auto-Submitted")
        && !v.eq_ignore_ascii_case("no")
    {
        return Err(Skip::Automatic(format!("Auto-Submitted: {v}")));
    }
    if let Some(v) = header_text(&message, "Precedence")
        && ["bulk", "list", "junk", "auto_reply"]
            .iter()
            .any(|p| v.eq_ignore_ascii_case(p))
    {
        return Err(Skip::Automatic(format!("Precedence: {v}")));
    }
    for marker in ["X-Autoreply", "X-Autorespond"] {
        if header_text(&message, marker).is_some() {
            return Err(Skip::Automatic(marker.to_owned()));
        }
    }
    let local = from.split('@').next().unwrap_or_default();
    let bounce_sender =
        local.eq_ignore_ascii_case("mailer-daemon") || local.eq_ignore_ascii_case("postmaster");
    let empty_return_path = header_text(&message, "Return-Path").is_some_and(|v| {
        v.trim_matches(|c: char| c == '<' || c == '>' || c.is_whitespace())
            .is_empty()
    });
    let is_report = message.content_type().is_some_and(|ct| {
        ct.ctype().eq_ignore_ascii_case("multipart")
            && ct
                .subtype()
                .is_some_and(|s| s.eq_ignore_ascii_case("report"))
    });
    if bounce_sender || empty_return_path || is_report {
        return Err(Skip::Bounce);
    }

    let mut body = String::new();
    let mut i = 0;
    while let Some(part) = message.body_text(i) {
        if !body.is_empty() {
            body.push_str("\n\n");
        }
        body.push_str(&part);
        i += 1;
    }
    let body = trim_history(&body.replace("\r\n", "\n"));

    let attachments = message
        .attachments()
        .map(|part| MailPart {
            name: part
                .attachment_name()
                .map(str::trim)
                .filter(|n| !n.is_empty())
                .map(str::to_owned),
            mime: part.content_type().map(|ct| match ct.subtype() {
                Some(sub) => format!("{}/{}", ct.ctype(), sub).to_ascii_lowercase(),
                None => ct.ctype().to_ascii_lowercase(),
            }),
            bytes: part.contents().to_vec(),
        })
        .collect();

    Ok(Inbound {
        from,
        from_name: from_name.filter(|n| !n.is_empty()),
        subject: message.subject().unwrap_or_default().trim().to_owned(),
        message_id: message.message_id().map(str::to_owned),
        in_reply_to: ids(message.in_reply_to()).into_iter().next(),
        references: ids(message.references()),
        body,
        attachments,
    })
}

/// A header's value as text, when the mail has it.
fn header_text(message: &mail_parser::Message<'_>, name: &str) -> Option<String> {
    message
        .header_raw(name)
        .map(|v| v.trim().to_owned())
        .filter(|v| !v.is_empty())
}

/// The message ids of an `In-Reply-To` or `References` header.
fn ids(value: &HeaderValue<'_>) -> Vec<String> {
    match value {
        HeaderValue::Text(t) => vec![t.to_string()],
        HeaderValue::TextList(list) => list.iter().map(|t| t.to_string()).collect(),
        _ => Vec::new(),
    }
    .into_iter()
    .map(|id| id.trim().trim_matches(|c| c == '<' || c == '>').to_owned())
    .filter(|id| !id.is_empty())
    .collect()
}

/// An address the bot can answer and name a chat by: `local@domain`, no
/// spaces, controls or characters that mean something in keys and targets.
pub fn is_plain_address(address: &str) -> bool {
    let Some((local, domain)) = address.rsplit_once('@') else {
        return false;
    };
    !local.is_empty()
        && !domain.is_empty()
        && address.len() <= 254
        && !address.chars().any(|c| {
            c.is_whitespace() || c.is_control() || matches!(c, ':' | '/' | '\\' | '<' | '>')
        })
        && !address.contains("..")
}

/// Drops what a mail client appends below the new text: a trailing block
/// of `>`-quoted lines with its "On ... wrote:" line, and a signature
/// after the standard `-- ` delimiter. Quotes interleaved with new text
/// are kept, since they give the answer its context.
pub fn trim_history(body: &str) -> String {
    let mut lines: Vec<&str> = body.lines().collect();
    if let Some(sig) = lines.iter().position(|l| *l == "-- ") {
        lines.truncate(sig);
    }
    let blank_or_quoted = |l: &&str| l.trim().is_empty() || l.trim_start().starts_with('>');
    let mut quoted = false;
    while lines.last().is_some_and(blank_or_quoted) {
        quoted |= lines
            .last()
            .is_some_and(|l| l.trim_start().starts_with('>'));
        lines.pop();
    }
    if quoted
        && lines
            .last()
            .is_some_and(|l| l.trim_end().ends_with("wrote:"))
    {
        lines.pop();
    }
    let text = lines.join("\n");
    let trimmed = text.trim();
    if trimmed.is_empty() {
        // All of it was quoted (a forward, say): better the quote than nothing.
        body.trim().to_owned()
    } else {
        trimmed.to_owned()
    }
}

/// A reply's subject: the original's with exactly one `Re: ` in front.
pub fn reply_subject(subject: &str) -> String {
    let mut rest = subject.trim();
    loop {
        let lower = rest.to_ascii_lowercase();
        let stripped = ["re:", "re :", "aw:", "sv:"]
            .iter()
            .find(|p| lower.starts_with(*p))
            .map(|p| rest[p.len()..].trim_start());
        match stripped {
            Some(r) => rest = r,
            None => break,
        }
    }
    if rest.is_empty() {
        "Re: your message".to_owned()
    } else {
        format!("Re: {rest}")
    }
}

/// A subject for a mail that answers nothing (a scheduled message): the
/// first line of its text, shortened.
pub fn fresh_subject(text: &str) -> String {
    let line = text
        .lines()
        .map(str::trim)
        .find(|l| !l.is_empty())
        .unwrap_or("Message from Talaria");
    let mut subject: String = line.chars().take(70).collect();
    if line.chars().count() > 70 {
        subject.push('…');
    }
    subject
}

#[cfg(test)]
mod tests {
    use super::*;

    const BOT: &str = "bot@example.test";

    fn mail(headers: &str, body: &str) -> Vec<u8> {
        format!("{headers}\r\n\r\n{body}")
            .replace('\n', "\r\n")
            .replace("\r\r", "\r")
            .into_bytes()
    }

    #[test]
    fn plain_text_mail() {
        let m = parse(
            &mail(
                "From: Alice Example <Alice@Example.ORG>\nTo: bot@example.test\nSubject: Hello\nMessage-ID: <a1@example.org>",
                "Hi bot,\nhow are you?\n",
            ),
            BOT,
        )
        .unwrap();
        assert_eq!(m.from, "alice@example.org");
        assert_eq!(m.from_name.as_deref(), Some("Alice Example"));
        assert_eq!(m.subject, "Hello");
        assert_eq!(m.message_id.as_deref(), Some("a1@example.org"));
        assert_eq!(m.body, "Hi bot,\nhow are you?");
        assert!(m.attachments.is_empty());
        assert_eq!(m.thread_root(), Some("a1@example.org"));
        assert!(!m.is_reply());
    }

    #[test]
    fn html_only_mail_becomes_text() {
        let m = parse(
            &mail(
                "From: a@example.org\nSubject: html\nContent-Type: text/html; charset=utf-8",
                "<html><body><p>Hello <b>there</b></p><p>Second&nbsp;line</p></body></html>",
            ),
            BOT,
        )
        .unwrap();
        assert!(m.body.contains("Hello there"), "{:?}", m.body);
        assert!(m.body.contains("Second"), "{:?}", m.body);
        assert!(!m.body.contains('<'), "{:?}", m.body);
    }

    #[test]
    fn plain_part_is_preferred_and_attachments_are_listed() {
        let body = "--XX\nContent-Type: multipart/alternative; boundary=\"YY\"\n\n--YY\nContent-Type: text/plain\n\nthe plain text\n--YY\nContent-Type: text/html\n\n<p>the <i>html</i> text</p>\n--YY--\n--XX\nContent-Type: application/pdf; name=\"report.pdf\"\nContent-Disposition: attachment; filename=\"report.pdf\"\nContent-Transfer-Encoding: base64\n\nJVBERi0xLjQK\n--XX--\n";
        let m = parse(
            &mail(
                "From: a@example.org\nSubject: files\nMIME-Version: 1.0\nContent-Type: multipart/mixed; boundary=\"XX\"",
                body,
            ),
            BOT,
        )
        .unwrap();
        assert_eq!(m.body, "the plain text");
        assert_eq!(
            m.attachments,
            vec![MailPart {
                name: Some("report.pdf".into()),
                mime: Some("application/pdf".into()),
                bytes: b"%PDF-1.4\n".to_vec(),
            }]
        );
    }

    #[test]
    fn encoded_subjects_and_threading_headers() {
        let m = parse(
            &mail(
                "From: =?UTF-8?Q?J=C3=BCrgen?= <j@example.org>\nSubject: =?UTF-8?B?R3LDvMOfZQ==?=\nMessage-ID: <c@x>\nIn-Reply-To: <b@x>\nReferences: <a@x> <b@x>",
                "reply",
            ),
            BOT,
        )
        .unwrap();
        assert_eq!(m.subject, "Grüße");
        assert_eq!(m.from_name.as_deref(), Some("Jürgen"));
        assert_eq!(m.in_reply_to.as_deref(), Some("b@x"));
        assert_eq!(m.references, vec!["a@x", "b@x"]);
        assert_eq!(m.thread_root(), Some("a@x"));
        assert!(m.is_reply());
        let m = parse(&mail("From: j@example.org\nIn-Reply-To: <b@x>", "r"), BOT).unwrap();
        assert_eq!(m.thread_root(), Some("b@x"));
    }

    #[test]
    fn loop_guards() {
        let p = |h: &str| parse(&mail(h, "x"), BOT);
        assert_eq!(p("From: BOT@example.test"), Err(Skip::OwnMail));
        assert!(matches!(
            p("From: a@example.org\nAuto-Submitted: auto-replied"),
            Err(Skip::Automatic(_))
        ));
        assert!(p("From: a@example.org\nAuto-Submitted: no").is_ok());
        for prec in ["bulk", "List", "junk"] {
            assert!(matches!(
                p(&format!("From: a@example.org\nPrecedence: {prec}")),
                Err(Skip::Automatic(_))
            ));
        }
        assert_eq!(p("From: MAILER-DAEMON@example.org"), Err(Skip::Bounce));
        assert_eq!(p("From: a@example.org\nReturn-Path: <>"), Err(Skip::Bounce));
        assert_eq!(
            p(
                "From: a@example.org\nContent-Type: multipart/report; report-type=delivery-status; boundary=z"
            ),
            Err(Skip::Bounce)
        );
        assert_eq!(p("Subject: no sender"), Err(Skip::NoSender));
        assert_eq!(p("From: weird/../x@example.org"), Err(Skip::NoSender));
    }

    #[test]
    fn quoted_history_and_signature_are_trimmed() {
        let body = "Sounds good.\n\nOn Mon, Alice wrote:\n> earlier\n> text\n";
        assert_eq!(trim_history(body), "Sounds good.");
        let inline = "> question one\nanswer one\n> question two\nanswer two";
        assert_eq!(trim_history(inline), inline);
        assert_eq!(trim_history("hi\n-- \nAlice\nCEO"), "hi");
        assert_eq!(trim_history("> only a quote"), "> only a quote");
    }

    #[test]
    fn reply_subjects_have_one_re() {
        assert_eq!(reply_subject("Hello"), "Re: Hello");
        assert_eq!(reply_subject("Re: Hello"), "Re: Hello");
        assert_eq!(reply_subject("RE: re: Re : Hello"), "Re: Hello");
        assert_eq!(reply_subject("AW: Hallo"), "Re: Hallo");
        assert_eq!(reply_subject("Fwd: x"), "Re: Fwd: x");
        assert_eq!(reply_subject("  "), "Re: your message");
        assert_eq!(fresh_subject("\n Daily report\nmore"), "Daily report");
    }
}
