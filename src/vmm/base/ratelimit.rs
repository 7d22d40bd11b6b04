//! Rate limiting for log lines a guest can trigger: at most a burst per
//! second per call site, and at most a fixed number per call site for the
//! whole run (the process), after which the site says once that it stops
//! repeating itself. Everything not printed is counted in the metrics. A
//! guest cannot grow lwpvmm's log without bound.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// Lines one call site may print per second.
pub const BURST_PER_SECOND: u64 = 10;
/// Lines one call site may print in a run.
pub const LINES_PER_RUN: u64 = 100;

/// Whether a line may be printed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Print it.
    Print,
    /// Print it, and say that this site stops here.
    PrintLast,
    /// Count it only.
    Suppress,
}

/// One call site's budget.
#[derive(Debug, Default)]
pub struct RateLimiter {
    second: AtomicU64,
    printed: AtomicU64,
    total: AtomicU64,
    suppressed: AtomicU64,
}

impl RateLimiter {
    /// A fresh budget (usable in a `static`).
    pub const fn new() -> Self {
        RateLimiter {
            second: AtomicU64::new(0),
            printed: AtomicU64::new(0),
            total: AtomicU64::new(0),
            suppressed: AtomicU64::new(0),
        }
    }

    /// Whether a line may be printed now; a line that may not is counted.
    pub fn allow(&self) -> Verdict {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        self.allow_at(now)
    }

    fn allow_at(&self, second: u64) -> Verdict {
        if self.second.swap(second, Ordering::Relaxed) != second {
            self.printed.store(0, Ordering::Relaxed);
        }
        let verdict = if self.printed.fetch_add(1, Ordering::Relaxed) >= BURST_PER_SECOND {
            Verdict::Suppress
        } else {
            match self.total.fetch_add(1, Ordering::Relaxed) + 1 {
                n if n < LINES_PER_RUN => Verdict::Print,
                LINES_PER_RUN => Verdict::PrintLast,
                _ => Verdict::Suppress,
            }
        };
        if verdict == Verdict::Suppress {
            self.suppressed.fetch_add(1, Ordering::Relaxed);
        }
        verdict
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
        static LIMIT: $crate::vmm::base::ratelimit::RateLimiter = $crate::vmm::base::ratelimit::RateLimiter::new();
        $counter.fetch_add(1, ::std::sync::atomic::Ordering::Relaxed);
        match LIMIT.allow() {
            $crate::vmm::base::ratelimit::Verdict::Print => ::log::warn!($($arg)+),
            $crate::vmm::base::ratelimit::Verdict::PrintLast => ::log::warn!(
                "{} (this warning has been printed {} times; from now on it is only counted in the metrics)",
                format_args!($($arg)+),
                $crate::vmm::base::ratelimit::LINES_PER_RUN
            ),
            $crate::vmm::base::ratelimit::Verdict::Suppress => {}
        }
    }};
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bursts_per_second() {
        let l = RateLimiter::new();
        let allowed = (0..100)
            .filter(|_| l.allow_at(7) != Verdict::Suppress)
            .count() as u64;
        assert_eq!(allowed, BURST_PER_SECOND);
        assert_eq!(l.suppressed(), 100 - BURST_PER_SECOND);
        assert_eq!(l.allow_at(8), Verdict::Print, "a new second, a new budget");
    }

    #[test]
    fn a_run_prints_a_bounded_number_and_says_when_it_stops() {
        let l = RateLimiter::new();
        let verdicts: Vec<Verdict> = (0..1000u64).map(|i| l.allow_at(i)).collect();
        let printed = verdicts.iter().filter(|v| **v == Verdict::Print).count() as u64;
        assert_eq!(printed, LINES_PER_RUN - 1);
        let last = verdicts.iter().position(|v| *v == Verdict::PrintLast);
        assert_eq!(last, Some(LINES_PER_RUN as usize - 1), "said once");
        assert_eq!(l.suppressed(), 1000 - LINES_PER_RUN);
    }
}
