//! The README's platform table is kept by the registry: every registered
//! platform has its row (found by the variables and `platforms.<name>`
//! keys it names), and the table lists nothing else but the API server,
//! which is not a platform adapter.

use std::path::Path;

use talaria_core::config::platform_var;
use talaria_platforms::registry::PLATFORMS;

/// The rows of the table under "## The messaging gateway".
fn table_rows() -> Vec<String> {
    let readme = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../README.md");
    let text = std::fs::read_to_string(&readme).expect("the README");
    let section = text
        .split("## The messaging gateway")
        .nth(1)
        .expect("the gateway section");
    section
        .lines()
        .skip_while(|l| !l.starts_with("| Platform |"))
        .skip(2)
        .take_while(|l| l.starts_with('|'))
        .map(str::to_owned)
        .collect()
}

/// The platforms a row names: each backticked variable belongs to the
/// platform with the longest environment prefix it starts with (so
/// `WECOM_CALLBACK_TOKEN` is `wecom_callback`'s, not `wecom`'s), and each
/// `platforms.<name>…` key to the platform of exactly that section.
fn owners(row: &str) -> Vec<&'static str> {
    let mut owners = Vec::new();
    for token in row.split('`').skip(1).step_by(2) {
        let owner = match token.strip_prefix("platforms.") {
            Some(rest) => {
                let section = rest.split('.').next().unwrap_or("");
                PLATFORMS.iter().find(|p| p.name == section)
            }
            None => PLATFORMS
                .iter()
                .filter(|p| token.starts_with(&platform_var(p.name, "")))
                .max_by_key(|p| platform_var(p.name, "").len()),
        };
        if let Some(p) = owner
            && !owners.contains(&p.name)
        {
            owners.push(p.name);
        }
    }
    owners
}

#[test]
fn a_variable_belongs_to_the_longest_prefix_and_a_key_to_its_exact_section() {
    if talaria_platforms::registry::platform("wecom").is_some()
        && talaria_platforms::registry::platform("wecom_callback").is_some()
    {
        assert_eq!(owners("| `WECOM_CALLBACK_TOKEN` |"), vec!["wecom_callback"]);
        assert_eq!(
            owners("| `WECOM_BOT_ID`, `platforms.wecom.secret` |"),
            vec!["wecom"]
        );
        assert_eq!(
            owners("| `platforms.wecom_callback` |"),
            vec!["wecom_callback"]
        );
    }
}

#[test]
fn every_registered_platform_has_its_row_and_the_table_has_no_other() {
    let rows = table_rows();
    assert!(!rows.is_empty(), "no platform table found");
    for p in PLATFORMS {
        let found = rows.iter().filter(|r| owners(r).contains(&p.name)).count();
        assert_eq!(
            found,
            1,
            "{}: expected one README row naming `{}…` or `platforms.{}…`",
            p.name,
            platform_var(p.name, ""),
            p.name
        );
    }
    // The API server is a front end, not an adapter, and has its own row.
    assert_eq!(rows.len(), PLATFORMS.len() + 1, "{rows:#?}");
    assert!(rows.iter().any(|r| r.contains("API_SERVER_KEY")));
}

/// The table's "Supports" column says what each adapter declares: threads
/// exactly where it has them, files in and out exactly where it receives
/// or sends them.
#[test]
fn each_rows_supports_column_agrees_with_the_adapters_capabilities() {
    let rows = table_rows();
    for p in PLATFORMS {
        let Some(row) = rows.iter().find(|r| owners(r).contains(&p.name)) else {
            panic!("{}: no row", p.name);
        };
        let cells: Vec<&str> = row.split(" | ").collect();
        assert_eq!(cells.len(), 4, "{}: four columns: {row}", p.name);
        let supports = cells[2];
        let caps = &p.capabilities;
        assert_eq!(
            supports.contains("threads"),
            caps.threads,
            "{}: threads in {supports:?}",
            p.name
        );
        let both = supports.contains("files in and out");
        assert_eq!(
            both || supports.contains("files in"),
            !caps.receives.is_empty(),
            "{}: files in, in {supports:?}",
            p.name
        );
        assert_eq!(
            both || supports.contains("files out"),
            !caps.sends.is_empty(),
            "{}: files out, in {supports:?}",
            p.name
        );
    }
}
