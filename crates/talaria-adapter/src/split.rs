//! Cutting long answers to a platform's limit without breaking code fences.
//!
//! [`split_message`] returns the text unchanged when it fits. Otherwise
//! every chunk fits [`MessageLimits::max_len`] (measured in its
//! [`LengthUnit`](crate::contract::LengthUnit)), including three kinds of
//! added text:
//!
//! - a ` (i/n)` suffix on every chunk;
//! - `"\n```"` at the end of a chunk whose cut falls inside a code fence;
//! - `"```info\n"` (the fence's info string, trimmed) at the start of the
//!   chunk that continues such a fence.
//!
//! Nothing of the original text is dropped: the break character (`\n` or
//! space) stays at the end of the earlier chunk, so removing the added text
//! and concatenating gives back the input exactly. Cuts never fall inside
//! a line that starts with ```` ``` ````, which keeps that removal
//! unambiguous (a non-final chunk's own text never ends with `"\n```"`).
//!
//! The only exception is a limit too small to hold even one character plus
//! the added text, or a fence line longer than a whole chunk; chunks then
//! still make progress but may exceed the limit.

use crate::contract::MessageLimits;

/// Added at the end of a chunk cut inside a code fence.
const FENCE_CLOSE: &str = "\n```";

/// Splits `text` into chunks that each fit `limits` (see the module docs).
pub fn split_message(text: &str, limits: MessageLimits) -> Vec<String> {
    if limits.unit.measure(text) <= limits.max_len {
        return vec![text.to_owned()];
    }
    // The suffix width depends only on the digit count of n, so guess it,
    // split, and redo with more room when the count needs more digits.
    let mut digits = 1;
    let bodies = loop {
        let bodies = split_bodies(text, limits, suffix_reserve(digits));
        let needed = digit_count(bodies.len());
        if needed <= digits {
            break bodies;
        }
        digits = needed;
    };
    let n = bodies.len();
    if n == 1 {
        // Cannot happen (the text did not fit), but never emit "(1/1)".
        return bodies;
    }
    bodies
        .into_iter()
        .enumerate()
        .map(|(i, mut b)| {
            b.push_str(&suffix(i + 1, n));
            b
        })
        .collect()
}

/// The suffix appended to chunk `i` of `n`.
fn suffix(i: usize, n: usize) -> String {
    format!(" ({i}/{n})")
}

/// Which part of a split answer `chunk` is, read back from the ` (i/n)`
/// suffix [`split_message`] writes: `Some((i, n))` with `1 <= i <= n` and
/// `n >= 2`, or `None` for a message that was not split. For adapters that
/// must hand a whole answer on at once (an HTTP response) and so wait for
/// the last part; [`join_parts`] then rebuilds the text.
///
/// A message that fits is sent unchanged, so an answer whose own text ends
/// in something like ` (1/2)` reads as a part; callers bound their wait.
pub fn part_number(chunk: &str) -> Option<(usize, usize)> {
    let inner = chunk.strip_suffix(')')?;
    let open = inner.rfind(" (")?;
    let (i, n) = inner[open + 2..].split_once('/')?;
    let digits = |s: &str| !s.is_empty() && s.len() <= 20 && s.bytes().all(|b| b.is_ascii_digit());
    if !digits(i) || !digits(n) || i.starts_with('0') || n.starts_with('0') {
        return None;
    }
    let (i, n) = (i.parse::<usize>().ok()?, n.parse::<usize>().ok()?);
    (n >= 2 && (1..=n).contains(&i)).then_some((i, n))
}

/// Undoes [`split_message`]: given every part of one split answer in
/// order, strips the ` (i/n)` suffixes and the fence lines added at cuts,
/// and returns the original text exactly. A single unsplit message comes
/// back as it is. `None` when the parts are not a complete, ordered split
/// (a part missing, or added text not where the split puts it).
pub fn join_parts(parts: &[String]) -> Option<String> {
    let n = parts.len();
    if n == 1 {
        return Some(parts[0].clone());
    }
    let mut text = String::new();
    for (i, chunk) in parts.iter().enumerate() {
        let mut body = chunk.strip_suffix(&suffix(i + 1, n))?;
        if let Some(info) = fence_state(&text, 0, text.len(), None) {
            body = body.strip_prefix(&format!("```{info}\n"))?;
        }
        // A cut inside a fence closed it; the text itself never ends a
        // non-final chunk with "\n```" (see the module docs).
        if i + 1 < n
            && let Some(inner) = body.strip_suffix(FENCE_CLOSE)
        {
            let candidate = format!("{text}{inner}");
            if fence_state(&candidate, 0, candidate.len(), None).is_some() {
                body = inner;
            }
        }
        text.push_str(body);
    }
    Some(text)
}

/// Room for a suffix whose numbers have at most `digits` digits (ASCII, so
/// the same in every unit).
fn suffix_reserve(digits: usize) -> usize {
    4 + 2 * digits
}

fn digit_count(mut n: usize) -> usize {
    let mut d = 1;
    while n >= 10 {
        n /= 10;
        d += 1;
    }
    d
}

/// The chunks without their ` (i/n)` suffix, leaving `reserve` units free
/// in each for it.
fn split_bodies(text: &str, limits: MessageLimits, reserve: usize) -> Vec<String> {
    let unit = limits.unit;
    let mut out = Vec::new();
    let mut pos = 0;
    // The info string of the fence open at `pos`, if any.
    let mut fence: Option<String> = None;
    while pos < text.len() {
        let prefix = fence
            .as_ref()
            .map(|info| format!("```{info}\n"))
            .unwrap_or_default();
        let avail = limits
            .max_len
            .saturating_sub(reserve)
            .saturating_sub(unit.measure(&prefix));
        let rest = &text[pos..];
        if unit.measure(rest) <= avail {
            out.push(prefix + rest);
            break;
        }
        let budget = avail.saturating_sub(unit.measure(FENCE_CLOSE));
        let cut = choose_cut(text, pos, budget, limits, fence.clone());
        let after = fence_state(text, pos, cut, fence.take());
        let mut chunk = prefix;
        chunk.push_str(&text[pos..cut]);
        if after.is_some() {
            chunk.push_str(FENCE_CLOSE);
        }
        out.push(chunk);
        fence = after;
        pos = cut;
    }
    out
}

/// Where to end the chunk starting at `pos` whose own text may take
/// `budget` units; `open` is the fence state at `pos`. Always returns a
/// position after `pos`.
fn choose_cut(
    text: &str,
    pos: usize,
    budget: usize,
    limits: MessageLimits,
    mut open: Option<String>,
) -> usize {
    let unit = limits.unit;
    let mut used = 0;
    // The end of the longest prefix that fits; at least one character so
    // that a tiny budget still makes progress.
    let mut window_end = pos;
    let (mut para, mut line, mut space) = (None, None, None);
    let mut prev = if pos == 0 {
        Some('\n')
    } else {
        text[..pos].chars().next_back()
    };
    // Whether the line that ends at the next newline is a fence line.
    let mut fence_line = false;
    // Whether the line being scanned is a fence line, whose spaces are no
    // breaks. Tracked here rather than asked of `inside_fence_line` per
    // space, which rescans the line each time (quadratic on long lines).
    // From the first line start on it equals `fence_line`; a chunk that
    // begins mid-line (after a hard cut) looks its line up once. It is kept
    // apart from `fence_line`, which has always started false, so that
    // line-break choices stay as they were.
    let mut in_fence_line =
        prev != Some('\n') && is_fence_line(line_at(text, line_start(text, pos)));
    for (i, c) in text[pos..].char_indices() {
        let len = unit.char_len(c);
        if used + len > budget && window_end > pos {
            break;
        }
        let at = pos + i;
        if prev == Some('\n') {
            let l = line_at(text, at);
            fence_line = is_fence_line(l);
            in_fence_line = fence_line;
            open = next_state(l, open);
        }
        used += len;
        let after = at + c.len_utf8();
        window_end = after;
        // Breaks in the first half would make needlessly small chunks.
        let second_half = used * 2 >= budget;
        match c {
            '\n' if second_half && useful_line_break(text, after, fence_line, &open) => {
                if prev == Some('\n') {
                    para = Some(after);
                }
                line = Some(after);
            }
            // What `inside_fence_line(text, after)` would say: a space is
            // not a newline, so `after` is on the scanned line, strictly
            // inside it unless it is the end of the text.
            ' ' if second_half && !(in_fence_line && after < text.len()) => space = Some(after),
            _ => {}
        }
        prev = Some(c);
    }
    if let Some(c) = para.or(line).or(space) {
        return c;
    }
    if inside_fence_line(text, window_end) {
        // Cutting a fence marker in two would corrupt it; move the whole
        // line to the next chunk when that leaves something here.
        let start = line_start(text, window_end);
        if start > pos {
            return start;
        }
    }
    window_end
}

/// Whether a cut right after a newline at `at` is worth taking: right after
/// an opening fence line, or right before the closing one, it would leave
/// an empty code block behind.
fn useful_line_break(text: &str, at: usize, ended_fence_line: bool, open: &Option<String>) -> bool {
    if open.is_none() {
        return true;
    }
    if ended_fence_line {
        return false;
    }
    let next = line_at(text, at);
    !(next.starts_with("```") && next[3..].trim().is_empty())
}

/// Whether `at` falls strictly inside a line that starts with ```` ``` ````.
fn inside_fence_line(text: &str, at: usize) -> bool {
    if at == 0 || at >= text.len() {
        return false;
    }
    let start = line_start(text, at);
    start < at && is_fence_line(line_at(text, start))
}

/// The start of the line containing byte `at`.
fn line_start(text: &str, at: usize) -> usize {
    text[..at].rfind('\n').map_or(0, |i| i + 1)
}

/// The line starting at `start`, without its newline.
fn line_at(text: &str, start: usize) -> &str {
    let rest = &text[start..];
    rest.find('\n').map_or(rest, |i| &rest[..i])
}

/// Any line starting with ```` ``` ```` opens or closes a fence, or is
/// fence-like text inside one; none of them may be cut.
fn is_fence_line(line: &str) -> bool {
    line.starts_with("```")
}

/// What a fence line means in the state `open`: `Some(info)` when it opens
/// a fence, `None` when it closes the open one, and `open` unchanged when
/// it is just content.
fn next_state(line: &str, open: Option<String>) -> Option<String> {
    let Some(rest) = line.strip_prefix("```") else {
        return open;
    };
    match open {
        // Only a bare marker closes; "```python" inside a fence is text.
        Some(info) => {
            if rest.trim().is_empty() {
                None
            } else {
                Some(info)
            }
        }
        None => {
            let info = rest.trim();
            if info.contains('`') {
                None
            } else {
                Some(info.to_owned())
            }
        }
    }
}

/// The fence state at `to`, given the state `open` at `from`: every line
/// that starts in `from..to` is taken into account, whole.
fn fence_state(text: &str, from: usize, to: usize, mut open: Option<String>) -> Option<String> {
    let mut start = if from == 0 || text.as_bytes()[from - 1] == b'\n' {
        from
    } else {
        // The line at `from` began earlier and was already counted.
        match text[from..].find('\n') {
            Some(i) => from + i + 1,
            None => return open,
        }
    };
    while start < to {
        let line = line_at(text, start);
        open = next_state(line, open);
        start += line.len() + 1;
    }
    open
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::contract::LengthUnit;
    use proptest::prelude::*;

    fn lim(max_len: usize, unit: LengthUnit) -> MessageLimits {
        MessageLimits { max_len, unit }
    }

    /// Undoes the split with the public helper, which must manage it.
    fn reassemble(chunks: &[String]) -> String {
        for (i, chunk) in chunks.iter().enumerate() {
            if chunks.len() > 1 {
                assert_eq!(part_number(chunk), Some((i + 1, chunks.len())), "{chunk:?}");
            }
        }
        join_parts(chunks).unwrap_or_else(|| panic!("cannot join {chunks:?}"))
    }

    #[test]
    fn part_numbers_are_read_back_only_from_a_suffix() {
        assert_eq!(part_number("abc (1/2)"), Some((1, 2)));
        assert_eq!(part_number("x (12/12)"), Some((12, 12)));
        assert_eq!(part_number(" (3/10)"), Some((3, 10)));
        for not in [
            "abc",
            "abc (1/1)",
            "abc (0/2)",
            "abc (3/2)",
            "abc (1/2) ",
            "abc(1/2)",
            "abc (01/2)",
            "abc (a/2)",
            "abc (1/)",
            "abc (/2)",
            "abc (1/2/3)",
            "(1/2)",
        ] {
            assert_eq!(part_number(not), None, "{not:?}");
        }
        assert_eq!(join_parts(&["a (1/2)".into()]), Some("a (1/2)".into()));
        assert_eq!(join_parts(&["a (1/3)".into(), "b (2/3)".into()]), None);
        assert_eq!(join_parts(&["a (2/2)".into(), "b (1/2)".into()]), None);
    }

    #[test]
    fn short_text_is_one_chunk() {
        assert_eq!(
            split_message("hello", lim(10, LengthUnit::Chars)),
            ["hello"]
        );
        assert_eq!(split_message("", lim(10, LengthUnit::Chars)), [""]);
    }

    #[test]
    fn prefers_paragraph_then_line_then_space() {
        let para = "aaaa bbbb\ncccc\n\ndddd eeee ffff";
        let chunks = split_message(para, lim(26, LengthUnit::Chars));
        assert_eq!(chunks[0], "aaaa bbbb\ncccc\n\n (1/2)");
        assert_eq!(reassemble(&chunks), para);

        // A line break beats a later space.
        let lines = "aaaa bbbb\ncccc dddd eeee ffff gggg";
        let chunks = split_message(lines, lim(26, LengthUnit::Chars));
        assert!(chunks[0].starts_with("aaaa bbbb\n ("), "{chunks:?}");
        assert_eq!(reassemble(&chunks), lines);

        let spaces = "aaaa bbbb cccc dddd eeee ffff gggg";
        let chunks = split_message(spaces, lim(26, LengthUnit::Chars));
        assert!(chunks[0].starts_with("aaaa bbbb cccc "), "{chunks:?}");
        assert_eq!(reassemble(&chunks), spaces);

        let chunks = split_message("aaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", lim(20, LengthUnit::Chars));
        assert!(chunks.iter().all(|c| c.chars().count() <= 20), "{chunks:?}");
        assert_eq!(reassemble(&chunks), "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaa");
    }

    #[test]
    fn ignores_breaks_in_the_first_half() {
        let text = format!("a {}", "b".repeat(60));
        let chunks = split_message(&text, lim(30, LengthUnit::Chars));
        // The space at position 2 is too early: hard cut instead.
        assert!(chunks[0].len() > 10, "{chunks:?}");
        assert_eq!(reassemble(&chunks), text);
    }

    #[test]
    fn measures_utf16_units() {
        let text = "😀".repeat(30); // 60 UTF-16 units, 30 chars
        assert_eq!(split_message(&text, lim(30, LengthUnit::Chars)).len(), 1);
        let chunks = split_message(&text, lim(30, LengthUnit::Utf16));
        assert!(chunks.len() > 1);
        for c in &chunks {
            assert!(LengthUnit::Utf16.measure(c) <= 30, "{c:?}");
        }
        assert_eq!(reassemble(&chunks), text);
    }

    #[test]
    fn code_fences_are_closed_and_reopened() {
        let code: String = (0..30).map(|i| format!("let x{i} = {i};\n")).collect();
        let text = format!("Here:\n\n```rust\n{code}```\nDone.");
        let chunks = split_message(&text, lim(120, LengthUnit::Utf16));
        assert!(chunks.len() > 2, "{chunks:?}");
        for (i, c) in chunks.iter().enumerate() {
            assert!(LengthUnit::Utf16.measure(c) <= 120, "{c:?}");
            let body = c.rsplit_once(" (").map_or(c.as_str(), |(b, _)| b);
            // Every chunk has balanced fences, so each renders on its own.
            let fences = body.lines().filter(|l| l.starts_with("```")).count();
            assert_eq!(fences % 2, 0, "chunk {i} unbalanced: {c:?}");
            if i > 0 && i + 1 < chunks.len() {
                assert!(body.starts_with("```rust\n"), "{c:?}");
            }
        }
        assert_eq!(reassemble(&chunks), text);
    }

    #[test]
    fn spaces_in_a_fence_line_are_no_breaks() {
        // The line break before the fence-like line (a backtick in its info
        // string: it opens nothing, so no fence is added) is in the first
        // half, not a candidate; its spaces are in the second. The line
        // moves to the next chunk whole.
        let text = format!(
            "{}\n```{}\n{}",
            "x".repeat(10),
            "`x` ".repeat(6),
            "y".repeat(40)
        );
        let chunks = split_message(&text, lim(40, LengthUnit::Chars));
        assert!(chunks[0].starts_with("xxxxxxxxxx\n ("), "{chunks:?}");
        assert_eq!(reassemble(&chunks), text);

        // A fence-like line longer than a chunk is hard-cut; the chunks
        // that start inside it must not break at its spaces either.
        let text = format!("```{}\nend", "`x` ".repeat(30));
        let chunks = split_message(&text, lim(40, LengthUnit::Chars));
        let n = chunks.len();
        let reserve = suffix_reserve(digit_count(n));
        let budget = 40 - reserve - FENCE_CLOSE.len();
        for (i, c) in chunks.iter().take(3).enumerate() {
            let body = c.strip_suffix(&suffix(i + 1, n)).unwrap();
            assert_eq!(body.chars().count(), budget, "chunk {i}: {chunks:?}");
        }
        assert_eq!(reassemble(&chunks), text);
    }

    #[test]
    fn suffix_room_grows_with_the_chunk_count() {
        let text = "word ".repeat(400);
        let chunks = split_message(&text, lim(20, LengthUnit::Chars));
        assert!(chunks.len() >= 100, "{}", chunks.len());
        assert!(chunks.iter().all(|c| c.chars().count() <= 20));
        let n = chunks.len();
        assert!(chunks[n - 1].ends_with(&format!(" ({n}/{n})")));
        assert_eq!(reassemble(&chunks), text);
    }

    fn piece() -> impl Strategy<Value = String> {
        prop_oneof![
            "[a-z]{1,12}",
            Just(" ".to_owned()),
            Just("\n".to_owned()),
            Just("\n\n".to_owned()),
            Just("😀".to_owned()),
            Just("👨‍👩‍👧".to_owned()),
            Just("日本語".to_owned()),
            Just("\n```rust\n".to_owned()),
            Just("\n```\n".to_owned()),
            Just("```py\n".to_owned()),
            Just("`x`".to_owned()),
            "[a-z]{20,80}",
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(400))]

        #[test]
        fn chunks_fit_and_reassemble(
            pieces in prop::collection::vec(piece(), 0..120),
            max_len in 40usize..200,
            utf16 in any::<bool>(),
        ) {
            let text: String = pieces.concat();
            let unit = if utf16 { LengthUnit::Utf16 } else { LengthUnit::Chars };
            let chunks = split_message(&text, lim(max_len, unit));
            prop_assert!(!chunks.is_empty());
            for c in &chunks {
                prop_assert!(unit.measure(c) <= max_len, "{} > {}: {:?}", unit.measure(c), max_len, c);
            }
            prop_assert_eq!(reassemble(&chunks), text);
        }
    }
}
