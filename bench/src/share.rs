//! Where a routing policy sends the traffic when one worker is slow (issue 12): a fixed number of
//! requests from `concurrency` clients, each sending its next request when its answer arrived,
//! and each engine's request count before and after (`/mock/stats`). The first engine named is
//! the slow one; its share of the requests is the number to read.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::control;
use crate::http1::{Conn, Keep, RawRequest};
use crate::load::round3;
use crate::report::cell;

pub struct ShareSpec {
    pub addr: SocketAddr,
    pub label: String,
    pub path: String,
    pub body: Vec<u8>,
    pub requests: usize,
    pub concurrency: usize,
    pub timeout: Duration,
    /// Engine API URLs, the slow one first.
    pub engines: Vec<SocketAddr>,
}

/// One client: keep-alive, a new connection after an error or a `Connection: close`.
async fn client(spec: Arc<ShareSpec>, req: RawRequest, next: Arc<AtomicUsize>) -> usize {
    let mut errors = 0;
    let mut conn: Option<Conn> = None;
    while next.fetch_add(1, Ordering::Relaxed) < spec.requests {
        if conn.is_none() {
            conn = Conn::connect(spec.addr).await.ok();
        }
        let Some(c) = conn.as_mut() else {
            errors += 1;
            continue;
        };
        match c.send(&req, Keep::default(), spec.timeout).await {
            Ok(r) => {
                if !(200..300).contains(&r.status) {
                    errors += 1;
                }
                if r.close {
                    conn = None;
                }
            }
            Err(_) => {
                errors += 1;
                conn = None;
            }
        }
    }
    errors
}

pub async fn run(spec: ShareSpec) -> Value {
    let spec = Arc::new(spec);
    let mut before = Vec::new();
    for e in &spec.engines {
        before.push(control::requests_total(*e).await);
    }
    let req = RawRequest::post_json(&spec.addr.to_string(), &spec.path, &spec.body, &[]);
    let next = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let clients: Vec<_> = (0..spec.concurrency.max(1))
        .map(|_| tokio::spawn(client(spec.clone(), req.clone(), next.clone())))
        .collect();
    let mut errors = 0;
    for c in clients {
        errors += c.await.unwrap_or(1);
    }
    let elapsed = started.elapsed().as_secs_f64();
    let mut served = Vec::new();
    for (i, e) in spec.engines.iter().enumerate() {
        served.push(match (before[i], control::requests_total(*e).await) {
            (Some(b), Some(a)) => Some(a - b),
            _ => None,
        });
    }
    let total: u64 = served.iter().flatten().sum();
    let slow_share = match served.first() {
        Some(Some(slow)) if total > 0 => json!(round3(*slow as f64 / total as f64)),
        _ => Value::Null,
    };
    json!({
        "target": spec.label,
        "requests": spec.requests,
        "concurrency": spec.concurrency,
        "errors": errors,
        "requests_per_engine": served,
        "slow_share": slow_share,
        "elapsed_s": round3(elapsed),
    })
}

pub fn table(rows: &[Value]) -> String {
    let mut out = String::from(
        "| run | requests | clients | errors | slow engine | other engines | slow share | seconds |\n|---|---:|---:|---:|---:|---|---:|---:|\n",
    );
    for r in rows {
        let per = r["requests_per_engine"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        let show = |v: &Value| v.as_u64().map_or("–".to_string(), |n| n.to_string());
        let slow = per.first().map_or("–".to_string(), show);
        let others = per.iter().skip(1).map(show).collect::<Vec<_>>().join(" / ");
        out.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {} | {} |\n",
            r["target"].as_str().unwrap_or("?"),
            cell(r, "requests"),
            cell(r, "concurrency"),
            cell(r, "errors"),
            slow,
            if others.is_empty() {
                "–".into()
            } else {
                others
            },
            cell(r, "slow_share"),
            cell(r, "elapsed_s"),
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_puts_the_slow_engine_first() {
        let row = json!({"target": "least_load", "requests": 150, "concurrency": 12, "errors": 0,
            "requests_per_engine": [4, 73, 73], "slow_share": 0.027, "elapsed_s": 0.9});
        let t = table(&[row]);
        assert!(
            t.contains("| least_load | 150 | 12 | 0 | 4 | 73 / 73 | 0.027 | 0.9 |"),
            "{t}"
        );
    }
}
