//! The span pipeline: finished spans go into a bounded queue (never blocking the request that
//! ended them) and one exporter thread sends them to the collector in batches over OTLP.
//!
//! Why not the SDK's `BatchSpanProcessor`: it counts the spans it drops but only logs the count
//! at shutdown. An operator needs to see drops as they happen, so this processor counts every
//! span it loses (`pdgate_trace_spans_dropped_total{reason}`: `queue_full` when the collector is
//! too slow, `export_failed` when it refused or could not be reached, `shutdown` when the
//! process exits before a span could go) and every span delivered
//! (`pdgate_trace_spans_exported_total`).
//!
//! The thread starts with the first finished span (after Pingora has daemonized, so it
//! survives the fork) and runs a single-threaded tokio runtime of its own for the exporter's
//! client (tonic, or hyper for OTLP/HTTP): nothing runs on the proxy's runtimes. It exports a
//! batch when [`QueueSettings::max_batch`] spans are waiting or the oldest waited
//! [`QueueSettings::delay`]; each export is bounded by [`QueueSettings::export_timeout`].

use std::sync::mpsc::{self, Receiver, RecvTimeoutError, SyncSender, TrySendError};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use opentelemetry::Context;
use opentelemetry_otlp::{Protocol, SpanExporter, WithExportConfig};
use opentelemetry_sdk::error::{OTelSdkError, OTelSdkResult};
use opentelemetry_sdk::trace::{Span, SpanData, SpanExporter as _, SpanProcessor};
use opentelemetry_sdk::Resource;
use pingora_prometheus::prometheus::IntCounter;

use crate::config::{OtlpEndpoint, OtlpProtocol};
use crate::metrics::METRICS;

/// Sizes and deadlines of the queue and its exporter.
#[derive(Clone, Debug)]
pub struct QueueSettings {
    /// Spans waiting to be exported; a span that finds it full is dropped (and counted).
    pub capacity: usize,
    /// Spans per export call.
    pub max_batch: usize,
    /// Longest a finished span waits for its batch.
    pub delay: Duration,
    /// Deadline of one export call (retries included).
    pub export_timeout: Duration,
}

impl Default for QueueSettings {
    /// The SDK's batch defaults (2048 queued, 512 per batch), a shorter delay (1 s instead of
    /// 5 s, so a trace shows up while the operator is still looking) and a 5 s export deadline.
    fn default() -> Self {
        QueueSettings {
            capacity: 2048,
            max_batch: 512,
            delay: Duration::from_secs(1),
            export_timeout: Duration::from_secs(5),
        }
    }
}

/// The drop counters by reason, resolved once (a label lookup takes a lock).
struct Counters {
    exported: IntCounter,
    queue_full: IntCounter,
    export_failed: IntCounter,
    shutdown: IntCounter,
}

impl Counters {
    fn get() -> &'static Counters {
        static COUNTERS: OnceLock<Counters> = OnceLock::new();
        COUNTERS.get_or_init(|| {
            let dropped = |reason| METRICS.trace_spans_dropped.with_label_values(&[reason]);
            Counters {
                exported: METRICS.trace_spans_exported.clone(),
                queue_full: dropped("queue_full"),
                export_failed: dropped("export_failed"),
                shutdown: dropped("shutdown"),
            }
        })
    }
}

/// What the exporter thread is asked besides exporting.
enum Control {
    /// Export everything queued, then answer.
    Flush(SyncSender<()>),
    /// Export everything queued within the deadline, stop, then answer.
    Shutdown(Instant, SyncSender<()>),
}

/// The SDK-facing end: [`SpanProcessor::on_end`] only tries to enqueue.
#[derive(Debug)]
pub struct QueueProcessor {
    spans: SyncSender<SpanData>,
    control: SyncSender<Control>,
    /// The exporter thread's inputs, taken when it starts.
    worker: Mutex<Option<Worker>>,
    started: OnceLock<()>,
}

/// Everything the exporter thread owns.
struct Worker {
    endpoint: OtlpEndpoint,
    settings: QueueSettings,
    spans: Receiver<SpanData>,
    control: Receiver<Control>,
    resource: Option<Resource>,
}

impl std::fmt::Debug for Worker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Worker")
            .field("endpoint", &self.endpoint)
            .finish()
    }
}

impl QueueProcessor {
    pub fn new(endpoint: OtlpEndpoint, settings: QueueSettings) -> QueueProcessor {
        let (spans_tx, spans) = mpsc::sync_channel(settings.capacity);
        let (control_tx, control) = mpsc::sync_channel(4);
        QueueProcessor {
            spans: spans_tx,
            control: control_tx,
            worker: Mutex::new(Some(Worker {
                endpoint,
                settings,
                spans,
                control,
                resource: None,
            })),
            started: OnceLock::new(),
        }
    }

    /// Starts the exporter thread (once).
    fn ensure_started(&self) {
        self.started.get_or_init(|| {
            let worker = self.worker.lock().unwrap_or_else(|e| e.into_inner()).take();
            if let Some(worker) = worker {
                let spawned = std::thread::Builder::new()
                    .name("pdgate-otlp".into())
                    .spawn(move || worker.run());
                if let Err(e) = spawned {
                    log::error!("trace export thread could not start: {e}; spans are dropped");
                }
            }
        });
    }

    /// Sends `control` and waits for its answer until `deadline`.
    fn ask(
        &self,
        make: impl FnOnce(SyncSender<()>) -> Control,
        deadline: Instant,
    ) -> OTelSdkResult {
        if self.started.get().is_none() {
            // Nothing was ever exported: nothing is queued that a thread would send.
            return Ok(());
        }
        let (tx, rx) = mpsc::sync_channel(1);
        if self.control.try_send(make(tx)).is_err() {
            return Err(OTelSdkError::InternalFailure(
                "the trace exporter is busy or gone".into(),
            ));
        }
        rx.recv_timeout(deadline.saturating_duration_since(Instant::now()))
            .map_err(|_| OTelSdkError::Timeout(Duration::ZERO))
    }
}

impl SpanProcessor for QueueProcessor {
    fn on_start(&self, _span: &mut Span, _cx: &Context) {}

    fn on_end(&self, span: SpanData) {
        if !span.span_context.is_sampled() {
            return;
        }
        self.ensure_started();
        match self.spans.try_send(span) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) => Counters::get().queue_full.inc(),
            Err(TrySendError::Disconnected(_)) => Counters::get().shutdown.inc(),
        }
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.ask(Control::Flush, Instant::now() + Duration::from_secs(10))
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        let deadline = Instant::now() + timeout;
        self.ask(|tx| Control::Shutdown(deadline, tx), deadline)
    }

    fn set_resource(&mut self, resource: &Resource) {
        if let Some(w) = self.worker.get_mut().unwrap_or_else(|e| e.into_inner()) {
            w.resource = Some(resource.clone());
        }
    }
}

impl Worker {
    fn run(self) {
        let rt = match tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        {
            Ok(rt) => rt,
            Err(e) => {
                log::error!("trace export runtime could not start: {e}; spans are dropped");
                return;
            }
        };
        // tonic's channel starts its worker on the current runtime: build inside it.
        let built = {
            let _inside = rt.enter();
            build_exporter(&self.endpoint, self.settings.export_timeout)
        };
        let mut exporter = match built {
            Ok(e) => e,
            Err(e) => {
                log::error!(
                    "trace exporter for {} could not be built: {e}; spans are dropped",
                    self.endpoint.url
                );
                drain_as_dropped(&self.spans);
                return;
            }
        };
        if let Some(resource) = &self.resource {
            exporter.set_resource(resource);
        }
        let mut sender = BatchSender {
            rt,
            exporter,
            url: self.endpoint.url.clone(),
            timeout: self.settings.export_timeout,
            last_warning: None,
        };
        let mut batch: Vec<SpanData> = Vec::with_capacity(self.settings.max_batch);
        let mut batch_due: Option<Instant> = None;
        // How often a quiet thread looks at its control channel.
        const TICK: Duration = Duration::from_millis(100);
        loop {
            let wait = batch_due
                .map_or(TICK, |due| due.saturating_duration_since(Instant::now()))
                .min(TICK);
            match self.spans.recv_timeout(wait) {
                Ok(span) => {
                    if batch.is_empty() {
                        batch_due = Some(Instant::now() + self.settings.delay);
                    }
                    batch.push(span);
                }
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => {
                    sender.send(std::mem::take(&mut batch), None);
                    return;
                }
            }
            let due = batch_due.is_some_and(|d| Instant::now() >= d);
            if batch.len() >= self.settings.max_batch || (due && !batch.is_empty()) {
                sender.send(std::mem::take(&mut batch), None);
                batch_due = None;
            }
            match self.control.try_recv() {
                Ok(Control::Flush(reply)) => {
                    self.flush(&mut sender, &mut batch, None);
                    batch_due = None;
                    let _ = reply.try_send(());
                }
                Ok(Control::Shutdown(deadline, reply)) => {
                    self.flush(&mut sender, &mut batch, Some(deadline));
                    let _ = sender
                        .exporter
                        .shutdown_with_timeout(deadline.saturating_duration_since(Instant::now()));
                    let _ = reply.try_send(());
                    // Spans that end from now on have nowhere to go.
                    drop(self.spans);
                    return;
                }
                Err(_) => {}
            }
        }
    }

    /// Exports the batch and everything queued, in batches; past `deadline` the rest is dropped.
    fn flush(
        &self,
        sender: &mut BatchSender,
        batch: &mut Vec<SpanData>,
        deadline: Option<Instant>,
    ) {
        batch.extend(self.spans.try_iter());
        while !batch.is_empty() {
            let rest = if batch.len() > self.settings.max_batch {
                batch.split_off(self.settings.max_batch)
            } else {
                Vec::new()
            };
            sender.send(std::mem::take(batch), deadline);
            *batch = rest;
        }
    }
}

/// Counts every span still queued as dropped (the exporter cannot run).
fn drain_as_dropped(spans: &Receiver<SpanData>) {
    let c = Counters::get();
    for _ in spans.iter() {
        c.export_failed.inc();
    }
}

/// The exporter and its runtime.
struct BatchSender {
    rt: tokio::runtime::Runtime,
    exporter: SpanExporter,
    url: String,
    timeout: Duration,
    /// When the last export failure was logged (one warning a minute at most).
    last_warning: Option<Instant>,
}

impl BatchSender {
    fn send(&mut self, batch: Vec<SpanData>, deadline: Option<Instant>) {
        if batch.is_empty() {
            return;
        }
        let n = batch.len() as u64;
        let c = Counters::get();
        let limit = match deadline {
            Some(d) => d
                .saturating_duration_since(Instant::now())
                .min(self.timeout),
            None => self.timeout,
        };
        if limit.is_zero() {
            c.shutdown.inc_by(n);
            return;
        }
        let exporter = &self.exporter;
        let result = self
            .rt
            .block_on(async { tokio::time::timeout(limit, exporter.export(batch)).await });
        match result {
            Ok(Ok(())) => c.exported.inc_by(n),
            failed => {
                c.export_failed.inc_by(n);
                let why = match failed {
                    Ok(Err(e)) => e.to_string(),
                    _ => format!("no answer within {limit:?}"),
                };
                let now = Instant::now();
                if self
                    .last_warning
                    .is_none_or(|t| now.duration_since(t) >= Duration::from_secs(60))
                {
                    self.last_warning = Some(now);
                    log::warn!(
                        "trace export to {} failed, {n} spans dropped (counted in \
                         pdgate_trace_spans_dropped_total): {why}",
                        self.url
                    );
                }
            }
        }
    }
}

fn build_exporter(endpoint: &OtlpEndpoint, timeout: Duration) -> Result<SpanExporter, String> {
    let built = match endpoint.protocol {
        OtlpProtocol::Grpc => SpanExporter::builder()
            .with_tonic()
            .with_endpoint(endpoint.url.clone())
            .with_timeout(timeout)
            .build(),
        OtlpProtocol::HttpProtobuf => SpanExporter::builder()
            .with_http()
            .with_protocol(Protocol::HttpBinary)
            .with_endpoint(endpoint.url.clone())
            .with_timeout(timeout)
            .build(),
    };
    built.map_err(|e| e.to_string())
}
