//! A deliberately broken confirm-withdrawal, for `paybus-lab chaos`'s own test only (never
//! deployed, never in the catalog): the seed's read-then-update design
//! (`paybus_testkit::confirmations::read_then_update`) in place of the conditional UPDATE, with
//! a short pause between its read and its write standing for the incident's window. Run by the
//! chaos harness with `--substitute confirm-withdrawal=<this binary>`, it must make the run
//! fail: the harness is shown to catch a double debit.

use std::time::Duration;

use paybus_bus::{Context, Envelope, Handler, HandlerError, Outcome, Services};
use paybus_confirmations::WithdrawalTxConfirmed;
use paybus_runtime::function::{BuildError, Function};
use paybus_testkit::confirmations::read_then_update;

/// Between the seed's read and its write (the incident: 64 s; here enough for the duplicates
/// the harness delivers at once to read the same snapshot).
const WINDOW: Duration = Duration::from_millis(100);

struct SeedConfirmWithdrawal;

impl Handler for SeedConfirmWithdrawal {
    type Message = WithdrawalTxConfirmed;
    const FUNCTION: &'static str = "confirm-withdrawal";

    async fn handle(
        &self,
        message: Envelope<WithdrawalTxConfirmed>,
        ctx: &Context<'_>,
    ) -> Result<Outcome, HandlerError> {
        let mut work = ctx.db.begin().await?;
        let data = &message.data;
        let debited = read_then_update(
            &mut work,
            data.withdrawal_id,
            &data.tx_hash,
            tokio::time::sleep(WINDOW),
        )
        .await
        .map_err(HandlerError::rejected)?;
        work.commit().await?;
        Ok(if debited {
            Outcome::Done
        } else {
            Outcome::Skipped("not in flight".into())
        })
    }
}

impl Function for SeedConfirmWithdrawal {
    fn build(_: &Services) -> Result<Self, BuildError> {
        Ok(Self)
    }
}

fn main() -> std::process::ExitCode {
    paybus_runtime::function::main::<SeedConfirmWithdrawal>()
}
