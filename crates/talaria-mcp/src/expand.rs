//! `${VAR}` in configured env and header values, filled from the process
//! environment and `.env` (the process wins), so secrets stay out of
//! `config.yaml`.

use talaria_core::Env;

/// `text` with every `${NAME}` replaced by the variable's value. `$$` is a
/// literal `$`; a `$` not followed by `{` stays as it is. A variable that is
/// not set is an error naming it, so a server never starts with an empty
/// token.
pub fn expand(text: &str, env: &Env) -> Result<String, String> {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        let after = &rest[at + 1..];
        if let Some(tail) = after.strip_prefix('$') {
            out.push('$');
            rest = tail;
        } else if let Some(body) = after.strip_prefix('{') {
            let end = body
                .find('}')
                .ok_or_else(|| format!("`{text}` has a `${{` without its `}}`"))?;
            let name = &body[..end];
            if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
                return Err(format!("`${{{name}}}` is not a variable name"));
            }
            let value = env.get(name).ok_or_else(|| {
                format!("the variable {name} is not set (in the environment or the .env file)")
            })?;
            out.push_str(value);
            rest = &body[end + 1..];
        } else {
            out.push('$');
            rest = after;
        }
    }
    out.push_str(rest);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn variables_are_filled_and_missing_ones_named() {
        let env = Env::from_pairs([("TOKEN", "abc123"), ("USER_ID", "7")]);
        assert_eq!(expand("Bearer ${TOKEN}", &env).unwrap(), "Bearer abc123");
        assert_eq!(expand("${USER_ID}-${TOKEN}", &env).unwrap(), "7-abc123");
        assert_eq!(expand("costs $5 or $$6", &env).unwrap(), "costs $5 or $6");
        assert_eq!(expand("plain", &env).unwrap(), "plain");
        let e = expand("${NOPE}", &env).unwrap_err();
        assert!(e.contains("NOPE"), "{e}");
        assert!(expand("${TOKEN", &env).is_err());
        assert!(expand("${BAD NAME}", &env).is_err());
    }
}
