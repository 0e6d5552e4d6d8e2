//! The job graph (SPEC §5 `plan.json`): every memory to make, every question to read and
//! judge from it, and the keys that name them. Built before anything runs; never changed.

mod anchors;
mod cross;
pub(crate) mod keys;
pub(crate) mod unknown;

pub(crate) use anchors::{Anchor, Anchors};
pub(crate) use cross::derangement;

use std::collections::BTreeMap;

use serde::Serialize;
use serde_json::{Value, json};

use crate::error::Invalid;
use crate::hash::sha256;
use crate::inputs::dataset::Dataset;
use crate::inputs::manifest::{Loaded, Manifest};
use crate::inputs::tokenizer::Tokenizer;
use crate::parallel::map_in_parallel;
use crate::protocol::{CallbackSet, Ratio};
use crate::protocol::{CellId, Condition, MemoryId};

pub(crate) const SCHEMA: &str = "gacc.plan/2";

/// A goal by position: (source index, goal index within the source).
pub(crate) type GoalRef = (usize, usize);

/// One memory to make: its source, the goal it answers (None: all of the source's goals),
/// and the goal the compressor is shown.
type Unit = (usize, Option<usize>, Option<GoalRef>);

/// One compressor call's worth of work: a memory and the questions answered from it.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct MemoryJob {
    /// Unique within the plan: the memory's (seed, compressor, condition, ratio, source, goal).
    pub key: String,
    /// The compressor call's cache key (shared by jobs whose calls are identical).
    pub cache_key: String,
    #[serde(flatten)]
    pub id: MemoryId,
    pub source_tokens: usize,
    pub budget: usize,
    #[serde(skip)]
    pub source: usize,
    #[serde(skip)]
    pub shown_goal: Option<(usize, usize)>,
    #[serde(skip)]
    pub questions: Vec<QuestionJob>,
    /// A ladder compressor's (SPEC §14): the key it shares with the jobs of its source, goal
    /// shown and seed at every other budget, which one call serves.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ladder: Option<String>,
}

/// A question read from a memory, then judged. Its read and judge jobs' keys follow from
/// the memory job's key and the question's id ([`keys::read_job`], [`keys::judge_job`]): they
/// are made when something writes them, not for every job of the plan.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct QuestionJob {
    pub goal: usize,
    pub question: usize,
}

#[derive(Debug, Clone)]
pub(crate) struct Plan {
    pub memories: Vec<MemoryJob>,
    /// Each callback's cache identity and seed rule, the audit judges' included.
    pub callbacks: CallbackSet<PlannedCallback>,
    /// The share of answers each audit judge audits (SPEC §10), in `[audit] judges` order.
    pub audit_shares: Vec<(String, f64)>,
    /// Which anchor reads each question also gets (SPEC §11).
    pub anchors: Anchors,
    /// The share of (memory, question) pairs each panel reader re-reads, in `[audit] readers`
    /// order (SPEC §11).
    pub panel_shares: Vec<(String, f64)>,
    /// The tokenizer's identity as canonical JSON (in every compressor and memory key).
    pub tokenizer_identity_json: String,
    /// Each source's SHA-256, in dataset order.
    pub source_sha256: Vec<String>,
    /// Per source, the questions and references of its goals that it does not itself
    /// contain: what no compressor request may carry.
    pub held_out_texts: Vec<Vec<String>>,
    /// SHA-256 of each question's text and reference, by [source][goal][question].
    pub question_sha256: Vec<Vec<Vec<QuestionHashes>>>,
    /// Each question's evidence spans, normalised (SPEC §11), by [source][goal][question].
    pub spans: Vec<Vec<Vec<crate::inputs::evidence::Spans>>>,
}

/// What the plan knows of one callback.
#[derive(Debug, Clone)]
pub(crate) struct PlannedCallback {
    /// Its cache identity, and the same serialised once for its cache keys.
    pub identity: Value,
    pub identity_json: String,
    /// How its keys carry the run's seed (SPEC §8).
    pub seed: crate::inputs::models::SeedRule,
}

impl PlannedCallback {
    fn of(spec: &crate::inputs::manifest::CallbackSpec) -> PlannedCallback {
        let identity = keys::callback_identity(spec);
        PlannedCallback {
            identity_json: identity.to_string(),
            identity,
            seed: keys::seed_rule(spec),
        }
    }
}

impl Plan {
    /// Each callback's cache identity by its manifest key (`compressors.NAME`, `reader`,
    /// `judge`, `judges.NAME`), as report.json lists them.
    pub(crate) fn callback_identities(&self) -> BTreeMap<String, Value> {
        self.callbacks
            .iter()
            .map(|(key, _, planned)| (key, planned.identity.clone()))
            .collect()
    }
}

/// Whether an answer is in the sample an audit judge at `fraction` looks at: the SHA-256 of
/// `[seed, question id, answer]` (as JSON), read as a number in [0, 1), is below `fraction`.
/// The same answers in every run, and a larger share audits a superset.
pub(crate) fn audited(seed: u64, question_id: &str, answer: &str, fraction: f64) -> bool {
    fraction >= 1.0 || below(&serde_json::json!([seed, question_id, answer]), fraction)
}

/// Whether a (memory, question) pair is in the sample a panel reader at `fraction` re-reads
/// (SPEC §11): the SHA-256 of `[seed, question id, memory's SHA-256]` (as JSON), read as a
/// number in [0, 1), is below `fraction`, as `audited` draws answers.
pub(crate) fn in_panel(seed: u64, question_id: &str, memory_sha256: &str, fraction: f64) -> bool {
    fraction >= 1.0 || below(&serde_json::json!([seed, question_id, memory_sha256]), fraction)
}

/// The SHA-256 of `drawn` (as JSON), read as a number in [0, 1), is below `fraction`.
fn below(drawn: &Value, fraction: f64) -> bool {
    let digest = crate::hash::sha256(drawn.to_string());
    let head = u64::from_str_radix(&digest[..16], 16).unwrap_or(u64::MAX);
    (head as f64 / 2f64.powi(64)) < fraction
}

#[derive(Debug, Clone)]
pub(crate) struct QuestionHashes {
    pub question: String,
    pub reference: String,
}

/// The texts among `texts` that `source` does not contain (non-empty, without repeats).
pub(crate) fn held_out_texts<'a>(source: &str, texts: impl Iterator<Item = &'a str>) -> Vec<String> {
    let mut out: Vec<String> = texts
        .filter(|t| !t.is_empty() && !source.contains(*t))
        .map(str::to_owned)
        .collect();
    out.sort();
    out.dedup();
    out
}

/// Expands a manifest and its dataset into the job graph, in a deterministic order:
/// seeds, compressors (by name), conditions and ratios as listed, then sources and goals.
pub(crate) fn plan(loaded: &Loaded, dataset: &Dataset, tokenizer: &dyn Tokenizer) -> Result<Plan, Invalid> {
    let manifest = &loaded.manifest;
    if manifest.conditions.contains(&Condition::CrossGoal) && dataset.sources.len() < 2 {
        return Err(Invalid::one(
            format!("{}: key `conditions`", loaded.path.display()),
            "cross-goal shows each goal of a different source, and the dataset has a single source",
        ));
    }
    let callbacks = manifest
        .callback_set()
        .map(|_, _, spec| PlannedCallback::of(spec));
    let expansion = Expansion::new(manifest, dataset, tokenizer)?;
    let crosses: Vec<(u64, Vec<GoalRef>)> = manifest
        .seeds
        .iter()
        .map(|&seed| (seed, derangement(&expansion.goals, seed)))
        .collect();
    // Each (seed, compressor)'s jobs are made on whichever core is free, then put in order.
    let parts: Vec<_> = crosses
        .iter()
        .flat_map(|cross| callbacks.compressors.iter().map(move |c| (cross, c)))
        .collect();
    let memories: Vec<MemoryJob> = map_in_parallel(&parts, |&(&(seed, ref shown), (name, planned))| {
        expansion.memories(seed, shown, name, &planned.identity, planned.seed)
    })
    .into_iter()
    .flatten()
    .collect();
    let audit_shares = manifest
        .audit_judges()
        .into_iter()
        .map(|(name, _, fraction)| (name.to_owned(), fraction))
        .collect();
    Ok(Plan {
        memories,
        callbacks,
        audit_shares,
        anchors: Anchors::of(manifest),
        panel_shares: (manifest.panel_readers().into_iter())
            .map(|(name, _, fraction)| (name.to_owned(), fraction))
            .collect(),
        tokenizer_identity_json: expansion.tokenizer_identity_json,
        source_sha256: expansion.source_sha256,
        question_sha256: question_hashes(dataset),
        spans: crate::inputs::evidence::Spans::of_sources(&dataset.sources),
        held_out_texts: held_out_by_source(dataset),
    })
}

/// Per source, the held-out texts its questions and references must not reach a compressor in.
fn held_out_by_source(dataset: &Dataset) -> Vec<Vec<String>> {
    dataset
        .sources
        .iter()
        .map(|source| {
            let texts = source.goals.iter().flat_map(|g| &g.questions);
            held_out_texts(
                &source.text,
                texts.flat_map(|q| [q.question.as_str(), q.reference.as_str()]),
            )
        })
        .collect()
}

/// What every memory job of a plan is made from.
struct Expansion<'a> {
    manifest: &'a Manifest,
    dataset: &'a Dataset,
    tokenizer_identity_json: String,
    source_tokens: Vec<usize>,
    source_sha256: Vec<String>,
    /// Each goal's text's SHA-256, by [source][goal].
    goal_sha256: Vec<Vec<String>>,
    /// Every goal, in dataset order.
    goals: Vec<GoalRef>,
}

impl<'a> Expansion<'a> {
    /// The plan's sources counted and hashed once, for every memory job.
    fn new(manifest: &'a Manifest, dataset: &'a Dataset, tokenizer: &dyn Tokenizer) -> Result<Self, Invalid> {
        let source_tokens: Vec<usize> = map_in_parallel(&dataset.sources, |s| {
            tokenizer.count(&s.text).map_err(|error| {
                Invalid::one(
                    format!("source `{}`", s.id),
                    format!("cannot count its tokens: {error}"),
                )
            })
        })
        .into_iter()
        .collect::<Result<_, _>>()?;
        Ok(Expansion {
            manifest,
            dataset,
            tokenizer_identity_json: keys::tokenizer_identity(tokenizer).to_string(),
            source_tokens,
            goal_sha256: dataset
                .sources
                .iter()
                .map(|source| source.goals.iter().map(|g| sha256(&g.text)).collect())
                .collect(),
            source_sha256: dataset.sources.iter().map(|s| s.sha256()).collect(),
            goals: dataset
                .sources
                .iter()
                .enumerate()
                .flat_map(|(s, source)| (0..source.goals.len()).map(move |g| (s, g)))
                .collect(),
        })
    }
}

impl Expansion<'_> {
    /// The memory jobs of one seed and compressor: per condition and ratio, one per unit.
    fn memories(
        &self,
        seed: u64,
        shown_for_cross: &[GoalRef],
        compressor: &str,
        identity: &Value,
        seed_rule: crate::inputs::models::SeedRule,
    ) -> Vec<MemoryJob> {
        let mut memories = Vec::new();
        let identity = identity.to_string();
        for &condition in &self.manifest.conditions {
            let units: Vec<Unit> = match condition {
                Condition::OwnGoal => self
                    .goals
                    .iter()
                    .map(|&(s, g)| (s, Some(g), Some((s, g))))
                    .collect(),
                Condition::NoGoal => (0..self.dataset.sources.len()).map(|s| (s, None, None)).collect(),
                Condition::CrossGoal => self
                    .goals
                    .iter()
                    .zip(shown_for_cross)
                    .map(|(&(s, g), &shown)| (s, Some(g), Some(shown)))
                    .collect(),
            };
            for budget in self.manifest.cell_budgets() {
                let cell = CellId {
                    compressor: compressor.to_owned(),
                    condition,
                    rule: budget,
                };
                memories.extend(
                    units
                        .iter()
                        .map(|&unit| self.memory(seed, &cell, &identity, seed_rule, unit)),
                );
            }
        }
        memories
    }

    /// One memory job: its keys, budget and questions.
    fn memory(
        &self,
        seed: u64,
        cell: &CellId,
        identity: &str,
        seed_rule: crate::inputs::models::SeedRule,
        (s, goal, shown): Unit,
    ) -> MemoryJob {
        let source = &self.dataset.sources[s];
        let budget = cell.rule.tokens(self.source_tokens[s]);
        let shown_goal = shown.map(|(ss, gg)| &self.dataset.sources[ss].goals[gg]);
        let goal_sha = shown.map(|(ss, gg)| self.goal_sha256[ss][gg].as_str());
        let (tokenizer, sha, seed_key) = (
            &self.tokenizer_identity_json,
            &self.source_sha256[s],
            seed_rule.key_term(seed),
        );
        let key = |budget| keys::compressor_key(identity, tokenizer, sha, goal_sha, budget, seed_key);
        let laddered = (self.manifest.compressors.get(&cell.compressor)).is_some_and(|spec| spec.ladder);
        let (cache_key, ladder) = (key(Some(budget)), (laddered && budget > 0).then(|| key(None)));
        let goal_id = goal.map(|g| source.goals[g].id.clone());
        let key = keys::memory_job(
            seed,
            &cell.compressor,
            cell.condition,
            cell.rule,
            &source.id,
            goal_id.as_deref(),
        );
        let answered: Vec<usize> = match goal {
            Some(g) => vec![g],
            None => (0..source.goals.len()).collect(),
        };
        let questions = answered
            .into_iter()
            .flat_map(|g| (0..source.goals[g].questions.len()).map(move |q| (g, q)))
            .map(|(goal, question)| QuestionJob { goal, question })
            .collect();
        MemoryJob {
            key,
            cache_key,
            id: MemoryId {
                seed,
                cell: cell.clone(),
                source_id: source.id.clone(),
                goal_id,
                shown_goal_id: shown_goal.map(|g| g.id.clone()),
            },
            source_tokens: self.source_tokens[s],
            budget,
            source: s,
            shown_goal: shown,
            questions,
            ladder,
        }
    }
}

/// SHA-256 of each question's text and reference, by [source][goal][question].
fn question_hashes(dataset: &Dataset) -> Vec<Vec<Vec<QuestionHashes>>> {
    dataset
        .sources
        .iter()
        .map(|s| {
            s.goals
                .iter()
                .map(|g| {
                    g.questions
                        .iter()
                        .map(|q| QuestionHashes {
                            question: sha256(&q.question),
                            reference: sha256(&q.reference),
                        })
                        .collect()
                })
                .collect()
        })
        .collect()
}

impl Plan {
    pub(crate) fn question_jobs(&self) -> usize {
        self.memories.iter().map(|m| m.questions.len()).sum()
    }

    /// Writes `plan.json` (`gacc.plan/2`): the schema, the size per stage, how read and judge
    /// job keys follow from a memory job's, and one line per memory job with its fields, its
    /// keys and the questions read (then judged) from its memory, by goal. Streamed: a
    /// paper-scale plan has ~10^5 memory jobs and ~10^6 jobs in all.
    pub(crate) fn write_json(&self, dataset: &Dataset, out: &mut dyn std::io::Write) -> std::io::Result<()> {
        let questions = self.question_jobs();
        let stages = json!({"compress": self.memories.len(), "read": questions, "judge": questions});
        write!(
            out,
            "{{\"schema\": \"{SCHEMA}\", \"stages\": {stages}, \"job_keys\": {}, \"jobs\": [",
            json!({"read": READ_JOB_KEY, "judge": JUDGE_JOB_KEY})
        )?;
        let mut first = true;
        for memory in &self.memories {
            let source = &dataset.sources[memory.source];
            let mut questions: Vec<(&str, Vec<&str>)> = Vec::new();
            for question in &memory.questions {
                let goal = &source.goals[question.goal];
                let id = goal.questions[question.question].id.as_str();
                match questions.last_mut() {
                    Some((goal_id, ids)) if *goal_id == goal.id => ids.push(id),
                    _ => questions.push((&goal.id, vec![id])),
                }
            }
            out.write_all(if std::mem::take(&mut first) { b"\n" } else { b",\n" })?;
            serde_json::to_writer(&mut *out, &CompressEntry::of(memory, Questions(&questions)))?;
        }
        writeln!(out, "\n]}}")
    }
}

/// How `plan.json` says a read job's key follows from its memory job's and its question's.
pub(crate) const READ_JOB_KEY: &str = "sha256(\"read\\n\" + memory job key + \"\\n\" + question_id)";
/// How `plan.json` says a judge job's key follows from its read job's.
pub(crate) const JUDGE_JOB_KEY: &str = "sha256(\"judge\\n\" + read job key)";

/// A memory job's questions by goal, in plan order: `{"goal_id": ["question_id", ...]}`.
struct Questions<'a>(&'a [(&'a str, Vec<&'a str>)]);

impl Serialize for Questions<'_> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut map = serializer.serialize_map(Some(self.0.len()))?;
        for (goal, ids) in self.0 {
            map.serialize_entry(goal, ids)?;
        }
        map.end()
    }
}

/// A memory job as `plan.json` lists it: its fields, its stage and its questions, keys in
/// sorted order as a JSON object of them would print.
#[derive(Serialize)]
struct CompressEntry<'a> {
    budget: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    budget_tokens: Option<usize>,
    cache_key: &'a str,
    compressor: &'a str,
    condition: Condition,
    goal_id: &'a Option<String>,
    key: &'a str,
    questions: Questions<'a>,
    #[serde(skip_serializing_if = "Option::is_none")]
    ratio: Option<Ratio>,
    seed: u64,
    shown_goal_id: &'a Option<String>,
    source_id: &'a str,
    source_tokens: usize,
    stage: &'static str,
}

impl<'a> CompressEntry<'a> {
    fn of(job: &'a MemoryJob, questions: Questions<'a>) -> Self {
        CompressEntry {
            budget: job.budget,
            budget_tokens: job.id.cell.rule.budget_tokens(),
            cache_key: &job.cache_key,
            compressor: &job.id.cell.compressor,
            condition: job.id.cell.condition,
            goal_id: &job.id.goal_id,
            key: &job.key,
            questions,
            ratio: job.id.cell.rule.ratio(),
            seed: job.id.seed,
            shown_goal_id: &job.id.shown_goal_id,
            source_id: &job.id.source_id,
            source_tokens: job.source_tokens,
            stage: "compress",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::BudgetRule;

    #[test]
    fn plan_entries_print_as_their_json_objects() {
        let job = MemoryJob {
            key: "k".into(),
            cache_key: "c".into(),
            id: MemoryId {
                seed: 7,
                cell: CellId {
                    compressor: "lines".into(),
                    condition: Condition::CrossGoal,
                    rule: BudgetRule::Ratio(serde_json::from_value(json!(0.29)).unwrap()),
                },
                source_id: "s1".into(),
                goal_id: Some("g1".into()),
                shown_goal_id: None,
            },
            source_tokens: 100,
            budget: 29,
            source: 0,
            shown_goal: None,
            questions: Vec::new(),
            ladder: None,
        };
        // What plan.json held before entries were written directly: the job as a JSON object.
        let mut expected = serde_json::to_value(&job).unwrap();
        expected["stage"] = json!("compress");
        expected["questions"] = json!({"g1": ["q1", "q2"], "g2": ["q1"]});
        let questions = [("g1", vec!["q1", "q2"]), ("g2", vec!["q1"])];
        let written = serde_json::to_string(&CompressEntry::of(&job, Questions(&questions))).unwrap();
        assert_eq!(written, expected.to_string());
    }

    #[test]
    fn the_plan_file_names_every_job_and_its_keys_follow_from_it() {
        let dataset = Dataset {
            sources: serde_json::from_value(json!([
                {"id": "s1", "text": "alpha beta gamma delta", "goals": [
                    {"id": "g1", "text": "greek", "questions": [
                        {"id": "q1", "question": "first?", "reference": "alpha"},
                        {"id": "q2", "question": "last?", "reference": "delta"}]},
                    {"id": "g2", "text": "more", "questions": [
                        {"id": "q1", "question": "second?", "reference": "beta"}]}]},
                {"id": "s2", "text": "one two three", "goals": [
                    {"id": "g1", "text": "numbers", "questions": [
                        {"id": "q1", "question": "first?", "reference": "one"}]}]}
            ]))
            .unwrap(),
        };
        let manifest = "name = \"t\"\nseeds = [1, 2]\nratios = [0.5]\nconditions = [\"own-goal\", \"no-goal\", \"cross-goal\"]\n[dataset]\npath = \"d.jsonl\"\n[compressors.c]\nbuiltin = \"goal-line\"\n[reader]\nbuiltin = \"field-lookup\"\n[judge]\nbuiltin = \"exact-match\"\n";
        let folder = tempfile::tempdir().unwrap();
        std::fs::write(folder.path().join("t.toml"), manifest).unwrap();
        let (loaded, _) = crate::inputs::manifest::load(&folder.path().join("t.toml"), &[]).unwrap();
        let tokenizer = crate::inputs::tokenizer::Cl100k::new();
        let plan = plan(&loaded, &dataset, &tokenizer).unwrap();
        let mut bytes = Vec::new();
        plan.write_json(&dataset, &mut bytes).unwrap();
        let written: Value = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(written["schema"], SCHEMA);
        assert_eq!(
            written["stages"],
            json!({"compress": 16, "read": 24, "judge": 24})
        );
        let jobs = written["jobs"].as_array().unwrap();
        assert_eq!(jobs.len(), plan.memories.len());
        for (entry, job) in jobs.iter().zip(&plan.memories) {
            assert_eq!(entry["key"], job.key.as_str());
            assert_eq!(entry["cache_key"], job.cache_key.as_str());
            // Each question job's keys, from the formulas the file states.
            let mut listed = Vec::new();
            for (goal, ids) in entry["questions"].as_object().unwrap() {
                for id in ids.as_array().unwrap() {
                    let read = sha256(format!("read\n{}\n{}", job.key, id.as_str().unwrap()));
                    listed.push((goal.clone(), read.clone(), sha256(format!("judge\n{read}"))));
                }
            }
            let source = &dataset.sources[job.source];
            let planned: Vec<(String, String, String)> = job
                .questions
                .iter()
                .map(|q| {
                    let goal = &source.goals[q.goal];
                    let read = keys::read_job(&job.key, &goal.questions[q.question].id);
                    (goal.id.clone(), read.clone(), keys::judge_job(&read))
                })
                .collect();
            assert_eq!(listed, planned, "job {}", job.key);
        }
        assert_eq!(written["job_keys"]["read"], READ_JOB_KEY);
    }

    #[test]
    fn derangement_never_shows_a_goal_of_the_same_source() {
        let goals: Vec<(usize, usize)> = vec![(0, 0), (0, 1), (1, 0), (1, 1), (2, 0), (2, 1), (2, 2)];
        for seed in 0..50 {
            let shown = derangement(&goals, seed);
            assert_eq!(shown.len(), goals.len());
            for (own, other) in goals.iter().zip(&shown) {
                assert_ne!(own.0, other.0, "seed {seed}");
            }
            let mut sorted = shown.clone();
            sorted.sort();
            assert_eq!(sorted, goals, "a permutation exists, so one is used");
            assert_eq!(shown, derangement(&goals, seed), "deterministic for a seed");
        }
        let differ = (0..10).any(|seed| derangement(&goals, seed) != derangement(&goals, seed + 1));
        assert!(differ, "seeds change the choice");
    }

    #[test]
    fn lopsided_sources_still_see_another_source() {
        // Source 0 holds most goals: no permutation avoids it, so each goal chooses.
        let goals = vec![(0, 0), (0, 1), (0, 2), (1, 0)];
        let shown = derangement(&goals, 7);
        for (own, other) in goals.iter().zip(&shown) {
            assert_ne!(own.0, other.0);
        }
    }
}
