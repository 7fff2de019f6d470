//! Toolsets: the named groups of tools `platform_toolsets` switches on per
//! platform, with the ancestor's names, so a config written for it keeps
//! its meaning here.

/// Every toolset Talaria knows and the tools it holds. A tool in none of
/// them (an MCP server's) is governed by `no_mcp` only.
pub const TOOLSETS: &[(&str, &[&str])] = &[
    ("web", &["web_search", "web_extract"]),
    (
        "browser",
        &[
            "browser_navigate",
            "browser_snapshot",
            "browser_click",
            "browser_type",
            "browser_scroll",
            "browser_back",
            "browser_press",
            "browser_get_images",
            "browser_vision",
            "browser_console",
        ],
    ),
    ("terminal", &["terminal", "process"]),
    (
        "file",
        &["read_file", "write_file", "patch", "search_files"],
    ),
    ("memory", &["memory"]),
    ("session_search", &["session_search"]),
    ("todo", &["todo"]),
    ("clarify", &["clarify"]),
    ("skills", &["skills_list", "skill_view", "skill_manage"]),
    ("vision", &["vision_analyze"]),
    ("image_gen", &["image_generate"]),
    ("tts", &["text_to_speech"]),
    ("messaging", &["send_message"]),
    ("delegation", &["delegate_task"]),
    ("code_execution", &["execute_code"]),
    (
        "homeassistant",
        &[
            "ha_list_entities",
            "ha_get_state",
            "ha_list_services",
            "ha_call_service",
        ],
    ),
    ("feishu_doc", &["feishu_doc_read"]),
    (
        "feishu_drive",
        &[
            "feishu_drive_list_comments",
            "feishu_drive_list_comment_replies",
            "feishu_drive_reply_comment",
            "feishu_drive_add_comment",
        ],
    ),
    (
        "yuanbao",
        &["yb_query_group_info", "yb_query_group_members"],
    ),
];

/// The entry that withholds every MCP server's tools.
pub const NO_MCP: &str = "no_mcp";

/// Whether `name` may appear in a `platform_toolsets` list: a toolset,
/// `no_mcp`, or one of the ancestor's `hermes-*` bundles (every toolset).
pub fn is_known(name: &str) -> bool {
    name == NO_MCP || is_bundle(name) || TOOLSETS.iter().any(|(n, _)| *n == name)
}

/// The ancestor's per-platform bundles (`hermes-telegram`, `hermes-cli`):
/// every toolset.
fn is_bundle(name: &str) -> bool {
    name.starts_with("hermes-")
}

/// The toolset `tool` belongs to, if any.
pub fn toolset_of(tool: &str) -> Option<&'static str> {
    TOOLSETS
        .iter()
        .find(|(_, tools)| tools.contains(&tool))
        .map(|(name, _)| *name)
}

/// Whether a platform whose conversations get `enabled` (its
/// `platform_toolsets` list) is offered `tool`. MCP tools (in no toolset)
/// are offered unless the list says `no_mcp`.
pub fn offers(enabled: &[String], tool: &str) -> bool {
    match toolset_of(tool) {
        Some(set) => enabled.iter().any(|e| e == set || is_bundle(e)),
        None => !enabled.iter().any(|e| e == NO_MCP),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn list(names: &[&str]) -> Vec<String> {
        names.iter().map(|n| (*n).to_owned()).collect()
    }

    #[test]
    fn a_list_offers_its_toolsets_only() {
        let l = list(&["terminal", "web"]);
        assert!(offers(&l, "web_search"));
        assert!(offers(&l, "terminal"));
        assert!(!offers(&l, "browser_navigate"));
        assert!(!offers(&l, "read_file"));
        assert!(offers(&l, "mcp_time_get_current_time"));
        assert!(!offers(
            &list(&["web", "no_mcp"]),
            "mcp_time_get_current_time"
        ));
        assert!(offers(&list(&["hermes-telegram"]), "browser_click"));
        assert!(!offers(&[], "web_extract"));
    }

    #[test]
    fn names_are_checked_and_tools_belong_to_one_set() {
        assert!(is_known("browser") && is_known("no_mcp") && is_known("hermes-cli"));
        assert!(!is_known("webb"));
        let mut seen = std::collections::HashSet::new();
        for (_, tools) in TOOLSETS {
            for t in *tools {
                assert!(seen.insert(*t), "{t} is in two toolsets");
            }
        }
    }
}
