//! Percentiles over recorded samples (µs).

/// Sorted samples, read by percentile.
pub struct Samples(Vec<u32>);

impl Samples {
    pub fn new(mut v: Vec<u32>) -> Samples {
        v.sort_unstable();
        Samples(v)
    }

    /// The `p`-th percentile (nearest rank), in ms; `None` without samples.
    pub fn pct_ms(&self, p: f64) -> Option<f64> {
        if self.0.is_empty() {
            return None;
        }
        let rank = ((p / 100.0) * self.0.len() as f64).ceil() as usize;
        let idx = rank.clamp(1, self.0.len()) - 1;
        Some(self.0[idx] as f64 / 1000.0)
    }

    pub fn mean_ms(&self) -> Option<f64> {
        if self.0.is_empty() {
            return None;
        }
        Some(self.0.iter().map(|&v| v as f64).sum::<f64>() / self.0.len() as f64 / 1000.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let s = Samples::new((1..=100).rev().map(|v| v * 1000).collect());
        assert_eq!(s.pct_ms(50.0), Some(50.0));
        assert_eq!(s.pct_ms(99.0), Some(99.0));
        assert_eq!(s.pct_ms(100.0), Some(100.0));
        assert_eq!(s.pct_ms(0.0), Some(1.0));
        assert_eq!(Samples::new(vec![]).pct_ms(50.0), None);
    }
}
