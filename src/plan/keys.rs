//! Every key of the run, in one place: the cache keys of SPEC §4 (what determines a call's
//! answer, hashed) and the names of the plan's jobs. The runner and `gacc plan` both ask here,
//! so a key cannot be made two ways.

use serde_json::{Value, json};

use crate::hash::sha256;
use crate::inputs::manifest::CallbackSpec;
use crate::inputs::models::{KeySeed, SeedRule};
use crate::inputs::tokenizer::Tokenizer;
use crate::plan::{MemoryJob, Plan, QuestionJob};
use crate::protocol::{BudgetRule, Condition, TruncationMode};

/// Keeps cache keys apart from any other SHA-256 of the same bytes.
const KEY_DOMAIN: &str = "gacc/1 cache key\n";

/// SHA-256 of a canonical description (serde_json sorts object keys, so equal values
/// serialise to equal bytes).
pub(crate) fn key(description: &Value) -> String {
    key_of_canonical(&description.to_string())
}

/// The key of a description already written in canonical form (compact JSON, keys sorted).
fn key_of_canonical(description: &str) -> String {
    let mut key = KeyHasher::new();
    key.put(description);
    key.finish()
}

/// A key's canonical description hashed as it is written, piece by piece, with no copy of it
/// made: the hot path's keys (385k reads and as many judgements at paper scale).
struct KeyHasher(sha2::Sha256);

impl KeyHasher {
    fn new() -> KeyHasher {
        use sha2::Digest;
        KeyHasher(sha2::Sha256::new_with_prefix(KEY_DOMAIN.as_bytes()))
    }

    fn put(&mut self, piece: &str) -> &mut KeyHasher {
        sha2::Digest::update(&mut self.0, piece.as_bytes());
        self
    }

    /// A value as `Display` writes it (a seed term).
    fn show(&mut self, value: impl std::fmt::Display) -> &mut KeyHasher {
        // Writing to a hasher cannot fail.
        let _ = std::fmt::Write::write_fmt(self, format_args!("{value}"));
        self
    }

    fn finish(self) -> String {
        crate::hash::hex(&sha2::Digest::finalize(self.0))
    }
}

impl std::fmt::Write for KeyHasher {
    fn write_str(&mut self, piece: &str) -> std::fmt::Result {
        self.put(piece);
        Ok(())
    }
}

/// The tokenizer in every compressor key: its name, whether it is the built-in, its revision.
pub(crate) fn tokenizer_identity(tokenizer: &dyn Tokenizer) -> Value {
    let identity = tokenizer.identity();
    json!({"name": identity.name, "builtin": identity.builtin, "revision": tokenizer_revision(tokenizer)})
}

/// The tokenizer's identity in cache keys: for the built-in, its vocabulary's hash.
fn tokenizer_revision(tokenizer: &dyn Tokenizer) -> String {
    let identity = tokenizer.identity();
    match &identity.vocabulary_sha256 {
        Some(sha) if identity.builtin => format!("vocabulary sha256:{sha}"),
        _ => identity.revision.clone(),
    }
}

/// What a callback's answers depend on: its command or built-in, revision and params.
pub(crate) fn callback_identity(spec: &CallbackSpec) -> Value {
    let program = match (&spec.model, &spec.builtin, &spec.command) {
        // A model built-in: its name and revision, its endpoint and its templates' text (SPEC §8).
        (Some(model), _, _) => {
            json!({"builtin": model.builtin, "builtin_revision": model.revision, "model": model.identity()})
        }
        (None, Some(name), _) => {
            json!({"builtin": name, "builtin_revision": crate::builtin::revision(name)})
        }
        // A command's files (its script and the modules beside it) unless a revision is pinned.
        (None, None, command) if !spec.script_files.is_empty() && spec.revision.is_empty() => {
            json!({"command": command, "files": spec.script_files})
        }
        (None, None, command) => json!({"command": command}),
    };
    json!({"program": program, "revision": spec.revision, "params": spec.params})
}

/// The seed rule of a callback (SPEC §8): a model built-in's from its endpoint and params.
pub(crate) fn seed_rule(spec: &CallbackSpec) -> SeedRule {
    SeedRule::of(spec.model.as_deref(), &spec.params)
}

/// A compressor call's key (SPEC §4), written from the callback's and tokenizer's identities
/// already serialised: the bytes serde_json writes for the canonical description. Without a
/// budget, its budget ladder's key (SPEC §14): the rest of the call's key, which the memory jobs
/// of one source, goal shown and seed share whatever their budgets.
pub(crate) fn compressor_key(
    identity_json: &str,
    tokenizer_json: &str,
    source_sha256: &str,
    goal_sha256: Option<&str>,
    budget: Option<usize>,
    seed: KeySeed,
) -> String {
    let goal = match goal_sha256 {
        Some(sha) => format!("\"{sha}\""),
        None => "null".to_owned(),
    };
    let (budget, role) = match budget {
        Some(budget) => (format!(r#""budget":{budget},"#), "compressor"),
        None => (String::new(), "compressor-ladder"),
    };
    key_of_canonical(&format!(
        r#"{{{budget}"callback":{identity_json},"goal_sha256":{goal},"role":"{role}","seed":{seed},"source_sha256":"{source_sha256}","tokenizer":{tokenizer_json}}}"#
    ))
}

/// The key of one ladder call: its group and the budgets it asks for (ascending).
pub(crate) fn ladder_call(group: &str, budgets: &[usize]) -> String {
    key(&json!({"kind": "ladder-call", "ladder": group, "token_budgets": budgets}))
}

/// A reader call's key (SPEC §4), written from the identity already serialised: the same bytes
/// serde_json writes for the canonical description (keys in order), without building it, for
/// the hot path.
pub(crate) fn reader_key_with(
    identity_json: &str,
    memory_sha256: &str,
    question_sha256: &str,
    seed: KeySeed,
) -> String {
    let mut key = KeyHasher::new();
    key.put(r#"{"callback":"#).put(identity_json);
    key.put(r#","memory_sha256":""#).put(memory_sha256);
    key.put(r#"","question_sha256":""#).put(question_sha256);
    key.put(r#"","role":"reader","seed":"#).show(seed).put("}");
    key.finish()
}

pub(crate) struct JudgeInputs<'a> {
    pub source_sha256: &'a str,
    pub question_sha256: &'a str,
    pub reference_sha256: &'a str,
    pub answer: &'a str,
}

/// A judge call's key (SPEC §4), written like `reader_key_with`.
pub(crate) fn judge_key_with(identity_json: &str, inputs: &JudgeInputs, seed: KeySeed) -> String {
    let mut key = KeyHasher::new();
    key.put(r#"{"answer_sha256":""#).put(&sha256(inputs.answer));
    key.put(r#"","callback":"#).put(identity_json);
    key.put(r#","question_sha256":""#).put(inputs.question_sha256);
    key.put(r#"","reference_sha256":""#).put(inputs.reference_sha256);
    key.put(r#"","role":"judge","seed":"#).show(seed);
    key.put(r#","source_sha256":""#)
        .put(inputs.source_sha256)
        .put(r#""}"#);
    key.finish()
}

/// The cache key of a memory as measured: its generation cut to its budget, counted. Written
/// like `reader_key_with` (once per memory job: 64,050 at paper scale), `tokenizer_json` being
/// the tokenizer's identity as canonical JSON.
pub(crate) fn memory_key(job: &MemoryJob, tokenizer_json: &str, truncation: TruncationMode) -> String {
    let mut key = KeyHasher::new();
    key.put(r#"{"budget":"#).show(job.budget);
    // A compressor key is hex: nothing in it is escaped.
    key.put(r#","compressor_key":""#).put(&job.cache_key);
    key.put(r#"","kind":"memory","tokenizer":"#).put(tokenizer_json);
    key.put(r#","truncation":""#)
        .put(truncation.as_str())
        .put(r#""}"#);
    key.finish()
}

/// What a text's proven token count (cache kind `count`) is bound to besides the text: the
/// tokenizer's identity and gacc's.
pub(crate) fn count_identity(tokenizer: &dyn Tokenizer) -> String {
    let identity = tokenizer.identity();
    serde_json::json!({
        "gacc": env!("CARGO_PKG_VERSION"),
        "name": identity.name,
        "builtin": identity.builtin,
        "revision": identity.revision,
        "vocabulary_sha256": identity.vocabulary_sha256,
    })
    .to_string()
}

/// The cache key of the proven count of the text whose SHA-256 is `text_sha256`.
pub(crate) fn count_key(identity: &str, text_sha256: &str) -> String {
    sha256(format!("count\n{identity}\n{text_sha256}"))
}

/// The job key of a memory: unique in a plan, the same in every plan of the experiment.
pub(crate) fn memory_job(
    seed: u64,
    compressor: &str,
    condition: Condition,
    budget: BudgetRule,
    source_id: &str,
    goal_id: Option<&str>,
) -> String {
    let mut job = json!({
        "job": "compress",
        "seed": seed,
        "compressor": compressor,
        "condition": condition,
        "source_id": source_id,
        "goal_id": goal_id,
    });
    // A ratio cell's key is what it has always been; a token budget names itself apart.
    job[match budget {
        BudgetRule::Ratio(_) => "ratio",
        BudgetRule::Tokens(_) => "budget_tokens",
    }] = match budget {
        BudgetRule::Ratio(ratio) => Value::from(ratio.to_string()),
        BudgetRule::Tokens(tokens) => Value::from(tokens),
    };
    key(&job)
}

/// The job key of a question read from a memory.
pub(crate) fn read_job(memory_job: &str, question_id: &str) -> String {
    sha256(format!("read\n{memory_job}\n{question_id}"))
}

/// The job key of a question's judgement.
pub(crate) fn judge_job(read_job: &str) -> String {
    sha256(format!("judge\n{read_job}"))
}

impl Plan {
    /// The reader call's key for a question of `job`, read from the memory with this hash.
    pub(crate) fn read_key(&self, job: &MemoryJob, question: &QuestionJob, memory_sha256: &str) -> String {
        self.read_key_seeded(job, question, memory_sha256, self.callbacks.reader.seed)
    }

    /// The judge call's key for a question of `job` answered with `answer`.
    pub(crate) fn judge_key(&self, job: &MemoryJob, question: &QuestionJob, answer: &str) -> String {
        self.judge_key_seeded(job, question, answer, self.callbacks.judge.seed)
    }

    /// An audit judge's call for a question of `job` answered with `answer`: a judge call's
    /// key under that judge's identity (the scoring judge's own key when it is the same judge).
    pub(crate) fn audit_key(
        &self,
        audit: &super::PlannedCallback,
        job: &MemoryJob,
        question: &QuestionJob,
        answer: &str,
    ) -> String {
        let seed = audit.seed.key_term(job.id.seed);
        self.judge_key_under(&audit.identity_json, job, question, answer, seed)
    }

    /// A panel reader's call for a question of `job` read from the memory with this hash: a
    /// reader call's key under that reader's identity (the run reader's own key when it is the
    /// same reader).
    pub(crate) fn panel_read_key(
        &self,
        panel: &super::PlannedCallback,
        job: &MemoryJob,
        question: &QuestionJob,
        memory_sha256: &str,
    ) -> String {
        let hashes = &self.question_sha256[job.source][question.goal][question.question];
        let seed = panel.seed.key_term(job.id.seed);
        reader_key_with(&panel.identity_json, memory_sha256, &hashes.question, seed)
    }

    fn read_key_seeded(
        &self,
        job: &MemoryJob,
        question: &QuestionJob,
        memory_sha256: &str,
        rule: SeedRule,
    ) -> String {
        let hashes = &self.question_sha256[job.source][question.goal][question.question];
        reader_key_with(
            &self.callbacks.reader.identity_json,
            memory_sha256,
            &hashes.question,
            rule.key_term(job.id.seed),
        )
    }

    fn judge_key_seeded(
        &self,
        job: &MemoryJob,
        question: &QuestionJob,
        answer: &str,
        rule: SeedRule,
    ) -> String {
        let seed = rule.key_term(job.id.seed);
        self.judge_key_under(&self.callbacks.judge.identity_json, job, question, answer, seed)
    }

    /// A judge call's key under the judge identity `identity_json`.
    fn judge_key_under(
        &self,
        identity_json: &str,
        job: &MemoryJob,
        question: &QuestionJob,
        answer: &str,
        seed: KeySeed,
    ) -> String {
        let hashes = &self.question_sha256[job.source][question.goal][question.question];
        let inputs = JudgeInputs {
            source_sha256: &self.source_sha256[job.source],
            question_sha256: &hashes.question,
            reference_sha256: &hashes.reference,
            answer,
        };
        judge_key_with(identity_json, &inputs, seed)
    }

    /// The key of `job`'s memory as measured.
    pub(crate) fn memory_key(&self, job: &MemoryJob, truncation: TruncationMode) -> String {
        memory_key(job, &self.tokenizer_identity_json, truncation)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_ignore_object_key_order() {
        let a: Value = serde_json::from_str(r#"{"b": 1, "a": {"y": 2, "x": 3}}"#).unwrap();
        let b: Value = serde_json::from_str(r#"{"a": {"x": 3, "y": 2}, "b": 1}"#).unwrap();
        assert_eq!(key(&a), key(&b));
        assert_ne!(key(&a), key(&json!({"b": 2})));
    }

    #[test]
    fn fast_keys_equal_the_canonical_descriptions() {
        let identity = json!({"program": {"builtin": "exact", "builtin_revision": "1"}, "revision": "2", "params": {"b": 1, "a": [1, "x"]}});
        let described = key(&json!({
            "role": "reader",
            "callback": identity,
            "memory_sha256": "m",
            "question_sha256": "q",
            "seed": 7,
        }));
        let seven = SeedRule::EachSeed.key_term(7);
        assert_eq!(reader_key_with(&identity.to_string(), "m", "q", seven), described);
        let inputs = JudgeInputs {
            source_sha256: "s",
            question_sha256: "q",
            reference_sha256: "r",
            answer: "the answer",
        };
        let described = key(&json!({
            "role": "judge",
            "callback": identity,
            "source_sha256": "s",
            "question_sha256": "q",
            "reference_sha256": "r",
            "answer_sha256": sha256("the answer"),
            "seed": 7,
        }));
        assert_eq!(judge_key_with(&identity.to_string(), &inputs, seven), described);
        let tokenizer = json!({"name": "cl100k_base", "builtin": true, "revision": "vocabulary sha256:x"});
        for truncation in [TruncationMode::Replace, TruncationMode::Utf8Safe] {
            use crate::protocol::{CellId, MemoryId};
            let job = MemoryJob {
                key: String::new(),
                cache_key: sha256("a compressor call"),
                id: MemoryId {
                    seed: 1,
                    cell: CellId {
                        compressor: "c".to_owned(),
                        condition: Condition::OwnGoal,
                        rule: BudgetRule::Tokens(827),
                    },
                    source_id: "s".to_owned(),
                    goal_id: None,
                    shown_goal_id: None,
                },
                source_tokens: 8275,
                budget: 827,
                source: 0,
                shown_goal: None,
                questions: Vec::new(),
                ladder: None,
            };
            let described = key(&json!({
                "kind": "memory",
                "compressor_key": job.cache_key,
                "tokenizer": tokenizer,
                "budget": job.budget,
                "truncation": truncation,
            }));
            assert_eq!(memory_key(&job, &tokenizer.to_string(), truncation), described);
            assert_eq!(json!(truncation), json!(truncation.as_str()));
        }
        for goal in [Some("g"), None] {
            let described = key(&json!({
                "role": "compressor",
                "callback": identity,
                "tokenizer": tokenizer,
                "source_sha256": "s",
                "goal_sha256": goal,
                "budget": 12,
                "seed": 7,
            }));
            let fast = compressor_key(
                &identity.to_string(),
                &tokenizer.to_string(),
                "s",
                goal,
                Some(12),
                seven,
            );
            assert_eq!(fast, described, "goal {goal:?}");
        }
        // A model call's seed term is canonical JSON too.
        let rule = SeedRule::Model {
            sent: crate::inputs::models::seed::SentSeed::Run,
            per_seed: false,
        };
        let described = key(&json!({
            "role": "reader",
            "callback": identity,
            "memory_sha256": "m",
            "question_sha256": "q",
            "seed": {"sent": 7, "per_seed": null},
        }));
        assert_eq!(
            reader_key_with(&identity.to_string(), "m", "q", rule.key_term(7)),
            described
        );
    }
}
