//! `gacc cache stats`: what a cache holds, read without keeping it open.

use std::fs::File;
use std::path::Path;

use serde::Serialize;

use super::{Cache, Index, Kind, SEGMENTS, Sinks, scan};

/// What `gacc cache stats` reports.
#[derive(Debug, Clone, Default, Serialize)]
pub(crate) struct Stats {
    pub segments: usize,
    pub bytes: u64,
    pub entries: std::collections::BTreeMap<String, usize>,
    /// Lines that failed to parse (torn by a crash); they are ignored.
    pub torn_lines: usize,
    /// Small entries whose payload is not the one their checksum states; ignored (a miss).
    pub damaged: usize,
    /// Entries of a kind this gacc does not know (a later gacc's): left alone, for it.
    #[serde(skip_serializing_if = "is_zero")]
    pub unknown_kind: usize,
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

impl Cache {
    /// Entries per kind, segments and bytes of the cache at `root`.
    pub(crate) fn stats(root: &Path) -> std::io::Result<Stats> {
        let mut stats = Stats::default();
        let folder = root.join(SEGMENTS);
        let Ok(entries) = std::fs::read_dir(&folder) else {
            return Ok(stats);
        };
        let mut index = Index::default();
        for entry in entries.filter_map(Result::ok) {
            let path = entry.path();
            if path.extension().is_some_and(|e| e == "log") {
                stats.segments += 1;
                stats.bytes += entry.metadata()?.len();
                let segment = stats.segments;
                let sinks = Sinks {
                    index: &mut index,
                    stats: &mut stats,
                    resident: None,
                    records: None,
                };
                scan(&File::open(&path)?, segment, 0, sinks)?;
            }
        }
        for (kind, _) in index.keys() {
            let name = Kind::ALL
                .get(*kind as usize)
                .map_or("unknown", |kind| kind.as_str());
            *stats.entries.entry(name.to_owned()).or_default() += 1;
        }
        Ok(stats)
    }
}
