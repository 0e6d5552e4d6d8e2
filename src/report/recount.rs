//! The independent recount behind `count_errors` (SPEC §5).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, mpsc};

use crate::hash::sha256;
use crate::inputs::dataset::Dataset;
use crate::inputs::tokenizer::Tokenizer;
use crate::parallel::Locked;
use crate::plan::keys::{count_identity, count_key};
use crate::store::cache::{Cache, Kind};
use crate::store::ledger::LedgerRow;

/// The independent recount (SPEC §5 `count_errors`): every source and every distinct memory
/// text re-encoded with the tokenizer and hashed, on threads of its own. It starts when the
/// run does and takes each memory as soon as the run hands it over, so at scale it is mostly
/// done by the time the report is built; each ledger row is then checked against it.
///
/// Counts are proven once: the recount stores each count it makes in the cache (kind
/// `count`, which nothing else writes) under the SHA-256 of the text and the tokenizer's and
/// gacc's identity, and a later run that hashes a text to the same SHA-256 takes that count
/// instead of encoding the text again. Every text is still hashed on every run, so a ledger
/// row is still checked against an encoding of exactly its text by the recount's own code
/// path (never the runner's truncate-and-count), made in this run or an earlier one.
pub(crate) struct Recount {
    texts: Option<mpsc::Sender<Arc<str>>>,
    sources: Vec<Arc<str>>,
    workers: Vec<std::thread::JoinHandle<Vec<Counted>>>,
    counter: Arc<Counter>,
}

/// A text as recounted: its tokens (None if the tokenizer failed) and its SHA-256.
type Counted = (Arc<str>, Option<usize>, String);

/// Counts texts: from the counts proven before, else by encoding them (and proving them).
struct Counter {
    tokenizer: Arc<dyn Tokenizer>,
    proven: Cache,
    /// What a proven count is bound to besides its text.
    identity: String,
}

impl Counter {
    fn new(tokenizer: Arc<dyn Tokenizer>, proven: Cache) -> Counter {
        let identity = count_identity(tokenizer.as_ref());
        Counter {
            tokenizer,
            proven,
            identity,
        }
    }

    /// The cache key of a text's proven count.
    fn key(&self, text_sha256: &str) -> String {
        count_key(&self.identity, text_sha256)
    }

    fn count(&self, text: &Arc<str>) -> Counted {
        let text_sha256 = sha256(&**text);
        let cache = &self.proven;
        let key = self.key(&text_sha256);
        let proven = cache
            .get(KIND, &key)
            .and_then(|entry| entry.get("tokens").and_then(serde_json::Value::as_u64));
        if let Some(tokens) = proven {
            return (text.clone(), Some(tokens as usize), text_sha256);
        }
        let tokens = self.tokenizer.encode(text).ok().map(|t| t.len());
        if let Some(tokens) = tokens {
            let description = serde_json::json!({"job": "count", "text_sha256": text_sha256});
            if let Err(error) = cache.put(KIND, &key, &description, &serde_json::json!({"tokens": tokens})) {
                tracing::warn!(%error, "could not store a proven token count");
            }
        }
        (text.clone(), tokens, text_sha256)
    }
}

/// The cache kind of proven counts.
const KIND: Kind = Kind::Count;

/// Counts texts on every core.
fn count_in_parallel(counter: &Counter, texts: &[Arc<str>]) -> Vec<Counted> {
    crate::parallel::map_in_parallel(texts, |text| counter.count(text))
}

/// A text's identity while its `Arc` is alive: the ledger shares one `Arc` per memory.
fn address(text: &Arc<str>) -> usize {
    Arc::as_ptr(text) as *const u8 as usize
}

impl Recount {
    /// Starts recounting, with the dataset's sources first; `proven` is the cache that holds
    /// (and receives) proven counts.
    pub(crate) fn start(tokenizer: Arc<dyn Tokenizer>, dataset: &Dataset, proven: Cache) -> Recount {
        let (sender, receiver) = mpsc::channel::<Arc<str>>();
        let receiver = Arc::new(Mutex::new(receiver));
        let counter = Arc::new(Counter::new(tokenizer, proven));
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
        let workers = (0..threads)
            .map(|_| {
                let (counter, receiver) = (counter.clone(), receiver.clone());
                std::thread::spawn(move || {
                    let mut counted = Vec::new();
                    loop {
                        let next = receiver.locked().recv();
                        let Ok(text) = next else { break };
                        counted.push(counter.count(&text));
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
            counter,
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
    pub(crate) fn errors(mut self, dataset: &Dataset, ledger: &[LedgerRow]) -> usize {
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
        for text in count_in_parallel(&self.counter, &missing) {
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
                    || row.budget != row.memory_id.cell.rule.tokens(row.source_tokens)
                    || row.retained_tokens > row.budget
                    || row.unused_budget != row.budget - row.retained_tokens.min(row.budget)
                    || Some(row.memory_tokens) != memory_tokens
                    || row.memory_sha256 != memory_sha256
                    || row.padding_tokens != 0
            })
            .count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inputs::tokenizer::{Cl100k, TokenizerError, TokenizerIdentity};
    use crate::protocol::{BudgetRule, CellId, Condition, MemoryId, TruncationMode};
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// The built-in tokenizer under an identity, counting the texts it encodes.
    struct Counting(Cl100k, AtomicUsize, TokenizerIdentity);

    fn counting(revision: Option<&str>) -> Arc<Counting> {
        let builtin = Cl100k::new();
        let mut identity = builtin.identity().clone();
        if let Some(revision) = revision {
            identity.revision = revision.into();
        }
        Arc::new(Counting(builtin, AtomicUsize::new(0), identity))
    }

    impl Tokenizer for Counting {
        fn encode(&self, text: &str) -> Result<Vec<u32>, TokenizerError> {
            self.1.fetch_add(1, Ordering::Relaxed);
            self.0.encode(text)
        }
        fn decode_bytes(&self, tokens: &[u32]) -> Result<Vec<u8>, TokenizerError> {
            self.0.decode_bytes(tokens)
        }
        fn identity(&self) -> &TokenizerIdentity {
            &self.2
        }
    }

    fn dataset() -> Dataset {
        serde_json::from_value(serde_json::json!({"sources": [
            {"id": "s", "text": "the reactor runs at 451 kelvin", "goals": []}]}))
        .unwrap()
    }

    /// The source's tokens (its budget, at `budget_tokens = 100`, is all of it).
    const SOURCE_TOKENS: usize = 8;

    /// A ledger row of `memory` as the runner would write it, claiming `memory_tokens`.
    fn row(memory: &Arc<str>, memory_tokens: usize) -> LedgerRow {
        LedgerRow {
            memory_id: MemoryId {
                seed: 1,
                cell: CellId {
                    compressor: "c".into(),
                    condition: Condition::NoGoal,
                    rule: BudgetRule::Tokens(100),
                },
                source_id: "s".into(),
                goal_id: None,
                shown_goal_id: None,
            },
            source_tokens: SOURCE_TOKENS,
            budget: SOURCE_TOKENS,
            generated_tokens: memory_tokens,
            retained_tokens: memory_tokens.min(SOURCE_TOKENS),
            unused_budget: SOURCE_TOKENS - memory_tokens.min(SOURCE_TOKENS),
            truncated: false,
            memory_tokens,
            padding_tokens: 0,
            utf8_split: false,
            truncation: TruncationMode::Replace,
            budget_violation: false,
            stopped_at_max_tokens: false,
            redacted: false,
            memory_sha256: sha256(&**memory),
            key: "k".into(),
            cache_key: "c".into(),
            ladder_call: None,
            nested: None,
            cached: false,
            memory: memory.clone(),
        }
    }

    /// One run's recount: the memories handed over as a run hands them, then checked.
    fn recount(tokenizer: &Arc<Counting>, cache: &Cache, ledger: &[LedgerRow]) -> (usize, usize) {
        let before = tokenizer.1.load(Ordering::Relaxed);
        let dataset = dataset();
        let recount = Recount::start(tokenizer.clone(), &dataset, cache.clone());
        let feed = recount.feed().unwrap();
        for row in ledger {
            feed.send(row.memory.clone()).unwrap();
        }
        drop(feed);
        let errors = recount.errors(&dataset, ledger);
        (errors, tokenizer.1.load(Ordering::Relaxed) - before)
    }

    #[test]
    fn counts_are_proven_once_and_still_check_every_row() {
        let folder = tempfile::tempdir().unwrap();
        let cache = Cache::open(folder.path()).unwrap();
        let tokenizer = counting(None);
        let (a, b): (Arc<str>, Arc<str>) = (Arc::from("the reactor"), Arc::from("runs at 451 kelvin"));
        let tokens = |text: &str| Cl100k::new().count(text).unwrap();
        assert_eq!(tokens(&dataset().sources[0].text), SOURCE_TOKENS);
        let honest = vec![row(&a, tokens(&a)), row(&b, tokens(&b))];
        // The first run encodes the source and both memories.
        assert_eq!(recount(&tokenizer, &cache, &honest), (0, 3));
        // The next run encodes nothing: every count is proven.
        assert_eq!(recount(&tokenizer, &cache, &honest), (0, 0));
        // A row claiming one token more is still caught by the proven count.
        let lying = vec![row(&a, tokens(&a) + 1), row(&b, tokens(&b))];
        assert_eq!(recount(&tokenizer, &cache, &lying), (1, 0));
        // A row whose text changed by a byte is encoded again, and checked against that.
        let changed: Arc<str> = Arc::from("the reactor!");
        let mut claims_old_count = row(&changed, tokens(&a));
        claims_old_count.memory_sha256 = sha256(&*changed);
        assert_eq!(recount(&tokenizer, &cache, &[claims_old_count]), (1, 1));
        // Another tokenizer identity proves its own counts.
        let other = counting(Some("another revision"));
        assert_eq!(recount(&other, &cache, &honest), (0, 3));
    }
}
