//! Writing variables into `$TALARIA_HOME/.env` (for `/sethome`), keeping
//! every other line, comment and ordering as it was.

use std::io::{self, Write};
use std::path::Path;

/// Sets each `(name, value)` in the file: an existing `NAME=` line is
/// replaced in place, a missing one appended. An empty value removes the
/// variable. The file is rewritten through a temporary file (mode 0600) and
/// renamed over the old one, so a crash leaves either version, never half.
pub fn upsert(path: &Path, vars: &[(String, String)]) -> io::Result<()> {
    let old = match std::fs::read_to_string(path) {
        Ok(s) => s,
        Err(e) if e.kind() == io::ErrorKind::NotFound => String::new(),
        Err(e) => return Err(e),
    };
    for (name, value) in vars {
        if value.contains(['\n', '\r']) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("the value for {name} contains a line break"),
            ));
        }
    }
    let mut done = vec![false; vars.len()];
    let mut out = String::new();
    for line in old.lines() {
        let name = line
            .trim_start()
            .trim_start_matches("export ")
            .split('=')
            .next()
            .unwrap_or("")
            .trim();
        match vars.iter().position(|(n, _)| n == name) {
            Some(i) => {
                done[i] = true;
                let value = &vars[i].1;
                if !value.is_empty() {
                    out.push_str(&format!("{name}={}\n", quote(value)));
                }
            }
            None => {
                out.push_str(line);
                out.push('\n');
            }
        }
    }
    for (i, (name, value)) in vars.iter().enumerate() {
        if !done[i] && !value.is_empty() {
            out.push_str(&format!("{name}={}\n", quote(value)));
        }
    }
    let dir = path.parent().unwrap_or_else(|| Path::new("."));
    let mut tmp = tempfile::NamedTempFile::new_in(dir)?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        tmp.as_file()
            .set_permissions(std::fs::Permissions::from_mode(0o600))?;
    }
    tmp.write_all(out.as_bytes())?;
    tmp.as_file().sync_all()?;
    tmp.persist(path).map_err(|e| e.error)?;
    Ok(())
}

/// Quotes a value when dotenv parsing would otherwise change it.
fn quote(value: &str) -> String {
    if value
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || "-_.:@/+".contains(c))
    {
        value.to_owned()
    } else {
        format!("\"{}\"", value.replace('\\', "\\\\").replace('"', "\\\""))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replaces_appends_removes_and_keeps_the_rest() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(".env");
        std::fs::write(
            &path,
            "# keys\nA=1\nTELEGRAM_HOME_CHANNEL=old\nB=\"two words\"\n",
        )
        .unwrap();
        upsert(
            &path,
            &[
                ("TELEGRAM_HOME_CHANNEL".into(), "-100123".into()),
                ("TELEGRAM_HOME_CHANNEL_THREAD_ID".into(), "7".into()),
                ("A".into(), String::new()),
            ],
        )
        .unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!(
            text,
            "# keys\nTELEGRAM_HOME_CHANNEL=-100123\nB=\"two words\"\nTELEGRAM_HOME_CHANNEL_THREAD_ID=7\n"
        );
        let parsed: Vec<(String, String)> = dotenvy::from_path_iter(&path)
            .unwrap()
            .map(|r| r.unwrap())
            .collect();
        assert!(parsed.contains(&("TELEGRAM_HOME_CHANNEL".into(), "-100123".into())));
        assert!(upsert(&path, &[("X".into(), "a\nb".into())]).is_err());
    }
}
