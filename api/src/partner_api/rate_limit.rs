//! Per-partner request limits of the partner API: a token bucket per partner (`governor`'s GCRA,
//! the well-kept crate for it), `per_second` sustained and `burst` at once, from the partner's
//! own row or the settings' default.
//!
//! Past the limit: 429 with `Retry-After` (whole seconds, at least 1) and the IETF httpapi
//! draft's `RateLimit-Policy` / `RateLimit` headers, also on every allowed answer so a partner
//! can pace itself. Admin, chain-monitor and payment routes never pass here.
//!
//! The buckets live in the API process: with several API processes (or Lambda environments)
//! a partner's limit is per process. That bounds what one process serves a partner, which is
//! the point (no partner starves the others' requests in the same process); a global quota
//! would need a shared store on every request.

use std::{
    collections::HashMap,
    num::NonZeroU32,
    sync::{Arc, Mutex},
    time::Duration,
};

use axum::http::{HeaderMap, HeaderValue};
use governor::{
    Quota, RateLimiter,
    clock::{Clock, DefaultClock},
    middleware::StateInformationMiddleware,
    state::{InMemoryState, NotKeyed},
};

use super::config::RateLimit;

type Bucket = RateLimiter<NotKeyed, InMemoryState, DefaultClock, StateInformationMiddleware>;
/// Each partner's bucket with the limit it was made for.
type Buckets = HashMap<u64, (RateLimit, Arc<Bucket>)>;

/// Every partner's bucket, made on its first request (and again when its limit changes).
#[derive(Clone, Default)]
pub struct RateLimits {
    buckets: Arc<Mutex<Buckets>>,
    clock: DefaultClock,
}

/// What the bucket said.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    Allowed { remaining: u32 },
    Limited { retry_after: Duration },
}

impl RateLimits {
    /// Takes one request from `partner_id`'s bucket.
    pub fn check(&self, partner_id: u64, limit: RateLimit) -> Verdict {
        let bucket = self.bucket(partner_id, limit);
        match bucket.check() {
            Ok(snapshot) => Verdict::Allowed {
                remaining: snapshot.remaining_burst_capacity(),
            },
            Err(not_until) => Verdict::Limited {
                retry_after: not_until.wait_time_from(self.clock.now()),
            },
        }
    }

    fn bucket(&self, partner_id: u64, limit: RateLimit) -> Arc<Bucket> {
        // A poisoned lock only means another request panicked while holding it; the map is
        // still whole (each insert is one call).
        let mut buckets = self
            .buckets
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        match buckets.get(&partner_id) {
            Some((current, bucket)) if *current == limit => bucket.clone(),
            _ => {
                let bucket = Arc::new(
                    RateLimiter::direct_with_clock(quota(limit), self.clock.clone())
                        .with_middleware::<StateInformationMiddleware>(),
                );
                buckets.insert(partner_id, (limit, bucket.clone()));
                bucket
            }
        }
    }
}

fn quota(limit: RateLimit) -> Quota {
    let per_second = NonZeroU32::new(limit.per_second).unwrap_or(NonZeroU32::MIN);
    let burst = NonZeroU32::new(limit.burst).unwrap_or(NonZeroU32::MIN);
    Quota::per_second(per_second).allow_burst(burst)
}

/// The draft's headers: the policy (`q` requests a `w`-second window… here the burst and the
/// time it takes to refill) and what is left of it.
pub fn headers(headers: &mut HeaderMap, limit: RateLimit, remaining: u32, reset: Duration) {
    let window = limit.burst.div_ceil(limit.per_second.max(1)).max(1);
    let policy = format!("\"partner\";q={};w={window}", limit.burst);
    let state = format!(
        "\"partner\";r={remaining};t={}",
        reset.as_secs() + u64::from(reset.subsec_nanos() > 0)
    );
    if let Ok(value) = HeaderValue::from_str(&policy) {
        headers.insert("ratelimit-policy", value);
    }
    if let Ok(value) = HeaderValue::from_str(&state) {
        headers.insert("ratelimit", value);
    }
}

/// `Retry-After` in whole seconds, never 0 (a client would retry at once and be refused).
pub fn retry_after_secs(wait: Duration) -> u64 {
    (wait.as_secs() + u64::from(wait.subsec_nanos() > 0)).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_is_allowed_then_refused_with_a_wait() {
        let limits = RateLimits::default();
        let limit = RateLimit {
            per_second: 1,
            burst: 3,
        };
        let verdicts: Vec<Verdict> = (0..4).map(|_| limits.check(7, limit)).collect();
        assert_eq!(verdicts[0], Verdict::Allowed { remaining: 2 });
        assert_eq!(verdicts[2], Verdict::Allowed { remaining: 0 });
        match &verdicts[3] {
            Verdict::Limited { retry_after } => {
                assert!(*retry_after > Duration::ZERO && *retry_after <= Duration::from_secs(1))
            }
            other => panic!("the fourth request passed: {other:?}"),
        }
        // Another partner has its own bucket.
        assert_eq!(limits.check(8, limit), Verdict::Allowed { remaining: 2 });
    }

    #[test]
    fn a_changed_limit_takes_effect() {
        let limits = RateLimits::default();
        let one = RateLimit {
            per_second: 1,
            burst: 1,
        };
        assert!(matches!(limits.check(1, one), Verdict::Allowed { .. }));
        assert!(matches!(limits.check(1, one), Verdict::Limited { .. }));
        let more = RateLimit {
            per_second: 10,
            burst: 10,
        };
        assert!(matches!(limits.check(1, more), Verdict::Allowed { .. }));
    }

    #[test]
    fn retry_after_is_whole_seconds_never_zero() {
        assert_eq!(retry_after_secs(Duration::from_millis(1)), 1);
        assert_eq!(retry_after_secs(Duration::from_millis(1500)), 2);
        assert_eq!(retry_after_secs(Duration::ZERO), 1);
    }
}
