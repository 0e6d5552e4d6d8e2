//! A callback's program (SPEC §3): what the launchers that start processes need, here or on a
//! cluster node, as data. Values of passed-through variables are never part of it: a process
//! reads them from gacc's environment when it starts, so a program can be written to a file
//! (a cluster array's `array.json`) without a secret.

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::exec::sandbox::Policy;
use crate::protocol::Mode;

/// A program and how it runs.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Program {
    /// The command line (argv, never a shell).
    pub argv: Vec<String>,
    pub cwd: PathBuf,
    /// The variables passed through, by name.
    pub env: Vec<String>,
    /// Those of `env` whose values are secrets (`crate::secrets::is_secret`), taken out of
    /// whatever gacc keeps; the other variables are data, kept as they are.
    #[serde(default)]
    pub secrets: Vec<String>,
    #[serde(rename = "timeout_ms", with = "millis")]
    pub timeout: Duration,
    pub mode: Mode,
    /// The sandbox each of its processes starts in; None runs it unrestricted.
    #[serde(with = "policy")]
    pub sandbox: Option<Policy>,
    /// A persistent worker's requests in flight at once (1: the protocol's request, reply,
    /// request; more: each request carries an `id` its reply echoes, in any order).
    #[serde(default = "one")]
    pub max_inflight: usize,
}

fn one() -> usize {
    1
}

impl Program {
    /// The passed-through variables with their values in this environment (those set).
    pub(crate) fn passed(&self) -> Vec<(String, String)> {
        self.env
            .iter()
            .filter_map(|name| std::env::var(name).ok().map(|value| (name.clone(), value)))
            .collect()
    }

    /// The passed-through secrets with their values in this environment (those set).
    pub(crate) fn passed_secrets(&self) -> Vec<(String, String)> {
        let mut passed = self.passed();
        passed.retain(|(name, _)| self.secrets.contains(name));
        passed
    }

    /// Its program's path or name, for messages.
    pub(crate) fn program(&self) -> &str {
        self.argv.first().map_or("", String::as_str)
    }
}

mod millis {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    pub(super) fn serialize<S: Serializer>(duration: &Duration, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_u64(duration.as_millis() as u64)
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Duration, D::Error> {
        Ok(Duration::from_millis(u64::deserialize(deserializer)?))
    }
}

/// A sandbox policy as `Policy::describe` writes it, rebuilt for the machine that reads it.
mod policy {
    use serde::{Deserialize, Deserializer, Serialize, Serializer};
    use serde_json::Value;

    use crate::exec::sandbox::Policy;

    pub(super) fn serialize<S: Serializer>(
        policy: &Option<Policy>,
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        policy.as_ref().map(Policy::describe).serialize(serializer)
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<Option<Policy>, D::Error> {
        match Option::<Value>::deserialize(deserializer)? {
            None | Some(Value::Null) => Ok(None),
            Some(description) => Policy::rebuild(&description)
                .map(Some)
                .map_err(serde::de::Error::custom),
        }
    }
}
