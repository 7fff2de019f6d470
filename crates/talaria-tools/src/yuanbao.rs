//! The `yb_*` tools: what a Yuanbao group ("派", Pai) is and who is in it,
//! asked over the bot's live socket.
//!
//! Both ride the [`YuanbaoLink`] the Yuanbao adapter of the same process
//! serves; when its socket is down (or no gateway runs here) the call says
//! so instead of waiting. Names and argument schemas are the ancestor's,
//! so prompts and skills written for it keep working. Names and nicknames
//! are written by the group's members: the output is marked untrusted,
//! and bounded (members listed, characters).

use std::sync::Arc;

use async_trait::async_trait;
use serde_json::{Value, json};
use talaria_agent::tools::{Tool, ToolContext, ToolError, ToolResult};
use talaria_platforms::yuanbao::{GroupMember, LinkError, Role, YuanbaoLink};

/// Most members read from the platform (pages of 200).
pub const MAX_MEMBERS_READ: usize = 2_000;

/// Most members shown in one answer.
pub const MAX_MEMBERS_SHOWN: usize = 100;

/// Most characters one answer holds.
pub const MAX_OUTPUT_CHARS: usize = 8_000;

/// How an @-mention must be written for the gateway to turn it into a
/// real one.
const MENTION_HINT: &str =
    "To @mention a member, write a space, @, the exact nickname and a space (e.g. \" @Alice \").";

/// The two tools, asking over `link`.
pub fn yb_tools(link: YuanbaoLink) -> Vec<Arc<dyn Tool>> {
    vec![
        Arc::new(QueryGroupInfo(link.clone())),
        Arc::new(QueryGroupMembers(link)),
    ]
}

fn explain(e: LinkError) -> ToolError {
    ToolError::new(e.to_string())
}

/// `group_code`, required; `group:<code>` (a chat id) is read as the code.
fn group_code(args: &Value) -> Result<String, ToolError> {
    let code = match args.get("group_code") {
        Some(Value::String(s)) => s.trim(),
        Some(Value::Number(n)) => return Ok(n.to_string()),
        None | Some(Value::Null) => "",
        Some(_) => return Err(ToolError::new("`group_code` must be a string")),
    };
    let code = code.strip_prefix("group:").unwrap_or(code).trim();
    if code.is_empty() {
        return Err(ToolError::new(
            "`group_code` is required (the code in the chat id group:<code>)",
        ));
    }
    Ok(code.to_owned())
}

/// `text` cut to [`MAX_OUTPUT_CHARS`], saying so.
fn bounded(text: String) -> String {
    if text.chars().count() <= MAX_OUTPUT_CHARS {
        return text;
    }
    let mut cut: String = text.chars().take(MAX_OUTPUT_CHARS).collect();
    cut.push_str("\n[output cut]");
    cut
}

struct QueryGroupInfo(YuanbaoLink);

#[async_trait]
impl Tool for QueryGroupInfo {
    fn name(&self) -> &str {
        "yb_query_group_info"
    }

    fn description(&self) -> &str {
        "Query basic info about a group (called '派/Pai' in the app), including group name, \
         owner, and member count."
    }

    fn parameters(&self) -> Value {
        json!({
            "type": "object",
            "properties": {
                "group_code": {
                    "type": "string",
                    "description": "The unique group identifier (group_code)."
                }
            },
            "required": ["group_code"]
        })
    }

    fn parallel_safe(&self) -> bool {
        true
    }

    fn untrusted_output(&self) -> bool {
        true
    }

    async fn call(&self, args: Value, _ctx: &ToolContext) -> ToolResult {
        let code = group_code(&args)?;
        let info = self.0.query_group_info(&code).await.map_err(explain)?;
        let out = json!({
            "group_code": code,
            "group_name": info.name,
            "member_count": info.member_count,
            "owner": {"user_id": info.owner_id, "nickname": info.owner_nickname},
            "note": "The group is called \"派 (Pai)\" in the app.",
        });
        Ok(bounded(out.to_string()))
    }
}

struct QueryGroupMembers(YuanbaoLink);

/// What `yb_query_group_members` was asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Action {
    Find(String),
    ListBots,
    ListAll,
}

fn action(args: &Value) -> Result<Action, ToolError> {
    let name = match args.get("name") {
        Some(Value::String(s)) => s.trim().to_owned(),
        None | Some(Value::Null) => String::new(),
        Some(_) => return Err(ToolError::new("`name` must be a string")),
    };
    match args.get("action").and_then(Value::as_str).map(str::trim) {
        Some("find") if name.is_empty() => Err(ToolError::new(
            "`name` is required for action `find` (part of the member's name)",
        )),
        Some("find") => Ok(Action::Find(name)),
        Some("list_bots") => Ok(Action::ListBots),
        Some("list_all") | None | Some("") => Ok(Action::ListAll),
        Some(other) => Err(ToolError::new(format!(
            "`action` must be find, list_bots or list_all, not {other:?}"
        ))),
    }
}

fn member_json(m: &GroupMember) -> Value {
    json!({"user_id": m.user_id, "nickname": m.nickname, "role": m.role.name()})
}

#[async_trait]
impl Tool for QueryGroupMembers {
    fn name(&self) -> &str {
        "yb_query_group_members"
    }

    fn description(&self) -> &str {
        "Query members of a group (called '派/Pai' in the app). Use this tool when you need to \
         @mention someone, find a user by name, list bots (including Yuanbao AI), or list all \
         members. IMPORTANT: You MUST call this tool before @mentioning any user, because you \
         need the exact nickname to construct the @mention format."
    }

    fn parameters(&self) -> Value {
        json!({
            "type": "object",
            "properties": {
                "group_code": {
                    "type": "string",
                    "description": "The unique group identifier (group_code)."
                },
                "action": {
                    "type": "string",
                    "enum": ["find", "list_bots", "list_all"],
                    "description": "find — search a user by name (use when you need to @mention \
                        or look up someone); list_bots — list bots and Yuanbao AI assistants; \
                        list_all — list all members."
                },
                "name": {
                    "type": "string",
                    "description": "User name to search (partial match, case-insensitive). \
                        Required for 'find'. Use the name the user mentioned in the conversation."
                },
                "mention": {
                    "type": "boolean",
                    "description": "Set to true when you need to @mention/at someone in your \
                        reply. The response will include the exact @mention format to use."
                }
            },
            "required": ["group_code", "action"]
        })
    }

    fn parallel_safe(&self) -> bool {
        true
    }

    fn untrusted_output(&self) -> bool {
        true
    }

    async fn call(&self, args: Value, _ctx: &ToolContext) -> ToolResult {
        let code = group_code(&args)?;
        let action = action(&args)?;
        let mention = args
            .get("mention")
            .and_then(Value::as_bool)
            .unwrap_or(false);
        let list = self
            .0
            .group_members(&code, MAX_MEMBERS_READ)
            .await
            .map_err(explain)?;
        if list.members.is_empty() {
            return Err(ToolError::new(format!("no members found in group {code}")));
        }
        let (found, msg, success) = match &action {
            Action::ListAll => (
                list.members.iter().collect::<Vec<_>>(),
                format!("Found {} member(s).", list.members.len()),
                true,
            ),
            Action::ListBots => {
                let bots: Vec<&GroupMember> = list
                    .members
                    .iter()
                    .filter(|m| m.role == Role::Bot)
                    .collect();
                let msg = if bots.is_empty() {
                    "No bots found in this group.".to_owned()
                } else {
                    format!("Found {} bot(s).", bots.len())
                };
                let success = !bots.is_empty();
                (bots, msg, success)
            }
            Action::Find(name) => {
                let needle = name.to_lowercase();
                let matched: Vec<&GroupMember> = list
                    .members
                    .iter()
                    .filter(|m| m.nickname.to_lowercase().contains(&needle))
                    .collect();
                if matched.is_empty() {
                    (
                        list.members.iter().collect(),
                        format!("No match for \"{name}\". All members listed below."),
                        false,
                    )
                } else {
                    let msg = format!("Found {} member(s) matching \"{name}\".", matched.len());
                    (matched, msg, true)
                }
            }
        };
        let shown: Vec<Value> = found
            .iter()
            .take(MAX_MEMBERS_SHOWN)
            .map(|m| member_json(m))
            .collect();
        let mut out = json!({"success": success, "msg": msg, "members": shown});
        if found.len() > MAX_MEMBERS_SHOWN {
            out["more"] = json!(format!(
                "{} more not shown; use find with a name to narrow",
                found.len() - MAX_MEMBERS_SHOWN
            ));
        }
        if list.truncated {
            out["note"] = json!(format!(
                "the group has more members than the {MAX_MEMBERS_READ} read; use find with a \
                 name for someone not listed"
            ));
        }
        if mention {
            out["mention_hint"] = json!(MENTION_HINT);
        }
        Ok(bounded(out.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arguments_are_read_as_the_ancestor_wrote_them() {
        assert_eq!(
            group_code(&json!({"group_code": " group:g1 "})).unwrap(),
            "g1"
        );
        assert_eq!(group_code(&json!({"group_code": 42})).unwrap(), "42");
        assert!(group_code(&json!({})).is_err());
        assert!(group_code(&json!({"group_code": ["x"]})).is_err());
        assert_eq!(
            action(&json!({"action": "find", "name": " Ann "})).unwrap(),
            Action::Find("Ann".into())
        );
        assert!(action(&json!({"action": "find"})).is_err());
        assert_eq!(action(&json!({})).unwrap(), Action::ListAll);
        assert_eq!(
            action(&json!({"action": "list_bots"})).unwrap(),
            Action::ListBots
        );
        assert!(action(&json!({"action": "kick"})).is_err());
    }

    #[test]
    fn long_output_is_cut_and_says_so() {
        let long = "x".repeat(MAX_OUTPUT_CHARS + 10);
        let cut = bounded(long);
        assert!(cut.ends_with("[output cut]"));
        assert_eq!(
            cut.chars().count(),
            MAX_OUTPUT_CHARS + "\n[output cut]".len()
        );
    }
}
