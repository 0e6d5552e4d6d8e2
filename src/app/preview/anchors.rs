//! `gacc plan`'s bounds of the anchor reads (SPEC §11): each question of each seed read with
//! an empty memory and with its whole source, and judged, as far as the cache does not answer.

use super::{Walk, cached};
use crate::plan::{Anchor, MemoryJob};
use crate::protocol::Role;
use crate::protocol::messages::{self, JudgeRequest, ReaderRequest, ReaderResponse, Request};

impl Walk<'_> {
    /// Bounds `job`'s questions' anchor calls. Their keys are a (seed, question)'s whatever the
    /// cell, so every cell after the first adds nothing; a ceiling read is bounded apart from an
    /// `identity` read at r = 1 whose memory is not made yet (a bound, not a count).
    pub(super) fn anchors(&mut self, job: &MemoryJob) {
        let (plan, manifest) = (&self.prepared.plan, &self.prepared.loaded.manifest);
        let source = &self.prepared.dataset.sources[job.source];
        let (reader, judge) = (
            self.bounder.launchers.reader.clone(),
            self.bounder.launchers.judge.clone(),
        );
        let seed = job.id.seed;
        for (anchor, memory) in plan.anchors.each(&source.text) {
            let memory_sha256 = match anchor {
                Anchor::Floor => crate::hash::sha256(""),
                Anchor::Ceiling => plan.source_sha256[job.source].clone(),
            };
            for question in &job.questions {
                let asked = &source.goals[question.goal].questions[question.question];
                let read_key = plan.read_key(job, question, &memory_sha256);
                let read = cached(self.cache, Role::Reader, &read_key);
                let answer =
                    read.and_then(|r| messages::read::<ReaderResponse>(&r).map(|r| r.answer.into_owned()));
                let (identity, answer, unknown) = match &answer {
                    Some(answer) => {
                        let key = plan.judge_key(job, question, answer);
                        if cached(self.cache, Role::Judge, &key).is_some() {
                            continue;
                        }
                        (key, answer.as_str(), 0)
                    }
                    None => {
                        if let Some(reader) = &reader {
                            let params = &manifest.reader.params;
                            let request = ReaderRequest::new(memory, &asked.question, seed, params);
                            let request = Request::Reader(request);
                            self.bounder.add(read_key.clone(), reader, &request, params, 0);
                        }
                        let longest = self.bounder.reader_max_tokens.unwrap_or(job.source_tokens as u64);
                        let term = plan.callbacks.judge.seed.key_term(seed);
                        (format!("{read_key}/judge/{term}"), "", longest)
                    }
                };
                let Some(judge) = &judge else { continue };
                let params = &manifest.judge.params;
                let judged = messages::Judged {
                    source: &source.text,
                    question: &asked.question,
                    reference: &asked.reference,
                    answer,
                };
                let request = Request::Judge(JudgeRequest::new(judged, seed, params));
                self.bounder.add(identity, judge, &request, params, unknown);
            }
        }
    }
}
