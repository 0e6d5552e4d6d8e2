//! The roles a callback plays and the stages of a job (SPEC §3, §5).

use std::fmt;

/// The roles a callback can play (SPEC §3).
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    serde::Serialize,
    serde::Deserialize,
    schemars::JsonSchema,
)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum Role {
    Compressor,
    Reader,
    Judge,
    /// Writes a dataset's goals and questions (SPEC §16, `gacc dataset build`); no run calls one.
    Writer,
}

impl Role {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Role::Compressor => "compressor",
            Role::Reader => "reader",
            Role::Judge => "judge",
            Role::Writer => "writer",
        }
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The stages of the job graph, one per role: a memory is compressed, then each of its
/// questions is read and judged.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    serde::Serialize,
    serde::Deserialize,
    schemars::JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Stage {
    Compress,
    Read,
    Judge,
}

impl Stage {
    pub(crate) const ALL: [Stage; 3] = [Stage::Compress, Stage::Read, Stage::Judge];

    /// The name the plan, the trace and the failure rows use.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Stage::Compress => "compress",
            Stage::Read => "read",
            Stage::Judge => "judge",
        }
    }

    /// The stage a plan, trace or failure row names.
    pub(crate) fn parse(name: &str) -> Option<Stage> {
        Stage::ALL.into_iter().find(|stage| stage.as_str() == name)
    }

    /// The role whose callback makes this stage's calls.
    pub(crate) fn role(self) -> Role {
        match self {
            Stage::Compress => Role::Compressor,
            Stage::Read => Role::Reader,
            Stage::Judge => Role::Judge,
        }
    }
}

impl fmt::Display for Stage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stages_and_roles_correspond() {
        let names: Vec<(&str, Role)> = Stage::ALL.iter().map(|s| (s.as_str(), s.role())).collect();
        assert_eq!(
            names,
            [
                ("compress", Role::Compressor),
                ("read", Role::Reader),
                ("judge", Role::Judge)
            ]
        );
    }
}
