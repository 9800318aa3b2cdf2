//! The checkpointer: moves each recently credited member's can checkpoint over its settled
//! charges (`paybus_bonuses::checkpoint`), so the continuous auditor's balance check reads
//! what a member bought lately rather than everything it ever bought. It runs as often as the
//! auditor passes, reads the members credited within the auditor's window plus the settling
//! time, and checkpoints charges stamped more than twice the auditor's overlap ago (the
//! checkpoint module's docs say why that bound). A checkpointer that stands still costs the
//! auditor time, never a finding: the check reads whatever lies above a checkpoint.

use std::time::Duration;

use paybus_bonuses::checkpoint;
use paybus_maintenance::{Job, JobFuture, JobReport, auditor::AuditorConfig};
use sqlx::MySqlPool;

/// The checkpointer job.
#[derive(Clone)]
pub struct MemberCanCheckpointer {
    pool: MySqlPool,
    interval: Duration,
    touched_within: Duration,
    settled_after: Duration,
}

impl MemberCanCheckpointer {
    /// A checkpointer paced by the auditor's settings.
    pub fn new(pool: MySqlPool, auditor: &AuditorConfig) -> Self {
        let settled_after = auditor.overlap.saturating_mul(2);
        Self {
            pool,
            interval: auditor.interval,
            touched_within: auditor.window.saturating_add(settled_after),
            settled_after,
        }
    }

    pub async fn run_once(&self) -> Result<checkpoint::Advanced, sqlx::Error> {
        let advanced =
            checkpoint::advance(&self.pool, self.touched_within, self.settled_after).await?;
        tracing::debug!(
            members = advanced.members,
            moved = advanced.moved,
            charges = advanced.charges,
            "member can checkpoints moved"
        );
        Ok(advanced)
    }
}

impl Job for MemberCanCheckpointer {
    fn name(&self) -> &'static str {
        "member-can-checkpointer"
    }

    fn interval(&self) -> Duration {
        self.interval
    }

    fn run_once(&self) -> JobFuture<'_> {
        Box::pin(async move {
            let advanced = MemberCanCheckpointer::run_once(self).await?;
            Ok(JobReport {
                changed: advanced.moved,
            })
        })
    }
}
