//! The independent recount behind `count_errors` (SPEC §5).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, mpsc};

use crate::hash::sha256;
use crate::inputs::dataset::Dataset;
use crate::inputs::tokenizer::Tokenizer;
use crate::store::ledger::LedgerRow;

/// The independent recount (SPEC §5 `count_errors`): every source and every distinct memory
/// text re-encoded with the tokenizer and hashed, on threads of its own. It starts when the
/// run does and takes each memory as soon as the run hands it over, so at scale it is mostly
/// done by the time the report is built; each ledger row is then checked against it.
pub(crate) struct Recount {
    texts: Option<mpsc::Sender<Arc<str>>>,
    sources: Vec<Arc<str>>,
    workers: Vec<std::thread::JoinHandle<Vec<Counted>>>,
}

/// A text as recounted: its tokens (None if the tokenizer failed) and its SHA-256.
type Counted = (Arc<str>, Option<usize>, String);

/// Re-encodes and hashes texts on every core.
fn count_in_parallel(tokenizer: &dyn Tokenizer, texts: &[Arc<str>]) -> Vec<Counted> {
    crate::parallel::map_in_parallel(texts, |text| {
        let tokens = tokenizer.encode(text).ok().map(|t| t.len());
        (text.clone(), tokens, sha256(&**text))
    })
}

/// A text's identity while its `Arc` is alive: the ledger shares one `Arc` per memory.
fn address(text: &Arc<str>) -> usize {
    Arc::as_ptr(text) as *const u8 as usize
}

impl Recount {
    /// Starts recounting, with the dataset's sources first.
    pub(crate) fn start(tokenizer: Arc<dyn Tokenizer>, dataset: &Dataset) -> Recount {
        let (sender, receiver) = mpsc::channel::<Arc<str>>();
        let receiver = Arc::new(Mutex::new(receiver));
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
        let workers = (0..threads)
            .map(|_| {
                let (tokenizer, receiver) = (tokenizer.clone(), receiver.clone());
                std::thread::spawn(move || {
                    let mut counted = Vec::new();
                    loop {
                        let next = receiver.lock().unwrap_or_else(|e| e.into_inner()).recv();
                        let Ok(text) = next else { break };
                        let tokens = tokenizer.encode(&text).ok().map(|t| t.len());
                        let sha = sha256(&*text);
                        counted.push((text, tokens, sha));
                    }
                    counted
                })
            })
            .collect();
        let sources: Vec<Arc<str>> = dataset
            .sources
            .iter()
            .map(|s| Arc::from(s.text.as_str()))
            .collect();
        for text in &sources {
            let _ = sender.send(text.clone());
        }
        Recount {
            texts: Some(sender),
            sources,
            workers,
        }
    }

    /// Somewhere to hand memory texts over as they are made (each distinct `Arc` once);
    /// every copy must be dropped before [`Recount::errors`], which waits for them.
    pub(crate) fn feed(&self) -> Option<mpsc::Sender<Arc<str>>> {
        self.texts.clone()
    }

    /// Ledger rows whose counts disagree with the recount: the source re-encoded for `N`, the
    /// budget recomputed, the memory re-encoded and hashed. Memories never handed over are
    /// recounted here, each distinct one once.
    pub(crate) fn errors(
        mut self,
        tokenizer: &dyn Tokenizer,
        dataset: &Dataset,
        ledger: &[LedgerRow],
    ) -> usize {
        drop(self.texts.take());
        // Each entry keeps its text alive, so no other text can take its address meanwhile.
        let mut counted: HashMap<usize, Counted> = self
            .workers
            .into_iter()
            .flat_map(|w| w.join().unwrap_or_default())
            .map(|counted| (address(&counted.0), counted))
            .collect();
        let mut missing = std::collections::HashSet::new();
        let missing: Vec<Arc<str>> = ledger
            .iter()
            .map(|row| &row.memory)
            .chain(&self.sources)
            .filter(|text| !counted.contains_key(&address(text)) && missing.insert(address(text)))
            .cloned()
            .collect();
        for text in count_in_parallel(tokenizer, &missing) {
            counted.insert(address(&text.0), text);
        }
        let count = |text: &Arc<str>| match counted.get(&address(text)) {
            Some((_, tokens, sha)) => (*tokens, sha.as_str()),
            None => (None, ""),
        };
        let source_tokens: HashMap<&str, Option<usize>> = dataset
            .sources
            .iter()
            .zip(&self.sources)
            .map(|(s, text)| (s.id.as_str(), count(text).0))
            .collect();
        ledger
            .iter()
            .filter(|row| {
                let n = source_tokens
                    .get(row.memory_id.source_id.as_str())
                    .copied()
                    .flatten();
                let (memory_tokens, memory_sha256) = count(&row.memory);
                n != Some(row.source_tokens)
                    || row.budget != row.memory_id.cell.budget.tokens(row.source_tokens)
                    || row.retained_tokens > row.budget
                    || row.unused_budget != row.budget - row.retained_tokens.min(row.budget)
                    || Some(row.memory_tokens) != memory_tokens
                    || row.memory_sha256 != memory_sha256
                    || row.padding_tokens != 0
            })
            .count()
    }
}
