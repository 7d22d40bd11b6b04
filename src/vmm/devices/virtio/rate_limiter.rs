//! Firecracker's rate limiter as its API describes it (`RateLimiter`): a
//! bandwidth and an ops token bucket, each holding `size` tokens refilled
//! evenly over `refill_time` milliseconds, with a `one_time_burst` spent
//! before them. A bucket whose size or refill time is 0 limits nothing, as
//! in Firecracker. Pure: the caller passes the time, so the tests run on a
//! clock of their own.

use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

/// One token bucket (Firecracker's `TokenBucket`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BucketConfig {
    /// Tokens the bucket holds when full.
    pub size: u64,
    /// Tokens spent before the bucket's own, once.
    #[serde(default)]
    pub one_time_burst: u64,
    /// Milliseconds in which an empty bucket refills.
    pub refill_time: u64,
}

impl BucketConfig {
    fn limits(&self) -> bool {
        self.size > 0 && self.refill_time > 0
    }
}

/// A rate limit (Firecracker's `RateLimiter`): bytes and operations.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RateLimit {
    /// Bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bandwidth: Option<BucketConfig>,
    /// Operations.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ops: Option<BucketConfig>,
}

#[derive(Debug, Clone)]
struct Bucket {
    config: BucketConfig,
    tokens: u64,
    burst: u64,
    /// When `tokens` was last brought up to date.
    at: Instant,
}

impl Bucket {
    fn new(config: BucketConfig, now: Instant) -> Self {
        Bucket {
            config,
            tokens: config.size,
            burst: config.one_time_burst,
            at: now,
        }
    }

    fn refill_nanos(&self) -> u128 {
        u128::from(self.config.refill_time) * 1_000_000
    }

    /// Adds what the time since `at` refilled, keeping the remainder's time
    /// (a token is never lost to rounding).
    fn refill(&mut self, now: Instant) {
        let elapsed = now.saturating_duration_since(self.at).as_nanos();
        let size = u128::from(self.config.size);
        let add = elapsed * size / self.refill_nanos();
        if add == 0 {
            return;
        }
        let room = u128::from(self.config.size - self.tokens);
        if add >= room {
            self.tokens = self.config.size;
            self.at = now;
        } else {
            self.tokens += add as u64;
            let spent = add * self.refill_nanos() / size;
            self.at += Duration::from_nanos(u64::try_from(spent).unwrap_or(u64::MAX));
        }
    }

    /// How long until `n` tokens are there (zero: now).
    fn wait_for(&self, n: u64) -> Duration {
        let have = self.tokens.saturating_add(self.burst);
        if have >= n {
            return Duration::ZERO;
        }
        let short = u128::from(n - have);
        let nanos = short * self.refill_nanos() / u128::from(self.config.size) + 1;
        Duration::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX))
    }

    /// Takes `n` tokens, the burst's first (the caller checked they are
    /// there).
    fn take(&mut self, n: u64) {
        let from_burst = n.min(self.burst);
        self.burst -= from_burst;
        self.tokens -= n - from_burst;
    }
}

/// A live rate limiter.
#[derive(Debug, Clone)]
pub struct RateLimiter {
    bandwidth: Option<Bucket>,
    ops: Option<Bucket>,
}

impl RateLimiter {
    /// A limiter for `limit` whose buckets start full at `now`.
    pub fn new(limit: &RateLimit, now: Instant) -> Self {
        let bucket =
            |c: Option<BucketConfig>| c.filter(BucketConfig::limits).map(|c| Bucket::new(c, now));
        RateLimiter {
            bandwidth: bucket(limit.bandwidth),
            ops: bucket(limit.ops),
        }
    }

    /// The most bytes one operation may ask for: a larger one could never
    /// be served.
    pub fn max_bytes(&self) -> u64 {
        self.bandwidth.as_ref().map_or(u64::MAX, |b| b.config.size)
    }

    /// Takes one operation of `bytes` (at most [`Self::max_bytes`]) at
    /// `now`, from both buckets or neither: `Err` says how long until it
    /// can be taken.
    pub fn consume(&mut self, bytes: u64, now: Instant) -> Result<(), Duration> {
        let mut wait = Duration::ZERO;
        for (bucket, n) in [(&mut self.bandwidth, bytes), (&mut self.ops, 1)] {
            if let Some(b) = bucket {
                b.refill(now);
                wait = wait.max(b.wait_for(n));
            }
        }
        if wait > Duration::ZERO {
            return Err(wait);
        }
        for (bucket, n) in [(&mut self.bandwidth, bytes), (&mut self.ops, 1)] {
            if let Some(b) = bucket {
                b.take(n);
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bucket(size: u64, one_time_burst: u64, refill_time: u64) -> Option<BucketConfig> {
        Some(BucketConfig {
            size,
            one_time_burst,
            refill_time,
        })
    }

    #[test]
    fn buckets_refill_over_their_time_and_spend_the_burst_first() {
        let start = Instant::now();
        let at = |ms: u64| start + Duration::from_millis(ms);
        // 1000 bytes a second, a burst of 500 first.
        let limit = RateLimit {
            bandwidth: bucket(1000, 500, 1000),
            ops: None,
        };
        let mut l = RateLimiter::new(&limit, start);
        assert_eq!(l.max_bytes(), 1000);
        // (when, bytes, taken, or how long to wait)
        let steps = [
            (0, 1000, Ok(())),
            (0, 500, Ok(())),
            (0, 1, Err(Duration::from_nanos(1_000_001))),
            (100, 100, Ok(())),
            (100, 200, Err(Duration::from_nanos(200_000_001))),
            (300, 200, Ok(())),
            // Refilled to full and no further.
            (10_000, 1000, Ok(())),
            (10_000, 1, Err(Duration::from_nanos(1_000_001))),
        ];
        for (i, (ms, bytes, want)) in steps.into_iter().enumerate() {
            assert_eq!(l.consume(bytes, at(ms)), want, "step {i}");
        }
    }

    #[test]
    fn an_operation_takes_from_both_buckets_or_neither() {
        let start = Instant::now();
        let at = |ms: u64| start + Duration::from_millis(ms);
        // Two operations a second; 100 bytes that take 1000 s to refill,
        // so none come back within the test.
        let limit = RateLimit {
            bandwidth: bucket(100, 0, 1_000_000),
            ops: bucket(2, 0, 1000),
        };
        let mut l = RateLimiter::new(&limit, start);
        assert_eq!(l.consume(10, at(0)), Ok(()));
        assert_eq!(l.consume(10, at(0)), Ok(()));
        assert!(l.consume(10, at(0)).is_err(), "the ops bucket is empty");
        // The refused operation took no bytes: 80 are left.
        assert!(l.consume(80, at(500)).is_ok());
        assert!(l.consume(1, at(500)).is_err());
        // A bucket of size 0 or refill time 0 limits nothing.
        let none = RateLimit {
            bandwidth: bucket(0, 0, 1000),
            ops: bucket(5, 0, 0),
        };
        let mut free = RateLimiter::new(&none, start);
        assert_eq!(free.max_bytes(), u64::MAX);
        for _ in 0..1000 {
            assert_eq!(free.consume(1 << 20, at(0)), Ok(()));
        }
    }
}
