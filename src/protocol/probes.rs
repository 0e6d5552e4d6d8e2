//! The synthetic requests `gacc callback check` sends each callback: the protocol's edge cases for its role (an
//! empty context, a zero budget, a large context, text that needs escaping), never the dataset's
//! questions.

use serde_json::Value;

use super::Role;
use super::messages::{self, CompressorRequest, JudgeRequest, LadderRequest, ReaderRequest, WriterRequest};

/// The size of the large-context probe: a long paper or a book chapter.
pub(crate) const LARGE_CONTEXT_BYTES: usize = 1 << 20;

/// A synthetic request and what it is for.
pub(crate) struct Probe {
    pub(crate) what: &'static str,
    pub(crate) role: Role,
    pub(crate) request: Value,
}

/// The seed every probe carries.
pub(crate) const PROBE_SEED: u64 = 42;

/// The synthetic requests for a callback of `role` with `params` (`gacc callback check`); a
/// ladder compressor's ask for several budgets at once (SPEC §14). A persistent callback gets
/// them all on one worker, one after another, as a run sends them.
pub(crate) fn probes(role: Role, params: &Value, ladder: bool) -> Vec<Probe> {
    let sentence = "The harbour master logs every ship that docks after dusk. ";
    let plain: String = sentence.repeat(8);
    let foreign = "Der Hafenmeister notiert jedes Schiff — 港の船はすべて記録される. Ship \u{1F6A2} \u{1F30A} \
                   arrived at 23:40; naïve café façade, Ελληνικά, עברית, 😀👍🏽.";
    let large: String = sentence.repeat(LARGE_CONTEXT_BYTES / sentence.len() + 1);
    let probe = |what, request| Probe { what, role, request };
    match role {
        Role::Compressor if ladder => ladder_probes(params, (&plain, foreign, &large)),
        Role::Compressor => {
            let compressor = |context: &str, goal: Option<&str>, budget: usize| {
                messages::to_value(&CompressorRequest::new(context, goal, budget, PROBE_SEED, params))
            };
            vec![
                probe(
                    "a short context with a goal",
                    compressor(&plain, Some("learn which ships dock after dusk"), 30),
                ),
                probe("no goal (goal = null)", compressor(&plain, None, 30)),
                probe("token_budget 1", compressor(&plain, Some("ships"), 1)),
                probe(
                    "non-ASCII and emoji text",
                    compressor(foreign, Some("Schiffe 🚢 und Häfen"), 20),
                ),
                probe(
                    "a 1 MB context",
                    compressor(&large, Some("ships after dusk"), 2000),
                ),
                probe(
                    "the first request again",
                    compressor(&plain, Some("learn which ships dock after dusk"), 30),
                ),
            ]
        }
        Role::Reader => {
            let reader = |memory: &str, question: &str| {
                messages::to_value(&ReaderRequest::new(memory, question, PROBE_SEED, params))
            };
            vec![
                probe("a short memory", reader(&plain, "Who logs the ships?")),
                probe("an empty memory", reader("", "Who logs the ships?")),
                probe(
                    "non-ASCII and emoji text",
                    reader(foreign, "Wann kam das Schiff 🚢 an?"),
                ),
                probe("a 1 MB memory", reader(&large, "When are ships logged?")),
                probe("the first request again", reader(&plain, "Who logs the ships?")),
            ]
        }
        Role::Judge => {
            let judge = |source: &str, answer: &str| {
                messages::to_value(&JudgeRequest::new(
                    messages::Judged {
                        source,
                        question: "Who logs the ships?",
                        reference: "the harbour master",
                        answer,
                    },
                    PROBE_SEED,
                    params,
                ))
            };
            vec![
                probe("a right answer", judge(&plain, "the harbour master")),
                probe("a wrong answer", judge(&plain, "the lighthouse keeper")),
                probe("an empty answer", judge(&plain, "")),
                probe("non-ASCII and emoji text", judge(foreign, "der Hafenmeister 🚢")),
                probe("a 1 MB source", judge(&large, "the harbour master")),
            ]
        }
        Role::Writer => writer_probes(params, &plain, foreign),
    }
}

/// A writer's probes (SPEC §16): goals of a source, questions of a goal, and text that needs
/// escaping.
fn writer_probes(params: &Value, plain: &str, foreign: &str) -> Vec<Probe> {
    let probe = |what, request| Probe {
        what,
        role: Role::Writer,
        request,
    };
    let goal = "learn which ships dock after dusk";
    vec![
        probe(
            "a source's goals",
            messages::to_value(&WriterRequest::goals(plain, 2, PROBE_SEED, params)),
        ),
        probe(
            "a goal's questions",
            messages::to_value(&WriterRequest::questions(plain, goal, 3, PROBE_SEED, params)),
        ),
        probe(
            "non-ASCII and emoji text",
            messages::to_value(&WriterRequest::goals(foreign, 1, PROBE_SEED, params)),
        ),
    ]
}

/// A ladder compressor's probes (SPEC §14): ladders of one to three budgets over the same texts.
fn ladder_probes(params: &Value, (plain, foreign, large): (&str, &str, &str)) -> Vec<Probe> {
    let probe = |what, request| Probe {
        what,
        role: Role::Compressor,
        request,
    };
    let ladder = |context: &str, goal: Option<&str>, budgets: &[usize]| {
        messages::to_value(&LadderRequest::new(
            context,
            goal,
            budgets.to_vec(),
            PROBE_SEED,
            params,
        ))
    };
    vec![
        probe(
            "a ladder of three budgets, with a goal",
            ladder(plain, Some("learn which ships dock after dusk"), &[10, 30, 60]),
        ),
        probe("no goal (goal = null)", ladder(plain, None, &[10, 30])),
        probe("a ladder of one budget, 1", ladder(plain, Some("ships"), &[1])),
        probe(
            "non-ASCII and emoji text",
            ladder(foreign, Some("Schiffe 🚢 und Häfen"), &[5, 20]),
        ),
        probe(
            "a 1 MB context",
            ladder(large, Some("ships after dusk"), &[500, 2000]),
        ),
        probe(
            "the first request again",
            ladder(plain, Some("learn which ships dock after dusk"), &[10, 30, 60]),
        ),
    ]
}
