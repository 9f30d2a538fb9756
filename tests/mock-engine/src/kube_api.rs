//! A fake Kubernetes API server for pods, on loopback, speaking the real list/watch wire format
//! (test support for pdgate's service discovery):
//!
//! * `GET /api/v1/namespaces/{ns}/pods` and `GET /api/v1/pods` (every namespace) with a
//!   `labelSelector` (`k=v,k2=v2`): a `PodList` whose `metadata.resourceVersion` is the store's.
//! * The same with `watch=true&resourceVersion=N`: a chunked stream of JSON lines
//!   `{"type": "ADDED|MODIFIED|DELETED|BOOKMARK|ERROR", "object": …}`, replaying the changes
//!   after `N` first; a `resourceVersion` older than the last [`FakeKubeApi::expire_watches`]
//!   gets a `410 Gone` `ERROR` Status object, as a compacted etcd gives, which forces a relist.
//!
//! Pods are JSON values (see [`pod`]); the server stamps `resourceVersion` and `uid`. Changes
//! made while [`FakeKubeApi::set_quiet`] is on reach no watch (as if the watch had missed them):
//! only a relist sees them.

use std::collections::BTreeMap;
use std::io;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use hyper::body::Incoming;
use hyper::Request;
use serde_json::{json, Value};
use tokio::net::TcpListener;
use tokio::sync::mpsc;

use crate::server::{self, query_pairs, HttpResponse, TaskGroup};

type EventTx = mpsc::Sender<Result<Bytes, io::Error>>;

struct Watch {
    namespace: Option<String>,
    selector: Vec<(String, String)>,
    tx: EventTx,
}

#[derive(Default)]
struct Store {
    resource_version: u64,
    /// Watches from a resourceVersion below this get 410 Gone.
    compacted: u64,
    pods: BTreeMap<(String, String), Value>,
    /// Every change a watch may replay: (resourceVersion, event type, pod).
    history: Vec<(u64, &'static str, Value)>,
    watches: Vec<Watch>,
    quiet: bool,
    lists: usize,
    watch_requests: usize,
    next_uid: u64,
}

/// The running fake; stops serving (every connection cut) on drop.
pub struct FakeKubeApi {
    addr: SocketAddr,
    store: Arc<Mutex<Store>>,
    group: Arc<TaskGroup>,
}

impl Drop for FakeKubeApi {
    fn drop(&mut self) {
        self.group.abort_all();
    }
}

/// A pod in `namespace` with `labels`, `Running` with IP `ip` and condition Ready = `ready`.
pub fn pod(namespace: &str, name: &str, labels: &[(&str, &str)], ip: &str, ready: bool) -> Value {
    let labels: serde_json::Map<String, Value> = labels
        .iter()
        .map(|(k, v)| (k.to_string(), json!(v)))
        .collect();
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": {"containers": [{"name": "engine", "image": "engine"}]},
        "status": {
            "phase": "Running",
            "podIP": ip,
            "conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}],
        },
    })
}

impl FakeKubeApi {
    /// Serves on an ephemeral loopback port.
    pub async fn start() -> io::Result<FakeKubeApi> {
        FakeKubeApi::start_on(0).await
    }

    /// Serves on `127.0.0.1:port` (a test that starts the gateway first picks the port).
    pub async fn start_on(port: u16) -> io::Result<FakeKubeApi> {
        let listener = TcpListener::bind(("127.0.0.1", port)).await?;
        let addr = listener.local_addr()?;
        let store = Arc::new(Mutex::new(Store::default()));
        let group = Arc::new(TaskGroup::default());
        let s = store.clone();
        server::serve(listener, group.clone(), move |req, _| {
            let store = s.clone();
            async move { handle(&store, req) }
        });
        Ok(FakeKubeApi { addr, store, group })
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// A kubeconfig naming `server` (no credentials), for `KUBECONFIG`.
    pub fn kubeconfig(server: &str, namespace: &str) -> String {
        format!(
            "apiVersion: v1\nkind: Config\ncurrent-context: fake\nclusters:\n- name: fake\n  \
             cluster:\n    server: {server}\ncontexts:\n- name: fake\n  context:\n    cluster: \
             fake\n    user: fake\n    namespace: {namespace}\nusers:\n- name: fake\n  user: {{}}\n"
        )
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Store> {
        self.store.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Creates or replaces a pod (ADDED or MODIFIED to the watches it matches).
    pub fn apply(&self, mut pod: Value) {
        let mut store = self.lock();
        let key = pod_key(&pod);
        let kind = match store.pods.get(&key) {
            Some(old) => {
                pod["metadata"]["uid"] = old["metadata"]["uid"].clone();
                "MODIFIED"
            }
            None => {
                store.next_uid += 1;
                pod["metadata"]["uid"] = json!(format!("uid-{}", store.next_uid));
                "ADDED"
            }
        };
        store.resource_version += 1;
        pod["metadata"]["resourceVersion"] = json!(store.resource_version.to_string());
        store.pods.insert(key, pod.clone());
        store.publish(kind, pod);
    }

    /// Deletes a pod (DELETED to its watches); false when there is none.
    pub fn delete(&self, namespace: &str, name: &str) -> bool {
        let mut store = self.lock();
        let Some(mut pod) = store
            .pods
            .remove(&(namespace.to_string(), name.to_string()))
        else {
            return false;
        };
        store.resource_version += 1;
        pod["metadata"]["resourceVersion"] = json!(store.resource_version.to_string());
        store.publish("DELETED", pod);
        true
    }

    /// While on, changes reach no watch and no replay (only a list sees them).
    pub fn set_quiet(&self, quiet: bool) {
        self.lock().quiet = quiet;
    }

    /// Compacts the history: every open watch gets a `410 Gone` ERROR event and ends, and a
    /// watch from an older resourceVersion is refused the same way, so clients relist.
    pub fn expire_watches(&self) {
        let mut store = self.lock();
        store.resource_version += 1;
        store.compacted = store.resource_version;
        store.history.clear();
        let status = gone(store.compacted);
        for w in std::mem::take(&mut store.watches) {
            let _ = w.tx.try_send(Ok(event_line("ERROR", &status)));
        }
    }

    /// How many pod lists were served.
    pub fn lists(&self) -> usize {
        self.lock().lists
    }

    /// How many watches are open now.
    pub fn open_watches(&self) -> usize {
        let mut store = self.lock();
        store.watches.retain(|w| !w.tx.is_closed());
        store.watches.len()
    }
}

impl Store {
    fn publish(&mut self, kind: &'static str, pod: Value) {
        if self.quiet {
            return;
        }
        self.history
            .push((self.resource_version, kind, pod.clone()));
        let line = event_line(kind, &pod);
        self.watches.retain(|w| {
            if !w.tx.is_closed() && matches(&pod, w.namespace.as_deref(), &w.selector) {
                return w.tx.try_send(Ok(line.clone())).is_ok();
            }
            !w.tx.is_closed()
        });
    }
}

fn pod_key(pod: &Value) -> (String, String) {
    let meta = &pod["metadata"];
    (
        meta["namespace"].as_str().unwrap_or("default").to_string(),
        meta["name"].as_str().unwrap_or("").to_string(),
    )
}

fn matches(pod: &Value, namespace: Option<&str>, selector: &[(String, String)]) -> bool {
    let meta = &pod["metadata"];
    namespace.is_none_or(|ns| meta["namespace"].as_str() == Some(ns))
        && selector
            .iter()
            .all(|(k, v)| meta["labels"][k].as_str() == Some(v.as_str()))
}

fn event_line(kind: &str, object: &Value) -> Bytes {
    let mut line = serde_json::to_vec(&json!({"type": kind, "object": object})).unwrap_or_default();
    line.push(b'\n');
    Bytes::from(line)
}

fn gone(current: u64) -> Value {
    json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": format!("too old resource version: the oldest available is {current}"),
        "reason": "Expired",
        "code": 410,
    })
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' if i + 2 < bytes.len() => match u8::from_str_radix(&s[i + 1..i + 3], 16) {
                Ok(b) => {
                    out.push(b);
                    i += 3;
                    continue;
                }
                Err(_) => out.push(b'%'),
            },
            b'+' => out.push(b' '),
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn parse_selector(s: &str) -> Vec<(String, String)> {
    s.split(',')
        .filter(|p| !p.is_empty())
        .filter_map(|p| {
            let (k, v) = p.split_once("==").or_else(|| p.split_once('='))?;
            Some((k.trim().to_string(), v.trim().to_string()))
        })
        .collect()
}

fn handle(store: &Arc<Mutex<Store>>, req: Request<Incoming>) -> HttpResponse {
    let path = req.uri().path().to_string();
    let namespace = match path.strip_prefix("/api/v1/namespaces/") {
        Some(rest) => match rest.split_once('/') {
            Some((ns, "pods")) => Some(ns.to_string()),
            _ => return not_found(&path),
        },
        None if path == "/api/v1/pods" => None,
        None => return not_found(&path),
    };
    let query: BTreeMap<String, String> = query_pairs(req.uri().query())
        .into_iter()
        .map(|(k, v)| (k, percent_decode(&v)))
        .collect();
    let selector = parse_selector(query.get("labelSelector").map_or("", String::as_str));
    let mut store = store.lock().unwrap_or_else(|e| e.into_inner());
    if query.get("watch").is_some_and(|w| w == "true" || w == "1") {
        store.watch_requests += 1;
        let from: u64 = query
            .get("resourceVersion")
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        let (response, tx) = server::channel(200, "application/json");
        if from < store.compacted {
            let _ = tx.try_send(Ok(event_line("ERROR", &gone(store.compacted))));
            return response;
        }
        let replay: Vec<Bytes> = store
            .history
            .iter()
            .filter(|(rv, _, pod)| *rv > from && matches(pod, namespace.as_deref(), &selector))
            .map(|(_, kind, pod)| event_line(kind, pod))
            .collect();
        // The channel holds 64 frames; a test's history is far shorter.
        for line in replay {
            let _ = tx.try_send(Ok(line));
        }
        if query
            .get("allowWatchBookmarks")
            .is_some_and(|b| b == "true")
        {
            let bookmark = json!({
                "kind": "Pod",
                "apiVersion": "v1",
                "metadata": {"resourceVersion": store.resource_version.to_string()},
            });
            let _ = tx.try_send(Ok(event_line("BOOKMARK", &bookmark)));
        }
        store.watches.push(Watch {
            namespace,
            selector,
            tx,
        });
        return response;
    }
    store.lists += 1;
    let items: Vec<Value> = store
        .pods
        .values()
        .filter(|pod| matches(pod, namespace.as_deref(), &selector))
        .cloned()
        .collect();
    server::json(
        200,
        &json!({
            "kind": "PodList",
            "apiVersion": "v1",
            "metadata": {"resourceVersion": store.resource_version.to_string()},
            "items": items,
        }),
    )
}

fn not_found(path: &str) -> HttpResponse {
    server::json(
        404,
        &json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": format!("the server could not find the requested resource ({path})"),
            "reason": "NotFound",
            "code": 404,
        }),
    )
}
