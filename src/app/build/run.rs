//! Writing and checking one source (SPEC §16): its goals, each goal's questions, and each
//! question through the checks in order; the reads and judgements only for a question that
//! passed the checks before them.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use serde_json::{Value, json};

use super::calls::Calls;
use super::checks::{self, Reason};
use super::file::Text;
use crate::exec::callback::{Callback, Failure};
use crate::hash::sha256;
use crate::inputs::evidence::Normalised;
use crate::inputs::models::KeySeed;
use crate::plan::keys;
use crate::protocol::messages::{self, JudgeRequest, Judged, ReaderRequest, WriterRequest};
use crate::protocol::writer::{self, WrittenQuestion};

/// What a dry run puts where a text the cache does not hold yet will be: about as long as
/// such a text is, so that what its calls would cost can be bounded.
const UNKNOWN_GOAL: &str =
    "an information need a reader of this source may have, in one sentence of about twenty words or so";
const UNKNOWN_QUESTION: &str =
    "a question about the source that this goal needs answered, in one sentence of about twenty words";

/// The callbacks of a build, their identities and seeds, and what every source shares.
pub(super) struct Context {
    pub calls: Calls,
    pub writer: Callback,
    pub reader: Callback,
    pub judge: Callback,
    /// (identity JSON, seed term) of the reader and the judge, as a run's keys have them.
    pub read_as: (String, KeySeed),
    pub judge_as: (String, KeySeed),
    /// The writer's seed term, as canonical JSON.
    pub writer_seed: Value,
    pub seed: u64,
    pub goals_per_source: usize,
    pub questions_per_goal: usize,
    pub keep_closed_book: bool,
    /// Sources finished, for the progress line.
    pub finished: AtomicUsize,
}

/// What became of a question.
#[derive(Debug, Clone)]
pub(super) enum Verdict {
    Kept,
    /// The first check it failed, and the reader's answer where a read decided it.
    Dropped(Reason, Option<String>),
    /// A dry run: its checks need calls not made.
    Unknown,
}

#[derive(Debug)]
pub(super) struct QuestionOutcome {
    pub written: WrittenQuestion,
    pub verdict: Verdict,
}

#[derive(Debug)]
pub(super) struct GoalOutcome {
    pub text: String,
    pub questions: Vec<QuestionOutcome>,
}

/// What became of a source: its goals as written, in order; or the call that failed.
#[derive(Debug)]
pub(super) struct SourceOutcome {
    pub goals: Vec<GoalOutcome>,
    pub failure: Option<String>,
}

/// Writes and checks one source's goals and questions.
pub(super) async fn source(context: Arc<Context>, source: Arc<Text>) -> SourceOutcome {
    let mut outcome = SourceOutcome {
        goals: Vec::new(),
        failure: None,
    };
    let hash = sha256(&source.text);
    let normalised = Normalised::of(&source.text);
    let goals = match context.goals(&source, &hash).await {
        Ok(Some(goals)) => goals,
        // A dry run without the goals: as many goals as asked for, their questions unknown.
        Ok(None) => vec![String::new(); context.goals_per_source],
        Err(failure) => {
            outcome.failure = Some(format!(
                "{} (goals of source `{}`): {}",
                context.writer.name, source.id, failure.kind
            ));
            return outcome;
        }
    };
    for goal in goals {
        let goal = GoalOutcome {
            questions: Vec::new(),
            text: goal,
        };
        let goal = context
            .goal(&source, &hash, &normalised, goal, &mut outcome.failure)
            .await;
        outcome.goals.push(goal);
        if outcome.failure.is_some() {
            break;
        }
    }
    context.finished.fetch_add(1, Ordering::Relaxed);
    outcome
}

impl Context {
    /// The writer's key of a call (SPEC §4's form: what determines its answer, hashed).
    fn writer_key(&self, op: writer::WriterOp, source_sha256: &str, goal: Option<&str>, n: usize) -> Value {
        let mut description = json!({
            "role": "writer",
            "op": op,
            "callback": self.writer.identity,
            "source_sha256": source_sha256,
            "n": n,
            "seed": self.writer_seed,
        });
        if let Some(goal) = goal {
            description["goal_sha256"] = json!(sha256(goal));
        }
        description
    }

    async fn goals(&self, source: &Text, hash: &str) -> Result<Option<Vec<String>>, Failure> {
        let n = self.goals_per_source;
        let description = self.writer_key(writer::WriterOp::Goals, hash, None, n);
        let request = WriterRequest::goals(&source.text, n, self.seed, &self.writer.params);
        let response = self
            .calls
            .call(
                &self.writer,
                &keys::key(&description),
                &description,
                &messages::to_bytes(&request),
            )
            .await?;
        response
            .map(|response| writer::read_goals(&response, n).map_err(reply_failure))
            .transpose()
    }

    async fn questions(
        &self,
        source: &Text,
        hash: &str,
        goal: &str,
    ) -> Result<Option<Vec<WrittenQuestion>>, Failure> {
        let n = self.questions_per_goal;
        if goal.is_empty() {
            let unknown =
                WriterRequest::questions(&source.text, UNKNOWN_GOAL, n, self.seed, &self.writer.params);
            self.calls
                .wanted(&self.writer, Some(&messages::to_bytes(&unknown)));
            return Ok(None);
        }
        let request = WriterRequest::questions(&source.text, goal, n, self.seed, &self.writer.params);
        let bytes = messages::to_bytes(&request);
        let description = self.writer_key(writer::WriterOp::Questions, hash, Some(goal), n);
        let response = self
            .calls
            .call(&self.writer, &keys::key(&description), &description, &bytes)
            .await?;
        response
            .map(|response| writer::read_questions(&response, n).map_err(reply_failure))
            .transpose()
    }

    /// A goal's questions, each checked in turn (a question is a duplicate only of one kept
    /// before it, so they are checked in the writer's order). The first failed call ends it.
    async fn goal(
        &self,
        source: &Text,
        hash: &str,
        normalised: &Normalised,
        mut goal: GoalOutcome,
        failure: &mut Option<String>,
    ) -> GoalOutcome {
        let written = match self.questions(source, hash, &goal.text).await {
            Ok(Some(written)) => written,
            Ok(None) => {
                for _ in 0..self.questions_per_goal {
                    self.unknown_checks(source);
                }
                return goal;
            }
            Err(failed) => {
                *failure = Some(format!(
                    "{} (questions of source `{}`): {}",
                    self.writer.name, source.id, failed.kind
                ));
                return goal;
            }
        };
        let mut kept: Vec<BTreeSet<String>> = Vec::new();
        for question in written {
            let verdict = match checks::first_failed(normalised, &goal.text, &question, &kept) {
                Some(reason) => Ok(Verdict::Dropped(reason, None)),
                None => self.read_checks(source, hash, &question).await,
            };
            let verdict = match verdict {
                Ok(verdict) => verdict,
                Err(failed) => {
                    *failure = Some(format!(
                        "{} (source `{}`, question `{}`)",
                        failed, source.id, question.question
                    ));
                    return goal;
                }
            };
            if matches!(verdict, Verdict::Kept) {
                kept.push(checks::word_set(&question.question));
            }
            goal.questions.push(QuestionOutcome {
                written: question,
                verdict,
            });
        }
        goal
    }

    /// The ceiling check, then the closed-book one (unless `keep_closed_book`). In a dry run a
    /// read the cache lacks is taken to pass, so that the calls after it are counted.
    async fn read_checks(
        &self,
        source: &Text,
        hash: &str,
        question: &WrittenQuestion,
    ) -> Result<Verdict, String> {
        let ceiling = self.read_and_judge(source, hash, &source.text, question).await?;
        if let Some((answer, false)) = ceiling {
            return Ok(Verdict::Dropped(Reason::Ceiling, Some(answer)));
        }
        if self.keep_closed_book {
            return Ok(ceiling.map_or(Verdict::Unknown, |_| Verdict::Kept));
        }
        let closed_book = self.read_and_judge(source, hash, "", question).await?;
        Ok(match (ceiling, closed_book) {
            (Some(_), Some((answer, true))) => Verdict::Dropped(Reason::ClosedBook, Some(answer)),
            (Some(_), Some((_, false))) => Verdict::Kept,
            _ => Verdict::Unknown,
        })
    }

    /// Counts the reads and judgements of a question a dry run does not know yet.
    fn unknown_checks(&self, source: &Text) {
        let memories = [source.text.as_str(), ""];
        for memory in memories
            .into_iter()
            .take(if self.keep_closed_book { 1 } else { 2 })
        {
            let read = ReaderRequest::new(memory, UNKNOWN_QUESTION, self.seed, &self.reader.params);
            self.calls.wanted(&self.reader, Some(&messages::to_bytes(&read)));
            self.unknown_judgement(source, UNKNOWN_QUESTION, UNKNOWN_QUESTION);
        }
    }

    /// Counts a judgement whose answer a dry run does not know yet.
    fn unknown_judgement(&self, source: &Text, question: &str, reference: &str) {
        let judged = Judged {
            source: &source.text,
            question,
            reference,
            answer: UNKNOWN_QUESTION,
        };
        let judge = JudgeRequest::new(judged, self.seed, &self.judge.params);
        self.calls.wanted(&self.judge, Some(&messages::to_bytes(&judge)));
    }

    /// The question read from `memory` and judged: (the answer, whether it is right); None in a
    /// dry run that lacks a call.
    async fn read_and_judge(
        &self,
        source: &Text,
        hash: &str,
        memory: &str,
        question: &WrittenQuestion,
    ) -> Result<Option<(String, bool)>, String> {
        let question_hash = sha256(&question.question);
        let (identity, seed) = &self.read_as;
        let key = keys::reader_key_with(identity, &sha256(memory), &question_hash, *seed);
        let request = ReaderRequest::new(memory, &question.question, self.seed, &self.reader.params);
        let description = json!({"job": "build-read", "cache_key": key});
        let made = self
            .calls
            .call(&self.reader, &key, &description, &messages::to_bytes(&request))
            .await;
        let Some(response) = made.map_err(|failed| format!("{}: {}", self.reader.name, failed.kind))? else {
            self.unknown_judgement(source, &question.question, &question.reference);
            return Ok(None);
        };
        let answer = messages::read::<messages::ReaderResponse>(&response)
            .map(|read| read.answer.into_owned())
            .unwrap_or_default();
        let judged = Judged {
            source: &source.text,
            question: &question.question,
            reference: &question.reference,
            answer: &answer,
        };
        let (identity, seed) = &self.judge_as;
        let inputs = keys::JudgeInputs {
            source_sha256: hash,
            question_sha256: &question_hash,
            reference_sha256: &sha256(&question.reference),
            answer: &answer,
        };
        let key = keys::judge_key_with(identity, &inputs, *seed);
        let request = JudgeRequest::new(judged, self.seed, &self.judge.params);
        let description = json!({"job": "build-judge", "cache_key": key});
        let made = self
            .calls
            .call(&self.judge, &key, &description, &messages::to_bytes(&request))
            .await;
        let Some(response) = made.map_err(|failed| format!("{}: {}", self.judge.name, failed.kind))? else {
            return Ok(None);
        };
        let correct =
            messages::read::<messages::JudgeResponse>(&response).is_some_and(|judged| judged.correct);
        Ok(Some((answer, correct)))
    }
}

/// A cached writer reply that does not read as what was asked (an entry another version of
/// the writer wrote): a failed call, named.
fn reply_failure(message: String) -> Failure {
    Failure {
        kind: crate::exec::callback::FailureKind::MissingField(message),
        stderr_tail: String::new(),
        attempts: 1,
    }
}
