//! The markdown tables of a sweep, with the subject gateway's ratios to the direct baseline and
//! to the peer gateway measured in the same run.

use std::fmt::Write as _;

use serde_json::Value;

/// Which targets play which part in the ratios.
pub struct Roles<'a> {
    /// The gateway under test (`pdgate`).
    pub subject: &'a str,
    /// Direct to the engine: the physical limit.
    pub baseline: Option<&'a str>,
    /// Another gateway on the same engines.
    pub peer: Option<&'a str>,
    /// The least a PD gateway can do on the same engines (`floor-proxy`), when it ran.
    pub floor: Option<&'a str>,
    /// The same floor inside Pingora's `ProxyHttp` (`floor-proxy --pingora`), when it ran: the
    /// least a gateway built on Pingora can do.
    pub pingora_floor: Option<&'a str>,
}

/// A JSON field as a table cell (`–` when absent or null).
pub fn cell(row: &Value, key: &str) -> String {
    match row.get(key) {
        Some(Value::Null) | None => "–".to_string(),
        Some(v) => v.to_string(),
    }
}

fn num(v: &Value, key: &str) -> Option<f64> {
    v.get(key).and_then(Value::as_f64)
}

fn fmt(v: Option<f64>, digits: usize) -> String {
    v.map_or_else(|| "–".to_string(), |x| format!("{x:.digits$}"))
}

fn size(bytes: f64) -> String {
    let kb = bytes / 1024.0;
    if kb >= 1.0 {
        format!("{kb:.0} KB")
    } else {
        format!("{bytes:.0} B")
    }
}

fn same_point(a: &Value, b: &Value) -> bool {
    ["mode", "stream", "concurrency"]
        .iter()
        .all(|k| a.get(*k) == b.get(*k))
        // The body size varies by a few bytes with the `stream` field: compare in KB.
        && (num(a, "prompt_bytes").unwrap_or(0.0) / 1024.0).round()
            == (num(b, "prompt_bytes").unwrap_or(0.0) / 1024.0).round()
}

fn ratio(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    match (a, b) {
        (Some(a), Some(b)) if b > 0.0 => Some(a / b),
        _ => None,
    }
}

/// One row per (point, target); the subject's row carries the ratios.
pub fn sweep_table(results: &[Value], roles: &Roles) -> String {
    let mut out = String::new();
    out.push_str(
        "| mode | stream | prompt | c | target | req/s | p50 ms | p99 ms | TTFT p50 ms | chunk gap p50 / p99 ms | gw CPU µs/req | engines CPU µs/req | gw peak RSS MB | errors | ×direct req/s | p50 − direct ms | ×peer req/s | ×peer CPU/req |\n",
    );
    out.push_str("|---|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    for r in results {
        let stream = r.get("stream").and_then(Value::as_bool).unwrap_or(false);
        let target = r.get("target").and_then(Value::as_str).unwrap_or("?");
        let find = |name: Option<&str>| {
            name.and_then(|n| {
                results.iter().find(|o| {
                    o.get("target").and_then(Value::as_str) == Some(n) && same_point(o, r)
                })
            })
        };
        let (mut x_direct, mut d_p50, mut x_peer, mut x_peer_cpu) = (None, None, None, None);
        if target == roles.subject {
            if let Some(b) = find(roles.baseline) {
                x_direct = ratio(num(r, "rps"), num(b, "rps"));
                d_p50 = num(r, "p50_ms").zip(num(b, "p50_ms")).map(|(a, b)| a - b);
            }
            if let Some(p) = find(roles.peer) {
                x_peer = ratio(num(r, "rps"), num(p, "rps"));
                x_peer_cpu = ratio(
                    num(r, "gateway_cpu_us_per_req"),
                    num(p, "gateway_cpu_us_per_req"),
                );
            }
        }
        let gap = if stream {
            format!(
                "{} / {}",
                fmt(num(r, "gap_p50_ms"), 3),
                fmt(num(r, "gap_p99_ms"), 3)
            )
        } else {
            "–".into()
        };
        let ttft = if stream {
            fmt(num(r, "ttft_p50_ms"), 3)
        } else {
            "–".into()
        };
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            r.get("mode").and_then(Value::as_str).unwrap_or(""),
            if stream { "yes" } else { "no" },
            size(num(r, "prompt_bytes").unwrap_or(0.0)),
            r.get("concurrency").and_then(Value::as_u64).unwrap_or(0),
            if target == roles.subject { format!("**{target}**") } else { target.to_string() },
            fmt(num(r, "rps"), 0),
            fmt(num(r, "p50_ms"), 3),
            fmt(num(r, "p99_ms"), 3),
            ttft,
            gap,
            fmt(num(r, "gateway_cpu_us_per_req"), 0),
            fmt(num(r, "engines_cpu_us_per_req_total"), 0),
            fmt(num(r, "gateway_peak_rss_mb"), 1),
            r.get("errors").and_then(Value::as_u64).unwrap_or(0),
            fmt(x_direct, 2),
            fmt(d_p50, 3),
            fmt(x_peer, 2),
            fmt(x_peer_cpu, 2),
        );
    }
    out
}

/// A sweep's mode label without its round (`canned/r2` → `canned`): `run.sh` with `ROUNDS` > 1
/// labels each round's points so, and the pivot takes medians over them.
fn base_mode(row: &Value) -> &str {
    let mode = row.get("mode").and_then(Value::as_str).unwrap_or("");
    match mode.rsplit_once("/r") {
        Some((base, n)) if !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()) => base,
        _ => mode,
    }
}

/// The median (the mean of the two middle values for an even count); `None` when empty.
pub fn median(mut xs: Vec<f64>) -> Option<f64> {
    if xs.is_empty() {
        return None;
    }
    xs.sort_by(f64::total_cmp);
    let n = xs.len();
    Some(if n % 2 == 1 {
        xs[n / 2]
    } else {
        (xs[n / 2 - 1] + xs[n / 2]) / 2.0
    })
}

/// One row per point (mode without its round, stream, prompt, c), the targets side by side in the
/// order they first ran — req/s, p50 and gateway CPU per request of each, the median over rounds
/// when a point ran more than once — and the subject's ratios to the peer.
pub fn pivot_table(results: &[Value], roles: &Roles) -> String {
    let mut targets: Vec<&str> = Vec::new();
    let mut points: Vec<&Value> = Vec::new();
    for r in results {
        let t = r.get("target").and_then(Value::as_str).unwrap_or("?");
        if !targets.contains(&t) {
            targets.push(t);
        }
        if !points
            .iter()
            .any(|p| base_mode(p) == base_mode(r) && same_size_stream_c(p, r))
        {
            points.push(r);
        }
    }
    let metric = |p: &Value, t: &str, key: &str| {
        median_where(results, t, key, |o| {
            base_mode(o) == base_mode(p) && same_size_stream_c(o, p)
        })
    };
    let mut out = String::from("| mode | stream | prompt | c | rounds |");
    let mut rule = String::from("|---|---|---:|---:|---:|");
    for t in &targets {
        let _ = write!(out, " {t} req/s | {t} p50 ms | {t} gw CPU µs/req |");
        rule.push_str("---:|---:|---:|");
    }
    let peer = roles.peer.filter(|p| targets.contains(p));
    if let Some(peer) = peer {
        let _ = write!(
            out,
            " {s} ÷ {peer} CPU/req | {s} ÷ {peer} req/s | {s} − {peer} p50 ms |",
            s = roles.subject
        );
        rule.push_str("---:|---:|---:|");
    }
    out.push('\n');
    out.push_str(&rule);
    out.push('\n');
    for p in points {
        let stream = p.get("stream").and_then(Value::as_bool).unwrap_or(false);
        let rounds = targets
            .iter()
            .map(|t| metric(p, t, "rps").1)
            .max()
            .unwrap_or(0);
        let _ = write!(
            out,
            "| {} | {} | {} | {} | {} |",
            base_mode(p),
            if stream { "yes" } else { "no" },
            size(num(p, "prompt_bytes").unwrap_or(0.0)),
            p.get("concurrency").and_then(Value::as_u64).unwrap_or(0),
            rounds,
        );
        for t in &targets {
            let _ = write!(
                out,
                " {} | {} | {} |",
                fmt(metric(p, t, "rps").0, 0),
                fmt(metric(p, t, "p50_ms").0, 3),
                fmt(metric(p, t, "gateway_cpu_us_per_req").0, 0),
            );
        }
        if let Some(peer) = peer {
            let (s, q) = (roles.subject, peer);
            let cpu = ratio(
                metric(p, s, "gateway_cpu_us_per_req").0,
                metric(p, q, "gateway_cpu_us_per_req").0,
            );
            let rps = ratio(metric(p, s, "rps").0, metric(p, q, "rps").0);
            let p50 = metric(p, s, "p50_ms")
                .0
                .zip(metric(p, q, "p50_ms").0)
                .map(|(a, b)| a - b);
            let _ = write!(
                out,
                " {} | {} | {} |",
                fmt(cpu, 2),
                fmt(rps, 2),
                fmt(p50, 3)
            );
        }
        out.push('\n');
    }
    out
}

/// The median over rounds of `key` in `target`'s rows that `at` selects, and how many rows had it.
fn median_where(
    results: &[Value],
    target: &str,
    key: &str,
    at: impl Fn(&Value) -> bool,
) -> (Option<f64>, usize) {
    let xs: Vec<f64> = results
        .iter()
        .filter(|o| o.get("target").and_then(Value::as_str) == Some(target) && at(o))
        .filter_map(|o| num(o, key))
        .collect();
    let n = xs.len();
    (median(xs), n)
}

/// The headline table of issue 15: direct, the peer and the subject side by side on the points
/// that show a gateway's own cost — 1 KB chat, non-streamed at c=64 and c=1, streamed at c=64
/// (medians over rounds) — and, from `holds` (`hold` rows), the memory of many open streams.
/// With a floor (`floor-proxy`, the least a PD gateway can do), its column sits beside direct,
/// with the subject's ratio to it and its own excess over direct.
pub fn ratio_table(results: &[Value], holds: &[Value], roles: &Roles) -> String {
    let (s, d) = (roles.subject, roles.baseline.unwrap_or("direct"));
    let p = roles.peer.unwrap_or("peer");
    let (floor, pfloor) = (roles.floor, roles.pingora_floor);
    let at = |stream: bool, c: u64| {
        move |o: &Value| {
            o.get("stream").and_then(Value::as_bool) == Some(stream)
                && o.get("concurrency").and_then(Value::as_u64) == Some(c)
                && (num(o, "prompt_bytes").unwrap_or(0.0) / 1024.0).round() == 1.0
        }
    };
    let m = |t: &str, key: &str, stream: bool, c: u64| median_where(results, t, key, at(stream, c));
    let rounds = [d, p, s]
        .iter()
        .map(|t| m(t, "rps", false, 64).1)
        .max()
        .unwrap_or(0);
    // Columns: label, direct, floor, Pingora floor, peer, subject, subject ÷ peer,
    // subject ÷ floor, subject ÷ Pingora floor, subject − direct, floor − direct; a floor's
    // columns only when it ran.
    const FLOOR_COLUMNS: [usize; 3] = [2, 7, 10];
    const PINGORA_FLOOR_COLUMNS: [usize; 2] = [3, 8];
    let shown = |i: &usize| {
        (floor.is_some() || !FLOOR_COLUMNS.contains(i))
            && (pfloor.is_some() || !PINGORA_FLOOR_COLUMNS.contains(i))
    };
    let line = |cells: [String; 11]| {
        let kept: Vec<String> = cells
            .into_iter()
            .enumerate()
            .filter(|(i, _)| shown(i))
            .map(|(_, c)| c)
            .collect();
        format!("| {} |\n", kept.join(" | "))
    };
    let f = floor.unwrap_or("floor");
    let pf = pfloor.unwrap_or("pingora-floor");
    let mut out = line([
        format!("1 KB chat, {rounds} round(s), medians"),
        d.into(),
        f.into(),
        pf.into(),
        p.into(),
        s.into(),
        format!("{s} ÷ {p}"),
        format!("{s} ÷ {f}"),
        format!("{s} ÷ {pf}"),
        format!("{s} − {d}"),
        format!("{f} − {d}"),
    ]);
    let columns = (1..11).filter(shown).count();
    out.push_str(&format!("|---|{}\n", "---:|".repeat(columns)));
    // One row: the targets' values (direct, floor, Pingora floor, peer, subject), the subject's
    // ratios to the peer and the floors, and (for latencies) the subject's and the floor's
    // excess over direct.
    let mut row = |label: &str, vals: [Option<f64>; 5], digits: usize, excess_us: bool| {
        let [direct, fl, pfl, peer, subject] = vals;
        let excess = |v: Option<f64>| {
            let x = if excess_us {
                v.zip(direct).map(|(a, b)| (a - b) * 1000.0)
            } else {
                None
            };
            x.map_or_else(|| "–".into(), |x| format!("{x:.0} µs"))
        };
        out.push_str(&line([
            label.into(),
            fmt(direct, digits),
            fmt(fl, digits),
            fmt(pfl, digits),
            fmt(peer, digits),
            fmt(subject, digits),
            fmt(ratio(subject, peer), 2),
            fmt(ratio(subject, fl), 2),
            fmt(ratio(subject, pfl), 2),
            excess(subject),
            excess(fl),
        ]));
    };
    let of =
        |t: Option<&str>, key: &str, stream: bool, c: u64| t.and_then(|t| m(t, key, stream, c).0);
    let all = |key: &str, stream: bool, c: u64| {
        [
            m(d, key, stream, c).0,
            of(floor, key, stream, c),
            of(pfloor, key, stream, c),
            m(p, key, stream, c).0,
            m(s, key, stream, c).0,
        ]
    };
    // The gateways' own figures (CPU, memory): direct has none.
    let gateways = |key: &str, stream: bool, c: u64| {
        let mut v = all(key, stream, c);
        v[0] = None;
        v
    };
    row("req/s, c=64", all("rps", false, 64), 0, false);
    row(
        "gateway CPU µs/request, c=64",
        gateways("gateway_cpu_us_per_req", false, 64),
        0,
        false,
    );
    row(
        "engines CPU µs/request, c=64",
        all("engines_cpu_us_per_req_total", false, 64),
        1,
        false,
    );
    row(
        "gateway peak RSS MB, c=64",
        gateways("gateway_peak_rss_mb", false, 64),
        1,
        false,
    );
    row("p50 ms, c=1", all("p50_ms", false, 1), 3, true);
    row(
        "gateway CPU µs/request, c=1",
        gateways("gateway_cpu_us_per_req", false, 1),
        0,
        false,
    );
    row("streamed req/s, c=64", all("rps", true, 64), 0, false);
    row(
        "streamed gateway CPU µs/request, c=64",
        gateways("gateway_cpu_us_per_req", true, 64),
        0,
        false,
    );
    // What a streamed answer was: the engines' token events, a finish event and `[DONE]`.
    row(
        "SSE events per streamed answer, c=64",
        all("events_per_request", true, 64),
        1,
        false,
    );
    let hold = |t: &str, key: &str| {
        holds
            .iter()
            .find(|h| h.get("target").and_then(Value::as_str) == Some(t))
            .and_then(|h| num(h, key))
    };
    if !holds.is_empty() {
        let open = |t: &str| hold(t, "streams_open").map_or("–".into(), |n| format!("{n:.0}"));
        row(
            &format!(
                "KB per open stream ({p}: {}, {s}: {} open)",
                open(p),
                open(s)
            ),
            [
                None,
                None,
                None,
                hold(p, "rss_per_stream_kb"),
                hold(s, "rss_per_stream_kb"),
            ],
            1,
            false,
        );
        row(
            "idle RSS MB (before the streams)",
            [
                None,
                None,
                None,
                hold(p, "rss_idle_mb"),
                hold(s, "rss_idle_mb"),
            ],
            1,
            false,
        );
    }
    out
}

fn same_size_stream_c(a: &Value, b: &Value) -> bool {
    a.get("stream") == b.get("stream")
        && a.get("concurrency") == b.get("concurrency")
        && (num(a, "prompt_bytes").unwrap_or(0.0) / 1024.0).round()
            == (num(b, "prompt_bytes").unwrap_or(0.0) / 1024.0).round()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn pivot_puts_targets_side_by_side_with_medians_over_rounds() {
        let point = |mode: &str, t: &str, c: u64, rps: f64, cpu: Option<f64>| {
            json!({"mode":mode,"stream":false,"prompt_bytes":1030,"concurrency":c,"target":t,
                   "rps":rps,"p50_ms":1.0,"gateway_cpu_us_per_req":cpu,"errors":0})
        };
        let rows = vec![
            point("canned/r1", "direct", 64, 9000.0, None),
            point("canned/r1", "new", 64, 3000.0, Some(60.0)),
            point("canned/r1", "old", 64, 3000.0, Some(50.0)),
            point("canned/r2", "direct", 64, 9000.0, None),
            point("canned/r2", "old", 64, 2000.0, Some(40.0)),
            point("canned/r2", "new", 64, 2000.0, Some(50.0)),
            point("canned/r3", "direct", 64, 9000.0, None),
            point("canned/r3", "new", 64, 1000.0, Some(70.0)),
            point("canned/r3", "old", 64, 1000.0, Some(60.0)),
            point("canned/r1", "new", 1, 500.0, Some(90.0)),
        ];
        let t = pivot_table(
            &rows,
            &Roles {
                subject: "new",
                baseline: Some("direct"),
                peer: Some("old"),
                floor: None,
                pingora_floor: None,
            },
        );
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines.len(), 4, "{t}");
        assert!(lines[0].starts_with("| mode | stream | prompt | c | rounds | direct req/s |"));
        assert!(lines[0].contains("| new ÷ old CPU/req |"), "{}", lines[0]);
        assert_eq!(
            lines[2],
            "| canned | no | 1 KB | 64 | 3 | 9000 | 1.000 | – | 2000 | 1.000 | 60 | 2000 | 1.000 | 50 | 1.20 | 1.00 | 0.000 |"
        );
        // A point only one target ran: the others' cells are empty, not zero.
        assert_eq!(
            lines[3],
            "| canned | no | 1 KB | 1 | 1 | – | – | – | 500 | 1.000 | 90 | – | – | – | – | – | – |"
        );
        assert_eq!(base_mode(&json!({"mode": "grpc-canned"})), "grpc-canned");
        assert_eq!(base_mode(&json!({"mode": "a/rx"})), "a/rx");
    }

    #[test]
    fn ratio_table_sets_direct_peer_and_subject_side_by_side() {
        let point =
            |mode: &str, t: &str, stream: bool, c: u64, rps: f64, p50: f64, cpu: Option<f64>| {
                json!({"mode":mode,"stream":stream,"prompt_bytes":1030,"concurrency":c,"target":t,
                   "rps":rps,"p50_ms":p50,"gateway_cpu_us_per_req":cpu,"errors":0})
            };
        let rows = vec![
            point("f/r1", "direct", false, 64, 100000.0, 0.6, None),
            point("f/r1", "smg", false, 64, 10000.0, 6.0, Some(100.0)),
            point("f/r1", "pdgate", false, 64, 30000.0, 2.0, Some(40.0)),
            point("f/r2", "pdgate", false, 64, 20000.0, 2.0, Some(60.0)),
            point("f/r1", "direct", false, 1, 20000.0, 0.040, None),
            point("f/r1", "pdgate", false, 1, 5000.0, 0.110, Some(90.0)),
            json!({"mode":"f/r1","stream":true,"prompt_bytes":1030,"concurrency":64,
                   "target":"pdgate","rps":20000.0,"p50_ms":2.0,"gateway_cpu_us_per_req":50.0,
                   "events_per_request":18.0,"errors":0}),
        ];
        let holds = vec![
            json!({"target":"pdgate","streams_open":9800,"rss_per_stream_kb":44.9,"rss_idle_mb":10.3}),
        ];
        let roles = Roles {
            subject: "pdgate",
            baseline: Some("direct"),
            peer: Some("smg"),
            floor: None,
            pingora_floor: None,
        };
        let t = ratio_table(&rows, &holds, &roles);
        let line = |start: &str| {
            t.lines()
                .find(|l| l.starts_with(start))
                .unwrap_or_else(|| panic!("{t}"))
        };
        assert!(t.starts_with("| 1 KB chat, 2 round(s), medians | direct | smg | pdgate | pdgate ÷ smg | pdgate − direct |"), "{t}");
        assert_eq!(
            line("| req/s, c=64 "),
            "| req/s, c=64 | 100000 | 10000 | 25000 | 2.50 | – |"
        );
        assert_eq!(
            line("| gateway CPU µs/request, c=64 "),
            "| gateway CPU µs/request, c=64 | – | 100 | 50 | 0.50 | – |"
        );
        assert_eq!(
            line("| p50 ms, c=1 "),
            "| p50 ms, c=1 | 0.040 | – | 0.110 | – | 70 µs |"
        );
        assert_eq!(
            line("| SSE events per streamed answer, c=64 "),
            "| SSE events per streamed answer, c=64 | – | – | 18.0 | – | – |"
        );
        assert_eq!(
            line("| KB per open stream"),
            "| KB per open stream (smg: –, pdgate: 9800 open) | – | – | 44.9 | – | – |"
        );
    }

    /// One non-streamed 1 KB point of a round, as the ratio table reads it.
    fn point(t: &str, c: u64, rps: f64, p50: f64, cpu: Option<f64>) -> Value {
        json!({"mode":"f/r1","stream":false,"prompt_bytes":1030,"concurrency":c,"target":t,
               "rps":rps,"p50_ms":p50,"gateway_cpu_us_per_req":cpu,"errors":0})
    }

    #[test]
    fn ratio_table_gives_the_floor_a_column_with_its_ratio_and_excess() {
        let rows = vec![
            point("direct", 64, 100000.0, 0.6, None),
            point("floor", 64, 40000.0, 1.5, Some(20.0)),
            point("smg", 64, 10000.0, 6.0, Some(100.0)),
            point("pdgate", 64, 30000.0, 2.0, Some(40.0)),
            point("direct", 1, 20000.0, 0.040, None),
            point("floor", 1, 9000.0, 0.070, Some(30.0)),
            point("pdgate", 1, 5000.0, 0.110, Some(90.0)),
        ];
        let roles = Roles {
            subject: "pdgate",
            baseline: Some("direct"),
            peer: Some("smg"),
            floor: Some("floor"),
            pingora_floor: None,
        };
        let t = ratio_table(&rows, &[], &roles);
        let line = |start: &str| {
            t.lines()
                .find(|l| l.starts_with(start))
                .unwrap_or_else(|| panic!("{t}"))
        };
        assert!(t.starts_with("| 1 KB chat, 1 round(s), medians | direct | floor | smg | pdgate | pdgate ÷ smg | pdgate ÷ floor | pdgate − direct | floor − direct |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|\n"), "{t}");
        assert_eq!(
            line("| gateway CPU µs/request, c=64 "),
            "| gateway CPU µs/request, c=64 | – | 20 | 100 | 40 | 0.40 | 2.00 | – | – |"
        );
        assert_eq!(
            line("| p50 ms, c=1 "),
            "| p50 ms, c=1 | 0.040 | 0.070 | – | 0.110 | – | 1.57 | 70 µs | 30 µs |"
        );
    }

    #[test]
    fn ratio_table_gives_the_pingora_floor_a_column_and_a_ratio() {
        let rows = vec![
            point("direct", 64, 100000.0, 0.6, None),
            point("floor", 64, 40000.0, 1.5, Some(20.0)),
            point("pfloor", 64, 35000.0, 1.7, Some(32.0)),
            point("smg", 64, 10000.0, 6.0, Some(100.0)),
            point("pdgate", 64, 30000.0, 2.0, Some(40.0)),
        ];
        let mut roles = Roles {
            subject: "pdgate",
            baseline: Some("direct"),
            peer: Some("smg"),
            floor: Some("floor"),
            pingora_floor: Some("pfloor"),
        };
        let t = ratio_table(&rows, &[], &roles);
        assert!(t.starts_with("| 1 KB chat, 1 round(s), medians | direct | floor | pfloor | smg | pdgate | pdgate ÷ smg | pdgate ÷ floor | pdgate ÷ pfloor | pdgate − direct | floor − direct |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n"), "{t}");
        assert!(
            t.contains("| gateway CPU µs/request, c=64 | – | 20 | 32 | 100 | 40 | 0.40 | 2.00 | 1.25 | – | – |"),
            "{t}"
        );
        // The Pingora floor alone, without the plain one.
        roles.floor = None;
        let t = ratio_table(&rows, &[], &roles);
        assert!(
            t.contains("| gateway CPU µs/request, c=64 | – | 32 | 100 | 40 | 0.40 | 1.25 | – |"),
            "{t}"
        );
    }

    #[test]
    fn subject_row_carries_ratios_to_direct_and_peer() {
        let point = |t: &str, rps: f64, p50: f64, cpu: Option<f64>| {
            json!({"mode":"canned","stream":false,"prompt_bytes":1030,"concurrency":64,"target":t,
                   "rps":rps,"p50_ms":p50,"gateway_cpu_us_per_req":cpu,"errors":0})
        };
        let rows = vec![
            point("direct", 20000.0, 3.0, None),
            point("pdgate", 10000.0, 6.0, Some(50.0)),
            point("smg", 5000.0, 12.0, Some(200.0)),
        ];
        let t = sweep_table(
            &rows,
            &Roles {
                subject: "pdgate",
                baseline: Some("direct"),
                peer: Some("smg"),
                floor: None,
                pingora_floor: None,
            },
        );
        let line = t.lines().find(|l| l.contains("**pdgate**")).unwrap();
        assert!(line.ends_with("| 0.50 | 3.000 | 2.00 | 0.25 |"), "{line}");
        let direct = t.lines().find(|l| l.contains("| direct |")).unwrap();
        assert!(direct.ends_with("| – | – | – | – |"), "{direct}");
    }
}
