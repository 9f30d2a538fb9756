//! Assembling a running gateway from one validated [`LoadedConfig`]: the Pingora server, the
//! data-plane proxy service, the Prometheus listener, and the background services (health,
//! service discovery).
//!
//! Nothing here starts threads or runtimes: Pingora may daemonize in `run_forever`, so all
//! runtime work happens inside services.

use std::sync::Arc;

use pingora::listeners::{L4BufferSettings, ListenerConfig};
use pingora::server::configuration::Opt;
use pingora::server::Server;
use pingora::services::background::background_service;
use pingora::services::listening::Service;

use crate::config::{DiscoveryProvider, LoadedConfig};
use crate::discovery::kubernetes::KubernetesDiscovery;
use crate::drain::{DrainOnShutdown, DrainingApp, DRAIN};
use crate::gateway::Gateway;
use crate::proxy::{Listener, PdGateway};
use crate::reload::ReloadOnHangup;
use crate::workers::health::HealthChecker;
use crate::workers::intake;
use crate::workers::load::LoadMonitor;
use crate::workers::select::LegPolicies;
use crate::workers::worker::{Origin, WorkerDefaults};
use crate::workers::Registry;

/// Why the server could not be built (shown to the operator, exit code 1).
#[derive(Debug)]
pub struct BuildError(pub String);

impl std::fmt::Display for BuildError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// Builds (but does not run) the server. Outside a graceful upgrade, every listening address is
/// bound once first (`crate::listen_check`): one that cannot be is the error.
pub fn build(loaded: LoadedConfig, opt: Opt) -> Result<Server, BuildError> {
    crate::metrics::init();
    crate::trace::init(&loaded.gateway).map_err(|e| BuildError(format!("tracing: {e}")))?;
    let startup: Vec<_> = loaded.startup_workers().cloned().collect();
    let cfg = loaded.gateway.clone();
    // Pingora's ServerConf is not Clone; the gateway keeps a copy of the startup settings so a
    // reload can report what it cannot change in place.
    let server_conf = serde_yaml::to_value(&loaded.server_conf)
        .and_then(serde_yaml::from_value)
        .map_err(|e| BuildError(format!("copying the server settings: {e}")))?;
    let defaults = WorkerDefaults::from_config(&cfg);
    let registry = Arc::new(Registry::new(cfg.pd_pairing_mode));
    for spec in &startup {
        let worker = intake::startup_worker(spec, &defaults, Origin::Config)
            .map_err(|e| BuildError(format!("worker {}: {e}", spec.url)))?;
        registry
            .add(worker)
            .map_err(|_| BuildError(format!("worker {} is listed twice", spec.url)))?;
    }
    let policies = LegPolicies::from_config(&cfg).map_err(BuildError)?;
    for w in &registry.snapshot().all {
        policies.worker_added(w);
    }
    let listen = cfg.listen_addr();
    let admin_addr = cfg.admin_addr();
    let prometheus_addr = cfg.prometheus_addr();
    let probes_addr = cfg.health_check_addr();
    if !opt.upgrade {
        let mut listeners = vec![
            ("serving", listen.as_str()),
            ("Prometheus", prometheus_addr.as_str()),
        ];
        listeners.extend(admin_addr.as_deref().map(|addr| ("admin", addr)));
        listeners.extend(probes_addr.as_deref().map(|addr| ("probe", addr)));
        crate::listen_check::check(listeners).map_err(BuildError)?;
    }
    let models = crate::models::Models::load(&cfg).map_err(BuildError)?;
    let gw = Arc::new(Gateway::new(loaded, registry, policies, models));

    let mut server = Server::new_with_opt_and_conf(opt, server_conf);
    server.bootstrap();
    DRAIN.set_idle_grace(std::time::Duration::from_secs(
        server
            .configuration
            .grace_period_seconds
            .unwrap_or(crate::config::defaults::PINGORA_GRACE_PERIOD_SECS),
    ));

    let data = PdGateway {
        gw: gw.clone(),
        listener: Listener::Data,
    };
    server.add_service(client_service(&server, data, "pdgate", &listen));
    if let Some(addr) = admin_addr {
        let admin = PdGateway {
            gw: gw.clone(),
            listener: Listener::Admin,
        };
        server.add_service(client_service(&server, admin, "pdgate admin", &addr));
    }
    if let Some(addr) = probes_addr {
        let probes = PdGateway {
            gw: gw.clone(),
            listener: Listener::Probes,
        };
        let mut service = client_service(&server, probes, "pdgate probes", &addr);
        // Its own runtime (Pingora gives each service one): a probe is answered on a thread
        // that requests cannot keep busy. One thread is plenty for probes.
        service.threads = Some(PROBE_THREADS);
        server.add_service(service);
    }
    server.add_service(background_service(
        "connection drain",
        DrainOnShutdown {
            phases: std::sync::Mutex::new(Some(server.watch_execution_phase())),
            exit: exit_now,
        },
    ));

    let mut prometheus = pingora_prometheus::prometheus_http_service();
    prometheus.add_tcp(&prometheus_addr);
    server.add_service(prometheus);

    server.add_service(background_service(
        "health checks",
        HealthChecker { gw: gw.clone() },
    ));
    server.add_service(background_service(
        "load monitor",
        LoadMonitor { gw: gw.clone() },
    ));
    server.add_service(background_service(
        "capacity advice",
        crate::capacity::CapacityAdvisor { gw: gw.clone() },
    ));
    server.add_service(background_service(
        "link canaries",
        crate::workers::canary::LinkCanaries { gw: gw.clone() },
    ));
    server.add_service(background_service(
        "config watch",
        crate::reload::ReloadOnChange { gw: gw.clone() },
    ));
    match cfg.discovery() {
        Some(DiscoveryProvider::Kubernetes) => {
            let discovery =
                KubernetesDiscovery::from_config(gw.clone(), &cfg).map_err(BuildError)?;
            server.add_service(background_service("kubernetes discovery", discovery));
        }
        Some(DiscoveryProvider::File) => {
            let discovery = crate::discovery::file::FileDiscovery::from_config(gw.clone(), &cfg)
                .map_err(BuildError)?;
            server.add_service(background_service("file discovery", discovery));
        }
        None => {}
    }
    server.add_service(background_service("config reload", ReloadOnHangup { gw }));
    Ok(server)
}

/// Threads of the probe listener's runtime (`health_check_port`).
const PROBE_THREADS: usize = 1;

/// How long the exit waits for the last spans to reach the collector.
const TRACE_FLUSH_DEADLINE: std::time::Duration = std::time::Duration::from_secs(3);

/// Runs the server until it shuts down (SIGTERM, SIGINT, or the hand-over of a graceful
/// upgrade), then flushes the trace exporter (bounded) and exits. Pingora's `run_forever` exits
/// the process as soon as its runtimes are down, before spans ended by that shutdown could go.
pub fn run(server: Server) -> ! {
    server.run(pingora::server::RunArgs::default());
    exit_now();
    unreachable!("exit_now returns only by exiting")
}

/// Flushes the trace exporter (bounded) and exits: at the end of Pingora's run, or as soon as a
/// graceful shutdown or upgrade has drained every client connection (`crate::drain`).
fn exit_now() {
    crate::trace::shutdown(TRACE_FLUSH_DEADLINE);
    std::process::exit(0)
}

/// A client-facing proxy service on `addr`, hosted so that its keep-alive connections drain
/// without losing a request at an upgrade or shutdown (see `crate::drain`).
fn client_service(
    server: &Server,
    app: PdGateway,
    name: &str,
    addr: &str,
) -> Service<DrainingApp<PdGateway>> {
    let proxy = pingora::proxy::http_proxy(&server.configuration, app);
    let mut service = Service::new(name.to_string(), DrainingApp::new(proxy));
    service.add_listener(client_listener(addr));
    service
}

/// A client-facing listener without Pingora's 64 KiB per-connection read buffer. Plain HTTP/1.1
/// with one request at a time gains nothing from it — request heads are read into their own
/// buffer, bodies into the body reader's — and it was the largest part of an open stream's
/// memory (bench/README.md, "Memory per open stream"). Nor its MSS-sized write buffer: writes are
/// gathered above it, in a buffer that exists only while it holds bytes (`crate::gather`).
fn client_listener(addr: &str) -> ListenerConfig {
    ListenerConfig::tcp(addr).l4_buffer(L4BufferSettings::new(0, 0))
}
