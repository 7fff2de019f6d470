//! The `todo` tool: the session's task list.

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::{Tool, ToolContext, ToolError, ToolResult, opt_array, opt_bool, opt_str};

/// One task on the session's list.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TodoItem {
    /// The model's handle for the item; merges match on it.
    pub id: String,
    /// What to do, at most [`MAX_CONTENT_CHARS`] characters.
    pub content: String,
    /// `pending`, `in_progress`, `completed` or `cancelled`.
    pub status: String,
}

/// Most items on one list.
pub const MAX_ITEMS: usize = 256;
/// Most characters in one item's content.
pub const MAX_CONTENT_CHARS: usize = 4000;
/// Longest accepted id.
const MAX_ID_CHARS: usize = 200;
/// The valid statuses, in display order.
pub const STATUSES: [&str; 4] = ["pending", "in_progress", "completed", "cancelled"];

/// Heading of the task list carried across context compression (the
/// ancestor's wording, so prompts that look for it still find it).
pub const PRESERVED_HEADER: &str =
    "[Your active task list was preserved across context compression]";

/// Most characters of the preserved list: a long plan must not eat the room
/// compression just made.
const MAX_PRESERVED_CHARS: usize = 16_000;

/// The items still open (pending or in progress) as the text that goes back
/// into the context after compression, or `None` when nothing is open.
/// Completed and cancelled items are history the summary already covers.
pub fn preserved_list(items: &[TodoItem]) -> Option<String> {
    let open: Vec<&TodoItem> = items
        .iter()
        .filter(|t| t.status == "pending" || t.status == "in_progress")
        .collect();
    if open.is_empty() {
        return None;
    }
    let mut out = format!("{PRESERVED_HEADER}\n");
    for (n, t) in open.iter().enumerate() {
        let line = format!("- [{}] {}: {}\n", t.status, t.id, t.content);
        if out.len() + line.len() > MAX_PRESERVED_CHARS {
            out.push_str(&format!(
                "- … and {} more open items (call todo to read the whole list)\n",
                open.len() - n
            ));
            break;
        }
        out.push_str(&line);
    }
    out.push_str("Keep working through this list; update it with the todo tool as items finish.");
    Some(out)
}

/// One item of a call: in merge mode fields other than `id` may be absent.
struct Update {
    id: String,
    content: Option<String>,
    status: Option<String>,
}

fn parse_item(v: &Value, i: usize) -> Result<Update, ToolError> {
    let at = |e: ToolError| ToolError::new(format!("todos[{i}]: {e}"));
    if !v.is_object() {
        return Err(ToolError::new(format!(
            "todos[{i}]: must be an object with id, content, status"
        )));
    }
    // Models number their items; an integer id is as good as a string one.
    let id = match v.get("id") {
        Some(Value::String(s)) => s.trim().to_owned(),
        Some(Value::Number(n)) => n.to_string(),
        Some(Value::Null) | None => {
            return Err(ToolError::new(format!("todos[{i}]: missing `id`")));
        }
        Some(other) => {
            return Err(ToolError::new(format!(
                "todos[{i}]: `id` must be a string, got {}",
                super::json_type(other)
            )));
        }
    };
    if id.is_empty() {
        return Err(ToolError::new(format!("todos[{i}]: `id` is empty")));
    }
    if id.chars().count() > MAX_ID_CHARS {
        return Err(ToolError::new(format!(
            "todos[{i}]: `id` is longer than {MAX_ID_CHARS} characters"
        )));
    }
    let content = opt_str(v, "content")
        .map_err(at)?
        .map(|c| c.trim().to_owned());
    if let Some(c) = &content {
        let n = c.chars().count();
        if n > MAX_CONTENT_CHARS {
            return Err(ToolError::new(format!(
                "todos[{i}]: `content` has {n} characters; at most {MAX_CONTENT_CHARS}"
            )));
        }
        if c.is_empty() {
            return Err(ToolError::new(format!("todos[{i}]: `content` is empty")));
        }
    }
    let status = opt_str(v, "status")
        .map_err(at)?
        .map(|s| s.trim().to_owned());
    if let Some(s) = &status
        && !STATUSES.contains(&s.as_str())
    {
        return Err(ToolError::new(format!(
            "todos[{i}]: `status` '{s}' is not one of {}",
            STATUSES.join(", ")
        )));
    }
    Ok(Update {
        id,
        content,
        status,
    })
}

fn render(items: &[TodoItem]) -> String {
    let count = |s: &str| items.iter().filter(|t| t.status == s).count();
    json!({
        "todos": items,
        "summary": {
            "total": items.len(),
            "pending": count("pending"),
            "in_progress": count("in_progress"),
            "completed": count("completed"),
            "cancelled": count("cancelled"),
        }
    })
    .to_string()
}

/// The `todo` tool.
#[derive(Debug, Clone, Copy, Default)]
pub struct TodoTool;

#[async_trait]
impl Tool for TodoTool {
    fn name(&self) -> &str {
        "todo"
    }

    fn description(&self) -> &str {
        "Keep a task list for multi-step work. Pass todos to write the list (merge=true \
         updates items by id and appends new ones; merge=false replaces the whole list); call \
         with no arguments to read it. Keep one item in_progress at a time."
    }

    fn parameters(&self) -> Value {
        json!({
            "type": "object",
            "properties": {
                "todos": {
                    "type": "array",
                    "description": "Items to write.",
                    "items": {
                        "type": "object",
                        "properties": {
                            "id": {"type": "string"},
                            "content": {"type": "string"},
                            "status": {"type": "string", "enum": STATUSES}
                        },
                        "required": ["id"]
                    }
                },
                "merge": {"type": "boolean", "description": "Update by id instead of replacing the list. Default false."}
            }
        })
    }

    async fn call(&self, args: Value, ctx: &ToolContext) -> ToolResult {
        let merge = opt_bool(&args, "merge")?.unwrap_or(false);
        let Some(list) = opt_array(&args, "todos")? else {
            let items = ctx.session.todos.lock().unwrap_or_else(|p| p.into_inner());
            return Ok(render(&items));
        };
        if list.len() > MAX_ITEMS {
            return Err(ToolError::new(format!(
                "`todos` has {} items; a list holds at most {MAX_ITEMS}",
                list.len()
            )));
        }
        let updates: Vec<Update> = list
            .iter()
            .enumerate()
            .map(|(i, v)| parse_item(v, i))
            .collect::<Result<_, _>>()?;
        let mut items = ctx.session.todos.lock().unwrap_or_else(|p| p.into_inner());
        // Built on a copy so an invalid call leaves the list untouched.
        let mut next: Vec<TodoItem> = if merge { items.clone() } else { Vec::new() };
        for (i, u) in updates.into_iter().enumerate() {
            if let Some(existing) = next.iter_mut().find(|t| t.id == u.id) {
                if let Some(c) = u.content {
                    existing.content = c;
                }
                if let Some(s) = u.status {
                    existing.status = s;
                }
                continue;
            }
            let Some(content) = u.content else {
                return Err(ToolError::new(format!(
                    "todos[{i}]: `content` is required for a new item (id '{}')",
                    u.id
                )));
            };
            next.push(TodoItem {
                id: u.id,
                content,
                status: u.status.unwrap_or_else(|| "pending".to_owned()),
            });
        }
        if next.len() > MAX_ITEMS {
            return Err(ToolError::new(format!(
                "the list would have {} items; at most {MAX_ITEMS}. Remove completed or \
                 cancelled items (merge=false) first",
                next.len()
            )));
        }
        *items = next;
        Ok(render(&items))
    }
}
