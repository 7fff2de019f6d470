//! An incremental Server-Sent Events parser.
//!
//! Network chunks split lines anywhere (even between `\r` and `\n`), so the
//! parser buffers partial lines and yields an event only once its closing
//! blank line has arrived. Lines are split on bytes before decoding, which
//! keeps multi-byte UTF-8 characters intact whatever the chunking.

/// One dispatched event.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SseEvent {
    /// The `event:` field, when the server sent one.
    pub event: Option<String>,
    /// The `data:` lines joined with `\n`.
    pub data: String,
}

/// Turns a byte stream into [`SseEvent`]s; feed it with [`SseParser::push`].
#[derive(Debug, Default)]
pub struct SseParser {
    /// Bytes of the current, not yet terminated line.
    line: Vec<u8>,
    /// The previous chunk ended in `\r`: a `\n` opening the next chunk belongs
    /// to the same line ending and must not produce an empty line.
    skip_lf: bool,
    event: Option<String>,
    data: String,
    has_data: bool,
}

impl SseParser {
    /// A parser at the start of a stream.
    pub fn new() -> SseParser {
        SseParser::default()
    }

    /// Consumes one chunk and returns the events it completed.
    pub fn push(&mut self, mut chunk: &[u8]) -> Vec<SseEvent> {
        let mut out = Vec::new();
        while let Some(&first) = chunk.first() {
            if self.skip_lf {
                self.skip_lf = false;
                if first == b'\n' {
                    chunk = &chunk[1..];
                    continue;
                }
            }
            // Whole runs of line bytes are copied at once: a token's chunk
            // is a few hundred bytes between line ends.
            let Some(at) = memchr::memchr2(b'\n', b'\r', chunk) else {
                self.line.extend_from_slice(chunk);
                break;
            };
            self.line.extend_from_slice(&chunk[..at]);
            self.skip_lf = chunk[at] == b'\r';
            self.end_line(&mut out);
            chunk = &chunk[at + 1..];
        }
        out
    }

    /// Ends the stream. A final event that lacks its closing blank line is
    /// still delivered: servers that close right after the last `data:` line
    /// are common, and dropping their last event would lose the answer.
    pub fn finish(&mut self) -> Vec<SseEvent> {
        let mut out = Vec::new();
        if !self.line.is_empty() {
            self.end_line(&mut out);
        }
        self.dispatch(&mut out);
        self.skip_lf = false;
        out
    }

    fn end_line(&mut self, out: &mut Vec<SseEvent>) {
        let raw = std::mem::take(&mut self.line);
        if raw.is_empty() {
            self.dispatch(out);
            return;
        }
        let line = String::from_utf8_lossy(&raw);
        if line.starts_with(':') {
            return;
        }
        let (field, value) = match line.find(':') {
            Some(i) => {
                let v = &line[i + 1..];
                (&line[..i], v.strip_prefix(' ').unwrap_or(v))
            }
            None => (line.as_ref(), ""),
        };
        match field {
            "data" => {
                if self.has_data {
                    self.data.push('\n');
                }
                self.data.push_str(value);
                self.has_data = true;
            }
            "event" => self.event = Some(value.to_owned()),
            // `id` and `retry` matter only for reconnecting, which a model
            // call never does.
            _ => {}
        }
    }

    fn dispatch(&mut self, out: &mut Vec<SseEvent>) {
        let event = self.event.take();
        if !self.has_data {
            return;
        }
        self.has_data = false;
        out.push(SseEvent {
            event,
            data: std::mem::take(&mut self.data),
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all(chunks: &[&[u8]]) -> Vec<SseEvent> {
        let mut p = SseParser::new();
        let mut out = Vec::new();
        for c in chunks {
            out.extend(p.push(c));
        }
        out.extend(p.finish());
        out
    }

    fn ev(event: Option<&str>, data: &str) -> SseEvent {
        SseEvent {
            event: event.map(str::to_owned),
            data: data.to_owned(),
        }
    }

    #[test]
    fn data_split_across_chunks() {
        let got = all(&[b"da", b"ta: {\"a\"", b":1}\n", b"\ndata: [DONE]\n\n"]);
        assert_eq!(got, vec![ev(None, "{\"a\":1}"), ev(None, "[DONE]")]);
    }

    #[test]
    fn multi_line_data_comments_and_event_field() {
        let got =
            all(&[b": keep-alive\n\nevent: message_start\ndata: a\ndata:b\nid: 7\nretry: 10\n\n"]);
        assert_eq!(got, vec![ev(Some("message_start"), "a\nb")]);
    }

    #[test]
    fn crlf_and_cr_line_endings_even_when_split() {
        let got = all(&[b"data: x\r", b"\n\r", b"\ndata: y\r\rdata: z\n\n"]);
        assert_eq!(got, vec![ev(None, "x"), ev(None, "y"), ev(None, "z")]);
    }

    #[test]
    fn event_without_data_is_not_dispatched() {
        assert_eq!(all(&[b"event: ping\n\ndata: 1\n\n"]), vec![ev(None, "1")]);
    }

    #[test]
    fn unterminated_last_event_is_delivered_at_finish() {
        assert_eq!(all(&[b"data: last"]), vec![ev(None, "last")]);
    }

    #[test]
    fn utf8_split_inside_a_character() {
        let s = "data: héllo\n\n".as_bytes();
        let got = all(&[&s[..8], &s[8..]]);
        assert_eq!(got, vec![ev(None, "héllo")]);
    }
}
