//! One warning a second at most for events a role or a local user can cause at will
//! (refused connections, refused control clients): each is still counted where it happens,
//! and the next warning says how many were not logged.

use std::time::{Duration, Instant};

#[derive(Debug, Default)]
pub struct Quiet {
    last: Option<Instant>,
    suppressed: u64,
}

impl Quiet {
    /// One more not logged (something else refused it), counted for the next warning.
    pub fn skip(&mut self) {
        self.suppressed += 1;
    }

    /// `Some(n)` when a warning may be logged now, `n` being how many were suppressed since the
    /// last one; `None` (and one more suppressed) otherwise.
    pub fn allow(&mut self, now: Instant) -> Option<u64> {
        if self.last.is_some_and(|t| now.duration_since(t) < Duration::from_secs(1)) {
            self.suppressed += 1;
            return None;
        }
        self.last = Some(now);
        Some(std::mem::take(&mut self.suppressed))
    }
}

/// A token bucket: `rate` events a second, up to `burst` saved; what it refuses is counted.
#[derive(Debug)]
pub struct Bucket {
    rate: f64,
    burst: f64,
    tokens: f64,
    at: Instant,
    /// Refused since the last report.
    pub dropped: u64,
    /// Refused in all.
    pub dropped_total: u64,
    quiet: Quiet,
}

impl Bucket {
    pub fn new(now: Instant, rate: f64, burst: f64) -> Bucket {
        Bucket { rate, burst, tokens: burst, at: now, dropped: 0, dropped_total: 0, quiet: Quiet::default() }
    }

    /// Is there room for one more now (nothing taken)?
    pub fn ready(&mut self, now: Instant) -> bool {
        self.tokens = (self.tokens + now.saturating_duration_since(self.at).as_secs_f64() * self.rate).min(self.burst);
        self.at = now;
        self.tokens >= 1.0
    }

    /// May one more go now?
    pub fn take(&mut self, now: Instant) -> bool {
        self.tokens = (self.tokens + now.saturating_duration_since(self.at).as_secs_f64() * self.rate).min(self.burst);
        self.at = now;
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            self.dropped += 1;
            self.dropped_total += 1;
            false
        }
    }

    /// Is there room for `n` now (nothing taken)?
    pub fn ready_n(&mut self, now: Instant, n: f64) -> bool {
        self.tokens = (self.tokens + now.saturating_duration_since(self.at).as_secs_f64() * self.rate).min(self.burst);
        self.at = now;
        self.tokens >= n
    }

    /// Take `n`, room or not (what is already spent: a debt the refill pays first); nothing
    /// is counted.
    pub fn spend(&mut self, n: f64) {
        self.tokens -= n;
    }

    /// When it will hold `n` again (now, if it does).
    pub fn when(&self, n: f64) -> Instant {
        let missing = (n.min(self.burst) - self.tokens).max(0.0);
        self.at + Duration::from_secs_f64(missing / self.rate)
    }

    /// The refused count to report now (at most once a second), reset once reported.
    pub fn report(&mut self, now: Instant) -> Option<u64> {
        if self.dropped == 0 {
            return None;
        }
        self.quiet.allow(now)?;
        Some(std::mem::take(&mut self.dropped))
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    #[test]
    fn one_a_second_with_the_count_of_the_rest() {
        let mut q = super::Quiet::default();
        let t = Instant::now();
        assert_eq!(q.allow(t), Some(0));
        for i in 1..=5 {
            assert_eq!(q.allow(t + Duration::from_millis(i * 100)), None);
        }
        assert_eq!(q.allow(t + Duration::from_millis(1001)), Some(5));
        assert_eq!(q.allow(t + Duration::from_millis(1500)), None);
    }
}
