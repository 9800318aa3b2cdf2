//! The functions' outcome counters are the process's (`metrics::count`), and plain `cargo test`
//! runs this binary's tests on threads of one process: a test that runs a function in process
//! holds the one turn for its whole run, so the counts it reads moved with its own messages
//! only. Under nextest, a process per test, the turn is never waited for.

use paybus_bus::metrics;

static TURN: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// A test's turn to run functions in process, and their counts when it began.
pub struct OutcomeCounts {
    _turn: tokio::sync::MutexGuard<'static, ()>,
    before: Vec<(String, &'static str, metrics::Stat)>,
}

impl OutcomeCounts {
    pub async fn take() -> Self {
        let turn = TURN.lock().await;
        Self {
            _turn: turn,
            before: metrics::snapshot(),
        }
    }

    /// Messages of `function` that ended with `outcome` since this turn began.
    pub fn count(&self, function: &str, outcome: &str) -> u64 {
        let before: u64 = self
            .before
            .iter()
            .filter(|(counted_function, counted, _)| {
                counted_function == function && *counted == outcome
            })
            .map(|(_, _, stat)| stat.count)
            .sum();
        metrics::count(function, outcome) - before
    }
}
