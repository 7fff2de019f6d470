//! The argument schemas of the tools whose work outlives a turn are the
//! ancestor's (`fixtures/ancestor_tool_schemas.json`, from its
//! documentation and tool definitions): the same names, types, enums,
//! bounds and required arguments, so prompts and skills written for it
//! call them unchanged. Descriptions are ours and not compared.

use serde_json::{Value, json};
use talaria_agent::background::ReportsSlot;
use talaria_agent::processes::ProcessRegistry;
use talaria_agent::tools::Tool;
use talaria_agent::tools::delegate::{DelegateBinding, DelegateTool};
use talaria_agent::tools::execute_code::ExecuteCodeTool;
use talaria_agent::tools::process::ProcessTool;
use talaria_agent::tools::terminal::TerminalTool;

/// A schema without its descriptions, with `required` in a stable order.
fn shape(schema: &Value) -> Value {
    match schema {
        Value::Object(map) => {
            let mut out = serde_json::Map::new();
            for (key, value) in map {
                match key.as_str() {
                    "description" => {}
                    "required" => {
                        let mut names: Vec<String> = value
                            .as_array()
                            .map(|r| {
                                r.iter()
                                    .filter_map(|v| v.as_str().map(str::to_owned))
                                    .collect()
                            })
                            .unwrap_or_default();
                        names.sort();
                        out.insert(key.clone(), json!(names));
                    }
                    _ => {
                        out.insert(key.clone(), shape(value));
                    }
                }
            }
            Value::Object(out)
        }
        Value::Array(items) => Value::Array(items.iter().map(shape).collect()),
        other => other.clone(),
    }
}

#[test]
fn the_schemas_are_the_ancestors() {
    let fixture: Value =
        serde_json::from_str(include_str!("fixtures/ancestor_tool_schemas.json")).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let home = talaria_core::Home::at(dir.path().join("home"));
    let processes = ProcessRegistry::new(&home, ReportsSlot::new());
    let tools: Vec<Box<dyn Tool>> = vec![
        Box::new(TerminalTool::with_processes(processes.clone())),
        Box::new(ProcessTool::new(processes)),
        Box::new(DelegateTool::new(
            DelegateBinding::new(),
            ReportsSlot::new(),
        )),
        Box::new(ExecuteCodeTool::new()),
    ];
    let compared: Vec<&str> = tools.iter().map(|t| t.name()).collect();
    assert_eq!(
        compared,
        ["terminal", "process", "delegate_task", "execute_code"]
    );
    for tool in &tools {
        let theirs = &fixture[tool.name()];
        assert!(
            theirs.is_object(),
            "{} is missing from the fixture",
            tool.name()
        );
        assert_eq!(shape(&tool.parameters()), shape(theirs), "{}", tool.name());
    }
}
