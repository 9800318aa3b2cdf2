//! The payment completion: the one REQUEST -> COMPLETE transition behind every gateway path
//! (webhooks and verify calls of PG, PAYVERSE, HECTO, GOOGLE_IAP and APPLE_IAP), with the
//! member's credit and the bonus jobs it owes, in one READ COMMITTED transaction; the flow is in
//! docs/workflows/bonuses.md.
//!
//! 1. One UPDATE makes the transition and credits the charge's container
//!    ([`charge::complete_and_credit`]); its affected rows decide (principle 1), and on 0 a
//!    locking read says why (a repeat of the same payment returns the original result).
//! 2. The bonuses owed (FIRST_CHARGE, ACTIVE_CHARGE_EVENT) are decided under the member's lock,
//!    so the counts see every other completion and grant of the member
//!    ([`event::charge_and_standing`]).
//! 3. One `charge_event_job` row per bonus and its message, through the outbox.
//!
//! Lock order: the charge, then the member; a grant locks its jobs, then the member, and a
//! completion locks no existing job, so the two never wait on each other in a cycle.

use chrono::{DateTime, Utc};
use paybus_bus::{Outbox, UnitOfWork, outbox::OutboxError};
use paybus_config::{ConfigError, Setting, Vars};
use paybus_db as db;
use paybus_money::Amount;
use serde::Serialize;
use sqlx::MySqlConnection;
use uuid::Uuid;

use crate::{
    BonusError,
    charge::{self, Charge, ChargeStatus, Container, PaymentGateway, PaymentStatus},
    event,
    job::{self, BonusJob, JobStatus, JobType, NewJob},
};

/// InnoDB's "deadlock found; try restarting transaction".
const DEADLOCK: u16 = 1213;

/// The reason recorded on a first-charge bonus (its EVENT charge's method).
pub const FIRST_CHARGE_METHOD: &str = "first charge bonus";

pub const VAR_FIRST_CHARGE_BONUS_PERCENT: Setting = Setting {
    name: "PAYBUS_FIRST_CHARGE_BONUS_PERCENT",
    default: "`0`",
    about: "a member's first completed purchase earns this percent of its cans as a \
            FIRST_CHARGE bonus (0 to 1000); 0: none",
};

/// What [`BonusRules::read`] reads.
pub const SETTINGS: &[Setting] = &[VAR_FIRST_CHARGE_BONUS_PERCENT];

/// The bonus rules that are configuration rather than rows (events are rows).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BonusRules {
    /// A member's first completed purchase earns this percent of its cans as a FIRST_CHARGE
    /// bonus (`PAYBUS_FIRST_CHARGE_BONUS_PERCENT`, 0 to 1000). Default 0: no first-charge
    /// bonus until one is configured (an unset setting never hands out cans).
    pub first_charge_percent: u32,
}

impl BonusRules {
    pub fn read(vars: &Vars) -> Result<Self, ConfigError> {
        Ok(Self {
            first_charge_percent: vars.parse(
                VAR_FIRST_CHARGE_BONUS_PERCENT,
                0,
                "a whole percent from 0 to 1000",
                |percent: &u32| *percent <= 1_000,
            )?,
        })
    }
}

/// A gateway's word that a charge is paid (a webhook, or a verify call's verdict).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PaymentCompletion {
    pub charge_id: u64,
    pub gateway: PaymentGateway,
    /// The gateway's id of the payment (receipt, transaction or order id).
    pub gateway_tx_id: String,
    /// What the gateway says was paid; must equal the charge's price.
    pub amount: Amount,
}

impl PaymentCompletion {
    pub(crate) fn payment(&self) -> charge::Payment<'_> {
        charge::Payment {
            charge_id: self.charge_id,
            gateway: self.gateway,
            gateway_tx_id: &self.gateway_tx_id,
            amount: self.amount,
        }
    }
}

/// A completed charge as the completion reports it, the first time and on every repeat.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CompletedCharge {
    pub charge_id: u64,
    pub member_id: u64,
    pub payment_gateway: PaymentGateway,
    pub gateway_tx_id: Option<String>,
    pub container: Container,
    /// Cans credited by the payment itself.
    pub cans: i32,
    pub completed_at: Option<DateTime<Utc>>,
    pub bonus_jobs: Vec<OwedBonus>,
}

/// A bonus job of the completed charge.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct OwedBonus {
    pub job_id: u64,
    pub job_type: JobType,
    pub charge_event_id: Option<u64>,
    pub additional_can: i32,
    pub status: JobStatus,
}

impl From<BonusJob> for OwedBonus {
    fn from(job: BonusJob) -> Self {
        Self {
            job_id: job.id,
            job_type: job.job_type,
            charge_event_id: job.charge_event_id,
            additional_can: job.additional_can,
            status: job.status,
        }
    }
}

/// What a completion did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Completion {
    /// This call completed the charge: credited, bonus jobs written, committed.
    Completed(CompletedCharge),
    /// The same gateway payment completed it before: the original result; nothing written.
    AlreadyCompleted(CompletedCharge),
}

impl Completion {
    pub fn charge(&self) -> &CompletedCharge {
        match self {
            Completion::Completed(charge) | Completion::AlreadyCompleted(charge) => charge,
        }
    }
}

/// Why a completion was refused (nothing was written), or could not run.
#[derive(Debug, thiserror::Error)]
pub enum CompleteError {
    #[error("charge {0} does not exist")]
    UnknownCharge(u64),
    #[error("charge {0} is a bonus (EVENT) charge, not a payment")]
    NotAPayment(u64),
    #[error("charge {charge_id} is paid through {expected}, not {presented}")]
    WrongGateway {
        charge_id: u64,
        expected: PaymentGateway,
        presented: PaymentGateway,
    },
    #[error("charge {charge_id} costs {expected}, but the gateway reports {presented}")]
    WrongAmount {
        charge_id: u64,
        expected: Amount,
        presented: Amount,
    },
    #[error("{gateway} payment {gateway_tx_id:?} already completed charge {other_charge_id}")]
    PaymentUsed {
        gateway: PaymentGateway,
        gateway_tx_id: String,
        other_charge_id: u64,
    },
    #[error(
        "charge {charge_id} was completed by {gateway} payment {recorded:?}, not {presented:?}"
    )]
    CompletedByAnotherPayment {
        charge_id: u64,
        gateway: PaymentGateway,
        recorded: String,
        presented: String,
    },
    #[error(transparent)]
    Bonus(#[from] BonusError),
}

impl From<sqlx::Error> for CompleteError {
    fn from(error: sqlx::Error) -> Self {
        CompleteError::Bonus(BonusError::Database(error))
    }
}

impl From<OutboxError> for CompleteError {
    fn from(error: OutboxError) -> Self {
        CompleteError::Bonus(BonusError::Outbox(error))
    }
}

impl CompleteError {
    /// The client's request cannot succeed as sent (as opposed to a fault of ours or of the
    /// database).
    pub fn is_refusal(&self) -> bool {
        !matches!(self, CompleteError::Bonus(_))
    }

    /// InnoDB chose the completion's transaction as a deadlock's victim and rolled it back
    /// whole: nothing of it stands, so it may simply run again.
    pub fn is_deadlock(&self) -> bool {
        let database = match self {
            CompleteError::Bonus(BonusError::Database(e))
            | CompleteError::Bonus(BonusError::Outbox(OutboxError::Database(e))) => e,
            _ => return false,
        };
        db::error_number(database) == Some(DEADLOCK)
    }
}

/// Completes the payment in a transaction of its own and commits it; see the module docs.
#[tracing::instrument(skip_all, fields(charge_id = request.charge_id, gateway = %request.gateway))]
pub async fn complete(
    outbox: &Outbox,
    rules: BonusRules,
    request: &PaymentCompletion,
) -> Result<Completion, CompleteError> {
    let mut uow = outbox.begin_read_committed().await?;
    let result = complete_in(&mut uow, rules, request, Uuid::now_v7()).await;
    match result {
        Ok(completion @ Completion::Completed(_)) => {
            uow.commit().await?;
            Ok(completion)
        }
        other => {
            if let Err(rollback) = uow.rollback().await {
                tracing::warn!(%rollback, "rolling back a completion that wrote nothing failed");
            }
            other
        }
    }
}

/// The completion in the caller's transaction (READ COMMITTED: [`Outbox::begin_read_committed`];
/// commit it on `Completed`, roll it back otherwise).
pub async fn complete_in(
    uow: &mut UnitOfWork<'_>,
    rules: BonusRules,
    request: &PaymentCompletion,
    correlation_id: Uuid,
) -> Result<Completion, CompleteError> {
    let id = request.charge_id;
    let transitioned = charge::complete_and_credit(uow, request.payment()).await;
    match transitioned {
        Ok(true) => {}
        Ok(false) => return not_completed(uow, request).await,
        Err(BonusError::Database(e)) if db::is_duplicate_on(&e, "uk_charges_gateway_tx") => {
            let other = charge::completed_by(uow, request.gateway, &request.gateway_tx_id).await?;
            tracing::warn!(charge_id = id, gateway = %request.gateway,
                gateway_tx_id = %request.gateway_tx_id, other_charge_id = other,
                "gateway payment presented for a second charge; refused");
            return Err(CompleteError::PaymentUsed {
                gateway: request.gateway,
                gateway_tx_id: request.gateway_tx_id.clone(),
                other_charge_id: other.unwrap_or_default(),
            });
        }
        Err(e) => return Err(e.into()),
    }

    let (charge, standing) =
        event::charge_and_standing(uow, id)
            .await?
            .ok_or(BonusError::Vanished {
                entity: "charge",
                id,
            })?;
    let completed = write_owed_bonuses(uow, rules, charge, standing, correlation_id).await?;
    Ok(Completion::Completed(completed))
}

/// A just-completed charge's bonus jobs (decided under its member's lock: `standing` read
/// after the credit) and their messages, in the completion's transaction; what the completion
/// reports.
pub(crate) async fn write_owed_bonuses(
    uow: &mut UnitOfWork<'_>,
    rules: BonusRules,
    charge: Charge,
    standing: Option<event::Standing>,
    correlation_id: Uuid,
) -> Result<CompletedCharge, CompleteError> {
    let mut bonus_jobs = Vec::new();
    for new in owed_bonuses(uow, rules, &charge, standing).await? {
        if let Some(job_id) = job::enqueue(uow, &new, correlation_id).await? {
            bonus_jobs.push(OwedBonus {
                job_id,
                job_type: new.job_type,
                charge_event_id: new.charge_event_id,
                additional_can: new.additional_can,
                status: JobStatus::Pending,
            });
        }
    }
    tracing::info!(charge_id = charge.id, member_id = charge.member_id, cans = charge.cans,
        container = %charge.container, bonus_jobs = bonus_jobs.len(), "payment completed");
    Ok(completed(charge, bonus_jobs))
}

fn completed(charge: Charge, bonus_jobs: Vec<OwedBonus>) -> CompletedCharge {
    CompletedCharge {
        charge_id: charge.id,
        member_id: charge.member_id,
        payment_gateway: charge.payment_gateway,
        gateway_tx_id: charge.gateway_tx_id,
        container: charge.container,
        cans: charge.cans,
        completed_at: charge.completed_at,
        bonus_jobs,
    }
}

/// The transition matched nothing: the latest committed charge (a locking read) says why. A
/// repeat of the payment that completed it is the original result; anything else is refused.
async fn not_completed(
    conn: &mut MySqlConnection,
    request: &PaymentCompletion,
) -> Result<Completion, CompleteError> {
    let id = request.charge_id;
    let Some(charge) = charge::find_locked(conn, id).await? else {
        return Err(CompleteError::UnknownCharge(id));
    };
    if charge.status == ChargeStatus::Event {
        return Err(CompleteError::NotAPayment(id));
    }
    if charge.payment_gateway != request.gateway {
        return Err(CompleteError::WrongGateway {
            charge_id: id,
            expected: charge.payment_gateway,
            presented: request.gateway,
        });
    }
    if charge.price != Some(request.amount) {
        return Err(CompleteError::WrongAmount {
            charge_id: id,
            expected: charge.price.unwrap_or(Amount::ZERO),
            presented: request.amount,
        });
    }
    match (charge.payment_status, charge.gateway_tx_id.as_deref()) {
        (PaymentStatus::Complete, Some(recorded)) if recorded == request.gateway_tx_id => {
            tracing::info!(
                charge_id = id,
                "payment completed before; returning that result"
            );
            let jobs = job::for_charge(conn, id).await?;
            Ok(Completion::AlreadyCompleted(completed(
                charge,
                jobs.into_iter().map(OwedBonus::from).collect(),
            )))
        }
        (PaymentStatus::Complete, recorded) => {
            tracing::warn!(charge_id = id, recorded, presented = %request.gateway_tx_id,
                "charge completed by another gateway payment");
            Err(CompleteError::CompletedByAnotherPayment {
                charge_id: id,
                gateway: charge.payment_gateway,
                recorded: recorded.unwrap_or_default().to_owned(),
                presented: request.gateway_tx_id.clone(),
            })
        }
        // The UPDATE read the same latest committed row under the same lock; a REQUEST that
        // matches every condition cannot be here.
        (PaymentStatus::Request, _) => Err(BonusError::Inconsistent(format!(
            "charge {id} is REQUEST with this gateway and price, yet the completion matched nothing"
        ))
        .into()),
    }
}

/// The bonuses a just-completed charge owes (decided under the member's lock), `standing` its
/// member's in the event that applies now ([`event::charge_and_standing`]).
async fn owed_bonuses(
    conn: &mut MySqlConnection,
    rules: BonusRules,
    charge: &Charge,
    standing: Option<event::Standing>,
) -> Result<Vec<NewJob>, sqlx::Error> {
    let owed = |job_type, charge_event_id, additional_can, method_snapshot: &str| NewJob {
        source_charge_id: charge.id,
        member_id: charge.member_id,
        charge_event_id,
        job_type,
        additional_can,
        payment_gateway: charge.payment_gateway,
        container: charge.container,
        method_snapshot: method_snapshot.to_owned(),
    };
    let mut bonuses = Vec::new();
    if rules.first_charge_percent > 0
        && charge::is_first_completed_purchase(conn, charge.member_id).await?
        && let Some(cans) = bonus_cans(charge.cans, rules.first_charge_percent)
    {
        bonuses.push(owed(JobType::FirstCharge, None, cans, FIRST_CHARGE_METHOD));
    }
    if let Some(event::Standing {
        event,
        granted,
        owed: owed_already,
    }) = standing
    {
        let (granted, owed_already) = (
            u64::try_from(granted).unwrap_or(0),
            u64::try_from(owed_already).unwrap_or(0),
        );
        let limit = u64::try_from(event.available_count).unwrap_or(0);
        let percent = u32::try_from(event.add_percent).unwrap_or(0);
        if granted + owed_already >= limit {
            tracing::info!(
                member_id = charge.member_id,
                event_id = event.id,
                granted,
                owed = owed_already,
                limit,
                "member reached the event's bonus limit"
            );
        } else if let Some(cans) = bonus_cans(charge.cans, percent) {
            bonuses.push(owed(
                JobType::ActiveChargeEvent,
                Some(event.id),
                cans,
                &event.title,
            ));
        }
    }
    Ok(bonuses)
}

/// floor(cans × percent / 100); `None` when that is no can at all (or past an INT).
pub fn bonus_cans(cans: i32, percent: u32) -> Option<i32> {
    let bonus = i64::from(cans) * i64::from(percent) / 100;
    i32::try_from(bonus).ok().filter(|cans| *cans > 0)
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    #[test]
    fn a_bonus_is_the_floor_of_the_percentage_and_never_zero() {
        assert_eq!(bonus_cans(100, 10), Some(10));
        assert_eq!(bonus_cans(15, 10), Some(1));
        assert_eq!(bonus_cans(9, 10), None);
        assert_eq!(bonus_cans(i32::MAX, 1_000), None);
    }

    #[test]
    fn the_first_charge_bonus_is_off_unless_configured() {
        let read = |pairs: &[(Setting, &str)]| {
            BonusRules::read(&Vars::new(
                pairs
                    .iter()
                    .map(|(k, v)| (k.name.to_owned(), (*v).to_owned()))
                    .collect::<HashMap<_, _>>(),
            ))
        };
        assert_eq!(read(&[]), Ok(BonusRules::default()));
        assert_eq!(
            read(&[(VAR_FIRST_CHARGE_BONUS_PERCENT, "100")]).map(|r| r.first_charge_percent),
            Ok(100)
        );
        for bad in ["-1", "1001", "ten"] {
            let error = read(&[(VAR_FIRST_CHARGE_BONUS_PERCENT, bad)]).unwrap_err();
            assert_eq!(error.variable, VAR_FIRST_CHARGE_BONUS_PERCENT.name);
        }
    }

    #[test]
    fn every_documented_default_is_the_default() {
        for (name, environment) in paybus_config::setting::documented_defaults(SETTINGS) {
            assert_eq!(
                BonusRules::read(&Vars::new(environment)),
                Ok(BonusRules::default()),
                "{name}"
            );
        }
    }
}
