//! A model endpoint's `batch` setting (SPEC §9): off, on, or the table of its limits.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::protocol::Timeout;

/// `batch = false | true | { poll, gather, max_requests, max_bytes, window, online_retry }`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(untagged)]
pub(crate) enum Batch {
    On(bool),
    Table(BatchSpec),
}

impl Default for Batch {
    fn default() -> Self {
        Batch::On(false)
    }
}

impl Batch {
    pub(super) fn is_off(&self) -> bool {
        *self == Batch::On(false)
    }

    /// The batch settings, when batches are on.
    pub(crate) fn spec(&self) -> Option<BatchSpec> {
        match self {
            Batch::On(false) => None,
            Batch::On(true) => Some(BatchSpec::default()),
            Batch::Table(spec) => Some(spec.clone()),
        }
    }
}

/// A batch endpoint's limits (SPEC §9); the defaults fit both providers' caps.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct BatchSpec {
    /// How often a batch's state is asked.
    #[serde(default = "default_poll")]
    pub poll: Timeout,
    /// How long calls that become ready are gathered before they are submitted together.
    #[serde(default = "default_gather")]
    pub gather: Timeout,
    /// The most requests in one batch (OpenAI takes 50,000; Anthropic 100,000).
    #[serde(default = "default_max_requests")]
    pub max_requests: usize,
    /// The most bytes of one batch's requests, e.g. `"200MB"` (OpenAI's file limit; Anthropic's
    /// is 256 MB).
    #[serde(default = "default_max_bytes")]
    pub max_bytes: Bytes,
    /// The completion window asked for (OpenAI; Anthropic's is always 24 hours).
    #[serde(default = "default_window")]
    pub window: String,
    /// Retry a request the batch answered with a retryable error online, not in the next batch.
    #[serde(default)]
    pub online_retry: bool,
}

impl Default for BatchSpec {
    fn default() -> Self {
        BatchSpec {
            poll: default_poll(),
            gather: default_gather(),
            max_requests: default_max_requests(),
            max_bytes: default_max_bytes(),
            window: default_window(),
            online_retry: false,
        }
    }
}

fn default_poll() -> Timeout {
    Timeout(std::time::Duration::from_secs(30))
}

fn default_gather() -> Timeout {
    Timeout(std::time::Duration::from_secs(10))
}

fn default_max_requests() -> usize {
    50_000
}

fn default_max_bytes() -> Bytes {
    Bytes(200_000_000)
}

fn default_window() -> String {
    "24h".into()
}

/// A size: a number of bytes, or text such as `"200MB"`, `"64KiB"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, JsonSchema)]
pub(crate) struct Bytes(pub u64);

impl Serialize for Bytes {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_u64(self.0)
    }
}

impl<'de> Deserialize<'de> for Bytes {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Written {
            Number(u64),
            Text(String),
        }
        match Written::deserialize(deserializer)? {
            Written::Number(n) => Ok(Bytes(n)),
            Written::Text(text) => parse_bytes(&text).map(Bytes).map_err(serde::de::Error::custom),
        }
    }
}

fn parse_bytes(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let split = text.find(|c: char| !c.is_ascii_digit()).unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let number: u64 = number
        .parse()
        .map_err(|_| format!("`{text}` is not a size: expected e.g. `200MB`"))?;
    let factor: u64 = match unit.trim().to_ascii_uppercase().as_str() {
        "" | "B" => 1,
        "KB" => 1_000,
        "MB" => 1_000_000,
        "GB" => 1_000_000_000,
        "KIB" => 1 << 10,
        "MIB" => 1 << 20,
        "GIB" => 1 << 30,
        _ => return Err(format!("`{text}` is not a size: expected e.g. `200MB`")),
    };
    Ok(number.saturating_mul(factor))
}
