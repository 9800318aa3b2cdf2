//! grant-bonus tests' harness: a fresh database and vhost per test, the handler, worker and
//! reaper on one manual clock (nothing sleeps for a backoff), purchases completed through the
//! real completion, and a fault that makes every grant fail until it is switched off.
#![allow(dead_code)] // each test binary uses its own part of the harness

use std::time::Duration;

use chrono::{DateTime, Utc};
use paybus_bonuses::{
    BonusJobCreated, BonusRules, Completion,
    charge::{Container, PaymentGateway},
    completion::{self, CompletedCharge},
    job::{self, BonusJob},
};
use paybus_bus::{Batched, Context, Envelope, Handler, Outcome, Services};
use paybus_grant_bonus::{BonusReaper, BonusWorker, GrantBonus, WorkerReport};
use paybus_retry::Clock;
use paybus_testkit::{
    TestEnv,
    bonuses::{self, Purchase},
};
use sqlx::MySqlPool;

/// Fields drop in order: the services' pool and connection go before the test database.
pub struct Bonuses {
    pub services: Services,
    pub clock: Clock,
    pub env: TestEnv,
}

impl Bonuses {
    pub async fn new() -> Self {
        let env = TestEnv::new().await;
        let services = env.services(&[GrantBonus::queue()]).await;
        let clock = Clock::manual(bonuses::db_now(&env.db).await);
        Self {
            services,
            clock,
            env,
        }
    }

    pub fn pool(&self) -> &MySqlPool {
        &self.env.db
    }

    /// What the clock reads now.
    pub fn now(&self) -> DateTime<Utc> {
        self.clock.sql_now().expect("a manual clock")
    }

    pub fn advance(&self, by: Duration) {
        self.clock.advance(by);
    }

    pub fn handler(&self) -> GrantBonus {
        GrantBonus::default().with_clock(self.clock.clone())
    }

    pub fn worker(&self) -> BonusWorker {
        BonusWorker::new(self.pool().clone(), Duration::from_secs(300), 30)
            .with_clock(self.clock.clone())
    }

    pub fn reaper(&self, timeout: Duration) -> BonusReaper {
        BonusReaper::new(self.pool().clone(), timeout).with_clock(self.clock.clone())
    }

    /// One worker run.
    pub async fn run_worker(&self) -> WorkerReport {
        self.worker().run_once().await.expect("a worker run")
    }

    /// `charge.bonus_job.created {job_id}` handled as its `attempt`-th delivery.
    pub async fn deliver_as(&self, job_id: u64, attempt: u32) -> Outcome {
        let ctx = Context {
            db: &self.services.outbox,
            attempt,
        };
        self.handler()
            .handle(Envelope::new(BonusJobCreated { job_id }), &ctx)
            .await
            .expect("the handler reaches an outcome")
    }

    pub async fn deliver(&self, job_id: u64) -> Outcome {
        self.deliver_as(job_id, 1).await
    }

    /// `charge.bonus_job.created` for each of `job_ids`, delivered together as one batch (first
    /// deliveries).
    pub async fn deliver_batch(&self, job_ids: &[u64]) -> Vec<Outcome> {
        let messages = job_ids
            .iter()
            .map(|&job_id| Batched {
                message: Envelope::new(BonusJobCreated { job_id }),
                attempt: 1,
            })
            .collect();
        self.handler()
            .handle_batch(messages, &self.services.outbox)
            .await
            .into_iter()
            .map(|outcome| outcome.expect("the handler reaches an outcome"))
            .collect()
    }

    /// A member's purchase of `cans` through PG, completed by its gateway.
    pub async fn completed_purchase(&self, cans: i32, rules: BonusRules) -> CompletedCharge {
        let member = bonuses::member(self.pool()).await;
        self.complete(
            &bonuses::purchase(self.pool(), member, PaymentGateway::Pg, cans).await,
            rules,
        )
        .await
    }

    pub async fn complete(&self, purchase: &Purchase, rules: BonusRules) -> CompletedCharge {
        match completion::complete(&self.services.outbox, rules, &purchase.paid())
            .await
            .expect("the completion commits")
        {
            Completion::Completed(charge) => charge,
            other => panic!("not completed now: {other:?}"),
        }
    }

    pub async fn job(&self, id: u64) -> BonusJob {
        let mut conn = self.pool().acquire().await.expect("a connection");
        job::find(&mut conn, id)
            .await
            .expect("read the job")
            .expect("the job exists")
    }

    /// From now on every grant fails: the database refuses bonus (EVENT) charges.
    /// A transaction holding the member's row lock (every grant of the member waits on it
    /// until it is rolled back).
    pub async fn hold_member(&self, member_id: u64) -> sqlx::Transaction<'static, sqlx::MySql> {
        let mut blocker = self.pool().begin().await.expect("a transaction");
        sqlx::query("SELECT id FROM members WHERE id = ? FOR UPDATE")
            .bind(member_id)
            .fetch_one(&mut *blocker)
            .await
            .expect("the member's lock");
        blocker
    }

    /// Whether, within 30 s, at least `count` transactions of this test's database wait on a
    /// row lock.
    pub async fn lock_waits(&self, count: i64) -> bool {
        paybus_testkit::eventually(Duration::from_secs(30), || async {
            self.count(
                "SELECT COUNT(*) FROM information_schema.INNODB_TRX t \
                 JOIN information_schema.PROCESSLIST p ON p.ID = t.trx_mysql_thread_id \
                 WHERE t.trx_state = 'LOCK WAIT' AND p.DB = DATABASE()",
            )
            .await
                >= count
        })
        .await
    }

    pub async fn break_grants(&self) {
        sqlx::raw_sql(
            "CREATE TRIGGER fault_refuse_bonus_charges BEFORE INSERT ON charges FOR EACH ROW \
             IF NEW.status = 'EVENT' THEN \
                 SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'injected fault: bonus charges refused'; \
             END IF",
        )
        .execute(self.pool())
        .await
        .expect("switch the fault on");
    }

    pub async fn repair_grants(&self) {
        sqlx::raw_sql("DROP TRIGGER fault_refuse_bonus_charges")
            .execute(self.pool())
            .await
            .expect("switch the fault off");
    }

    /// The member's bonus was granted exactly once: one EVENT charge in all, the member's pg
    /// balance `cans` (the payment and the bonus), and the audit clean.
    pub async fn assert_granted_once(&self, member_id: u64, cans: i32) {
        assert_eq!(
            self.count("SELECT COUNT(*) FROM charges WHERE status = 'EVENT'")
                .await,
            1,
            "one EVENT charge"
        );
        assert_eq!(
            bonuses::cans(self.pool(), member_id, Container::Pg).await,
            cans,
            "the payment and its bonus, once"
        );
        bonuses::assert_audit_clean(self.pool()).await;
    }

    pub async fn count(&self, sql: &'static str) -> i64 {
        paybus_testkit::scalar(self.pool(), sql).await
    }
}

/// An active event giving 10% more, once per member.
pub async fn ten_percent_event(pool: &MySqlPool) -> u64 {
    bonuses::active_event(pool, "spring 10% bonus", 10, 1).await
}

pub fn minutes(n: u64) -> Duration {
    Duration::from_secs(n * 60)
}
