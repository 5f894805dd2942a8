//! Percentiles, medians and the formatting of figures.

use std::time::Duration;

/// Latency samples of one measured operation.
#[derive(Debug, Default, Clone)]
pub(crate) struct Samples(Vec<Duration>);

impl Samples {
    pub(crate) fn push(&mut self, d: Duration) {
        self.0.push(d);
    }

    pub(crate) fn len(&self) -> usize {
        self.0.len()
    }

    /// The `p`-th percentile (nearest rank), `p` in 0..=100.
    pub(crate) fn percentile(&self, p: f64) -> Duration {
        if self.0.is_empty() {
            return Duration::ZERO;
        }
        let mut sorted = self.0.clone();
        sorted.sort_unstable();
        let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
        sorted[rank.clamp(1, sorted.len()) - 1]
    }

    pub(crate) fn p50(&self) -> Duration {
        self.percentile(50.0)
    }

    pub(crate) fn p99(&self) -> Duration {
        self.percentile(99.0)
    }

    pub(crate) fn max(&self) -> Duration {
        self.0.iter().copied().max().unwrap_or_default()
    }
}

/// The median of `values` (the mean of the middle two for an even count).
pub(crate) fn median(values: &[f64]) -> f64 {
    if values.is_empty() {
        return f64::NAN;
    }
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    let mid = v.len() / 2;
    if v.len().is_multiple_of(2) {
        (v[mid - 1] + v[mid]) / 2.0
    } else {
        v[mid]
    }
}

/// Milliseconds with three decimals.
pub(crate) fn ms(d: Duration) -> String {
    format!("{:.3}", d.as_secs_f64() * 1e3)
}

/// A ratio `a / b` as `1.23×`.
pub(crate) fn ratio(a: f64, b: f64) -> String {
    if b == 0.0 || !a.is_finite() || !b.is_finite() {
        return "n/a".into();
    }
    format!("{:.2}×", a / b)
}

/// A duration ratio.
pub(crate) fn dratio(a: Duration, b: Duration) -> String {
    ratio(a.as_secs_f64(), b.as_secs_f64())
}

/// An integer with thousands separators (`1,000,000`).
pub(crate) fn count(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_use_the_nearest_rank() {
        let mut s = Samples::default();
        for ms in 1..=100 {
            s.push(Duration::from_millis(ms));
        }
        assert_eq!(s.p50(), Duration::from_millis(50));
        assert_eq!(s.p99(), Duration::from_millis(99));
        assert_eq!(s.max(), Duration::from_millis(100));
    }

    #[test]
    fn median_of_even_and_odd_counts() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), 2.5);
    }

    #[test]
    fn counts_group_thousands() {
        assert_eq!(count(1_000_000), "1,000,000");
        assert_eq!(count(999), "999");
    }
}
