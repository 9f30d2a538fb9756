//! Link health: a breaker per prefill → decode link, fed by handoff outcomes.
//!
//! A broken link (a NIC, a switch port, an RDMA path between two hosts) fails handoffs — or
//! makes the decode recompute the prompt — while both workers look healthy with their other
//! partners, so the per-worker breakers never trip. Each prefill keeps the outcomes of its
//! links to each decode over a sliding window (the current and the previous `window`); a link
//! whose failure share reaches `failure_ratio` over at least `min_handoffs` handoffs is taken
//! out of pair selection for `cooldown`, then let back half-open: live requests use it again,
//! `probe_successes` good handoffs in a row close it, one failure opens it again. The workers
//! stay in service with their other partners. When excluding open links would leave no pair at
//! all, selection ignores link health (see `select`): a degraded link beats a 503.
//!
//! What counts as a handoff failure is decided by the caller (`legs::dispatch`): a decode-side
//! error after the pair was chosen, or a detected recompute; a prefill-side error is the
//! prefill worker's own failure and is not held against the link.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::config::GatewayConfig;
use crate::metrics::METRICS;

/// The link breaker's thresholds (gateway settings).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LinkSettings {
    pub enabled: bool,
    pub window: Duration,
    pub min_handoffs: u32,
    pub failure_ratio: f64,
    pub cooldown: Duration,
    pub probe_successes: u32,
}

impl LinkSettings {
    pub fn from_config(cfg: &GatewayConfig) -> LinkSettings {
        LinkSettings {
            enabled: !cfg.disable_link_health,
            window: Duration::from_secs(cfg.link_window_secs),
            min_handoffs: cfg.link_min_handoffs,
            failure_ratio: cfg.link_failure_ratio,
            cooldown: Duration::from_secs(cfg.link_cooldown_secs),
            probe_successes: cfg.link_probe_successes,
        }
    }
}

/// How one handoff over a link went.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LinkOutcome {
    /// The decode received the KV (or nothing says otherwise).
    Transferred,
    /// The decode answered, but recomputed the prompt itself.
    Recomputed,
    /// The handoff failed on the decode side.
    Failed,
}

impl LinkOutcome {
    fn is_failure(self) -> bool {
        !matches!(self, LinkOutcome::Transferred)
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum State {
    Closed,
    /// Out of selection until `until`.
    Open {
        until: Instant,
    },
    /// Back in selection; `successes` good handoffs so far.
    HalfOpen {
        successes: u32,
    },
}

impl State {
    fn as_str(self) -> &'static str {
        match self {
            State::Closed => "closed",
            State::Open { .. } => "open",
            State::HalfOpen { .. } => "half_open",
        }
    }
}

/// Outcome counts over the current and the previous window.
#[derive(Clone, Copy, Debug, Default)]
struct Counts {
    ok: u32,
    failed: u32,
}

struct Link {
    prefill_url: Arc<str>,
    decode_url: Arc<str>,
    state: State,
    current_start: Instant,
    current: Counts,
    previous: Counts,
    /// Recomputes seen on this link (its first one is logged).
    recomputes: u64,
}

impl Link {
    /// `pdgate_pd_link_open` for this link: 1 open, 0 half-open, no series when closed.
    fn publish(&self) {
        let labels = [&*self.prefill_url, &*self.decode_url];
        match self.state {
            State::Open { .. } => METRICS.pd_link_open.with_label_values(&labels).set(1),
            State::HalfOpen { .. } => METRICS.pd_link_open.with_label_values(&labels).set(0),
            State::Closed => {
                let _ = METRICS.pd_link_open.remove_label_values(&labels);
            }
        }
    }

    fn counts(&mut self, now: Instant, window: Duration) -> Counts {
        let age = now.saturating_duration_since(self.current_start);
        if age >= window {
            self.previous = if age >= window * 2 {
                Counts::default()
            } else {
                self.current
            };
            self.current = Counts::default();
            self.current_start = now;
        }
        Counts {
            ok: self.current.ok + self.previous.ok,
            failed: self.current.failed + self.previous.failed,
        }
    }
}

/// A prefill worker's links to its decodes, by decode worker id.
#[derive(Default)]
pub struct LinkTable {
    links: Mutex<HashMap<Arc<str>, Link>>,
    /// Links currently out of selection: while 0, `usable` takes no lock.
    open: AtomicUsize,
}

impl LinkTable {
    /// Whether pair selection may use the link to `decode_id` (an open link whose cooldown has
    /// passed turns half-open here).
    pub fn usable(&self, decode_id: &str) -> bool {
        if self.open.load(Ordering::Acquire) == 0 {
            return true;
        }
        self.usable_at(decode_id, Instant::now())
    }

    /// [`LinkTable::usable`] at `now`.
    fn usable_at(&self, decode_id: &str, now: Instant) -> bool {
        let mut links = self.links.lock().unwrap_or_else(|e| e.into_inner());
        let Some(link) = links.get_mut(decode_id) else {
            return true;
        };
        match link.state {
            State::Open { until } if now < until => false,
            State::Open { .. } => {
                link.state = State::HalfOpen { successes: 0 };
                self.open.fetch_sub(1, Ordering::AcqRel);
                METRICS.pd_links_open.dec();
                link.publish();
                log::info!(
                    "link to decode {} is half-open: live requests probe it",
                    link.decode_url
                );
                true
            }
            _ => true,
        }
    }

    /// Records one handoff from `prefill_url` to the decode `decode_id` / `decode_url`, ended
    /// at `now`.
    pub fn record(
        &self,
        prefill_url: &str,
        decode_id: &str,
        decode_url: &str,
        outcome: LinkOutcome,
        settings: &LinkSettings,
        now: Instant,
    ) {
        if !settings.enabled {
            return;
        }
        let mut links = self.links.lock().unwrap_or_else(|e| e.into_inner());
        // One lookup for the link every handoff after the first finds.
        let link = match links.get_mut(decode_id) {
            Some(link) => link,
            None => {
                links.insert(
                    Arc::from(decode_id),
                    Link {
                        prefill_url: Arc::from(prefill_url),
                        decode_url: Arc::from(decode_url),
                        state: State::Closed,
                        current_start: now,
                        current: Counts::default(),
                        previous: Counts::default(),
                        recomputes: 0,
                    },
                );
                links.get_mut(decode_id).expect("inserted above")
            }
        };
        let _ = link.counts(now, settings.window);
        if outcome.is_failure() {
            link.current.failed += 1;
        } else {
            link.current.ok += 1;
        }
        if outcome == LinkOutcome::Recomputed {
            link.recomputes += 1;
            if link.recomputes == 1 {
                log::warn!(
                    "link {prefill_url} -> {decode_url}: the decode recomputed the prompt instead of \
                     receiving its KV (first occurrence on this link)"
                );
            }
        }
        let counts = link.counts(now, settings.window);
        // A handoff over an open link past its cooldown (a canary's, or one that started just
        // before) is its first probe.
        if let State::Open { until } = link.state {
            if now >= until {
                link.state = State::HalfOpen { successes: 0 };
                self.open.fetch_sub(1, Ordering::AcqRel);
                METRICS.pd_links_open.dec();
                link.publish();
            }
        }
        match link.state {
            State::Closed => {
                let total = counts.ok + counts.failed;
                if total >= settings.min_handoffs
                    && f64::from(counts.failed) >= settings.failure_ratio * f64::from(total)
                {
                    self.trip(link, now, settings);
                    log::warn!(
                        "link {prefill_url} -> {decode_url} taken out of pair selection for {:?}: \
                         {} of the last {total} handoffs failed or recomputed",
                        settings.cooldown,
                        counts.failed
                    );
                }
            }
            State::Open { .. } => {}
            State::HalfOpen { successes } => {
                if outcome.is_failure() {
                    self.trip(link, now, settings);
                    log::warn!(
                        "link {prefill_url} -> {decode_url} failed its probe: out again for {:?}",
                        settings.cooldown
                    );
                } else if successes + 1 >= settings.probe_successes {
                    link.state = State::Closed;
                    link.current = Counts::default();
                    link.previous = Counts::default();
                    link.current_start = now;
                    link.publish();
                    log::info!("link {prefill_url} -> {decode_url} restored");
                } else {
                    link.state = State::HalfOpen {
                        successes: successes + 1,
                    };
                }
            }
        }
    }

    /// Takes `link` out of selection for the cooldown.
    fn trip(&self, link: &mut Link, now: Instant, settings: &LinkSettings) {
        link.state = State::Open {
            until: now + settings.cooldown,
        };
        self.open.fetch_add(1, Ordering::AcqRel);
        METRICS.pd_links_open.inc();
        METRICS.pd_link_trips.inc();
        link.publish();
    }

    /// The links not closed, for `/workers` and `/debug/handoffs`.
    pub fn unhealthy(&self) -> Vec<Value> {
        let links = self.links.lock().unwrap_or_else(|e| e.into_inner());
        let mut out: Vec<Value> = links
            .values()
            .filter(|l| l.state != State::Closed)
            .map(|l| {
                let mut v = json!({
                    "decode": &*l.decode_url,
                    "state": l.state.as_str(),
                    "failed": l.current.failed + l.previous.failed,
                    "handoffs": l.current.failed + l.previous.failed + l.current.ok + l.previous.ok,
                    "recomputes": l.recomputes,
                });
                if let State::Open { until } = l.state {
                    v["reopens_in_seconds"] = json!(until
                        .saturating_duration_since(Instant::now())
                        .as_secs_f64());
                }
                v
            })
            .collect();
        out.sort_by(|a, b| a["decode"].as_str().cmp(&b["decode"].as_str()));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings() -> LinkSettings {
        LinkSettings {
            enabled: true,
            window: Duration::from_secs(60),
            min_handoffs: 4,
            failure_ratio: 0.5,
            cooldown: COOLDOWN,
            probe_successes: 2,
        }
    }

    /// Long: the tests pass the time in, so no stall of the machine can end a cooldown early.
    const COOLDOWN: Duration = Duration::from_secs(30);

    fn record(t: &LinkTable, outcome: LinkOutcome, at: Instant) {
        t.record("http://p", "d1", "http://d1", outcome, &settings(), at);
    }

    #[test]
    fn a_link_opens_over_the_threshold_and_closes_after_its_probes() {
        let t = LinkTable::default();
        let t0 = Instant::now();
        record(&t, LinkOutcome::Transferred, t0);
        record(&t, LinkOutcome::Failed, t0);
        record(&t, LinkOutcome::Transferred, t0);
        assert!(t.usable("d1"), "3 handoffs are below the minimum");
        record(&t, LinkOutcome::Recomputed, t0);
        assert!(!t.usable("d1"), "2 of 4 failed: open");
        assert!(t.usable("d2"), "other links are untouched");
        assert_eq!(t.unhealthy()[0]["state"], "open");
        let later = t0 + COOLDOWN;
        assert!(!t.usable_at("d1", later - Duration::from_millis(1)));
        assert!(t.usable_at("d1", later), "half-open after the cooldown");
        record(&t, LinkOutcome::Transferred, later);
        assert_eq!(t.unhealthy()[0]["state"], "half_open");
        record(&t, LinkOutcome::Transferred, later);
        assert!(t.unhealthy().is_empty(), "two good probes close it");
        assert!(t.usable("d1"));
    }

    #[test]
    fn a_failed_probe_opens_the_link_again() {
        let t = LinkTable::default();
        let t0 = Instant::now();
        for _ in 0..4 {
            record(&t, LinkOutcome::Failed, t0);
        }
        assert!(!t.usable("d1"));
        let later = t0 + COOLDOWN;
        assert!(t.usable_at("d1", later));
        record(&t, LinkOutcome::Failed, later);
        assert!(!t.usable_at("d1", later));
        assert!(!t.usable_at("d1", later + COOLDOWN - Duration::from_millis(1)));
        assert!(t.usable_at("d1", later + COOLDOWN));
    }

    #[test]
    fn disabled_link_health_records_nothing() {
        let t = LinkTable::default();
        let off = LinkSettings {
            enabled: false,
            ..settings()
        };
        for _ in 0..10 {
            t.record(
                "http://p",
                "d1",
                "http://d1",
                LinkOutcome::Failed,
                &off,
                Instant::now(),
            );
        }
        assert!(t.usable("d1"));
    }
}
