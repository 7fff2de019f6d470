//! The environment a command starts with.
//!
//! Never Talaria's whole one: provider keys, bot tokens, `API_SERVER_KEY`
//! and database URLs would leave through `env | base64`, which no redaction
//! of the output can recognise. A command gets the variables of
//! [`BASE_ENV`], the `LC_*` locale variables and the names the
//! configuration passes through (`terminal.env_passthrough`, a skill's
//! `required_environment_variables`), and nothing else.

use std::ffi::OsString;

/// Variables a command inherits whatever the configuration says: where
/// programs are, who and where the user is, the language and the
/// terminal. None of them carries a credential.
pub const BASE_ENV: &[&str] = &[
    "PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "LANGUAGE", "TERM", "TZ", "TMPDIR",
];

/// Variables every command gets, so nothing waits on a keyboard nobody is
/// at: pagers print, git never prompts.
pub const NON_INTERACTIVE: &[(&str, &str)] = &[
    ("PAGER", "cat"),
    ("GIT_PAGER", "cat"),
    ("GIT_TERMINAL_PROMPT", "0"),
];

/// The allowlisted variables of `from` (the process environment) plus the
/// names `passthrough` adds, and [`NON_INTERACTIVE`]. Variables that are
/// not valid UTF-8 are left out.
pub fn child_env<I>(from: I, passthrough: &[String]) -> Vec<(String, String)>
where
    I: IntoIterator<Item = (OsString, OsString)>,
{
    let mut out: Vec<(String, String)> = from
        .into_iter()
        .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?)))
        .filter(|(k, _)| allowed(k, passthrough))
        .filter(|(k, _)| !NON_INTERACTIVE.iter().any(|(n, _)| n == k))
        .collect();
    out.extend(
        NON_INTERACTIVE
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned())),
    );
    out
}

fn allowed(name: &str, passthrough: &[String]) -> bool {
    BASE_ENV.contains(&name) || name.starts_with("LC_") || passthrough.iter().any(|p| p == name)
}

/// `env` with the variables an isolated backend sets itself replaced:
/// inside a sandbox or container the home, the user and `TMPDIR` are the
/// sandbox's, not the host's (the host's home path would only tell a
/// command where the secrets are).
pub fn for_isolated(env: &[(String, String)], home: &str) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = env
        .iter()
        .filter(|(k, _)| !matches!(k.as_str(), "HOME" | "TMPDIR" | "USER" | "LOGNAME" | "SHELL"))
        .cloned()
        .collect();
    out.push(("HOME".to_owned(), home.to_owned()));
    out.push(("TMPDIR".to_owned(), "/tmp".to_owned()));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn os(k: &str, v: &str) -> (OsString, OsString) {
        (OsString::from(k), OsString::from(v))
    }

    #[test]
    fn children_get_the_allowlist_and_the_passthrough_only() {
        let from = vec![
            os("PATH", "/usr/bin"),
            os("HOME", "/home/u"),
            os("LC_ALL", "C.UTF-8"),
            os("OPENAI_API_KEY", "sk-leak"),
            os("TELEGRAM_BOT_TOKEN", "123:leak"),
            os("DATABASE_URL", "postgres://u:leak@db/x"),
            os("GITHUB_TOKEN", "ghp_wanted"),
            os("PAGER", "less"),
        ];
        let got = child_env(from, &["GITHUB_TOKEN".to_owned()]);
        let names: Vec<&str> = got.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(
            names,
            [
                "PATH",
                "HOME",
                "LC_ALL",
                "GITHUB_TOKEN",
                "PAGER",
                "GIT_PAGER",
                "GIT_TERMINAL_PROMPT"
            ]
        );
        assert!(got.contains(&("PAGER".to_owned(), "cat".to_owned())));
    }

    #[test]
    fn an_isolated_command_gets_the_sandbox_home() {
        let env = vec![
            ("HOME".to_owned(), "/root".to_owned()),
            ("PATH".to_owned(), "/usr/bin".to_owned()),
        ];
        let got = for_isolated(&env, "/workspace");
        assert!(got.contains(&("HOME".to_owned(), "/workspace".to_owned())));
        assert!(!got.iter().any(|(_, v)| v == "/root"));
    }
}
