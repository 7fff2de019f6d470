//! IRC's line protocol (RFC 1459 and 2812, with IRCv3 message tags): one
//! message per line, read into [`Message`], and text cut into lines that
//! fit the 512 bytes a server relays.
//!
//! Nothing here does I/O, so every rule is tested on strings.

use base64::Engine;

/// A line's most bytes, the final CRLF included (RFC 2812 §2.3).
pub const MAX_LINE_BYTES: usize = 512;

/// A received message: `@tags :source COMMAND params... :trailing`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    /// The IRCv3 `msgid` tag, where the server sets one.
    pub msgid: Option<String>,
    /// Who sent it: `nick!user@host`, or a server's name.
    pub source: Option<String>,
    /// The command or three-digit numeric, upper-cased.
    pub command: String,
    /// The parameters, the trailing one included.
    pub params: Vec<String>,
}

impl Message {
    /// Reads one line (without its CRLF); `None` for a line with no
    /// command.
    pub fn parse(line: &str) -> Option<Message> {
        let mut rest = line.trim_end_matches(['\r', '\n']);
        let mut msgid = None;
        if let Some(tagged) = rest.strip_prefix('@') {
            let (tags, after) = tagged.split_once(' ')?;
            msgid = tags
                .split(';')
                .find_map(|t| t.strip_prefix("msgid="))
                .filter(|v| !v.is_empty())
                .map(unescape_tag);
            rest = after.trim_start_matches(' ');
        }
        let mut source = None;
        if let Some(prefixed) = rest.strip_prefix(':') {
            let (s, after) = prefixed.split_once(' ')?;
            source = Some(s.to_owned());
            rest = after.trim_start_matches(' ');
        }
        let (command, mut rest) = match rest.split_once(' ') {
            Some((c, r)) => (c, r),
            None => (rest, ""),
        };
        if command.is_empty() {
            return None;
        }
        let mut params = Vec::new();
        loop {
            rest = rest.trim_start_matches(' ');
            if rest.is_empty() {
                break;
            }
            if let Some(trailing) = rest.strip_prefix(':') {
                params.push(trailing.to_owned());
                break;
            }
            match rest.split_once(' ') {
                Some((p, r)) => {
                    params.push(p.to_owned());
                    rest = r;
                }
                None => {
                    params.push(rest.to_owned());
                    break;
                }
            }
        }
        Some(Message {
            msgid,
            source,
            command: command.to_ascii_uppercase(),
            params,
        })
    }

    /// The sender's nick: the source up to its `!`.
    pub fn nick(&self) -> Option<&str> {
        let source = self.source.as_deref()?;
        Some(source.split_once('!').map_or(source, |(nick, _)| nick))
    }

    /// Parameter `i`, or `""`.
    pub fn param(&self, i: usize) -> &str {
        self.params.get(i).map_or("", String::as_str)
    }
}

/// An IRCv3 tag value with its escapes (`\:` `\s` `\\` `\r` `\n`) undone.
fn unescape_tag(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    let mut chars = value.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some(':') => out.push(';'),
            Some('s') => out.push(' '),
            Some('r') => out.push('\r'),
            Some('n') => out.push('\n'),
            Some(other) => out.push(other),
            None => {}
        }
    }
    out
}

/// Whether `target` names a channel rather than a nick.
pub fn is_channel(target: &str) -> bool {
    target.starts_with(['#', '&', '+', '!'])
}

/// Whether `nick` is a nick a server accepts (RFC 2812 §2.3.1, without its
/// nine-character cap, which no current network keeps).
pub fn is_valid_nick(nick: &str) -> bool {
    let special = |c: char| "[]\\`_^{|}".contains(c);
    let mut chars = nick.chars();
    match chars.next() {
        Some(c) if c.is_ascii_alphabetic() || special(c) => {}
        _ => return false,
    }
    nick.len() <= 64 && chars.all(|c| c.is_ascii_alphanumeric() || special(c) || c == '-')
}

/// The nicks tried after `nick` is refused: `nick_`, then `nick_1`,
/// `nick_2`, ...
pub fn fallback_nick(nick: &str, attempt: usize) -> String {
    match attempt {
        0 => nick.to_owned(),
        1 => format!("{nick}_"),
        n => format!("{nick}_{}", n - 1),
    }
}

/// The text after the bot's nick when `text` addresses it the way IRC
/// users do (`nick: ...`, `nick, ...`, `nick ...`, `@nick ...`), nicks
/// compared without case; `None` when it does not.
pub fn addressed<'a>(text: &'a str, nick: &str) -> Option<&'a str> {
    let text = text.trim_start();
    let body = text.strip_prefix('@').unwrap_or(text);
    let head = body.get(..nick.len())?;
    if !head.eq_ignore_ascii_case(nick) {
        return None;
    }
    let rest = &body[nick.len()..];
    let rest = match rest.chars().next() {
        None => rest,
        Some(':' | ',') => &rest[1..],
        Some(' ') => rest,
        Some(_) => return None,
    };
    Some(rest.trim())
}

/// A CTCP request (`\x01VERB args\x01`) split into its verb and
/// arguments; `None` for ordinary text.
pub fn ctcp(text: &str) -> Option<(&str, &str)> {
    let inner = text.strip_prefix('\u{1}')?;
    let inner = inner.strip_suffix('\u{1}').unwrap_or(inner);
    Some(inner.split_once(' ').unwrap_or((inner, "")))
}

/// How many bytes of text fit a `PRIVMSG` to `target`, when the server
/// relays it to others with the bot's source (`:nick!user@host `,
/// `source_len` bytes with the colon and the space) in front.
pub fn text_budget(target: &str, source_len: usize) -> usize {
    // "PRIVMSG " + target + " :" + text + CRLF, as relayed.
    let fixed = source_len + "PRIVMSG ".len() + target.len() + " :".len() + 2;
    MAX_LINE_BYTES.saturating_sub(fixed).max(32)
}

/// A generous guess at the bot's source before the server shows it: the
/// nick, a ten-character user name and the longest host name.
pub fn source_len_guess(nick: &str) -> usize {
    ":".len() + nick.len() + "!".len() + 10 + "@".len() + 63 + " ".len()
}

/// `text` (plain, one message) as the lines that carry it: one per line
/// of the text, an empty line as a single space (a server refuses an empty
/// message; the space shows the paragraph break), control characters
/// removed so no text can end a line early or start a CTCP, and each line
/// cut to `budget` bytes on a UTF-8 boundary, after a space where there is
/// one in the second half.
pub fn lines(text: &str, budget: usize) -> Vec<String> {
    let mut out = Vec::new();
    for line in text.split('\n') {
        let clean: String = line
            .chars()
            .filter_map(|c| match c {
                '\t' => Some(' '),
                c if c.is_control() => None,
                c => Some(c),
            })
            .collect();
        if clean.is_empty() {
            out.push(" ".to_owned());
            continue;
        }
        let mut rest = clean.as_str();
        while !rest.is_empty() {
            let cut = cut_at(rest, budget);
            out.push(rest[..cut].to_owned());
            rest = &rest[cut..];
        }
    }
    out
}

/// Where to end a piece of `text` of at most `budget` bytes.
fn cut_at(text: &str, budget: usize) -> usize {
    if text.len() <= budget {
        return text.len();
    }
    let mut end = budget.max(1);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    if end == 0 {
        // A budget smaller than one character: take the character whole.
        return text.chars().next().map_or(text.len(), char::len_utf8);
    }
    match text[..end].rfind(' ') {
        Some(space) if space + 1 >= end / 2 => space + 1,
        _ => end,
    }
}

/// The `AUTHENTICATE` arguments that carry a SASL PLAIN login: the
/// base64 of `account \0 account \0 password` in 400-byte pieces, and `+`
/// after a last piece of exactly 400 bytes (or for an empty payload), so
/// the server knows it has everything (IRCv3 SASL 3.1).
pub fn sasl_plain(account: &str, password: &str) -> Vec<String> {
    let payload = format!("{account}\0{account}\0{password}");
    let encoded = base64::engine::general_purpose::STANDARD.encode(payload);
    let mut pieces: Vec<String> = encoded
        .as_bytes()
        .chunks(400)
        .map(|c| String::from_utf8_lossy(c).into_owned())
        .collect();
    if pieces.last().is_none_or(|p| p.len() == 400) {
        pieces.push("+".to_owned());
    }
    pieces
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_are_parsed_with_tags_source_and_trailing() {
        let m = Message::parse(
            "@time=2026-01-01T00:00:00Z;msgid=ab\\:c :alice!~a@host PRIVMSG #chan :hello there :)\r",
        )
        .unwrap();
        assert_eq!(m.msgid.as_deref(), Some("ab;c"));
        assert_eq!(m.source.as_deref(), Some("alice!~a@host"));
        assert_eq!(m.nick(), Some("alice"));
        assert_eq!(m.command, "PRIVMSG");
        assert_eq!(m.params, ["#chan", "hello there :)"]);
        let m = Message::parse("PING :irc.example.org").unwrap();
        assert_eq!((m.source.as_deref(), m.command.as_str()), (None, "PING"));
        assert_eq!(m.param(0), "irc.example.org");
        let m = Message::parse(":srv 001 talaria :Welcome to IRC").unwrap();
        assert_eq!(m.params, ["talaria", "Welcome to IRC"]);
        let m = Message::parse(":srv CAP * LS * :multi-prefix sasl=PLAIN").unwrap();
        assert_eq!(m.params, ["*", "LS", "*", "multi-prefix sasl=PLAIN"]);
        assert_eq!(Message::parse(":srv.only").map(|m| m.command), None);
        assert_eq!(Message::parse("").map(|m| m.command), None);
        assert_eq!(Message::parse("quit").unwrap().command, "QUIT");
    }

    #[test]
    fn addressing_and_ctcp() {
        for (text, rest) in [
            ("talaria: what time", Some("what time")),
            ("Talaria, what time", Some("what time")),
            ("TALARIA what time", Some("what time")),
            ("@talaria what time", Some("what time")),
            ("talaria:", Some("")),
            ("talarias are nice", None),
            ("hey talaria: hi", None),
            ("tal", None),
        ] {
            assert_eq!(addressed(text, "talaria"), rest, "{text}");
        }
        assert_eq!(ctcp("\u{1}ACTION waves\u{1}"), Some(("ACTION", "waves")));
        assert_eq!(ctcp("\u{1}VERSION\u{1}"), Some(("VERSION", "")));
        assert_eq!(ctcp("plain"), None);
    }

    #[test]
    fn nicks_are_checked_and_fall_back() {
        for good in ["talaria", "t[1]", "_x", "a-b", "Zed^"] {
            assert!(is_valid_nick(good), "{good}");
        }
        for bad in ["", "9lives", "-a", "a b", "a!b", "é"] {
            assert!(!is_valid_nick(bad), "{bad}");
        }
        let tried: Vec<String> = (0..4).map(|i| fallback_nick("bot", i)).collect();
        assert_eq!(tried, ["bot", "bot_", "bot_1", "bot_2"]);
    }

    #[test]
    fn lines_fit_the_budget_on_utf8_boundaries_and_carry_no_controls() {
        let text = "first line\n\nsecond\r\nQUIT :injected\u{0}\u{1}\ttabbed";
        assert_eq!(
            lines(text, 100),
            ["first line", " ", "second", "QUIT :injected tabbed"]
        );
        // A long line of multi-byte characters and no spaces.
        let long = "é€😀".repeat(200);
        let pieces = lines(&long, 50);
        assert!(pieces.iter().all(|p| p.len() <= 50 && !p.is_empty()));
        assert_eq!(pieces.concat(), long);
        // A cut prefers the last space in the second half of the budget,
        // which stays with the earlier piece.
        let words = "alpha beta gamma delta epsilon";
        let pieces = lines(words, 12);
        assert_eq!(pieces, ["alpha beta ", "gamma delta ", "epsilon"]);
        assert_eq!(pieces.concat(), words);
        // No space in reach: a hard cut.
        assert_eq!(lines("abcdefghij klm", 5), ["abcde", "fghij", " klm"]);
    }

    #[test]
    fn the_budget_counts_the_relayed_source_and_target() {
        let source = ":talaria!~talaria@host.example ".len();
        let budget = text_budget("#chan", source);
        let line = format!(
            ":talaria!~talaria@host.example PRIVMSG #chan :{}\r\n",
            "x".repeat(budget)
        );
        assert_eq!(line.len(), MAX_LINE_BYTES);
        assert!(text_budget("#c", source_len_guess("talaria")) < 450);
    }

    #[test]
    fn sasl_plain_comes_in_400_byte_pieces() {
        let short = sasl_plain("bot", "pw");
        assert_eq!(short, ["Ym90AGJvdABwdw=="]);
        // 300 raw bytes encode to exactly 400: a `+` must follow.
        let exact = sasl_plain("a", &"p".repeat(300 - 4));
        assert_eq!(exact.len(), 2);
        assert_eq!((exact[0].len(), exact[1].as_str()), (400, "+"));
        let long = sasl_plain("account", &"p".repeat(700));
        assert!(long.len() == 3 && long[..2].iter().all(|p| p.len() == 400));
        let joined: String = long.concat();
        let decoded = base64::engine::general_purpose::STANDARD
            .decode(joined)
            .unwrap();
        assert_eq!(
            decoded,
            format!("account\0account\0{}", "p".repeat(700)).as_bytes()
        );
    }
}
