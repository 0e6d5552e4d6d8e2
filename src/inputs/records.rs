//! The dataset's records (SPEC §2): a source, its goals, and each goal's questions.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::hash::sha256;

/// One source as written: inline text or a path to it.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct SourceRecord {
    pub id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<PathBuf>,
    #[serde(default)]
    pub goals: Vec<Goal>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct Goal {
    pub id: String,
    pub text: String,
    #[serde(default)]
    pub questions: Vec<Question>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct Question {
    pub id: String,
    pub question: String,
    pub reference: String,
}

/// A source with its text loaded.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct Source {
    pub id: String,
    pub text: String,
    pub goals: Vec<Goal>,
}

impl Source {
    pub(crate) fn sha256(&self) -> String {
        sha256(&self.text)
    }
}
