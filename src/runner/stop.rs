//! Why a run stopped before its plan was done, in the words the terminal prints.

/// Why a run stopped before its plan was done.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Stop {
    /// `--fail-fast`, after the first failure.
    FailFast,
    /// `[run] max_cost_usd`: the next call could have passed it.
    CostCap(f64),
    /// An endpoint refused the key (or has no such model): every later call would fail too.
    Rejected(String),
    /// A cache entry or a row could not be written (a full disk, a quota, a place made
    /// read-only): no call starts after it, since its answer could not be kept.
    /// `[run] stop`: the listed pairs were decided before every goal was read (why, said so).
    Early(String),
    LostWrite {
        /// The path and the error, as the write failed.
        what: String,
        /// Answers this run could not keep.
        lost: usize,
    },
}

impl std::fmt::Display for Stop {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Stop::FailFast => write!(f, "--fail-fast stopped the run after a failure"),
            Stop::CostCap(cap) => write!(
                f,
                "the spending cap stopped the run: the next calls could pass max_cost_usd = {cap}; \
                 raise it and run again to go on (the cache keeps what was paid for)"
            ),
            Stop::Rejected(why) => write!(f, "the run stopped: {why}"),
            Stop::Early(why) => write!(f, "stopped early: {why}"),
            Stop::LostWrite { what, lost } => write!(
                f,
                "the run stopped at its first lost write: {what}. No call started after it{}; every \
                 answer written before it is kept. Free space there (or make it writable), then run \
                 the same command again: nothing kept is paid for twice",
                match lost {
                    0 => String::new(),
                    n => format!(" ({n} answer(s) made then could not be kept, and will be made again)"),
                }
            ),
        }
    }
}
