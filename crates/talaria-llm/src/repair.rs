//! Light repair of tool-call argument JSON.
//!
//! Models (and dropped streams) produce arguments with trailing commas or
//! missing closers. Fixing those two cases recovers most calls; anything
//! else is left for the agent to report back to the model.

/// Returns `raw` when it is valid JSON, a repaired copy when a light repair
/// makes it valid, and `None` otherwise.
pub fn repair_json(raw: &str) -> Option<String> {
    if serde_json::from_str::<serde_json::Value>(raw).is_ok() {
        return Some(raw.to_owned());
    }
    let mut out = String::with_capacity(raw.len() + 4);
    let mut closers: Vec<char> = Vec::new();
    let mut in_string = false;
    let mut escaped = false;
    for c in raw.trim().chars() {
        if in_string {
            out.push(c);
            if escaped {
                escaped = false;
            } else if c == '\\' {
                escaped = true;
            } else if c == '"' {
                in_string = false;
            }
            continue;
        }
        match c {
            '"' => in_string = true,
            '{' => closers.push('}'),
            '[' => closers.push(']'),
            '}' | ']' => {
                drop_trailing_comma(&mut out);
                if closers.last() == Some(&c) {
                    closers.pop();
                } else {
                    return None;
                }
            }
            _ => {}
        }
        out.push(c);
    }
    if in_string {
        if escaped {
            out.pop();
        }
        out.push('"');
    }
    while let Some(c) = closers.pop() {
        drop_trailing_comma(&mut out);
        out.push(c);
    }
    serde_json::from_str::<serde_json::Value>(&out)
        .ok()
        .map(|_| out)
}

fn drop_trailing_comma(out: &mut String) {
    let trimmed = out.trim_end().len();
    if out[..trimmed].ends_with(',') {
        out.truncate(trimmed - 1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn valid_json_is_returned_unchanged() {
        assert_eq!(repair_json(r#"{"a": 1}"#).as_deref(), Some(r#"{"a": 1}"#));
    }

    #[test]
    fn trailing_commas_and_unclosed_brackets() {
        assert_eq!(repair_json(r#"{"a": 1,}"#).as_deref(), Some(r#"{"a": 1}"#));
        assert_eq!(
            repair_json(r#"{"a": [1, 2,"#).as_deref(),
            Some(r#"{"a": [1, 2]}"#)
        );
        assert_eq!(
            repair_json(r#"{"cmd": "echo }"#).as_deref(),
            Some(r#"{"cmd": "echo }"}"#)
        );
    }

    #[test]
    fn hopeless_input_is_rejected() {
        assert_eq!(repair_json("not json"), None);
        assert_eq!(repair_json(r#"{"a": 1]"#), None);
    }
}
