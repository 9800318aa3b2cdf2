//! A rolling deploy as a run's fault schedule (`paybus-lab upgrade`): the fleet starts on an
//! earlier release's binaries and schema; under load, this release's migrations are applied
//! by its own `paybus migrate` (and topology), every process is replaced by this release's
//! binary one at a time (SIGTERM: in-flight work finishes first), then the code is rolled
//! back to the earlier release the same way, on the new schema. Each step is a line of the
//! fault log, so the report and the timeline show the deploy where the chaos run shows faults.

use std::{
    collections::{BTreeMap, HashMap},
    path::{Path, PathBuf},
    sync::Arc,
    time::{Duration, Instant},
};

use anyhow::{Context, bail};
use serde::Serialize;

use super::{
    checks::{self, Violation},
    faults::Fault,
    fleet::{Binary, Fleet},
    outside::{API_PROCESS, Api},
};
use crate::{
    finished::{Workflow, finished},
    release::Release,
};

/// One side of the deploy: a release and the folder of its binaries.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Side {
    #[serde(flatten)]
    pub(crate) release: Release,
    pub(crate) bin_dir: PathBuf,
}

impl Side {
    /// `name`'s binary of this side, as the fleet runs it (`paybus serve` for the API).
    fn binary(&self, name: &str) -> Binary {
        if name == API_PROCESS {
            Binary {
                name: name.to_owned(),
                path: self.paybus(),
                args: vec!["serve".to_owned()],
            }
        } else {
            Binary {
                name: name.to_owned(),
                path: self.bin_dir.join(name),
                args: Vec::new(),
            }
        }
    }

    pub(crate) fn paybus(&self) -> PathBuf {
        self.bin_dir.join("paybus")
    }
}

/// What the deploy does, and when (on the run's clock).
#[derive(Debug, Clone)]
pub(crate) struct Plan {
    pub(crate) from: Side,
    pub(crate) to: Side,
    /// The processes in the order they are replaced (rolled back in the reverse order).
    pub(crate) order: Vec<String>,
    /// SQL applied right after the new release's migrations, as one more migration would be:
    /// a contract-breaking change the run must catch.
    pub(crate) planted: Option<PathBuf>,
    /// The deploy's window: the migrations at a tenth of it, the replacements spread over
    /// its second fifth, the rollback over the fifth after its middle; the load, over four
    /// fifths of it, meets the earlier code on the new schema before and after them.
    pub(crate) window: Duration,
    /// How long a new process must stay up before the next is replaced.
    pub(crate) settle: Duration,
    /// The settings `paybus migrate` and `paybus topology` read.
    pub(crate) env: HashMap<String, String>,
}

/// What the deploy did: its steps as fault lines, who ran which release when, and what went
/// wrong in the deploy itself (a migration refused, a process that would not stay up).
#[derive(Debug, Default)]
pub(crate) struct Deployed {
    pub(crate) steps: Vec<Fault>,
    /// (seconds on the run's clock, processes on the new release) at every change.
    pub(crate) on_new: Vec<(f64, usize)>,
    pub(crate) violations: Vec<Violation>,
    /// What the new release's `paybus migrate` printed.
    pub(crate) migrations: String,
}

/// The run's figures of the deploy.
#[derive(Debug, Clone, Serialize)]
pub struct DeployFigures {
    pub from: Release,
    pub to: Release,
    pub processes: usize,
    /// Replacements that went through, both ways.
    pub replaced: usize,
    /// The longest a replaced process took to finish its in-flight work and exit.
    pub slowest_stop_ms: u64,
    /// What the migrations' step printed (`paybus migrate`).
    pub migrations: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub planted: Option<PathBuf>,
    /// (seconds on the run's clock, processes on the new release) at every change.
    pub on_new: Vec<(f64, usize)>,
    /// What each workflow finished in each stretch of the deploy (none where the workflows'
    /// timestamps could not be read).
    pub phases: Vec<Phase>,
}

/// A stretch of the deploy, and the items each workflow finished in it (by the workflows'
/// own timestamps).
#[derive(Debug, Clone, Serialize)]
pub struct Phase {
    pub name: String,
    pub from_s: f64,
    pub to_s: f64,
    pub finished: BTreeMap<&'static str, usize>,
}

impl Phase {
    /// The stretches of a deploy whose steps are `steps`, up to `end_s`: the earlier release
    /// on its schema, then on the new one, rolling out, the new release, rolling back, and the
    /// earlier release on the new schema again. A stretch whose bounds a failed step left
    /// unknown is left out.
    pub(crate) fn stretches(steps: &[Fault], end_s: f64, from: &str, to: &str) -> Vec<Self> {
        let end_of = |s: &Fault| s.at_s + s.lasts_ms.unwrap_or(s.took_ms) as f64 / 1e3;
        let migrated = steps
            .iter()
            .filter(|s| s.what.starts_with("migrations of ") || s.what.starts_with("planted "))
            .map(end_of)
            .reduce(f64::max);
        let replaced = |direction: &str| -> Option<(f64, f64)> {
            let steps: Vec<&Fault> = steps
                .iter()
                .filter(|s| s.what.starts_with(direction) && !s.what.ends_with("FAILED"))
                .collect();
            Some((steps.first()?.at_s, end_of(steps.last()?)))
        };
        let (Some(migrated), Some(out), Some(back)) =
            (migrated, replaced("deploy "), replaced("roll back "))
        else {
            return Vec::new();
        };
        [
            (format!("{from} on its schema"), 0.0, migrated),
            (format!("{from} on {to}'s schema"), migrated, out.0),
            ("rolling out".to_owned(), out.0, out.1),
            (to.to_owned(), out.1, back.0),
            ("rolling back".to_owned(), back.0, back.1),
            (
                format!("{from} on {to}'s schema, rolled back"),
                back.1,
                end_s,
            ),
        ]
        .into_iter()
        .map(|(name, from_s, to_s)| Self {
            name,
            from_s,
            to_s,
            finished: BTreeMap::new(),
        })
        .collect()
    }

    /// Counts what each workflow finished in each of `phases`; `zero`: the run's clock's 0
    /// on the wall clock.
    pub(crate) async fn count(
        phases: &mut [Self],
        pool: &sqlx::MySqlPool,
        zero: chrono::DateTime<chrono::Utc>,
    ) -> Result<(), sqlx::Error> {
        let wall = |s: f64| zero + chrono::Duration::microseconds((s * 1e6) as i64);
        for phase in phases {
            for workflow in Workflow::ALL {
                let items = finished(pool, workflow, wall(phase.from_s), wall(phase.to_s)).await?;
                phase.finished.insert(workflow.name(), items.len());
            }
        }
        Ok(())
    }
}

impl DeployFigures {
    pub(crate) fn of(
        plan: &Plan,
        steps: &[Fault],
        on_new: Vec<(f64, usize)>,
        migrations: String,
    ) -> Self {
        let replacements = steps.iter().filter(|s| s.lasts_ms.is_some());
        Self {
            from: plan.from.release.clone(),
            to: plan.to.release.clone(),
            processes: plan.order.len(),
            replaced: replacements.clone().count(),
            slowest_stop_ms: replacements.map(|s| s.took_ms).max().unwrap_or(0),
            migrations,
            planted: plan.planted.clone(),
            on_new,
            phases: Vec::new(),
        }
    }
}

/// The settings a release's `paybus migrate` and `paybus topology` read: the run's database,
/// broker and queue layout.
pub(crate) fn environment(settings: &paybus_config::Settings) -> HashMap<String, String> {
    [
        ("PAYBUS_DATABASE_URL", settings.database.url.to_string()),
        ("PAYBUS_AMQP_URL", settings.broker.to_env_value()),
        (
            paybus_config::Shards::VARIABLE,
            settings.broker.shards.to_string(),
        ),
        // migrate seals the partners' plaintext webhook secrets with it.
        ("PAYBUS_SECRETS_KEY", paybus_testkit::SECRETS_KEY.to_owned()),
        ("RUST_LOG", "warn".to_owned()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect()
}

/// Runs `paybus <args>` of a release with `env`; what it printed.
pub(crate) async fn paybus(
    paybus: &Path,
    args: &[&str],
    env: &HashMap<String, String>,
) -> anyhow::Result<String> {
    let output = tokio::process::Command::new(paybus)
        .args(args)
        .envs(env)
        .stdin(std::process::Stdio::null())
        .output()
        .await
        .with_context(|| format!("running {} {}", paybus.display(), args.join(" ")))?;
    if !output.status.success() {
        bail!(
            "{} {}: {} {}",
            paybus.display(),
            args.join(" "),
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&output.stdout).trim().to_owned())
}

/// Applies `side`'s migrations and declares its topology, as its deploy does first.
pub(crate) async fn migrate(side: &Side, env: &HashMap<String, String>) -> anyhow::Result<String> {
    let migrated = paybus(&side.paybus(), &["migrate"], env).await?;
    paybus(&side.paybus(), &["topology"], env).await?;
    Ok(migrated)
}

/// Plays `plan` on `fleet` from `started` (the run's clock), waiting for the API after each
/// of its replacements.
pub(crate) async fn run(
    plan: Plan,
    fleet: Arc<Fleet>,
    api: Api,
    pool: sqlx::MySqlPool,
    started: Instant,
) -> Deployed {
    let mut deployed = Deployed::default();
    let at = |fraction: f64| started + plan.window.mul_f64(fraction);
    let clock = |instant: Instant| instant.saturating_duration_since(started).as_secs_f64();
    deployed.on_new.push((0.0, 0));

    tokio::time::sleep_until(at(0.1).into()).await;
    let began = Instant::now();
    deployed.migrations = match migrate(&plan.to, &plan.env).await {
        Ok(printed) => printed,
        Err(e) => {
            deployed.violations.push(checks::violation(
                "deploy_migration_failed",
                format!("{} migrations: {e:#}", plan.to.release.version),
            ));
            String::new()
        }
    };
    deployed.steps.push(Fault {
        at_s: clock(began),
        what: format!(
            "migrations of {}: {}",
            plan.to.release.version, deployed.migrations
        ),
        took_ms: began.elapsed().as_millis() as u64,
        lasts_ms: None,
    });
    if let Some(planted) = &plan.planted {
        let began = Instant::now();
        if let Err(e) = plant(&pool, planted).await {
            deployed.violations.push(checks::violation(
                "deploy_migration_failed",
                format!("the planted migration: {e:#}"),
            ));
        }
        deployed.steps.push(Fault {
            at_s: clock(began),
            what: format!("planted migration {}", planted.display()),
            took_ms: began.elapsed().as_millis() as u64,
            lasts_ms: None,
        });
    }

    let forward: Vec<&String> = plan.order.iter().collect();
    let back: Vec<&String> = plan.order.iter().rev().collect();
    for (direction, names, from, to, begin, end) in [
        ("deploy", forward, &plan.from, &plan.to, 0.2, 0.4),
        ("roll back", back, &plan.to, &plan.from, 0.5, 0.7),
    ] {
        let spacing = (end - begin) / names.len().max(1) as f64;
        for (i, name) in names.into_iter().enumerate() {
            tokio::time::sleep_until(at(begin + spacing * i as f64).into()).await;
            let began = Instant::now();
            let replaced = fleet
                .replace(name, to.binary(name), plan.settle)
                .await
                .map(|replaced| (replaced, name == API_PROCESS));
            let ready = match &replaced {
                Ok((_, true)) => api.ready(Duration::from_secs(60)).await,
                _ => Ok(()),
            };
            let what = format!(
                "{direction} {name}: {} → {}",
                from.release.version, to.release.version
            );
            match replaced.and_then(|r| ready.map(|()| r.0)) {
                Ok(replaced) => {
                    let on_new = deployed.on_new.last().map_or(0, |(_, n)| *n);
                    let on_new = if direction == "deploy" {
                        on_new + 1
                    } else {
                        on_new.saturating_sub(1)
                    };
                    deployed.on_new.push((clock(Instant::now()), on_new));
                    deployed.steps.push(Fault {
                        at_s: clock(began),
                        what,
                        took_ms: replaced.stopped_in.as_millis() as u64,
                        lasts_ms: Some(replaced.up_in.as_millis() as u64),
                    });
                }
                Err(e) => {
                    deployed.violations.push(checks::violation(
                        "deploy_process_not_up",
                        format!("{what}: {e:#}"),
                    ));
                    deployed.steps.push(Fault {
                        at_s: clock(began),
                        what: format!("{what} FAILED"),
                        took_ms: began.elapsed().as_millis() as u64,
                        lasts_ms: None,
                    });
                }
            }
        }
    }
    deployed
}

/// Applies the planted migration's statements, in one session.
async fn plant(pool: &sqlx::MySqlPool, path: &Path) -> anyhow::Result<()> {
    let sql = tokio::fs::read_to_string(path)
        .await
        .with_context(|| format!("reading {}", path.display()))?;
    sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
        .execute(pool)
        .await
        .with_context(|| format!("applying {}", path.display()))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn step(at_s: f64, what: &str, took_ms: u64, lasts_ms: Option<u64>) -> Fault {
        Fault {
            at_s,
            what: what.to_owned(),
            took_ms,
            lasts_ms,
        }
    }

    #[test]
    fn the_stretches_run_from_the_migrations_through_the_rollout_and_the_rollback_to_the_end() {
        let steps = [
            step(7.5, "migrations of 0.4.0: 70 known", 500, None),
            step(15.0, "deploy a: 0.3.0 → 0.4.0", 20, Some(1_000)),
            step(17.0, "deploy b: 0.3.0 → 0.4.0", 30, Some(1_200)),
            step(40.0, "roll back b: 0.4.0 → 0.3.0", 20, Some(1_000)),
            step(42.0, "roll back a: 0.4.0 → 0.3.0", 20, Some(1_500)),
        ];
        let stretches: Vec<(String, f64, f64)> = Phase::stretches(&steps, 80.0, "0.3.0", "0.4.0")
            .into_iter()
            .map(|p| (p.name, p.from_s, p.to_s))
            .collect();
        let expected = [
            ("0.3.0 on its schema", 0.0, 8.0),
            ("0.3.0 on 0.4.0's schema", 8.0, 15.0),
            ("rolling out", 15.0, 18.2),
            ("0.4.0", 18.2, 40.0),
            ("rolling back", 40.0, 43.5),
            ("0.3.0 on 0.4.0's schema, rolled back", 43.5, 80.0),
        ];
        assert_eq!(stretches.len(), expected.len(), "{stretches:?}");
        for ((name, from, to), (want, want_from, want_to)) in stretches.iter().zip(expected) {
            assert_eq!(name, want);
            assert!((from - want_from).abs() < 1e-9, "{name}: {from}");
            assert!((to - want_to).abs() < 1e-9, "{name}: {to}");
        }
    }

    #[test]
    fn a_rollout_that_never_went_through_has_no_stretches() {
        let steps = [
            step(7.5, "migrations of 0.4.0: 70 known", 500, None),
            step(15.0, "deploy a: 0.3.0 → 0.4.0 FAILED", 60_000, None),
            step(40.0, "roll back a: 0.4.0 → 0.3.0", 20, Some(1_500)),
        ];
        assert!(Phase::stretches(&steps, 80.0, "0.3.0", "0.4.0").is_empty());
    }
}
