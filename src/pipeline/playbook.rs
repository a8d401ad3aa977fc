//! Playbooks: the declarative list of stages an operation runs, in YAML.
//!
//! ```yaml
//! operation: backup
//! description: Back up one hosted cluster.
//! stages:
//!   - name: pause
//!   - name: scale-down
//!     with:
//!       timeout: 5m
//! ```
//!
//! A playbook is parsed first (syntax, unknown keys) and then checked against
//! the stages an operation knows; every error names the source and the line.

use serde::Deserialize;
use serde_json::Value;
use serde_saphyr::Spanned;

/// Why a playbook was refused.
#[derive(Debug, thiserror::Error)]
pub enum PlaybookError {
    /// Not valid YAML, or not of the playbook's shape (unknown or missing keys).
    #[error("playbook {origin}: {message}")]
    Syntax { origin: String, message: String },
    /// A stage name the operation does not know.
    #[error("playbook {origin}, line {line}: unknown stage `{stage}` for {operation}; known stages: {known}")]
    UnknownStage {
        origin: String,
        line: u32,
        stage: String,
        operation: String,
        known: String,
    },
    /// The same stage listed twice.
    #[error("playbook {origin}, line {line}: stage `{stage}` is listed twice (first at line {first_line})")]
    DuplicateStage {
        origin: String,
        line: u32,
        first_line: u32,
        stage: String,
    },
    /// The playbook is for another operation.
    #[error("playbook {origin}, line {line}: it is a `{found}` playbook, but this command runs `{expected}`")]
    WrongOperation {
        origin: String,
        line: u32,
        found: String,
        expected: String,
    },
    /// A playbook with no stage.
    #[error("playbook {origin}: it lists no stages")]
    Empty { origin: String },
    /// A stage's `with:` parameters do not fit the stage.
    #[error("playbook {origin}, line {line}: stage `{stage}`: with: {message}")]
    Params {
        origin: String,
        line: u32,
        stage: String,
        message: String,
    },
    /// A stage that must come before another is missing or after it.
    #[error("playbook {origin}, line {line}: stage `{stage}` needs `{needs}` before it")]
    Order {
        origin: String,
        line: u32,
        stage: String,
        needs: String,
    },
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPlaybook {
    operation: Spanned<String>,
    #[serde(default)]
    description: String,
    stages: Vec<RawStage>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawStage {
    name: Spanned<String>,
    #[serde(default, rename = "with")]
    params: Option<Spanned<Value>>,
}

/// One entry of a playbook.
#[derive(Debug, Clone, PartialEq)]
pub struct StageRef {
    pub name: String,
    /// Line of the stage's name in the source, for error messages.
    pub line: u32,
    /// The stage's `with:` parameters (an object, or Null).
    pub params: Value,
    /// Line of the parameters (of the name when there are none).
    pub params_line: u32,
}

/// A parsed playbook.
#[derive(Debug, Clone, PartialEq)]
pub struct Playbook {
    /// Where it came from: a file path or `builtin:<name>`.
    pub origin: String,
    pub operation: String,
    operation_line: u32,
    pub description: String,
    pub stages: Vec<StageRef>,
}

/// What an operation accepts: its stage names and which must precede which.
#[derive(Debug, Clone)]
pub struct StageRules {
    pub operation: &'static str,
    pub known: Vec<&'static str>,
    /// `(stage, needs)`: when `stage` is listed, `needs` must be listed before it.
    pub requires_before: Vec<(&'static str, &'static str)>,
}

impl Playbook {
    /// Parse a playbook's text. `origin` names the source in errors.
    pub fn parse(text: &str, origin: &str) -> Result<Playbook, PlaybookError> {
        let raw: RawPlaybook =
            serde_saphyr::from_str(text).map_err(|err| PlaybookError::Syntax {
                origin: origin.to_string(),
                message: err.to_string(),
            })?;
        if raw.stages.is_empty() {
            return Err(PlaybookError::Empty {
                origin: origin.to_string(),
            });
        }
        Ok(Playbook {
            origin: origin.to_string(),
            operation: raw.operation.value,
            operation_line: raw.operation.referenced.line() as u32,
            description: raw.description,
            stages: raw
                .stages
                .into_iter()
                .map(|stage| StageRef {
                    line: stage.name.referenced.line() as u32,
                    params_line: stage.params.as_ref().map_or(stage.name.referenced.line() as u32, |p| p.referenced.line() as u32),
                    name: stage.name.value,
                    params: stage.params.map_or(Value::Null, |p| p.value),
                })
                .collect(),
        })
    }

    /// Check the playbook against what `rules.operation` can run.
    pub fn check(&self, rules: &StageRules) -> Result<(), PlaybookError> {
        if self.operation != rules.operation {
            return Err(PlaybookError::WrongOperation {
                origin: self.origin.clone(),
                line: self.operation_line,
                found: self.operation.clone(),
                expected: rules.operation.to_string(),
            });
        }
        for (index, stage) in self.stages.iter().enumerate() {
            if !rules.known.contains(&stage.name.as_str()) {
                return Err(PlaybookError::UnknownStage {
                    origin: self.origin.clone(),
                    line: stage.line,
                    stage: stage.name.clone(),
                    operation: rules.operation.to_string(),
                    known: rules.known.join(", "),
                });
            }
            if let Some(first) = self.stages[..index].iter().find(|s| s.name == stage.name) {
                return Err(PlaybookError::DuplicateStage {
                    origin: self.origin.clone(),
                    line: stage.line,
                    first_line: first.line,
                    stage: stage.name.clone(),
                });
            }
            for (_, needs) in rules
                .requires_before
                .iter()
                .filter(|(name, _)| *name == stage.name)
            {
                if !self.stages[..index].iter().any(|s| s.name == *needs) {
                    return Err(PlaybookError::Order {
                        origin: self.origin.clone(),
                        line: stage.line,
                        stage: stage.name.clone(),
                        needs: needs.to_string(),
                    });
                }
            }
        }
        Ok(())
    }

    /// Check each stage's `with:` against the parameters `params_of` says
    /// it takes (`None`: a stage the operation does not know, which
    /// [`Playbook::check`] refuses).
    pub fn check_params(&self, params_of: impl Fn(&str) -> Option<super::stage::Params>) -> Result<(), PlaybookError> {
        for stage in &self.stages {
            if let Some(params) = params_of(&stage.name) {
                params.check(&stage.params).map_err(|message| PlaybookError::Params {
                    origin: self.origin.clone(),
                    line: stage.params_line,
                    stage: stage.name.clone(),
                    message,
                })?;
            }
        }
        Ok(())
    }

    pub fn stage_names(&self) -> Vec<String> {
        self.stages.iter().map(|s| s.name.clone()).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn rules() -> StageRules {
        StageRules {
            operation: "backup",
            known: vec!["lock", "pause", "scale-down", "snapshot", "resume"],
            requires_before: vec![("scale-down", "pause"), ("resume", "scale-down")],
        }
    }

    #[test]
    fn parses_stages_with_lines_and_params() {
        let text = "operation: backup\ndescription: test\nstages:\n  - name: lock\n  - name: pause\n    with:\n      ttl: 30m\n";
        let playbook = Playbook::parse(text, "t.yaml").unwrap();
        playbook.check(&rules()).unwrap();
        assert_eq!(playbook.stage_names(), vec!["lock", "pause"]);
        assert_eq!(playbook.stages[0].line, 4);
        assert_eq!(playbook.stages[1].line, 5);
        assert_eq!(playbook.stages[1].params, json!({"ttl": "30m"}));
        assert_eq!(playbook.stages[0].params, Value::Null);
    }

    #[test]
    fn unknown_stage_names_the_line() {
        let text = "operation: backup\nstages:\n  - name: lock\n  - name: snapshop\n";
        let err = Playbook::parse(text, "my.yaml").unwrap().check(&rules()).unwrap_err();
        let message = err.to_string();
        assert!(matches!(err, PlaybookError::UnknownStage { line: 4, .. }), "{message}");
        assert!(message.contains("my.yaml, line 4: unknown stage `snapshop`"), "{message}");
        assert!(message.contains("known stages: lock, pause"), "{message}");
    }

    #[test]
    fn duplicates_order_and_operation_are_checked() {
        let dup = "operation: backup\nstages:\n  - name: pause\n  - name: pause\n";
        assert!(matches!(
            Playbook::parse(dup, "d").unwrap().check(&rules()),
            Err(PlaybookError::DuplicateStage { line: 4, first_line: 3, .. })
        ));
        let order = "operation: backup\nstages:\n  - name: scale-down\n  - name: pause\n";
        let err = Playbook::parse(order, "o").unwrap().check(&rules()).unwrap_err();
        assert!(err.to_string().contains("`scale-down` needs `pause` before it"), "{err}");
        let other = "operation: restore\nstages:\n  - name: lock\n";
        assert!(matches!(
            Playbook::parse(other, "r").unwrap().check(&rules()),
            Err(PlaybookError::WrongOperation { line: 1, .. })
        ));
    }

    #[test]
    fn malformed_playbooks_are_refused() {
        for (text, what) in [
            ("operation: backup\nstages: []\n", "lists no stages"),
            ("operation: backup\nstages:\n  - nmae: lock\n", "nmae"),
            ("operation: backup\nstages:\n  - name: lock\nextra: 1\n", "extra"),
            ("stages:\n  - name: lock\n", "operation"),
            ("operation: [backup\n", "playbook bad"),
        ] {
            let err = Playbook::parse(text, "bad").unwrap_err();
            assert!(err.to_string().contains(what), "{text:?}: {err}");
        }
    }
}
