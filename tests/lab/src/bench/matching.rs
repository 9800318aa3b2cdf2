//! `paybus-lab bench match`: W1's matching with a slow quote service (a real HTTP stub, 200 ms
//! a call) and `--concurrency` buyers at once, next to the seed's design measured in the same
//! run on the same database: one transaction holding `FOR UPDATE` on the candidates and the
//! partner's lock row across the quote call (seed 000 §0).
//!
//! Both phases create and match orders as the switch-off API does (`Matcher::create` with
//! `Handoff::Inline`, against `paybus_p2p::seed::create_and_match_holding_locks`), each buyer
//! waiting for its own answer: throughput and p50/p99 of each, their ratio (target >= 20x), and
//! how close the production path comes to the ideal (every buyer waiting only for its two quote
//! calls). A third phase creates the orders with the switch on, publishes a copy of every
//! message, and lets match-deposit consume both: its rate against the inline path is the
//! "through the broker, duplicates included" ratio (target >= 0.8). Then every order must be
//! MATCHED and the audit clean.

use std::{
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use anyhow::{Context, bail};
use paybus_bus::Handler;
use paybus_match_deposit::MatchDeposit;
use paybus_p2p::messages::DepositOrderCreated;
use paybus_p2p::{
    Accounted, Created, DepositOrderStatus, FillPolicy, Handoff, Matcher, NewDepositOrder,
    quote::QuoteClient,
};
use paybus_runtime::runner::Runner;
use paybus_testkit::{
    TestEnv,
    p2p::{self, QuoteStub},
};
use tokio_util::sync::CancellationToken;

use super::{
    BenchArgs, Counters, Phase, bench_services, drive, met, processed_by, publish_copy,
    until_processed,
};

/// Every quote service call takes this long.
const QUOTE_DELAY: Duration = Duration::from_millis(200);
/// Calls per matched order: getQuote and createTrade.
const CALLS_PER_ORDER: u32 = 2;
/// The seed's design serialises every buyer: its phase is capped so the run stays short.
const BASELINE_ORDERS_PER_BUYER: usize = 2;

/// Latencies of one phase, in the order they finished.
#[derive(Default)]
struct Latencies(Mutex<Vec<Duration>>);

impl Latencies {
    fn record(&self, took: Duration) {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).push(took);
    }

    /// The `q`-quantile (nearest rank).
    fn quantile(&self, q: f64) -> Duration {
        let mut all = self.0.lock().unwrap_or_else(|p| p.into_inner()).clone();
        all.sort();
        if all.is_empty() {
            return Duration::ZERO;
        }
        let rank = ((q * all.len() as f64).ceil() as usize).clamp(1, all.len());
        all[rank - 1]
    }
}

fn order(partners: &[u64], i: usize) -> NewDepositOrder {
    p2p::buyer(partners[i % partners.len()], "1")
}

pub(super) async fn run(args: &BenchArgs) -> anyhow::Result<()> {
    let env = TestEnv::new().await;
    let services = bench_services(&env, args.concurrency).await?;
    let stub = QuoteStub::with_delay(QUOTE_DELAY).await;
    let mut partners = Vec::with_capacity(usize::from(args.partners));
    for n in 0..args.partners {
        partners.push(p2p::partner(&services.pool, &format!("bench buyer {n}")).await);
    }
    let seller_partner = p2p::partner(&services.pool, "bench seller").await;
    let baseline_items = args
        .items
        .min(usize::from(args.concurrency) * BASELINE_ORDERS_PER_BUYER);
    // Plenty of liquidity for both phases, spread over more sellers than buyers at once.
    let per_seller = (args.items + baseline_items).to_string();
    p2p::sellers(
        &services.pool,
        seller_partner,
        usize::from(args.concurrency).max(10) * 2,
        &per_seller,
    )
    .await;
    println!(
        "match: {} buyers at once, quote service {:?} a call ({CALLS_PER_ORDER} calls an order), \
         {} orders (production path) and {baseline_items} (seed's design), {} buyer partner(s)",
        args.concurrency, QUOTE_DELAY, args.items, args.partners
    );

    // The production path: claim, reserve, trade with no lock held, settle, account.
    let mut config = p2p::config(&stub, FillPolicy::FillOrCancel, 5);
    config.quote.timeout = Duration::from_secs(10);
    let matcher = Arc::new(Matcher::new(services.outbox.clone(), config.clone())?);
    let ours = Arc::new(Latencies::default());
    let counters = Counters::read(&services.pool).await?;
    let elapsed = drive(args.items, args.concurrency, {
        let (matcher, ours, partners) = (matcher.clone(), ours.clone(), partners.clone());
        move |i| {
            let (matcher, ours, new) = (matcher.clone(), ours.clone(), order(&partners, i));
            async move {
                let started = Instant::now();
                let created = matcher
                    .create(&new, Handoff::Inline)
                    .await
                    .context("creating and matching a deposit order")?;
                ours.record(started.elapsed());
                match created {
                    Created::Attempted {
                        accounted:
                            Accounted::Terminal {
                                status: DepositOrderStatus::Matched,
                                ..
                            },
                        ..
                    } => Ok(()),
                    other => bail!("an order was not matched: {other:?}"),
                }
            }
        }
    })
    .await?;
    let production = Phase {
        name: "no lock across the quote call (production)",
        unit: "orders",
        count: args.items,
        elapsed,
        statements: Some(counters.since(&services.pool).await?),
    };

    // The seed's design: the same work in one transaction holding its locks across the call.
    let quote = QuoteClient::new(&config.quote)?.context("the stub's quote client")?;
    let seed = Arc::new(Latencies::default());
    let outbox = services.outbox.clone();
    let elapsed = drive(baseline_items, args.concurrency, {
        let (seed, partners) = (seed.clone(), partners.clone());
        move |i| {
            let (outbox, quote, seed, new) = (
                outbox.clone(),
                quote.clone(),
                seed.clone(),
                order(&partners, i),
            );
            async move {
                let started = Instant::now();
                match paybus_p2p::seed::create_and_match_holding_locks(&outbox, &quote, &new).await
                {
                    Ok((_, paybus_p2p::CloseReason::Filled)) => {}
                    Ok((id, reason)) => bail!("seed design: order {id} closed {reason}"),
                    Err(e) => return Err(e).context("seed design"),
                }
                seed.record(started.elapsed());
                Ok(())
            }
        }
    })
    .await?;
    let baseline = Phase {
        name: "locks held across the call (seed's design)",
        unit: "orders",
        count: baseline_items,
        elapsed,
        statements: None,
    };

    let through_broker = through_the_broker(&env, args, &config, &partners).await?;

    let matched: i64 =
        sqlx::query_scalar("SELECT COUNT(*) FROM p2p_deposit_orders WHERE status = 'MATCHED'")
            .fetch_one(&services.pool)
            .await?;
    let mut conn = services.pool.acquire().await?;
    let violations = paybus_ops::audit::run(&mut conn, &paybus_catalog::audit_checks()).await?;
    let expected = i64::try_from(2 * args.items + baseline_items)?;
    if matched != expected || !violations.is_empty() {
        bail!("{matched} of {expected} orders MATCHED; audit: {violations:?}");
    }

    for (phase, latencies) in [(&production, &ours), (&baseline, &seed)] {
        phase.print();
        println!(
            "    latency per order: p50 {:>8.1?}  p99 {:>8.1?}",
            latencies.quantile(0.50),
            latencies.quantile(0.99)
        );
    }
    through_broker.print();
    let ratio = production.rate() / baseline.rate();
    let ideal = f64::from(args.concurrency) / (QUOTE_DELAY * CALLS_PER_ORDER).as_secs_f64();
    println!(
        "production / seed's design:                   {ratio:.1}x  (target >= 20x: {})",
        met(ratio >= 20.0)
    );
    println!(
        "production vs. ideal ({} buyers each waiting only for {CALLS_PER_ORDER} x {:?}): {:.0} of {ideal:.0} /s = {:.2}",
        args.concurrency,
        QUOTE_DELAY,
        production.rate(),
        production.rate() / ideal
    );
    println!(
        "p99 latency: {:.1?} (production) vs {:.1?} (seed's design)",
        ours.quantile(0.99),
        seed.quantile(0.99)
    );
    let broker_ratio = through_broker.rate() / production.rate();
    println!(
        "through the broker / inline:                 {broker_ratio:.2}  (target >= 0.80: {})",
        met(broker_ratio >= 0.8)
    );
    println!("every order MATCHED ({matched}), audit clean");
    Ok(())
}

/// `args.items` orders created with the switch on, every message published twice, matched by
/// match-deposit through the broker; the clock stops when every message was processed.
async fn through_the_broker(
    env: &TestEnv,
    args: &BenchArgs,
    config: &paybus_p2p::MatchingConfig,
    partners: &[u64],
) -> anyhow::Result<Phase> {
    let services = bench_services(env, args.concurrency).await?;
    let matcher = Matcher::new(services.outbox.clone(), config.clone())?;
    let shutdown = CancellationToken::new();
    let mut runner = Runner::new(services.clone());
    runner.add_function(MatchDeposit::new(matcher.clone()));
    let running = tokio::spawn(runner.run(shutdown.clone()));
    let before = processed_by(MatchDeposit::FUNCTION);
    let counters = Counters::read(&services.pool).await?;
    let started = Instant::now();
    drive(args.items, args.concurrency, {
        let (matcher, services, partners) = (matcher.clone(), services.clone(), partners.to_vec());
        move |i| {
            let (matcher, services, new) = (matcher.clone(), services.clone(), order(&partners, i));
            async move {
                let Created::Queued(deposit_order_id) = matcher
                    .create(&new, Handoff::Queued)
                    .await
                    .context("creating a deposit order")?
                else {
                    bail!("a new order was not queued");
                };
                publish_copy(&services, DepositOrderCreated { deposit_order_id }).await
            }
        }
    })
    .await?;
    until_processed(
        MatchDeposit::FUNCTION,
        before,
        2 * args.items as u64,
        started,
    )
    .await?;
    let phase = Phase {
        name: "through the broker (switch on, duplicates)",
        unit: "orders",
        count: args.items,
        elapsed: started.elapsed(),
        statements: Some(counters.since(&services.pool).await?),
    };
    shutdown.cancel();
    running.await??;
    Ok(phase)
}
