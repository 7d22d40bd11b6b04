//! Rate limiting for log lines a guest can trigger: at most a burst per
//! second per call site, the rest counted, never printed. A guest cannot
//! grow lwpvmm's log without bound.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// Lines one call site may print per second.
pub const BURST_PER_SECOND: u64 = 10;

/// One call site's budget.
#[derive(Debug, Default)]
pub struct RateLimiter {
    second: AtomicU64,
    printed: AtomicU64,
    suppressed: AtomicU64,
}

impl RateLimiter {
    /// A fresh budget (usable in a `static`).
    pub const fn new() -> Self {
        RateLimiter {
            second: AtomicU64::new(0),
            printed: AtomicU64::new(0),
            suppressed: AtomicU64::new(0),
        }
    }

    /// True when a line may be printed now; otherwise counts it.
    pub fn allow(&self) -> bool {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        self.allow_at(now)
    }

    fn allow_at(&self, second: u64) -> bool {
        if self.second.swap(second, Ordering::Relaxed) != second {
            self.printed.store(0, Ordering::Relaxed);
        }
        if self.printed.fetch_add(1, Ordering::Relaxed) < BURST_PER_SECOND {
            true
        } else {
            self.suppressed.fetch_add(1, Ordering::Relaxed);
            false
        }
    }

    /// Lines not printed so far.
    pub fn suppressed(&self) -> u64 {
        self.suppressed.load(Ordering::Relaxed)
    }
}

/// `warn!` for guest-triggered conditions, limited per call site and counted
/// in the given metric.
#[macro_export]
macro_rules! guest_warn {
    ($counter:expr, $($arg:tt)+) => {{
        static LIMIT: $crate::vmm::ratelimit::RateLimiter = $crate::vmm::ratelimit::RateLimiter::new();
        $counter.fetch_add(1, ::std::sync::atomic::Ordering::Relaxed);
        if LIMIT.allow() {
            ::log::warn!($($arg)+);
        }
    }};
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bursts_per_second() {
        let l = RateLimiter::new();
        let allowed = (0..100).filter(|_| l.allow_at(7)).count() as u64;
        assert_eq!(allowed, BURST_PER_SECOND);
        assert_eq!(l.suppressed(), 100 - BURST_PER_SECOND);
        assert!(l.allow_at(8), "a new second, a new budget");
    }
}
