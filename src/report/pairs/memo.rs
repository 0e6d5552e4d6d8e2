//! Pair tests kept once made. A test's interval, p and MDE are a function of what the two cells
//! scored per goal and seed and of the method (draws, seed, gacc's version): its cache entry
//! (kind `pair`) is keyed by exactly that, so a report whose cells scored as before (a cached
//! re-run, a run that adds a compressor) reads its pairs' tests back, to the last bit, rather
//! than make 10,000 resamples and sign flips for each again (SPEC §13; docs/cache.md).

use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use super::summed::Support;
use super::{Compared, EXACT_UP_TO, Metric, PAIR_DRAWS, PAIR_SEED, Scores, compare_all};
use crate::report::stats::Interval;
use crate::store::cache::{Cache, Kind};

/// Everything besides the scores that a test's figures depend on.
fn method() -> String {
    format!(
        "gacc/1 pair test\ngacc {}\ndraws {PAIR_DRAWS} seed {PAIR_SEED:#x} exact up to {EXACT_UP_TO}\n",
        env!("CARGO_PKG_VERSION")
    )
}

/// The key of `metric`'s test of B against A: the method, then each side's goals in order, each
/// with its name and, per seed, the questions it got right and scored (every count framed by
/// its length, so no two inputs spell the same bytes).
pub(super) fn key(metric: Metric, a: &Scores, b: &Scores) -> String {
    let mut hasher = Sha256::new_with_prefix(method());
    hasher.update([metric as u8]);
    for side in [a, b] {
        hasher.update((side.len() as u64).to_le_bytes());
        for (goal, seeds) in side {
            hasher.update((goal.len() as u64).to_le_bytes());
            hasher.update(goal.as_bytes());
            hasher.update((seeds.len() as u64).to_le_bytes());
            for (seed, &(right, scored)) in seeds {
                hasher.update(seed.to_le_bytes());
                hasher.update((right as u64).to_le_bytes());
                hasher.update((scored as u64).to_le_bytes());
            }
        }
    }
    crate::hash::hex(&hasher.finalize())
}

/// Where a report's pair tests are kept: a run's cache, or nowhere (a replay, `gacc verify`,
/// makes every test again).
#[derive(Clone, Copy, Default)]
pub(crate) struct Memo<'c> {
    cache: Option<&'c Cache>,
}

impl<'c> Memo<'c> {
    pub(crate) fn of(cache: Option<&'c Cache>) -> Memo<'c> {
        Memo { cache }
    }

    /// Whether tests are kept at all (else none is looked for).
    pub(super) fn is_kept(&self) -> bool {
        self.cache.is_some()
    }

    /// The test kept under `key`, if one is and reads back whole and possible (a p in [0, 1],
    /// an interval in order, a difference and an error no test gives are not read: that test
    /// is made again).
    pub(super) fn get(&self, key: &str) -> Option<Compared> {
        let entry = self.cache?.get(Kind::Pair, key)?;
        let number = |name: &str| entry.get(name)?.as_f64();
        let compared = Compared {
            diff: number("diff")?,
            ci95: Interval {
                low: number("low")?,
                high: number("high")?,
            },
            p: number("p")?,
            se: number("se")?,
            mde: number("mde")?,
            goals: usize::try_from(entry.get("goals")?.as_u64()?).ok()?,
        };
        let within = |x: f64, low: f64, high: f64| (low..=high).contains(&x);
        let possible = within(compared.p, 0.0, 1.0)
            && compared.ci95.low <= compared.ci95.high
            && [compared.diff, compared.ci95.low, compared.ci95.high]
                .into_iter()
                .all(|d| within(d, -1.0, 1.0))
            && compared.se >= 0.0
            && compared.mde >= 0.0
            && compared.goals > 0;
        possible.then_some(compared)
    }

    /// Keeps `compared` under `key`. A figure that is not finite (JSON has no such number) is
    /// not kept: that test is made again. A write that fails costs only that.
    pub(super) fn put(&self, key: &str, metric: Metric, compared: &Compared) {
        let Some(cache) = self.cache else { return };
        let figures = [
            compared.diff,
            compared.ci95.low,
            compared.ci95.high,
            compared.p,
            compared.se,
            compared.mde,
        ];
        if !figures.iter().all(|f| f.is_finite()) {
            return;
        }
        let response: Value = json!({
            "diff": compared.diff,
            "low": compared.ci95.low,
            "high": compared.ci95.high,
            "p": compared.p,
            "se": compared.se,
            "mde": compared.mde,
            "goals": compared.goals,
        });
        let description = json!({"job": "pair", "metric": metric});
        if let Err(error) = cache.put(Kind::Pair, key, &description, &response) {
            tracing::debug!(%error, "could not keep a pair test in the cache");
        }
    }
}

/// Each test of `asked` (a metric and two cells of `scored`): read from `memo` where it is kept,
/// else made (`compare_all`) and kept.
pub(super) fn kept_or_made(
    memo: Memo,
    cells: &[(Metric, (usize, usize))],
    scored: &[Scores],
    alike: &[(Vec<usize>, Support)],
) -> Vec<Option<Compared>> {
    let keys: Vec<String> = match memo.is_kept() {
        true => {
            crate::parallel::map_in_parallel(cells, |&(metric, (i, j))| key(metric, &scored[i], &scored[j]))
        }
        false => Vec::new(),
    };
    let kept: Vec<Option<Compared>> = (0..cells.len())
        .map(|k| keys.get(k).and_then(|key| memo.get(key)))
        .collect();
    let compared = compare_all(cells, scored, alike, &kept);
    // Pairs that scored alike (the same key) are one test: kept once.
    let mut put = std::collections::HashSet::new();
    for (k, compared) in compared.iter().enumerate() {
        if let (None, Some(compared), Some(key)) = (&kept[k], compared, keys.get(k))
            && put.insert(key)
        {
            memo.put(key, cells[k].0, compared);
        }
    }
    compared
}

#[cfg(test)]
mod tests {
    use super::super::{PAIR_DRAWS, goal_diffs, pairs};
    use super::*;
    use crate::protocol::CellId;
    use crate::store::ledger::ResultRow;
    use std::collections::HashMap;

    fn scores(cells: &[(&'static str, u64, usize, usize)]) -> Scores<'static> {
        let mut scores = Scores::new();
        for &(goal, seed, right, scored) in cells {
            scores.entry(goal).or_default().insert(seed, (right, scored));
        }
        scores
    }

    #[test]
    fn a_key_changes_with_every_count_name_seed_side_and_metric() {
        let a = scores(&[("g1", 1, 1, 2), ("g2", 1, 0, 1)]);
        let b = scores(&[("g1", 1, 2, 2), ("g2", 1, 1, 1)]);
        let base = key(Metric::Micro, &a, &b);
        assert_eq!(
            base,
            key(Metric::Micro, &a.clone(), &b.clone()),
            "the same scores, the same key"
        );
        let changed = [
            key(Metric::Macro, &a, &b),
            key(Metric::Micro, &b, &a),
            key(Metric::Micro, &scores(&[("g1", 1, 0, 2), ("g2", 1, 0, 1)]), &b),
            key(Metric::Micro, &scores(&[("g1", 1, 1, 3), ("g2", 1, 0, 1)]), &b),
            key(Metric::Micro, &scores(&[("g1", 2, 1, 2), ("g2", 1, 0, 1)]), &b),
            key(Metric::Micro, &scores(&[("g0", 1, 1, 2), ("g2", 1, 0, 1)]), &b),
            key(Metric::Micro, &scores(&[("g1", 1, 1, 2)]), &b),
            // The same numbers framed otherwise: one goal moved from A to B.
            key(
                Metric::Micro,
                &scores(&[("g1", 1, 1, 2)]),
                &scores(&[("g2", 1, 0, 1), ("g1", 1, 2, 2), ("g2", 1, 1, 1)]),
            ),
        ];
        for (k, other) in changed.iter().enumerate() {
            assert_ne!(&base, other, "change {k} keeps the key");
        }
    }

    #[test]
    fn a_kept_test_reads_back_to_the_last_bit() {
        let folder = tempfile::tempdir().unwrap();
        let cache = Cache::open(folder.path()).unwrap();
        let memo = Memo::of(Some(&cache));
        let compared = Compared {
            diff: 0.1 + 0.2,
            ci95: Interval {
                low: -1e-300,
                high: 0.5f64.sqrt(),
            },
            p: 1.0 / (1.0 + PAIR_DRAWS as f64),
            se: std::f64::consts::PI / 7.0,
            mde: 5e-324,
            goals: 500,
        };
        let key = crate::hash::sha256("a test");
        assert_eq!(memo.get(&key), None);
        memo.put(&key, Metric::Micro, &compared);
        assert_eq!(memo.get(&key), Some(compared));
        // Across processes too: the entry is read from its segment.
        drop(cache);
        let cache = Cache::open(folder.path()).unwrap();
        let got = Memo::of(Some(&cache)).get(&key).unwrap();
        assert_eq!(got.diff.to_bits(), compared.diff.to_bits());
        assert_eq!(got.ci95.low.to_bits(), compared.ci95.low.to_bits());
        assert_eq!(got.mde.to_bits(), compared.mde.to_bits());
        assert_eq!(Memo::of(None).get(&key), None, "no cache, nothing kept");
        // Not finite: not kept.
        let odd = crate::hash::sha256("odd");
        Memo::of(Some(&cache)).put(
            &odd,
            Metric::Micro,
            &Compared {
                p: f64::NAN,
                ..compared
            },
        );
        assert_eq!(Memo::of(Some(&cache)).get(&odd), None);
        // An entry no test could give (a hostile cache's) is not read.
        let impossible = [
            json!({"p": 1.5}),
            json!({"p": -0.1}),
            json!({"diff": 2.0}),
            json!({"low": 0.5, "high": 0.1}),
            json!({"se": -1.0}),
            json!({"mde": -1.0}),
            json!({"goals": 0}),
            json!({"goals": -3}),
            json!({"p": "0.5"}),
        ];
        let whole =
            json!({"diff": 0.1, "low": 0.0, "high": 0.2, "p": 0.5, "se": 0.05, "mde": 0.14, "goals": 7});
        let planted = crate::hash::sha256("planted");
        cache.put(Kind::Pair, &planted, &json!({}), &whole).unwrap();
        assert!(
            Memo::of(Some(&cache)).get(&planted).is_some(),
            "a possible entry is read"
        );
        for (n, change) in impossible.iter().enumerate() {
            let mut entry = whole.clone();
            for (field, value) in change.as_object().unwrap() {
                entry[field] = value.clone();
            }
            let key = crate::hash::sha256(format!("impossible {n}"));
            cache.put(Kind::Pair, &key, &json!({}), &entry).unwrap();
            assert_eq!(Memo::of(Some(&cache)).get(&key), None, "{change}");
        }
    }

    fn row(compressor: &str, goal: &str, question: usize, correct: bool) -> ResultRow {
        let mut row: ResultRow = serde_json::from_value(serde_json::json!({
            "seed": 1, "compressor": compressor, "condition": "own-goal", "ratio": 0.1,
            "source_id": "s", "goal_id": goal, "question_id": format!("q{question}"),
            "memory_key": "k", "correct": correct,
        }))
        .unwrap();
        row.correct = Some(correct);
        row
    }

    /// Three compressors over 40 goals of two questions each, right at different rates.
    fn three_cells() -> (Vec<CellId>, Vec<ResultRow>) {
        let mut rows = Vec::new();
        for (c, name) in ["a", "b", "c"].iter().enumerate() {
            for g in 0..40 {
                for q in 0..2 {
                    let right = (g * 7 + q * 3 + c * 5) % (3 + c) != 0;
                    rows.push(row(name, &format!("g{g:02}"), q, right));
                }
            }
        }
        let mut ids: Vec<CellId> = rows.iter().map(ResultRow::cell).collect();
        ids.dedup();
        (ids, rows)
    }

    #[test]
    fn pairs_read_from_the_memo_are_the_pairs_made() {
        let (ids, rows) = three_cells();
        let mut by_cell: HashMap<CellId, Vec<&ResultRow>> = HashMap::new();
        for row in &rows {
            by_cell.entry(row.cell()).or_default().push(row);
        }
        let folder = tempfile::tempdir().unwrap();
        let cache = Cache::open(folder.path()).unwrap();
        let made = pairs(&ids, &by_cell, Memo::default());
        assert_eq!(made.len(), 6, "three pairs, two metrics");
        let kept = pairs(&ids, &by_cell, Memo::of(Some(&cache)));
        let read = pairs(&ids, &by_cell, Memo::of(Some(&cache)));
        let shown = |pairs: &[super::super::Pair]| serde_json::to_string(pairs).unwrap();
        assert_eq!(shown(&kept), shown(&made));
        assert_eq!(shown(&read), shown(&made));
        // What is read is what the memo holds: a planted test stands in for one made.
        let (a, b) = (
            super::super::scores(&by_cell[&ids[0]]),
            super::super::scores(&by_cell[&ids[1]]),
        );
        assert!(!goal_diffs(&a, &b, Metric::Micro).is_empty());
        let planted = Compared {
            p: 0.5,
            ..Memo::of(Some(&cache)).get(&key(Metric::Micro, &a, &b)).unwrap()
        };
        Memo::of(Some(&cache)).put(&key(Metric::Micro, &a, &b), Metric::Micro, &planted);
        let read = pairs(&ids, &by_cell, Memo::of(Some(&cache)));
        let ab = (read.iter())
            .find(|p| p.a == "a" && p.b == "b" && p.metric == Metric::Micro)
            .unwrap();
        assert_eq!(ab.p, 0.5);
        // Without the memo (a replay) every test is made again.
        assert_eq!(shown(&pairs(&ids, &by_cell, Memo::default())), shown(&made));
    }
}
