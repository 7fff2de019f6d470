//! `code_execution:`: the `execute_code` tool, which runs a Python script
//! that calls Talaria's tools through a small generated module.

use serde::{Deserialize, Serialize};

/// `code_execution:`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct CodeExecutionConfig {
    /// Seconds a script may run before it is killed with everything it
    /// started.
    pub timeout_secs: u64,
    /// Tool calls one script may make; later calls get an error.
    pub max_tool_calls: u32,
    /// The Python 3 interpreter, as the conversation's terminal backend
    /// finds it: a name looked up on its `PATH` or an absolute path.
    pub python: String,
    /// Output (stdout and stderr) kept from one script, head and tail.
    pub max_output_chars: usize,
}

impl Default for CodeExecutionConfig {
    fn default() -> CodeExecutionConfig {
        CodeExecutionConfig {
            timeout_secs: 300,
            max_tool_calls: 50,
            python: "python3".to_owned(),
            max_output_chars: 50_000,
        }
    }
}

impl CodeExecutionConfig {
    /// The first setting that cannot work, as (key, what is expected).
    pub fn problem(&self) -> Option<(&'static str, &'static str)> {
        if self.timeout_secs == 0 {
            return Some((
                "code_execution.timeout_secs",
                "expected whole seconds, at least 1",
            ));
        }
        if self.python.trim().is_empty() {
            return Some((
                "code_execution.python",
                "expected a Python 3 interpreter: a program name such as python3, or its path",
            ));
        }
        if self.max_output_chars < 100 {
            return Some((
                "code_execution.max_output_chars",
                "expected an integer of at least 100",
            ));
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_section_is_read_and_checked() {
        let origin = std::path::Path::new("config.yaml");
        let (config, warnings) = crate::Config::parse(
            "code_execution:\n  python: /opt/py/bin/python3\n  max_tool_calls: 7\n",
            origin,
        )
        .unwrap();
        assert!(warnings.is_empty(), "{warnings:?}");
        assert_eq!(config.code_execution.python, "/opt/py/bin/python3");
        assert_eq!(config.code_execution.max_tool_calls, 7);
        assert_eq!(config.code_execution.timeout_secs, 300);
        let err = crate::Config::parse("code_execution:\n  timeout_secs: 0\n", origin)
            .unwrap_err()
            .to_string();
        assert!(err.contains("code_execution.timeout_secs"), "{err}");
    }

    #[test]
    fn the_defaults_work_and_a_blank_interpreter_does_not() {
        assert_eq!(CodeExecutionConfig::default().problem(), None);
        let blank = CodeExecutionConfig {
            python: "  ".into(),
            ..CodeExecutionConfig::default()
        };
        assert_eq!(blank.problem().map(|p| p.0), Some("code_execution.python"));
        let zero = CodeExecutionConfig {
            timeout_secs: 0,
            ..CodeExecutionConfig::default()
        };
        assert_eq!(
            zero.problem().map(|p| p.0),
            Some("code_execution.timeout_secs")
        );
    }
}
