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
