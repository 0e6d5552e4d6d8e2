//! `gacc plan`'s bounds of the reader panel's calls (SPEC §11): each panel reader's read of a
//! (memory, question) pair in its sample, and the scoring judge's judgement of its answer, as far
//! as the cache does not answer them.

use super::{Walk, cached};
use crate::inputs::records::Source;
use crate::plan::{MemoryJob, QuestionJob, in_panel};
use crate::protocol::Role;
use crate::protocol::messages::{self, JudgeRequest, ReaderRequest, ReaderResponse, Request};

impl Walk<'_> {
    /// Bounds a question's panel calls. With its memory's hash known, only the readers whose
    /// sample holds the pair, and only what the cache does not answer; with it unknown, every
    /// panel reader's read and judgement (its sample is known only once the memory is).
    pub(super) fn bound_panel(
        &mut self,
        source: &Source,
        job: &MemoryJob,
        question: &QuestionJob,
        memory_sha256: Option<&str>,
    ) {
        let (plan, manifest) = (&self.prepared.plan, &self.prepared.loaded.manifest);
        let asked = &source.goals[question.goal].questions[question.question];
        let seed = job.id.seed;
        for (name, share) in &plan.panel_shares {
            let (Some(planned), Some(spec)) = (plan.callbacks.panel_reader(name), manifest.readers.get(name))
            else {
                continue;
            };
            let (read, answer) = match memory_sha256 {
                Some(sha256) if !in_panel(seed, &asked.id, sha256, *share) => continue,
                Some(sha256) => {
                    let key = plan.panel_read_key(planned, job, question, sha256);
                    let read = cached(self.cache, Role::Reader, &key);
                    let answer = read
                        .and_then(|r| messages::read::<ReaderResponse>(&r).map(|r| r.answer.into_owned()));
                    (key, answer)
                }
                None => {
                    let term = planned.seed.key_term(seed);
                    let memory = plan.memory_key(job, manifest.truncation);
                    (
                        format!(
                            "{memory}/{}/{}/panel/{name}/{term}",
                            question.goal, question.question
                        ),
                        None,
                    )
                }
            };
            let launcher = self.bounder.launchers.panel_reader(name).cloned().flatten();
            if let (None, Some(launcher)) = (&answer, launcher) {
                let request = Request::Reader(ReaderRequest::new("", &asked.question, seed, &spec.params));
                self.bounder
                    .add(read.clone(), &launcher, &request, &spec.params, job.budget as u64);
            }
            let (identity, text, unknown) = match &answer {
                Some(answer) => {
                    let key = plan.judge_key(job, question, answer);
                    if cached(self.cache, Role::Judge, &key).is_some() {
                        continue;
                    }
                    (key, answer.as_str(), 0)
                }
                None => {
                    let term = plan.callbacks.judge.seed.key_term(seed);
                    (format!("{read}/judge/{term}"), "", job.budget as u64)
                }
            };
            let Some(judge) = self.bounder.launchers.judge.clone() else {
                continue;
            };
            let judged = messages::Judged {
                source: &source.text,
                question: &asked.question,
                reference: &asked.reference,
                answer: text,
            };
            let request = Request::Judge(JudgeRequest::new(judged, seed, &manifest.judge.params));
            self.bounder
                .add(identity, &judge, &request, &manifest.judge.params, unknown);
        }
    }
}
