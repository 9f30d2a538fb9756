//! Many open streams at once: opens `streams` streamed requests (at most `ramp` connecting at a
//! time), waits until each has delivered its first event, samples the gateway's memory on the way
//! and while all are open, keeps them open for `hold`, then hangs up.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tokio::sync::{watch, Semaphore};

use crate::http1::{Conn, RawRequest};
use crate::load::{round1, round3};
use crate::procstat;
use crate::report::cell;

pub struct HoldSpec {
    pub addr: SocketAddr,
    pub path: String,
    pub body: Vec<u8>,
    pub streams: usize,
    pub ramp: usize,
    pub open_timeout: Duration,
    pub hold: Duration,
    pub pid: Option<u32>,
    pub label: String,
}

#[derive(Default)]
struct Counters {
    open: AtomicU64,
    failed: AtomicU64,
    events: AtomicU64,
    /// Streams that opened, then ended before the hold was over.
    ended_early: AtomicU64,
}

async fn one_stream(
    addr: SocketAddr,
    req: RawRequest,
    ramp: Arc<Semaphore>,
    counters: Arc<Counters>,
    mut stop: watch::Receiver<bool>,
) -> Option<String> {
    let permit = ramp.acquire_owned().await.ok()?;
    let mut conn = match Conn::connect(addr).await {
        Ok(c) => c,
        Err(e) => {
            counters.failed.fetch_add(1, Ordering::Relaxed);
            return Some(format!("connect: {e}"));
        }
    };
    let mut permit = Some(permit);
    let mut opened = false;
    let stop_fut = async move {
        let _ = stop.wait_for(|s| *s).await;
    };
    let result = conn
        .hold_stream(
            &req,
            |n| {
                if !opened {
                    opened = true;
                    permit.take();
                    counters.open.fetch_add(1, Ordering::Relaxed);
                }
                counters.events.fetch_add(u64::from(n), Ordering::Relaxed);
            },
            stop_fut,
        )
        .await;
    match result {
        Ok(r) if r.done.is_some() => {
            if opened {
                counters.ended_early.fetch_add(1, Ordering::Relaxed);
            }
            (!(200..300).contains(&r.status)).then(|| format!("status {}", r.status))
        }
        Ok(_) => None,
        Err(e) => {
            counters.failed.fetch_add(1, Ordering::Relaxed);
            Some(format!("{:?}: {e}", e.kind()))
        }
    }
}

pub async fn run(spec: HoldSpec) -> Value {
    let req = RawRequest::post_json(&spec.addr.to_string(), &spec.path, &spec.body, &[]);
    let counters = Arc::new(Counters::default());
    let ramp = Arc::new(Semaphore::new(spec.ramp.max(1)));
    let (stop_tx, stop_rx) = watch::channel(false);
    let mem = |pid: Option<u32>| pid.and_then(procstat::memory);
    let idle = mem(spec.pid);
    let cpu0 = spec.pid.and_then(procstat::cpu_us);
    let started = Instant::now();
    let tasks: Vec<_> = (0..spec.streams)
        .map(|_| {
            tokio::spawn(one_stream(
                spec.addr,
                req.clone(),
                Arc::clone(&ramp),
                Arc::clone(&counters),
                stop_rx.clone(),
            ))
        })
        .collect();

    // Memory at each quarter of the fleet, to show the per-stream slope.
    let mut checkpoints = Vec::new();
    let quarters: Vec<u64> = (1..=4).map(|q| (spec.streams * q / 4) as u64).collect();
    let mut next_q = 0;
    let deadline = started + spec.open_timeout;
    loop {
        let open = counters.open.load(Ordering::Relaxed);
        let failed = counters.failed.load(Ordering::Relaxed);
        while next_q < quarters.len() && open >= quarters[next_q] {
            if let Some(m) = mem(spec.pid) {
                checkpoints.push(json!({"open": open, "rss_mb": round1(m.rss_kb as f64 / 1024.0)}));
            }
            next_q += 1;
        }
        if open + failed >= spec.streams as u64 || Instant::now() >= deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let open_s = started.elapsed().as_secs_f64();
    let open_all = counters.open.load(Ordering::Relaxed);

    let events0 = counters.events.load(Ordering::Relaxed);
    let cpu_hold0 = spec.pid.and_then(procstat::cpu_us);
    let hold_start = Instant::now();
    tokio::time::sleep(spec.hold).await;
    let hold_s = hold_start.elapsed().as_secs_f64();
    let events_hold = counters.events.load(Ordering::Relaxed) - events0;
    let cpu_hold1 = spec.pid.and_then(procstat::cpu_us);
    let still_open = open_all.saturating_sub(counters.ended_early.load(Ordering::Relaxed));
    let held = mem(spec.pid);

    let _ = stop_tx.send(true);
    let mut errors: Vec<String> = Vec::new();
    for t in tasks {
        if let Ok(Some(e)) = t.await {
            if errors.len() < 5 && !errors.contains(&e) {
                errors.push(e);
            }
        }
    }
    let mb = |m: Option<procstat::Memory>, f: fn(&procstat::Memory) -> u64| {
        m.map_or(Value::Null, |m| json!(round1(f(&m) as f64 / 1024.0)))
    };
    let per_stream_kb = match (idle, held) {
        (Some(i), Some(h)) if open_all > 0 => {
            json!(round1(
                h.rss_kb.saturating_sub(i.rss_kb) as f64 / open_all as f64
            ))
        }
        _ => Value::Null,
    };
    let cpu_per_event = match (cpu_hold0, cpu_hold1) {
        (Some(a), Some(b)) if events_hold > 0 => {
            json!(round3(b.saturating_sub(a) as f64 / events_hold as f64))
        }
        _ => Value::Null,
    };
    json!({
        "target": spec.label,
        "streams_requested": spec.streams,
        "streams_open": open_all,
        "streams_open_after_hold": still_open,
        "failed": counters.failed.load(Ordering::Relaxed),
        "error_samples": errors,
        "open_s": round3(open_s),
        "hold_s": round3(hold_s),
        "chunks_per_s_during_hold": round1(events_hold as f64 / hold_s),
        "gateway_cpu_us_per_chunk": cpu_per_event,
        "gateway_cpu_s_total": match (cpu0, cpu_hold1) { (Some(a), Some(b)) => json!(round3((b - a) as f64 / 1e6)), _ => Value::Null },
        "rss_idle_mb": mb(idle, |m| m.rss_kb),
        "rss_open_mb": mb(held, |m| m.rss_kb),
        "peak_rss_mb": mb(held, |m| m.hwm_kb),
        "rss_per_stream_kb": per_stream_kb,
        "checkpoints": checkpoints,
    })
}

pub fn table(rows: &[Value]) -> String {
    let mut out = String::from(
        "| target | streams open / asked | failed | time to open s | RSS idle MB | RSS all open MB | peak RSS MB | KB per stream | chunks/s while held | gw CPU µs/chunk |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    for r in rows {
        let f = |k: &str| cell(r, k);
        out.push_str(&format!(
            "| {} | {} / {} | {} | {} | {} | {} | {} | {} | {} | {} |\n",
            r["target"].as_str().unwrap_or("?"),
            f("streams_open"),
            f("streams_requested"),
            f("failed"),
            f("open_s"),
            f("rss_idle_mb"),
            f("rss_open_mb"),
            f("peak_rss_mb"),
            f("rss_per_stream_kb"),
            f("chunks_per_s_during_hold"),
            f("gateway_cpu_us_per_chunk"),
        ));
    }
    out
}
