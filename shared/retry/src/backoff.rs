//! How long to wait before trying again: the one backoff type of paybus. The runtime's
//! requeue pause, a failing sweeper job, the broker link's reconnection and every row-backed
//! retry schedule are all a [`Backoff`].

use std::{borrow::Cow, time::Duration};

/// The pause after the n-th consecutive failure (n = 1 for the first).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Backoff {
    /// `initial` after the first failure, doubling after each one, never more than `max`.
    Exponential { initial: Duration, max: Duration },
    /// `steps[n - 1]` after the n-th failure; past the end the last step repeats (the cap).
    Schedule(Cow<'static, [Duration]>),
}

impl Backoff {
    pub const fn exponential(initial: Duration, max: Duration) -> Self {
        Backoff::Exponential { initial, max }
    }

    pub const fn schedule(steps: &'static [Duration]) -> Self {
        Backoff::Schedule(Cow::Borrowed(steps))
    }

    /// The pause after `failures` consecutive failures; 0 counts as 1. A schedule without
    /// steps pauses for nothing.
    pub fn delay(&self, failures: u32) -> Duration {
        let n = failures.max(1);
        match self {
            Backoff::Exponential { initial, max } => {
                // 2^31 times anything useful is past any cap: stop doubling there.
                let factor = 1u32.checked_shl(n - 1).unwrap_or(u32::MAX);
                initial.saturating_mul(factor).min(*max)
            }
            Backoff::Schedule(steps) => {
                let index = usize::try_from(n - 1).unwrap_or(usize::MAX);
                steps
                    .get(index)
                    .or(steps.last())
                    .copied()
                    .unwrap_or(Duration::ZERO)
            }
        }
    }

    /// The same backoff with no pause shorter than `floor`.
    pub fn at_least(self, floor: Duration) -> Self {
        match self {
            Backoff::Exponential { initial, max } => Backoff::Exponential {
                initial: initial.max(floor),
                max: max.max(floor),
            },
            Backoff::Schedule(steps) => {
                Backoff::Schedule(steps.iter().map(|step| (*step).max(floor)).collect())
            }
        }
    }

    pub fn is_empty(&self) -> bool {
        matches!(self, Backoff::Schedule(steps) if steps.is_empty())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exponential_doubles_from_the_first_failure_up_to_the_cap() {
        let backoff = Backoff::exponential(Duration::from_millis(250), Duration::from_secs(30));
        let pauses: Vec<u128> = (1..=9).map(|n| backoff.delay(n).as_millis()).collect();
        assert_eq!(
            pauses,
            [250, 500, 1_000, 2_000, 4_000, 8_000, 16_000, 30_000, 30_000]
        );
        assert_eq!(backoff.delay(0), Duration::from_millis(250));
        assert_eq!(backoff.delay(u32::MAX), Duration::from_secs(30));
    }

    #[test]
    fn a_schedule_repeats_its_last_step() {
        const STEPS: &[Duration] = &[Duration::from_secs(5), Duration::from_secs(10)];
        let backoff = Backoff::schedule(STEPS);
        assert_eq!(backoff.delay(1), Duration::from_secs(5));
        assert_eq!(backoff.delay(2), Duration::from_secs(10));
        assert_eq!(backoff.delay(7), Duration::from_secs(10));
        assert_eq!(
            Backoff::Schedule(Cow::Owned(Vec::new())).delay(1),
            Duration::ZERO
        );
    }

    #[test]
    fn a_floor_raises_every_pause() {
        let floor = Duration::from_millis(1);
        let raised = Backoff::Schedule(Cow::Owned(vec![Duration::ZERO, Duration::from_secs(1)]))
            .at_least(floor);
        assert_eq!(raised.delay(1), floor);
        assert_eq!(raised.delay(2), Duration::from_secs(1));
    }
}
