//! The dangerous-command guard used by the `terminal` tool.
//!
//! Two lists. The HARDLINE list names commands that destroy a machine (wipe
//! `/`, format a disk, fork-bomb, power off); nothing runs them, whatever
//! the approval mode or allowlist says. The pattern list names commands that
//! are often fine but destructive when wrong (recursive deletes, force
//! pushes, `DROP TABLE`); those need a human's approval unless approvals are
//! off, the pattern was approved for the session, or the exact command was
//! approved "always" (see [`super::terminal::authorize`]).
//!
//! Matching runs over several de-obfuscated spellings of the command
//! (quotes and backslashes stripped, `sudo`/`env`/`command` wrappers and
//! absolute program paths seen through), because `"r""m" -rf /` and
//! `sudo /bin/rm -rf /` mean the same as `rm -rf /`. This is a seat belt
//! against model mistakes, not a sandbox: a determined adversary with a
//! shell can always write a program that does the same thing.

use std::sync::LazyLock;

use regex::Regex;

/// What the guard says about a command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GuardVerdict {
    /// Nothing on either list.
    Allow,
    /// On the hardline list: never runs.
    Hardline {
        /// Which rule matched, for the message to the model.
        reason: &'static str,
    },
    /// On the pattern list: runs only with approval.
    NeedsApproval {
        /// Every matched pattern, in list order, without repeats.
        findings: Vec<Finding>,
    },
}

/// One matched approval pattern.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finding {
    /// Stable key, remembered for "session" approvals and usable in the
    /// configuration's `command_allowlist`. It is the description itself,
    /// so an allowlist stays readable.
    pub key: &'static str,
}

impl Finding {
    /// Human-readable description (the same text as the key).
    pub fn description(&self) -> &'static str {
        self.key
    }
}

/// Checks a command against the hardline list, then the pattern list.
pub fn check(command: &str) -> GuardVerdict {
    // Bounded work on absurd inputs: no real command line is this long, and
    // the regexes are linear anyway.
    let command = match command.char_indices().nth(100_000) {
        Some((cut, _)) => &command[..cut],
        None => command,
    };
    let variants = variants(command);
    if let Some(reason) = hardline(command, &variants) {
        return GuardVerdict::Hardline { reason };
    }
    let mut findings: Vec<Finding> = Vec::new();
    for p in PATTERNS.iter() {
        if variants.iter().any(|v| (p.test)(&p.re, v)) && !findings.iter().any(|f| f.key == p.key) {
            findings.push(Finding { key: p.key });
        }
    }
    if findings.is_empty() {
        GuardVerdict::Allow
    } else {
        GuardVerdict::NeedsApproval { findings }
    }
}

/// Every approval-pattern key, in list order (for docs and allowlist checks).
pub fn pattern_keys() -> Vec<&'static str> {
    PATTERNS.iter().map(|p| p.key).collect()
}

/// Whether the command uses shell operators (chaining, pipes, redirects,
/// substitution). Allowlist entries never apply to such commands: an
/// approved `git push --force` must not smuggle `; rm -rf ~` along.
pub fn has_shell_operators(command: &str) -> bool {
    command.contains([';', '&', '|', '>', '<', '`', '\n', '\r']) || command.contains("$(")
}

/// Shell-style glob match of the whole `text`: `*` is any run of characters,
/// `?` is one character. No character classes: allowlist entries are
/// literal commands with wildcards.
pub fn glob_match(pattern: &str, text: &str) -> bool {
    let p: Vec<char> = pattern.chars().collect();
    let t: Vec<char> = text.chars().collect();
    // Iterative matcher with single-star backtracking: linear-ish and no
    // recursion, so hostile patterns cannot blow the stack.
    let (mut pi, mut ti) = (0usize, 0usize);
    let mut star: Option<(usize, usize)> = None;
    while ti < t.len() {
        if pi < p.len() && (p[pi] == '?' || p[pi] == t[ti]) {
            pi += 1;
            ti += 1;
        } else if pi < p.len() && p[pi] == '*' {
            star = Some((pi, ti));
            pi += 1;
        } else if let Some((sp, st)) = star {
            pi = sp + 1;
            ti = st + 1;
            star = Some((sp, st + 1));
        } else {
            return false;
        }
    }
    while pi < p.len() && p[pi] == '*' {
        pi += 1;
    }
    pi == p.len()
}

/// Spellings of the command that the lists are matched against.
fn variants(command: &str) -> Vec<String> {
    let collapsed = collapse_ws(command);
    let stripped = collapse_ws(&strip_quoting(command));
    let segments: Vec<String> = segments(&stripped)
        .into_iter()
        .map(|seg| unwrap_segment(&seg).join(" "))
        .filter(|s| !s.is_empty())
        .collect();
    let mut out = vec![collapsed, stripped, segments.join(" ; ")];
    out.dedup();
    out
}

fn collapse_ws(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Removes quoting that the shell would remove, and spellings that expand
/// to a space or to `$HOME`.
fn strip_quoting(s: &str) -> String {
    let s = s
        .replace("${IFS}", " ")
        .replace("$IFS", " ")
        .replace("${HOME}", "$HOME")
        .replace("\\\n", "");
    s.chars()
        .filter(|c| !matches!(c, '\'' | '"' | '\\'))
        .collect()
}

/// Splits a (quote-stripped) command line into simple commands.
fn segments(s: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut chars = s.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            ';' | '|' | '&' | '\n' | '(' | ')' | '`' => {
                out.push(std::mem::take(&mut cur));
            }
            '$' if chars.peek() == Some(&'(') => {
                out.push(std::mem::take(&mut cur));
            }
            _ => cur.push(c),
        }
    }
    out.push(cur);
    out.into_iter()
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty())
        .collect()
}

/// The words of a simple command with wrappers removed and the program
/// reduced to its base name: `sudo -u root env X=1 /bin/rm -rf /` becomes
/// `rm -rf /`. A `sh -c '...'` payload is returned as the command itself.
fn unwrap_segment(seg: &str) -> Vec<String> {
    let mut words: Vec<String> = seg.split_whitespace().map(str::to_owned).collect();
    // Each pass removes one wrapper; the bound stops a pathological input
    // from looping long.
    for _ in 0..32 {
        let Some(first) = words.first().cloned() else {
            break;
        };
        if first == "{" || first == "!" {
            words.remove(0);
            continue;
        }
        if is_assignment(&first) {
            words.remove(0);
            continue;
        }
        let prog = base_name(&first);
        match prog.as_str() {
            "sudo" | "doas" => {
                words.remove(0);
                skip_options(
                    &mut words,
                    &["-u", "-g", "-C", "-D", "-h", "-p", "-r", "-t", "-U"],
                );
            }
            "env" => {
                words.remove(0);
                skip_options(&mut words, &["-u", "-C", "-S"]);
                while words.first().is_some_and(|w| is_assignment(w)) {
                    words.remove(0);
                }
            }
            "command" | "builtin" | "exec" | "nohup" | "time" | "eval" | "setsid" => {
                words.remove(0);
                skip_options(&mut words, &[]);
            }
            "nice" | "ionice" | "timeout" | "stdbuf" => {
                words.remove(0);
                skip_options(&mut words, &["-n", "-c", "-s", "-k"]);
                // timeout's duration operand.
                if prog == "timeout"
                    && words
                        .first()
                        .is_some_and(|w| w.starts_with(|c: char| c.is_ascii_digit()))
                {
                    words.remove(0);
                }
            }
            "sh" | "bash" | "zsh" | "dash" | "ksh" => {
                if let Some(pos) = words.iter().position(|w| {
                    w == "-c" || (w.starts_with('-') && !w.starts_with("--") && w.ends_with('c'))
                }) {
                    words.drain(..=pos);
                } else {
                    break;
                }
            }
            _ => {
                words[0] = prog;
                break;
            }
        }
    }
    if let Some(w) = words.last()
        && w == "}"
    {
        words.pop();
    }
    words
}

fn is_assignment(word: &str) -> bool {
    match word.split_once('=') {
        Some((name, _)) => {
            !name.is_empty()
                && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
                && !name.starts_with(|c: char| c.is_ascii_digit())
        }
        None => false,
    }
}

/// Drops leading options; those in `with_value` also drop their operand.
fn skip_options(words: &mut Vec<String>, with_value: &[&str]) {
    while let Some(w) = words.first() {
        if w == "--" {
            words.remove(0);
            break;
        }
        if !w.starts_with('-') || w == "-" {
            break;
        }
        let takes_value = with_value.contains(&w.as_str());
        words.remove(0);
        if takes_value && !words.is_empty() {
            words.remove(0);
        }
    }
}

/// `/usr/bin/rm` → `rm`; keeps anything that is not a path as is.
fn base_name(word: &str) -> String {
    word.rsplit('/').next().unwrap_or(word).to_owned()
}

/// Directories whose recursive removal is never allowed.
const SYSTEM_DIRS: &[&str] = &[
    "/",
    "/bin",
    "/boot",
    "/dev",
    "/etc",
    "/home",
    "/lib",
    "/lib32",
    "/lib64",
    "/libx32",
    "/media",
    "/mnt",
    "/opt",
    "/proc",
    "/root",
    "/run",
    "/sbin",
    "/snap",
    "/srv",
    "/sys",
    "/usr",
    "/var",
    "/usr/bin",
    "/usr/lib",
    "/usr/local",
    "/usr/sbin",
    "/usr/share",
    "/var/lib",
    "/var/log",
    "/Applications",
    "/Library",
    "/System",
    "/Users",
];

/// Whether an `rm` operand names `/`, a system directory, or the home.
fn catastrophic_target(arg: &str) -> bool {
    let mut t = arg.to_owned();
    // `/*` and `dir/*` remove the same tree as the directory itself.
    while let Some(rest) = t.strip_suffix("/*").or_else(|| t.strip_suffix("/.")) {
        t = if rest.is_empty() {
            "/".to_owned()
        } else {
            rest.to_owned()
        };
    }
    if t == "*" {
        return false;
    }
    let trimmed = t.trim_end_matches('/');
    if trimmed == "~" || trimmed == "$HOME" {
        return true;
    }
    if let Some(home) = std::env::var_os("HOME").and_then(|h| h.into_string().ok())
        && !home.is_empty()
        && home != "/"
        && trimmed == home.trim_end_matches('/')
    {
        return true;
    }
    if !t.starts_with('/') {
        return false;
    }
    // Collapse `//`, and `/..` at the root stays the root.
    let mut parts: Vec<&str> = Vec::new();
    for part in t.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            p => parts.push(p),
        }
    }
    let normal = format!("/{}", parts.join("/"));
    SYSTEM_DIRS.iter().any(|d| d.eq_ignore_ascii_case(&normal))
}

fn is_block_device(path: &str) -> bool {
    static DEV: LazyLock<Regex> = LazyLock::new(|| {
        Regex::new(r"^/dev/(?:sd[a-z]|nvme\d|hd[a-z]|vd[a-z]|xvd[a-z]|mmcblk\d|disk\d|md\d|dm-\d|loop\d|mapper/)")
            .unwrap_or_else(|e| panic!("bad device pattern: {e}"))
    });
    DEV.is_match(path)
}

/// The hardline rule the command breaks, if any.
fn hardline(raw: &str, variants: &[String]) -> Option<&'static str> {
    // Fork bombs are recognised on the text with all whitespace removed:
    // `name(){ name|name& };name` for any function name.
    let dense: String = raw.chars().filter(|c| !c.is_whitespace()).collect();
    if is_fork_bomb(&dense) {
        return Some("fork bomb");
    }
    static REDIRECT: LazyLock<Regex> = LazyLock::new(|| {
        Regex::new(r">\s*(/dev/\S+)").unwrap_or_else(|e| panic!("bad redirect pattern: {e}"))
    });
    for v in variants {
        for cap in REDIRECT.captures_iter(v) {
            if cap.get(1).is_some_and(|m| is_block_device(m.as_str())) {
                return Some("redirect into a raw block device");
            }
        }
    }
    let stripped = collapse_ws(&strip_quoting(raw));
    for seg in segments(&stripped) {
        let words = unwrap_segment(&seg);
        if let Some(reason) = hardline_words(&words) {
            return Some(reason);
        }
    }
    None
}

fn is_fork_bomb(dense: &str) -> bool {
    static DEF: LazyLock<Regex> = LazyLock::new(|| {
        Regex::new(r"([^\s(){}|&;]+)\(\)\{").unwrap_or_else(|e| panic!("bad fork pattern: {e}"))
    });
    DEF.captures_iter(dense).any(|cap| {
        let name = cap.get(1).map_or("", |m| m.as_str());
        let name = name
            .strip_prefix("function")
            .filter(|n| !n.is_empty())
            .unwrap_or(name);
        dense.contains(&format!("{name}|{name}&")) || dense.contains(&format!("{name}&{name}&"))
    })
}

fn hardline_words(words: &[String]) -> Option<&'static str> {
    let prog = words.first()?.to_ascii_lowercase();
    let args = &words[1..];
    match prog.as_str() {
        "rm" => {
            let mut recursive = false;
            let mut operands_only = false;
            let mut targets = Vec::new();
            for a in args {
                if !operands_only && a == "--" {
                    operands_only = true;
                } else if !operands_only && a.starts_with("--") {
                    if a == "--recursive" {
                        recursive = true;
                    }
                    if a == "--no-preserve-root" {
                        return Some("rm --no-preserve-root");
                    }
                } else if !operands_only && a.starts_with('-') && a.len() > 1 {
                    if a.contains(['r', 'R']) {
                        recursive = true;
                    }
                } else {
                    targets.push(a);
                }
            }
            if recursive && targets.iter().any(|t| catastrophic_target(t)) {
                return Some("recursive delete of /, the home directory or a system directory");
            }
            None
        }
        p if p.starts_with("mkfs") || p == "mke2fs" || p == "mkswap" || p == "wipefs" => {
            Some("formatting a file system")
        }
        "dd" => args
            .iter()
            .filter_map(|a| a.strip_prefix("of="))
            .any(is_block_device)
            .then_some("dd onto a raw disk device"),
        "shred" | "tee" if args.iter().any(|a| is_block_device(a)) => {
            Some("writing over a raw disk device")
        }
        "kill" => {
            let operands: Vec<&String> = args.iter().filter(|a| *a != "--").collect();
            // `kill -1` alone, or any later operand of -1: signal every process.
            let all = (operands.len() == 1 && operands[0] == "-1")
                || operands.iter().skip(1).any(|a| *a == "-1");
            all.then_some("kill -1 (every process)")
        }
        "shutdown" | "reboot" | "halt" | "poweroff" => {
            Some("shutting down or rebooting the machine")
        }
        "init" | "telinit" if args.first().is_some_and(|a| a == "0" || a == "6") => {
            Some("shutting down or rebooting the machine")
        }
        "systemctl" => args
            .iter()
            .find(|a| !a.starts_with('-'))
            .is_some_and(|a| {
                matches!(
                    a.as_str(),
                    "poweroff" | "reboot" | "halt" | "kexec" | "emergency" | "rescue"
                )
            })
            .then_some("shutting down or rebooting the machine"),
        _ => None,
    }
}

struct Pattern {
    key: &'static str,
    re: Regex,
    /// Usually "the regex matches"; a few rules need a check regexes cannot
    /// express (no look-ahead in the `regex` crate).
    test: fn(&Regex, &str) -> bool,
}

fn re_matches(re: &Regex, text: &str) -> bool {
    re.is_match(text)
}

/// `DELETE FROM t` with no `WHERE` before the statement ends.
fn delete_without_where(re: &Regex, text: &str) -> bool {
    re.find_iter(text).any(|m| {
        let rest = &text[m.end()..];
        let end = rest.find([';', '"', '\'']).unwrap_or(rest.len());
        !rest[..end].to_ascii_lowercase().contains("where")
    })
}

static PATTERNS: LazyLock<Vec<Pattern>> = LazyLock::new(|| {
    let p = |key: &'static str, src: &str| Pattern {
        key,
        // Constant patterns, all compiled by the unit tests below.
        re: Regex::new(&format!("(?i){src}"))
            .unwrap_or_else(|e| panic!("bad guard pattern {key}: {e}")),
        test: re_matches,
    };
    let shell = r"(?:sudo\s+)?(?:\S*/)?(?:ba|z|da|k|fi)?sh\b";
    vec![
        p(
            "recursive delete (rm -r)",
            r"(?:^|[\s;&|(`])rm\s+(?:\S+\s+)*?(?:-[a-z]*r[a-z]*|--recursive)\b",
        ),
        p(
            "delete in a system directory",
            r"(?:^|[\s;&|(`])rm\s+(?:\S+\s+)*?/(?:etc|usr|bin|sbin|boot|lib|lib64|var|opt|root|srv|sys|proc|dev)(?:/|\s|$)",
        ),
        p(
            "world-writable permissions (chmod 777 / o+w)",
            r"\bchmod\s+(?:-\S+\s+)*(?:0?777\b|[ugoa]*o[ugoa]*\+[rwxX]*w|a\+[rwxX]*w)",
        ),
        p(
            "recursive chmod",
            r"\bchmod\s+(?:\S+\s+)*?(?-i:-[a-zA-Z]*R[a-zA-Z]*)\b|\bchmod\b.*\s--recursive\b",
        ),
        p(
            "recursive chown",
            r"\bchown\s+(?:\S+\s+)*?(?-i:-[a-zA-Z]*R[a-zA-Z]*)\b|\bchown\b.*\s--recursive\b",
        ),
        p(
            "pipe remote content into a shell",
            &format!(
                r"\b(?:curl|wget|fetch)\b[^;&]*\|\s*{shell}|\b(?:curl|wget)\b[^;&]*\|\s*(?:sudo\s+)?(?:python[0-9.]*|perl|ruby|node)\b|{shell}\s+(?:-\S+\s+)*<\(\s*(?:curl|wget)|{shell}\s+-c\s+\S*\$\(\s*(?:curl|wget)"
            ),
        ),
        p(
            "decode and run encoded content",
            &format!(
                r"\b(?:base64\s+(?:\S+\s+)*?(?:-d|--decode|-D)\b|xxd\s+(?:\S+\s+)*?-r\b|openssl\s+(?:base64|enc)\b[^|;&]*\s-d\b)[^;&]*\|\s*{shell}"
            ),
        ),
        p(
            "in-place edit of dotfiles or credentials",
            r"\b(?:sed|perl)\s+(?:\S+\s+)*?(?:-i\S*|--in-place\S*)\s+(?:\S+\s+)*?\S*(?:(?:^|/|~)\.[\w.-]+|credentials|secrets?|\.pem|\.key|id_[a-z0-9]+|authorized_keys)\b",
        ),
        p(
            "write into /etc",
            r"(?:>>?|\btee\b(?:\s+-\S+)*)\s*/etc/|\b(?:cp|mv|install|ln|rsync)\b[^;&|]*\s/etc(?:/|\s|$)|\bsed\s+[^;&|]*-i[^;&|]*\s/etc/",
        ),
        p(
            "git reset --hard",
            r"\bgit\b[^;&|]*\breset\b[^;&|]*\s--hard\b",
        ),
        p(
            "git force push",
            r"\bgit\b[^;&|]*\bpush\b[^;&|]*(?:\s--force\b|\s--force-with-lease\b|\s-[a-z]*f\b|\s\+\S)",
        ),
        p(
            "git clean -f",
            r"\bgit\b[^;&|]*\bclean\b[^;&|]*(?:\s-[a-z]*f|\s--force\b)",
        ),
        p(
            "git branch -D",
            r"\bgit\b[^;&|]*\bbranch\b[^;&|]*\s(?-i:-D)\b|\bgit\b[^;&|]*\bbranch\b[^;&|]*\s--delete\s+--force\b",
        ),
        p(
            "SQL DROP TABLE/DATABASE",
            r"\bdrop\s+(?:table|database|schema)\b",
        ),
        p("SQL TRUNCATE", r"\btruncate\s+(?:table\s+)?[a-z_`\x22\[]"),
        Pattern {
            key: "SQL DELETE without WHERE",
            re: Regex::new(r"(?i)\bdelete\s+from\s+\S+")
                .unwrap_or_else(|e| panic!("bad guard pattern: {e}")),
            test: delete_without_where,
        },
        p(
            "kill -9 (SIGKILL)",
            r"\bkill\s+(?:-9|-kill|-sigkill|-s\s+(?:9|kill|sigkill))\b",
        ),
        p(
            "kill processes by name (pkill/killall)",
            r"\b(?:pkill|killall)\b",
        ),
        p(
            "stop, restart or disable a system service",
            r"\bsystemctl\s+(?:--?\S+\s+)*(?:stop|restart|disable|mask|kill|isolate)\b|\bservice\s+\S+\s+(?:stop|restart)\b",
        ),
        p(
            "find -delete / -exec rm",
            r"\bfind\b[^;&|]*\s(?:-delete\b|-exec(?:dir)?\s+(?:\S*/)?(?:rm|shred|unlink)\b)",
        ),
        p("xargs rm", r"\bxargs\b[^;&|]*\b(?:rm|shred|unlink)\b"),
        p(
            "docker remove or prune",
            r"\bdocker\s+(?:container\s+|image\s+|volume\s+|network\s+|system\s+|builder\s+)?(?:rm|rmi|prune)\b|\bdocker[\s-]compose\s+(?:\S+\s+)*?down\b[^;&|]*\s-v\b",
        ),
        p(
            "write to .env or config.yaml",
            r"(?:>>?|\btee\b(?:\s+-\S+)*)\s*\S*(?:\.env\b|config\.ya?ml\b)|\b(?:cp|mv)\b[^;&|]*\s\S*(?:\.env|config\.ya?ml)\s*$",
        ),
        p("raw disk write with dd", r"\bdd\b[^;&|]*\bof=/dev/"),
        p(
            "run a shell script from a heredoc",
            &format!(r"{shell}\s+(?:-\S+\s+)*<<"),
        ),
        p(
            "remove all crontab entries",
            r"\bcrontab\s+(?:\S+\s+)*?-r\b",
        ),
        p(
            "flush firewall rules",
            r"\b(?:iptables|ip6tables|nft)\s+(?:\S+\s+)*?(?:-F\b|--flush\b|flush\s+ruleset\b)",
        ),
        p(
            "make the whole file system writable or owned (chmod/chown on /)",
            r"\bch(?:mod|own)\s+(?:\S+\s+)+/(?:\s|$)",
        ),
    ]
});

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_compile_and_keys_are_unique() {
        let keys = pattern_keys();
        let mut sorted = keys.clone();
        sorted.sort();
        sorted.dedup();
        assert_eq!(keys.len(), sorted.len());
    }

    #[test]
    fn wrappers_are_seen_through() {
        assert_eq!(
            unwrap_segment("sudo -u root env A=1 /bin/rm -rf /"),
            ["rm", "-rf", "/"]
        );
        assert_eq!(unwrap_segment("bash -c rm -rf ~"), ["rm", "-rf", "~"]);
        assert_eq!(unwrap_segment("timeout 5 nice -n 3 ls"), ["ls"]);
    }

    #[test]
    fn globs() {
        assert!(glob_match("git push *", "git push origin main"));
        assert!(glob_match("a?c", "abc"));
        assert!(!glob_match("git push *", "git pull"));
        assert!(glob_match("*", ""));
    }
}
