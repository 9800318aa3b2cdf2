//! The harness of match-deposit's tests: a database and vhost of their own, a quote service
//! stub (a real HTTP server), a manual clock, a buyer and a seller partner.
#![allow(dead_code)] // each test binary uses its own part of it

use std::time::Duration;

use paybus_bus::{Context, Envelope, Handler, Outcome, Services};
use paybus_match_deposit::MatchDeposit;
use paybus_p2p::{DepositOrderCreated, FillPolicy, Handoff, Matcher, MatchingConfig};
use paybus_retry::Clock;
use paybus_testkit::{
    TestEnv,
    p2p::{self, QuoteStub},
    scalar,
};
use sqlx::MySqlPool;

pub struct World {
    pub services: Services,
    pub stub: QuoteStub,
    pub clock: Clock,
    pub buyer: u64,
    pub seller_partner: u64,
    pub env: TestEnv,
}

impl World {
    pub async fn new() -> Self {
        let env = TestEnv::new().await;
        let services = env.services(&[MatchDeposit::queue()]).await;
        let stub = QuoteStub::start().await;
        let now: chrono::DateTime<chrono::Utc> = sqlx::query_scalar("SELECT NOW(6)")
            .fetch_one(&env.db)
            .await
            .unwrap();
        let buyer = p2p::partner(&env.db, "buyer partner").await;
        let seller_partner = p2p::partner(&env.db, "seller partner").await;
        Self {
            services,
            stub,
            clock: Clock::manual(now),
            buyer,
            seller_partner,
            env,
        }
    }

    pub fn pool(&self) -> &MySqlPool {
        &self.env.db
    }

    pub fn matcher(&self, policy: FillPolicy, max_attempts: u32) -> Matcher {
        self.matcher_with(p2p::config(&self.stub, policy, max_attempts))
    }

    pub fn matcher_with(&self, config: MatchingConfig) -> Matcher {
        Matcher::new(self.services.outbox.clone(), config)
            .unwrap()
            .with_clock(self.clock.clone())
    }

    pub async fn seller(&self, amount: &str) -> u64 {
        p2p::seller(self.pool(), self.seller_partner, amount).await
    }

    /// A PENDING order, as the API creates it with async matching on (its message is not
    /// sent anywhere: the tests hand it to the handler themselves).
    pub async fn queued(&self, matcher: &Matcher, amount: &str) -> u64 {
        matcher
            .create(&p2p::buyer(self.buyer, amount), Handoff::Queued)
            .await
            .unwrap()
            .id()
    }

    pub async fn deliver(&self, handler: &MatchDeposit, id: u64, attempt: u32) -> Outcome {
        let ctx = Context {
            db: &self.services.outbox,
            attempt,
        };
        handler
            .handle(
                Envelope::new(DepositOrderCreated {
                    deposit_order_id: id,
                }),
                &ctx,
            )
            .await
            .unwrap()
    }

    pub async fn count(&self, sql: &'static str) -> i64 {
        scalar(self.pool(), sql).await
    }
}

pub async fn seller_amounts(pool: &MySqlPool, id: u64) -> (String, String, String) {
    sqlx::query_as(
        "SELECT CAST(remaining_amount AS CHAR), CAST(reserved_amount AS CHAR), status \
         FROM p2p_withdraw_orders WHERE id = ?",
    )
    .bind(id)
    .fetch_one(pool)
    .await
    .unwrap()
}

pub fn trim(text: &str) -> &str {
    let text = text.trim_end_matches('0');
    text.trim_end_matches('.')
}

/// A World whose quote calls time out after `timeout`.
pub fn with_timeout(world: &World, timeout: Duration, policy: FillPolicy) -> Matcher {
    let mut config = p2p::config(&world.stub, policy, 5);
    config.quote.timeout = timeout;
    config.trade_checks = paybus_retry::RetryPolicy::with_schedule(3, vec![Duration::from_secs(2)])
        .expect("a valid policy");
    world.matcher_with(config)
}

/// paybus's reconciliation with the stub over the last hour (every trade judged).
pub async fn reconciled(world: &World) -> paybus_p2p::reconcile::Reconciliation {
    let now = chrono::Utc::now();
    let mut tx = world.pool().begin().await.unwrap();
    let found = paybus_p2p::reconcile::reconcile(
        &mut tx,
        &world.stub.client(),
        now - chrono::Duration::hours(1),
        now + chrono::Duration::minutes(1),
    )
    .await
    .unwrap();
    tx.rollback().await.unwrap();
    found
}
