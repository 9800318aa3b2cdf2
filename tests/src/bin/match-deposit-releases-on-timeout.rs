//! A deliberately broken match-deposit, for `paybus-lab chaos`'s own test only (never deployed,
//! never in the catalog): W1 as it was before createTrade had three outcomes — a createTrade
//! that timed out is read as *not done*, so the fill's reservation is released and the attempt
//! counted as failed, while the quote service may have made the trade (principle 12's
//! violation; the quick profile's quote service trades and then answers after the client's
//! timeout). Run by the chaos harness with `--substitute match-deposit=<this binary>`, it must
//! make the run fail: the harness is shown to catch an orphan trade.
//!
//! The seam: everything is the real match-deposit — its handler
//! ([`paybus_match_deposit::MatchDepositWith`]), its settings and the real [`Matcher`] — except
//! the one classification the matcher takes from [`QuoteError::effect`], replaced by the
//! matcher's type parameter ([`TradeFailureReading`]). The deployed binary's matcher is
//! `Matcher<QuoteContract>`: it has no field or feature to switch to this reading
//! (`functions/match-deposit/src/main.rs` is one line over the real handler).

use paybus_bus::{Context, Envelope, Handler, HandlerError, Outcome, Services};
use paybus_match_deposit::MatchDepositWith;
use paybus_p2p::{
    DepositOrderCreated, Matcher, MatchingConfig,
    matcher::TradeFailureReading,
    quote::{Effect, QuoteError},
};
use paybus_runtime::function::{BuildError, Function};

/// The broken classification: a timeout (the request was written, no answer came in time) is
/// taken for a refusal. Every other failure is read as the real client reads it, so a run's
/// finding points at this one line.
#[derive(Debug, Clone, Copy)]
struct TimeoutIsNotDone;

impl TradeFailureReading for TimeoutIsNotDone {
    fn effect(&self, error: &QuoteError) -> Effect {
        match error {
            QuoteError::Timeout { .. } => Effect::NotDone,
            other => other.effect(),
        }
    }
}

/// The real handler over a matcher with the broken classification.
struct ReleasesOnTimeout(MatchDepositWith<TimeoutIsNotDone>);

impl Handler for ReleasesOnTimeout {
    type Message = DepositOrderCreated;
    const FUNCTION: &'static str = paybus_p2p::FUNCTION;

    async fn handle(
        &self,
        message: Envelope<DepositOrderCreated>,
        ctx: &Context<'_>,
    ) -> Result<Outcome, HandlerError> {
        self.0.handle(message, ctx).await
    }
}

impl Function for ReleasesOnTimeout {
    /// As match-deposit builds its matcher (`PAYBUS_MATCH_*` / `PAYBUS_QUOTE_*`), then broken.
    /// Its sweeper jobs are not this process's: the run's sweeper retries with the real code.
    fn build(services: &Services) -> Result<Self, BuildError> {
        let matcher = Matcher::new(services.outbox.clone(), MatchingConfig::from_env()?)
            .map_err(|source| BuildError::Client {
                what: "the quote service HTTP client",
                source: source.into(),
            })?
            .reading_trade_failures(TimeoutIsNotDone);
        Ok(Self(MatchDepositWith::new(matcher)))
    }
}

fn main() -> std::process::ExitCode {
    paybus_runtime::function::main::<ReleasesOnTimeout>()
}
