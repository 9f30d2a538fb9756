//! Per-worker circuit breakers, SMG's model: consecutive outcomes, `closed → open` after the
//! failure threshold, `open → half_open` once the open timeout passed (checked lazily when the
//! state is read), `half_open → closed` after the success threshold, any half-open failure
//! reopens. Fed only by legs actually contacted: a failed prefill never touches the decode's
//! breaker, and a leg the gateway dropped records nothing. As in SMG 1.13.0, a worker whose
//! health returns (promoted to Ready by the health checker) has an open breaker half-opened at
//! once instead of waiting out the open timeout (`smg_worker_cb_health_readmissions_total`): a
//! restarted engine serves again on its first good probe, not up to `cb_timeout_secs` later.
//!
//! The hot path (`allows` on a closed breaker) is one atomic load; transitions take a short
//! lock that is never held across an `.await`.

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Mutex;
use std::time::Instant;

use pingora_prometheus::prometheus::{IntCounter, IntGauge};

use crate::config::{CircuitBreakerSettings, ResilienceOverrides};
use crate::metrics::METRICS;

/// What one leg's result means for its worker's health.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    Success,
    Failure,
    /// Says nothing about health (a capacity answer such as 429).
    Ignored,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Phase {
    Closed = 0,
    Open = 1,
    HalfOpen = 2,
}

impl Phase {
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Closed => "closed",
            Phase::Open => "open",
            Phase::HalfOpen => "half_open",
        }
    }

    fn from_u8(v: u8) -> Phase {
        match v {
            1 => Phase::Open,
            2 => Phase::HalfOpen,
            _ => Phase::Closed,
        }
    }
}

struct Counts {
    consecutive_failures: u32,
    consecutive_successes: u32,
    opened_at: Option<Instant>,
}

pub struct Breaker {
    settings: CircuitBreakerSettings,
    phase: AtomicU8,
    counts: Mutex<Counts>,
    worker: String,
    /// This worker's series, resolved once: an outcome is recorded for every leg, and
    /// `with_label_values` hashes the labels and takes the vector's lock each time.
    series: Series,
}

struct Series {
    state: IntGauge,
    successes: IntCounter,
    failures: IntCounter,
    consecutive_failures: IntGauge,
    consecutive_successes: IntGauge,
    health_readmissions: IntCounter,
}

/// The global settings with a worker's `resilience` overrides applied.
pub fn settings_for(
    base: &CircuitBreakerSettings,
    o: Option<&ResilienceOverrides>,
) -> CircuitBreakerSettings {
    let mut s = base.clone();
    let Some(o) = o else { return s };
    if o.disable_circuit_breaker == Some(true) {
        s.enabled = false;
        s.failure_threshold = u32::MAX;
    }
    if let (true, Some(t)) = (s.enabled, o.cb_failure_threshold) {
        s.failure_threshold = t;
    }
    if let Some(t) = o.cb_success_threshold {
        s.success_threshold = t;
    }
    if let Some(secs) = o.cb_timeout_secs {
        s.open_duration = std::time::Duration::from_secs(secs);
    }
    if let Some(codes) = &o.capacity_status_codes {
        s.capacity_status_codes = codes.clone();
    }
    s
}

impl Breaker {
    pub fn new(settings: CircuitBreakerSettings, worker: &str) -> Breaker {
        let series = Series {
            state: METRICS.worker_cb_state.with_label_values(&[worker]),
            successes: METRICS
                .worker_cb_outcomes
                .with_label_values(&[worker, "success"]),
            failures: METRICS
                .worker_cb_outcomes
                .with_label_values(&[worker, "failure"]),
            consecutive_failures: METRICS
                .worker_cb_consecutive_failures
                .with_label_values(&[worker]),
            consecutive_successes: METRICS
                .worker_cb_consecutive_successes
                .with_label_values(&[worker]),
            health_readmissions: METRICS
                .worker_cb_health_readmissions
                .with_label_values(&[worker]),
        };
        series.state.set(0);
        Breaker {
            settings,
            phase: AtomicU8::new(Phase::Closed as u8),
            counts: Mutex::new(Counts {
                consecutive_failures: 0,
                consecutive_successes: 0,
                opened_at: None,
            }),
            worker: worker.to_string(),
            series,
        }
    }

    /// The outcome an HTTP status means (SMG's sets: capacity codes record nothing, failure
    /// codes a failure, everything else — 4xx included — a success).
    pub fn classify(&self, status: u16) -> Outcome {
        if self.settings.capacity_status_codes.contains(&status) {
            Outcome::Ignored
        } else if self.settings.failure_status_codes.contains(&status) {
            Outcome::Failure
        } else {
            Outcome::Success
        }
    }

    pub fn phase(&self) -> Phase {
        Phase::from_u8(self.phase.load(Ordering::Acquire))
    }

    /// Whether the worker may get a request now. An open breaker whose timeout passed turns
    /// half-open here (and lets the request through).
    pub fn allows(&self) -> bool {
        match self.phase() {
            Phase::Closed | Phase::HalfOpen => true,
            Phase::Open => {
                let mut c = self.counts.lock().unwrap_or_else(|e| e.into_inner());
                let due = c
                    .opened_at
                    .is_none_or(|t| t.elapsed() >= self.settings.open_duration);
                if due && self.phase() == Phase::Open {
                    c.consecutive_successes = 0;
                    self.transition(Phase::Open, Phase::HalfOpen);
                }
                due
            }
        }
    }

    /// The worker's health returned (the health checker promoted it to Ready): an open breaker
    /// goes half-open now rather than at its timeout, so the next requests test it; a closed or
    /// half-open one is left as it is. True when it re-admitted the worker.
    pub fn readmit_on_health(&self) -> bool {
        if self.phase() != Phase::Open {
            return false;
        }
        let mut c = self.counts.lock().unwrap_or_else(|e| e.into_inner());
        if self.phase() != Phase::Open {
            return false;
        }
        c.consecutive_successes = 0;
        self.series.consecutive_successes.set(0);
        self.transition(Phase::Open, Phase::HalfOpen);
        self.series.health_readmissions.inc();
        true
    }

    /// Records one leg's status (`None`: a transport failure, counted as a failure).
    pub fn record_status(&self, status: Option<u16>) {
        let outcome = match status {
            Some(s) => self.classify(s),
            None => Outcome::Failure,
        };
        self.record(outcome);
    }

    pub fn record(&self, outcome: Outcome) {
        match outcome {
            Outcome::Success => self.series.successes.inc(),
            Outcome::Failure => self.series.failures.inc(),
            Outcome::Ignored => return,
        }
        if !self.settings.enabled {
            return;
        }
        let mut c = self.counts.lock().unwrap_or_else(|e| e.into_inner());
        let phase = self.phase();
        match outcome {
            Outcome::Success => {
                c.consecutive_failures = 0;
                c.consecutive_successes = c.consecutive_successes.saturating_add(1);
                if phase == Phase::HalfOpen
                    && c.consecutive_successes >= self.settings.success_threshold
                {
                    self.transition(phase, Phase::Closed);
                }
            }
            Outcome::Failure => {
                c.consecutive_successes = 0;
                c.consecutive_failures = c.consecutive_failures.saturating_add(1);
                let open = match phase {
                    Phase::HalfOpen => true,
                    Phase::Closed => c.consecutive_failures >= self.settings.failure_threshold,
                    Phase::Open => false,
                };
                if open {
                    c.opened_at = Some(Instant::now());
                    self.transition(phase, Phase::Open);
                }
            }
            Outcome::Ignored => {}
        }
        self.series
            .consecutive_failures
            .set(i64::from(c.consecutive_failures));
        self.series
            .consecutive_successes
            .set(i64::from(c.consecutive_successes));
    }

    fn transition(&self, from: Phase, to: Phase) {
        self.phase.store(to as u8, Ordering::Release);
        self.series.state.set(to as i64);
        METRICS
            .worker_cb_transitions
            .with_label_values(&[self.worker.as_str(), from.as_str(), to.as_str()])
            .inc();
        log::warn!(
            "circuit breaker of {}: {} -> {}",
            self.worker,
            from.as_str(),
            to.as_str()
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn breaker(failures: u32, successes: u32, open: Duration) -> Breaker {
        Breaker::new(
            CircuitBreakerSettings {
                enabled: true,
                failure_threshold: failures,
                success_threshold: successes,
                open_duration: open,
                window: Duration::from_secs(120),
                failure_status_codes: vec![408, 429, 500, 502, 503, 504],
                capacity_status_codes: vec![429],
            },
            "http://test-breaker",
        )
    }

    #[test]
    fn consecutive_failures_open_the_breaker() {
        let b = breaker(3, 1, Duration::from_secs(60));
        b.record_status(Some(500));
        b.record_status(Some(500));
        b.record_status(Some(200));
        b.record_status(Some(500));
        b.record_status(None);
        assert!(b.allows(), "a success in between resets the count");
        b.record_status(Some(503));
        assert_eq!(b.phase(), Phase::Open);
        assert!(!b.allows());
    }

    #[test]
    fn an_open_breaker_half_opens_after_the_timeout_and_closes_on_successes() {
        let b = breaker(1, 2, Duration::from_millis(0));
        b.record_status(Some(502));
        assert_eq!(b.phase(), Phase::Open);
        assert!(
            b.allows(),
            "timeout elapsed: half-open lets traffic through"
        );
        assert_eq!(b.phase(), Phase::HalfOpen);
        b.record_status(Some(200));
        assert_eq!(b.phase(), Phase::HalfOpen);
        b.record_status(Some(200));
        assert_eq!(b.phase(), Phase::Closed);
    }

    #[test]
    fn returning_health_half_opens_an_open_breaker_before_its_timeout() {
        let b = breaker(1, 2, Duration::from_secs(3600));
        assert!(!b.readmit_on_health(), "a closed breaker stays closed");
        assert_eq!(b.phase(), Phase::Closed);
        b.record_status(None);
        assert!(!b.allows(), "open for an hour");
        let readmitted = METRICS
            .worker_cb_health_readmissions
            .with_label_values(&["http://test-breaker"]);
        let before = readmitted.get();
        assert!(b.readmit_on_health());
        assert_eq!(b.phase(), Phase::HalfOpen);
        assert_eq!(readmitted.get(), before + 1);
        assert!(b.allows(), "the next request tests the worker");
        assert!(!b.readmit_on_health(), "already half-open: nothing to do");
        assert_eq!(readmitted.get(), before + 1);
        // Half-open as after a timeout: the success threshold closes it, a failure reopens it.
        b.record_status(Some(200));
        assert_eq!(b.phase(), Phase::HalfOpen);
        b.record_status(Some(200));
        assert_eq!(b.phase(), Phase::Closed);
        b.record_status(Some(502));
        assert!(b.readmit_on_health());
        b.record_status(Some(502));
        assert_eq!(b.phase(), Phase::Open, "a failed test reopens it");
        assert!(!b.allows());
    }

    #[test]
    fn a_half_open_failure_reopens() {
        let b = breaker(1, 2, Duration::from_millis(0));
        b.record_status(Some(500));
        assert!(b.allows());
        b.record_status(Some(500));
        assert_eq!(b.phase(), Phase::Open);
    }

    #[test]
    fn capacity_answers_and_client_errors_are_not_failures() {
        let b = breaker(1, 1, Duration::from_secs(60));
        b.record_status(Some(429));
        b.record_status(Some(400));
        b.record_status(Some(404));
        assert_eq!(b.phase(), Phase::Closed);
    }

    #[test]
    fn worker_overrides_replace_the_global_settings() {
        let base = breaker(10, 3, Duration::from_secs(60)).settings;
        let o = ResilienceOverrides {
            cb_failure_threshold: Some(2),
            ..Default::default()
        };
        assert_eq!(settings_for(&base, Some(&o)).failure_threshold, 2);
        let off = ResilienceOverrides {
            disable_circuit_breaker: Some(true),
            ..Default::default()
        };
        assert!(!settings_for(&base, Some(&off)).enabled);
    }
}
