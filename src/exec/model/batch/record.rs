//! A batch's record in `<cache>/batches/`: what was submitted (its keys, then its provider id),
//! where it stands, and how its requests were answered; written before gacc waits on it.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::inputs::models::Api;

/// A batch as recorded in `<cache>/batches/<local>.json`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Record {
    pub local: String,
    pub endpoint: String,
    pub api: Api,
    pub base_url: String,
    pub model: String,
    /// The variable holding the key (for `gacc batches cancel`); never its value.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_key_env: Option<String>,
    pub created: String,
    pub state: BatchState,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub batch_id: Option<String>,
    /// Sent as the batch's metadata (OpenAI), to find a batch whose id a kill lost.
    pub submission: String,
    pub keys: Vec<String>,
    /// Once ended: how its requests were answered.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub outcome: BTreeMap<String, usize>,
}

/// Where a recorded batch stands, as its record names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum BatchState {
    /// Recorded before it was sent: perhaps accepted, its id perhaps lost with a kill.
    Submitting,
    /// Accepted and running.
    Open,
    /// Ended, its answers read.
    Ended,
    /// The provider would not take it.
    Refused,
}

impl BatchState {
    /// Whether it may still answer calls: accepted and running, or recorded and perhaps
    /// accepted (a later run re-attaches to both).
    pub(crate) fn in_flight(self) -> bool {
        matches!(self, BatchState::Open | BatchState::Submitting)
    }

    /// Its name in a record and on the terminal.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            BatchState::Submitting => "submitting",
            BatchState::Open => "open",
            BatchState::Ended => "ended",
            BatchState::Refused => "refused",
        }
    }
}

impl std::fmt::Display for BatchState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.pad(self.as_str())
    }
}

impl Record {
    /// Whether it may still answer calls (see `BatchState::in_flight`).
    pub(crate) fn in_flight(&self) -> bool {
        self.state.in_flight()
    }

    /// Whether `gacc batches cancel` can cancel it: running, with the provider's id known.
    pub(crate) fn cancellable(&self) -> bool {
        self.state == BatchState::Open && self.batch_id.is_some()
    }

    fn path(folder: &Path, local: &str) -> PathBuf {
        folder.join(format!("{local}.json"))
    }

    pub(super) fn save(&self, folder: &Path) -> std::io::Result<()> {
        let mut record = serde_json::to_value(self).unwrap_or_default();
        crate::secrets::redact_json(&mut record);
        let text = serde_json::to_vec_pretty(&record).unwrap_or_default();
        crate::files::write_durably(&Record::path(folder, &self.local), &text)
    }
}

/// Every batch recorded in a cache's batch folder, oldest first.
pub(crate) fn records(folder: &Path) -> Vec<Record> {
    let mut records: Vec<Record> = std::fs::read_dir(folder)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.path().extension().is_some_and(|x| x == "json"))
        .filter_map(|e| serde_json::from_slice(&std::fs::read(e.path()).ok()?).ok())
        .collect();
    records.sort_by(|a, b| a.local.cmp(&b.local));
    records
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn a_batch_state_is_written_as_records_always_named_it_and_says_what_it_allows() {
        // (state, its name in a record, in flight, cancellable once its id is known)
        let table = [
            (BatchState::Submitting, "submitting", true, false),
            (BatchState::Open, "open", true, true),
            (BatchState::Ended, "ended", false, false),
            (BatchState::Refused, "refused", false, false),
        ];
        for (state, name, in_flight, cancellable) in table {
            assert_eq!(serde_json::to_value(state).unwrap(), json!(name));
            assert_eq!(serde_json::from_value::<BatchState>(json!(name)).unwrap(), state);
            assert_eq!(format!("{state:<12}|"), format!("{name:<12}|"));
            let record = |batch_id: Option<&str>| Record {
                local: "l".into(),
                endpoint: "e".into(),
                api: crate::providers::Api::named("openai-chat").unwrap(),
                base_url: "http://127.0.0.1:1".into(),
                model: "m".into(),
                api_key_env: None,
                created: "2026-12-03T00:00:00Z".into(),
                state,
                batch_id: batch_id.map(str::to_owned),
                submission: "s".into(),
                keys: Vec::new(),
                outcome: BTreeMap::new(),
            };
            assert_eq!(record(None).in_flight(), in_flight, "{name}");
            assert_eq!(record(Some("b")).cancellable(), cancellable, "{name}");
            assert!(!record(None).cancellable(), "{name}: no id, nothing to cancel");
        }
        assert!(serde_json::from_value::<BatchState>(json!("running")).is_err());
    }
}
