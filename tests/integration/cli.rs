//! The command line: `check` on every shipped config, `check` refusing a bad one with its reason,
//! `launch` with SMG's flags serving PD, and the demo config serving a request.

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use mock_engine::{EngineKind, MockEngine, MockEngineConfig, Role};
use serde_json::json;

use crate::harness::{free_port, pdgate_bin, Gateway, KillOnDrop};

fn repo(path: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(path)
}

#[test]
fn every_shipped_config_passes_check() {
    let mut checked = 0;
    for entry in std::fs::read_dir(repo("conf")).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().and_then(|e| e.to_str()) != Some("yaml") {
            continue;
        }
        // workers.yaml is a worker list for `workers_file`, not a whole config.
        if path.file_name().and_then(|n| n.to_str()) == Some("workers.yaml") {
            continue;
        }
        let out = Command::new(pdgate_bin())
            .arg("check")
            .arg("-c")
            .arg(&path)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}: {}",
            path.display(),
            String::from_utf8_lossy(&out.stderr)
        );
        checked += 1;
    }
    assert!(checked >= 2, "expected conf/pdgate.yaml and conf/demo.yaml");
}

#[test]
fn check_refuses_a_bad_config_with_the_reason() {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    let cases = [
        ("gateway:\n  pd_disaggregation: true\n  retry_max_retires: 3\n", "retry_max_retires"),
        ("gateway:\n  pd_disaggregation: true\n  decode_policy: bucket\n", "bucket"),
        (
            "gateway:\n  pd_disaggregation: true\n  workers:\n    - {url: \"HTTP://p:1\", worker_type: prefill}\n",
            "lowercase",
        ),
        ("gateway:\n  pd_disaggregation: true\n  port: 70000\n", "port"),
    ];
    for (i, (yaml, needle)) in cases.iter().enumerate() {
        let path = dir.join(format!("bad-{i}.yaml"));
        std::fs::write(&path, yaml).unwrap();
        let out = Command::new(pdgate_bin())
            .arg("check")
            .arg("-c")
            .arg(&path)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "case {i} accepted");
        assert!(
            err.contains(needle),
            "case {i}: message does not name `{needle}`: {err}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn launch_with_smg_flags_serves_pd() {
    let p = MockEngine::spawn(MockEngineConfig::test(
        EngineKind::Sglang,
        Role::Prefill,
        [127, 0, 0, 2],
    ))
    .await
    .unwrap();
    let d = MockEngine::spawn(MockEngineConfig::test(
        EngineKind::Sglang,
        Role::Decode,
        [127, 0, 0, 3],
    ))
    .await
    .unwrap();
    let port = free_port();
    let prom = free_port();
    let child = KillOnDrop(
        Command::new(pdgate_bin())
            .args([
                "launch",
                "--pd-disaggregation",
                "--host",
                "127.0.0.1",
                "--port",
                &port.to_string(),
            ])
            .args([
                "--prefill",
                &p.api_url(),
                &p.bootstrap_port().unwrap().to_string(),
            ])
            .args(["--decode", &d.api_url()])
            .args([
                "--prefill-policy",
                "round_robin",
                "--decode-policy",
                "random",
            ])
            .args([
                "--prometheus-host",
                "127.0.0.1",
                "--prometheus-port",
                &prom.to_string(),
            ])
            .args([
                "--worker-startup-check-interval",
                "1",
                "--shutdown-grace-period-secs",
                "0",
            ])
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    );
    let url = format!("http://127.0.0.1:{port}");
    let ready = mock_engine::wait_until(Duration::from_secs(20), || {
        std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
    })
    .await;
    assert!(ready, "launch did not listen");
    let mut status = 0;
    for _ in 0..200 {
        status = mock_engine::client::get(&format!("{url}/readiness"))
            .await
            .map(|r| r.status)
            .unwrap_or(0);
        if status == 200 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(status, 200, "launch never became ready");
    // The re-execution with malloc's tunables (through /proc/self/exe) keeps the process's name.
    let comm = std::fs::read_to_string(format!("/proc/{}/comm", child.0.id())).unwrap();
    assert_eq!(comm.trim_end(), "pdgate", "the name ps and pgrep show");
    let r = mock_engine::client::post_json(
        &format!("{url}/generate"),
        &json!({"text": "hi", "sampling_params": {"max_new_tokens": 2}}),
    )
    .await
    .unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    let rec = &d.records()[0];
    assert_eq!(rec.body["bootstrap_port"], json!(p.bootstrap_port()));
    assert_eq!(rec.handoff.kv_source.as_deref(), Some("remote"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_demo_config_serves_a_request() {
    // conf/demo.yaml names fixed ports; run it as shipped except for the port numbers, so a
    // running demo (or anything else on those ports) cannot collide with the test.
    let text = std::fs::read_to_string(repo("conf/demo.yaml")).unwrap();
    let (port, prom, p_port, p_boot, d_port) = (
        free_port(),
        free_port(),
        free_port(),
        free_port(),
        free_port(),
    );
    let mut conf = text.clone();
    for (fixed, free) in [
        (30000, port),
        (29000, prom),
        (31001, p_port),
        (31901, p_boot),
        (31002, d_port),
    ] {
        assert!(
            conf.contains(&fixed.to_string()),
            "demo.yaml no longer uses port {fixed}"
        );
        conf = conf.replace(&fixed.to_string(), &free.to_string());
    }
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    let path = dir.join("demo-conf.yaml");
    std::fs::write(&path, conf).unwrap();
    let mut pc = MockEngineConfig::test(EngineKind::Sglang, Role::Prefill, [127, 0, 0, 1]);
    pc.port = p_port;
    pc.bootstrap_port = p_boot;
    let mut dc = MockEngineConfig::test(EngineKind::Sglang, Role::Decode, [127, 0, 0, 1]);
    dc.port = d_port;
    let _p = MockEngine::spawn(pc).await.unwrap();
    let _d = MockEngine::spawn(dc).await.unwrap();
    let mut gw = Gateway::spawn(&path, port, prom, dir.join("demo-conf.log"));
    gw.wait_ready().await;
    let r = gw
        .post("/v1/chat/completions", &json!({"model": "mock-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}))
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
}

/// The gateway runs with a larger glibc tcache, set by re-executing itself once at start (same
/// pid, same arguments); an operator's own `glibc.malloc.*` tunables win. (glibc shows only the
/// first tunable of the variable in `/proc/<pid>/environ`: ours puts the tcache first.)
#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gateway_tunes_malloc_unless_the_operator_did() {
    fn tunables(gw: &Gateway) -> String {
        let env = std::fs::read(format!("/proc/{}/environ", gw.pid())).unwrap();
        env.split(|b| *b == 0)
            .find_map(|e| e.strip_prefix(b"GLIBC_TUNABLES="))
            .map(|v| String::from_utf8_lossy(v).into_owned())
            .unwrap_or_default()
    }
    let ours = Gateway::start(&[], "").await;
    assert!(
        tunables(&ours).starts_with("glibc.malloc.tcache_count=32"),
        "GLIBC_TUNABLES={:?}\n{}",
        tunables(&ours),
        ours.log()
    );
    let theirs = Gateway::start_with_env(
        &[],
        "",
        &[("GLIBC_TUNABLES", "glibc.malloc.tcache_count=7")],
    )
    .await;
    assert_eq!(tunables(&theirs), "glibc.malloc.tcache_count=7");
}

/// A port another process listens on ends `pdgate run` at once, with status 1 and the address,
/// for the serving and the Prometheus listener alike. (Pingora alone retried for 30 s, then
/// panicked in the listener's thread and left a process running that served nothing there.)
#[test]
fn run_exits_at_once_when_a_listening_port_is_taken() {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    for which in ["serving", "Prometheus"] {
        let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let busy = taken.local_addr().unwrap().port();
        let (port, prom) = match which {
            "serving" => (busy, free_port()),
            _ => (free_port(), busy),
        };
        let path = dir.join(format!("port-taken-{which}.yaml"));
        let yaml = format!(
            "version: 1\nthreads: 1\npid_file: {d}/port-taken-{port}.pid\n\
             upgrade_sock: {d}/port-taken-{port}.sock\ngateway:\n  pd_disaggregation: true\n  \
             host: 127.0.0.1\n  port: {port}\n  prometheus_host: 127.0.0.1\n  \
             prometheus_port: {prom}\n",
            d = dir.display()
        );
        std::fs::write(&path, yaml).unwrap();
        let mut child = Command::new(pdgate_bin())
            .args(["run", "-c"])
            .arg(&path)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        // Long enough for a loaded machine, well short of Pingora's 30 s of retries.
        let deadline = std::time::Instant::now() + Duration::from_secs(15);
        let status = loop {
            if let Some(status) = child.try_wait().unwrap() {
                break status;
            }
            if std::time::Instant::now() > deadline {
                child.kill().ok();
                child.wait().ok();
                panic!("{which}: pdgate still running 15 s after it started on a taken port");
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let mut err = String::new();
        std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
        assert_eq!(status.code(), Some(1), "{which}: {err}");
        assert!(
            err.contains(&format!("the {which} listener 127.0.0.1:{busy}"))
                && err.contains("already in use"),
            "{which}: {err}"
        );
        drop(taken);
    }
}
