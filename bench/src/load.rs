//! Closed-loop load: `concurrency` connections, each sending the next request as soon as the
//! previous response ended, for a warm-up then a measured window. Only responses that complete
//! inside the window count; the CPU time of the watched processes is sampled at its edges.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::http1::{Conn, Keep, RawRequest};
use crate::procstat;
use crate::stats::Samples;

/// Where to send load, and the process to charge it to (none for direct-to-engine).
#[derive(Clone, Debug)]
pub struct Target {
    pub name: String,
    pub addr: SocketAddr,
    pub pid: Option<u32>,
}

impl Target {
    /// `name=http://host:port[,pid=N]`.
    pub fn parse(s: &str) -> Result<Target, String> {
        let (name, rest) = s
            .split_once('=')
            .ok_or_else(|| format!("target {s:?}: want name=http://host:port[,pid=N]"))?;
        let mut parts = rest.split(',');
        let url = parts.next().unwrap_or_default();
        let addr = parse_http_addr(url)?;
        let mut pid = None;
        for p in parts {
            match p.split_once('=') {
                Some(("pid", v)) => pid = Some(v.parse().map_err(|_| format!("bad pid {v:?}"))?),
                _ => return Err(format!("target {s:?}: unknown option {p:?}")),
            }
        }
        Ok(Target {
            name: name.to_string(),
            addr,
            pid,
        })
    }
}

/// `http://host:port[/...]` → socket address (loopback bench: IP literals or `localhost`).
pub fn parse_http_addr(url: &str) -> Result<SocketAddr, String> {
    let rest = url
        .strip_prefix("http://")
        .ok_or_else(|| format!("{url:?}: only http:// URLs"))?;
    let authority = rest.split('/').next().unwrap_or_default();
    let authority = authority.replace("localhost", "127.0.0.1");
    authority
        .parse()
        .map_err(|_| format!("{url:?}: want http://IP:PORT"))
}

/// One measured load point.
#[derive(Clone, Debug)]
pub struct LoadSpec {
    pub path: String,
    pub body: Arc<Vec<u8>>,
    pub stream: bool,
    pub concurrency: usize,
    pub warmup: Duration,
    pub duration: Duration,
    pub timeout: Duration,
    /// Every request's prompt differs (its first 8 bytes carry the connection and request
    /// number), so nothing downstream can answer from a cache of earlier prompts.
    pub unique_prompts: bool,
}

/// What one connection saw inside the window.
#[derive(Default)]
struct Tally {
    ok: u64,
    errors: u64,
    error_samples: Vec<String>,
    latency_us: Vec<u32>,
    ttft_us: Vec<u32>,
    gaps_us: Vec<u32>,
    events: u64,
}

impl Tally {
    fn error(&mut self, why: String) {
        self.errors += 1;
        if self.error_samples.len() < 3 {
            self.error_samples.push(why);
        }
    }

    fn merge(&mut self, o: Tally) {
        self.ok += o.ok;
        self.errors += o.errors;
        for e in o.error_samples {
            if self.error_samples.len() < 5 && !self.error_samples.contains(&e) {
                self.error_samples.push(e);
            }
        }
        self.latency_us.extend(o.latency_us);
        self.ttft_us.extend(o.ttft_us);
        self.gaps_us.extend(o.gaps_us);
        self.events += o.events;
    }
}

fn us(d: Duration) -> u32 {
    d.as_micros().min(u32::MAX as u128) as u32
}

/// Where a request's prompt text starts (after the first `"content":"`), if it has 8 bytes to
/// overwrite.
fn prompt_offset(bytes: &[u8]) -> Option<usize> {
    const KEY: &[u8] = b"\"content\":\"";
    let at = bytes.windows(KEY.len()).position(|w| w == KEY)? + KEY.len();
    bytes
        .get(at..at + 8)
        .filter(|p| p.iter().all(|&b| b.is_ascii_lowercase() || b == b' '))
        .map(|_| at)
}

/// Writes `n` as 8 letters `a`–`p` (4 bits each): a pseudo-word, no JSON escaping.
fn stamp(out: &mut [u8], n: u32) {
    for (i, b) in out.iter_mut().enumerate() {
        *b = b'a' + ((n >> (28 - 4 * i)) & 15) as u8;
    }
}

async fn drive(
    target: SocketAddr,
    mut req: RawRequest,
    spec: Arc<LoadSpec>,
    window: (Instant, Instant),
    task: u32,
) -> Tally {
    let mut tally = Tally::default();
    let mut conn: Option<Conn> = None;
    // Unique prompts: this connection's own copy of the request, stamped before each send.
    let mut stamped = spec
        .unique_prompts
        .then(|| prompt_offset(&req.bytes).map(|at| (req.bytes.to_vec(), at)))
        .flatten();
    let mut sent: u32 = 0;
    let in_window = |t: Instant| t >= window.0 && t < window.1;
    while Instant::now() < window.1 {
        let c = match conn.as_mut() {
            Some(c) => c,
            None => match Conn::connect(target).await {
                Ok(c) => conn.insert(c),
                Err(e) => {
                    if in_window(Instant::now()) {
                        tally.error(format!("connect: {e}"));
                    }
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                }
            },
        };
        if let Some((bytes, at)) = stamped.as_mut() {
            stamp(&mut bytes[*at..*at + 8], (task << 20) | (sent & 0xF_FFFF));
            sent = sent.wrapping_add(1);
            req.bytes = bytes.as_slice().into();
        }
        let start = Instant::now();
        let result = c.send(&req, Keep::default(), spec.timeout).await;
        let end = Instant::now();
        let counted = in_window(end);
        match result {
            Err(e) => {
                conn = None;
                if counted {
                    tally.error(format!("{:?}: {e}", e.kind()));
                }
            }
            Ok(r) => {
                if r.close {
                    conn = None;
                }
                if !counted {
                    continue;
                }
                if !(200..300).contains(&r.status) {
                    tally.error(format!("status {}", r.status));
                } else if spec.stream && !r.ended_with_done() {
                    tally.error("stream ended without [DONE]".into());
                } else {
                    tally.ok += 1;
                    tally.latency_us.push(us(end - start));
                    if let Some(t) = r.first_event {
                        tally.ttft_us.push(us(t - start));
                    }
                    tally.gaps_us.extend_from_slice(&r.gaps_us);
                    tally.events += u64::from(r.events);
                }
            }
        }
    }
    tally
}

/// Runs `spec` against `target`, charging CPU to `target.pid` (the gateway) and to every process
/// of `watch` (engines), and returns the measured point as JSON.
pub async fn run(target: &Target, spec: &LoadSpec, watch: &[(String, u32)]) -> Value {
    let host = target.addr.to_string();
    let req = RawRequest::post_json(&host, &spec.path, &spec.body, &[]);
    let spec = Arc::new(spec.clone());
    let begin = Instant::now() + Duration::from_millis(20);
    let window = (begin + spec.warmup, begin + spec.warmup + spec.duration);
    let tasks: Vec<_> = (0..spec.concurrency)
        .map(|i| {
            tokio::spawn(drive(
                target.addr,
                req.clone(),
                Arc::clone(&spec),
                window,
                i as u32,
            ))
        })
        .collect();

    tokio::time::sleep_until(window.0.into()).await;
    if let Some(pid) = target.pid {
        procstat::reset_peak(pid);
    }
    let cpu_at = || -> (Option<u64>, Option<u64>, Vec<Option<u64>>) {
        (
            target.pid.and_then(procstat::cpu_us),
            procstat::self_cpu_us(),
            watch.iter().map(|(_, p)| procstat::cpu_us(*p)).collect(),
        )
    };
    let t0 = Instant::now();
    let before = cpu_at();
    tokio::time::sleep_until(window.1.into()).await;
    let after = cpu_at();
    let elapsed = t0.elapsed().as_secs_f64();
    let mem = target.pid.and_then(procstat::memory);

    let mut tally = Tally::default();
    for t in tasks {
        match t.await {
            Ok(t) => tally.merge(t),
            Err(e) => tally.error(format!("load task failed: {e}")),
        }
    }
    let n = tally.ok.max(1) as f64;
    let per_req = |a: Option<u64>, b: Option<u64>| -> Value {
        match (a, b) {
            (Some(a), Some(b)) if tally.ok > 0 => json!(round1(b.saturating_sub(a) as f64 / n)),
            _ => Value::Null,
        }
    };
    let mut engines = serde_json::Map::new();
    let mut engines_total = 0.0;
    for (i, (name, _)) in watch.iter().enumerate() {
        let v = per_req(before.2[i], after.2[i]);
        engines_total += v.as_f64().unwrap_or(0.0);
        engines.insert(name.clone(), v);
    }
    let latency = Samples::new(tally.latency_us);
    let ttft = Samples::new(tally.ttft_us);
    let gaps = Samples::new(tally.gaps_us);
    let ms = |v: Option<f64>| v.map_or(Value::Null, |v| json!(round3(v)));
    json!({
        "target": target.name,
        "stream": spec.stream,
        "prompt_bytes": spec.body.len(),
        "unique_prompts": spec.unique_prompts,
        "concurrency": spec.concurrency,
        "window_s": round3(elapsed),
        "requests": tally.ok,
        "errors": tally.errors,
        "error_samples": tally.error_samples,
        "rps": round1(tally.ok as f64 / elapsed),
        "p50_ms": ms(latency.pct_ms(50.0)),
        "p99_ms": ms(latency.pct_ms(99.0)),
        "mean_ms": ms(latency.mean_ms()),
        "ttft_p50_ms": ms(ttft.pct_ms(50.0)),
        "ttft_p99_ms": ms(ttft.pct_ms(99.0)),
        "gap_p50_ms": ms(gaps.pct_ms(50.0)),
        "gap_p99_ms": ms(gaps.pct_ms(99.0)),
        "gap_mean_ms": ms(gaps.mean_ms()),
        "events_per_request": if tally.ok > 0 { json!(round1(tally.events as f64 / n)) } else { Value::Null },
        "gateway_cpu_us_per_req": per_req(before.0, after.0),
        "gateway_rss_mb": mem.map_or(Value::Null, |m| json!(round1(m.rss_kb as f64 / 1024.0))),
        "gateway_peak_rss_mb": mem.map_or(Value::Null, |m| json!(round1(m.hwm_kb as f64 / 1024.0))),
        "loadgen_cpu_us_per_req": per_req(before.1, after.1),
        "engines_cpu_us_per_req": engines,
        "engines_cpu_us_per_req_total": round1(engines_total),
    })
}

pub fn round1(v: f64) -> f64 {
    (v * 10.0).round() / 10.0
}

pub fn round3(v: f64) -> f64 {
    (v * 1000.0).round() / 1000.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_parse_with_and_without_pid() {
        let t = Target::parse("pdgate=http://127.0.0.1:30100,pid=42").unwrap();
        assert_eq!(
            (t.name.as_str(), t.addr.port(), t.pid),
            ("pdgate", 30100, Some(42))
        );
        let d = Target::parse("direct=http://localhost:31003/").unwrap();
        assert_eq!((d.addr.ip().to_string(), d.pid), ("127.0.0.1".into(), None));
        assert!(Target::parse("http://127.0.0.1:1").is_err());
        assert!(Target::parse("x=http://127.0.0.1:1,cpu=3").is_err());
    }

    #[test]
    fn unique_prompts_stamp_the_first_word_of_the_prompt() {
        let body = crate::workload::chat_body(300, 16, false);
        let at = prompt_offset(&body).expect("the prompt is found");
        let original: serde_json::Value = serde_json::from_slice(&body).unwrap();
        let len = original["messages"][0]["content"].as_str().unwrap().len();
        let mut a = body.clone();
        let mut b = body.clone();
        stamp(&mut a[at..at + 8], 1);
        stamp(&mut b[at..at + 8], (3 << 20) | 1);
        assert_ne!(a, b);
        for v in [&a, &b] {
            let json: serde_json::Value = serde_json::from_slice(v).expect("still JSON");
            let prompt = json["messages"][0]["content"].as_str().unwrap();
            assert_eq!(prompt.len(), len);
            assert!(prompt.bytes().take(8).all(|c| (b'a'..=b'p').contains(&c)));
        }
    }
}
