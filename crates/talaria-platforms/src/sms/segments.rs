//! How many SMS segments a text costs.
//!
//! A text made only of the GSM-7 alphabet is sent 7 bits a character: 160
//! characters fit one segment, and a longer text is cut into segments of
//! 153 (the rest of each carries the header that reassembles them). A
//! character of the GSM-7 extension table (`€`, `[`, `{`, ...) takes two
//! places. Any other character (an emoji, a curly quote, most non-Latin
//! scripts) switches the whole text to UCS-2: 70 UTF-16 units in one
//! segment, 67 in each of several. Carriers bill per segment.

/// Characters of the GSM-7 basic alphabet besides ASCII letters and digits.
const GSM_BASIC: &str = "@£$¥èéùìòÇ\nØø\rÅåΔ_ΦΓΛΩΠΨΣΘΞÆæßÉ !\"#¤%&'()*+,-./:;<=>?¡ÄÖÑÜ§¿äöñüà";

/// Characters of the GSM-7 extension table: two septets each.
const GSM_EXTENDED: &str = "^{}\\[~]|€\u{c}";

/// How a text is encoded on the air.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Encoding {
    /// GSM 03.38, 7 bits a character.
    Gsm7,
    /// UCS-2 (UTF-16), 16 bits a unit.
    Ucs2,
}

/// The places `c` takes in GSM-7, or `None` when it is not in the alphabet.
fn gsm_septets(c: char) -> Option<usize> {
    if c.is_ascii_alphanumeric() || GSM_BASIC.contains(c) {
        Some(1)
    } else if GSM_EXTENDED.contains(c) {
        Some(2)
    } else {
        None
    }
}

/// The encoding `text` needs and its length in that encoding's units.
pub fn measure(text: &str) -> (Encoding, usize) {
    let septets: Option<usize> = text.chars().map(gsm_septets).sum();
    match septets {
        Some(n) => (Encoding::Gsm7, n),
        None => (Encoding::Ucs2, text.encode_utf16().count()),
    }
}

/// How many segments `text` is sent as (0 for an empty text).
pub fn count(text: &str) -> usize {
    let (encoding, units) = measure(text);
    let (single, each) = match encoding {
        Encoding::Gsm7 => (160, 153),
        Encoding::Ucs2 => (70, 67),
    };
    if units <= single {
        usize::from(units > 0)
    } else {
        units.div_ceil(each)
    }
}

/// `text` shortened, when needed, to fit `max` segments, ending in `...`
/// when it was (ASCII, so the ending never changes the encoding).
pub fn cap(text: &str, max: usize) -> String {
    if max == 0 || count(text) <= max {
        return text.to_owned();
    }
    const ENDING: &str = "...";
    let chars: Vec<char> = text.chars().collect();
    // The longest prefix that fits with the ending, found by bisection:
    // the count only grows with the prefix.
    let (mut lo, mut hi) = (0usize, chars.len());
    while lo < hi {
        let mid = (lo + hi).div_ceil(2);
        let candidate: String = chars[..mid].iter().collect::<String>() + ENDING;
        if count(&candidate) <= max {
            lo = mid;
        } else {
            hi = mid - 1;
        }
    }
    let kept: String = chars[..lo].iter().collect();
    format!("{}{ENDING}", kept.trim_end())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gsm_texts_count_septets() {
        assert_eq!(count(""), 0);
        assert_eq!(count("hello"), 1);
        assert_eq!(count(&"a".repeat(160)), 1);
        assert_eq!(count(&"a".repeat(161)), 2);
        assert_eq!(count(&"a".repeat(306)), 2);
        assert_eq!(count(&"a".repeat(307)), 3);
        // Extension characters take two places.
        assert_eq!(measure("€[]"), (Encoding::Gsm7, 6));
        assert_eq!(count(&"€".repeat(80)), 1);
        assert_eq!(count(&"€".repeat(81)), 2);
        assert_eq!(measure("Ça coûte 5 £?").0, Encoding::Ucs2, "û is not GSM-7");
        assert_eq!(
            measure("Ça va, 5 £? ¿Sí?").0,
            Encoding::Ucs2,
            "í is not GSM-7"
        );
        assert_eq!(measure("Ça, 5 £? ¿Ñ?"), (Encoding::Gsm7, 12));
    }

    #[test]
    fn one_other_character_makes_it_ucs2() {
        assert_eq!(measure("it’s"), (Encoding::Ucs2, 4));
        assert_eq!(count(&"a".repeat(70)), 1);
        assert_eq!(count(&format!("{}’", "a".repeat(69))), 1);
        assert_eq!(count(&format!("{}’", "a".repeat(70))), 2);
        assert_eq!(count(&format!("{}’", "a".repeat(133))), 2);
        assert_eq!(count(&format!("{}’", "a".repeat(134))), 3);
        // An emoji is two UTF-16 units.
        assert_eq!(measure("ok 👍"), (Encoding::Ucs2, 5));
    }

    #[test]
    fn cap_cuts_to_the_segment_budget() {
        let long = "word ".repeat(100);
        assert_eq!(cap(&long, 0), long, "0 is no cap");
        assert_eq!(cap("short", 1), "short");
        let one = cap(&long, 1);
        assert!(one.ends_with("..."), "{one}");
        assert_eq!(count(&one), 1);
        assert!(one.chars().count() <= 160 && one.chars().count() > 150);
        let two = cap(&long, 2);
        assert_eq!(count(&two), 2);
        assert!(long.starts_with(two.trim_end_matches("...")));
        let ucs = "’".repeat(200);
        let capped = cap(&ucs, 1);
        assert_eq!(count(&capped), 1);
        assert_eq!(capped.chars().count(), 70);
    }
}
