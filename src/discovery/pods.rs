//! What a pod means for the gateway: whether it serves (Running, Ready, an IP, not being
//! deleted) and the worker spec its IP, the discovery port and its annotations give. Pure: no
//! client, no registry.

use k8s_openapi::api::core::v1::Pod;

use crate::config::defaults::BOOTSTRAP_PORT_ANNOTATION;
use crate::config::{GatewayConfig, WorkerSpec, WorkerType};

/// What the pods' annotations and the port are read with (from the startup config).
#[derive(Clone, Debug)]
pub struct PodReading {
    pub port: u16,
    /// EPD fleets are gRPC only: discovered pods are `grpc://` workers.
    pub grpc: bool,
    pub kv_connector_annotation: String,
    pub kv_engine_id_annotation: String,
}

impl PodReading {
    pub fn from_config(cfg: &GatewayConfig) -> PodReading {
        PodReading {
            port: cfg.service_discovery_port,
            grpc: cfg.epd_disaggregation,
            kv_connector_annotation: cfg.kv_connector_annotation.clone(),
            kv_engine_id_annotation: cfg.kv_engine_id_annotation.clone(),
        }
    }
}

/// `namespace/name`, for the logs.
pub fn pod_name(pod: &Pod) -> String {
    format!(
        "{}/{}",
        pod.metadata.namespace.as_deref().unwrap_or("-"),
        pod.metadata.name.as_deref().unwrap_or("-")
    )
}

/// The pod's IP when it may take requests: phase Running, condition Ready true, an IP, and no
/// deletion under way (a terminating pod drains even before its readiness turns false).
pub fn serving_ip(pod: &Pod) -> Option<&str> {
    if pod.metadata.deletion_timestamp.is_some() {
        return None;
    }
    let status = pod.status.as_ref()?;
    if status.phase.as_deref() != Some("Running") {
        return None;
    }
    let ready = status.conditions.as_ref().is_some_and(|conditions| {
        conditions
            .iter()
            .any(|c| c.type_ == "Ready" && c.status == "True")
    });
    if !ready {
        return None;
    }
    status.pod_ip.as_deref().filter(|ip| !ip.is_empty())
}

/// The worker spec of a serving pod (`None` when it does not serve), validated as a
/// `POST /workers` body is. Annotations: `sglang.ai/bootstrap-port` (prefill only), the KV
/// connector and KV engine id ones. A bad bootstrap port is logged and left out.
pub fn worker_spec(pod: &Pod, role: WorkerType, reading: &PodReading) -> Option<WorkerSpec> {
    let ip = serving_ip(pod)?;
    let host = if ip.contains(':') {
        format!("[{ip}]")
    } else {
        ip.to_string()
    };
    let annotation = |key: &str| {
        pod.metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(key))
            .map(|v| v.trim())
            .filter(|v| !v.is_empty())
    };
    let mut body = serde_json::json!({
        "url": format!(
            "{}://{host}:{}",
            if reading.grpc { "grpc" } else { "http" },
            reading.port
        ),
        "worker_type": role.as_str(),
    });
    if matches!(role, WorkerType::Prefill | WorkerType::Encode) {
        if let Some(port) = annotation(BOOTSTRAP_PORT_ANNOTATION) {
            match port.parse::<u16>() {
                Ok(p) if p > 0 => body["bootstrap_port"] = p.into(),
                _ => log::warn!(
                    "discovery: pod {}: annotation {BOOTSTRAP_PORT_ANNOTATION}={port:?} is not a port; ignored",
                    pod_name(pod)
                ),
            }
        }
    }
    if let Some(c) = annotation(&reading.kv_connector_annotation) {
        body["kv_connector"] = c.into();
    }
    if let Some(e) = annotation(&reading.kv_engine_id_annotation) {
        body["kv_engine_id"] = e.into();
    }
    let spec = WorkerSpec::from_json(body.to_string().as_bytes()).and_then(|spec| {
        spec.validate()?;
        Ok(spec)
    });
    match spec {
        Ok(spec) => Some(spec),
        Err(e) => {
            log::warn!(
                "discovery: pod {} is not a valid worker: {e}",
                pod_name(pod)
            );
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn reading() -> PodReading {
        PodReading::from_config(&GatewayConfig::default())
    }

    fn pod(phase: &str, ready: &str, ip: Option<&str>, annotations: serde_json::Value) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": "p", "namespace": "ns", "annotations": annotations},
            "status": {
                "phase": phase,
                "podIP": ip,
                "conditions": [{"type": "Ready", "status": ready}],
            },
        }))
        .expect("a pod")
    }

    #[test]
    fn only_running_ready_pods_with_an_ip_serve() {
        assert_eq!(
            serving_ip(&pod("Running", "True", Some("10.0.0.1"), json!({}))),
            Some("10.0.0.1")
        );
        assert_eq!(
            serving_ip(&pod("Running", "False", Some("10.0.0.1"), json!({}))),
            None
        );
        assert_eq!(
            serving_ip(&pod("Pending", "True", Some("10.0.0.1"), json!({}))),
            None
        );
        assert_eq!(serving_ip(&pod("Running", "True", None, json!({}))), None);
        let mut terminating = pod("Running", "True", Some("10.0.0.1"), json!({}));
        terminating.metadata.deletion_timestamp =
            serde_json::from_value(json!("2026-01-01T00:00:00Z")).ok();
        assert_eq!(serving_ip(&terminating), None);
    }

    #[test]
    fn annotations_and_the_discovery_port_make_the_worker_spec() {
        let p = pod(
            "Running",
            "True",
            Some("10.0.0.7"),
            json!({
                "sglang.ai/bootstrap-port": "8998",
                "smg.ai/kv-connector": "NixlConnector",
                "smg.ai/kv-engine-id": "engine-7",
            }),
        );
        let spec = worker_spec(&p, WorkerType::Prefill, &reading()).expect("serving");
        assert_eq!(spec.url, "http://10.0.0.7:80");
        assert_eq!(spec.worker_type, WorkerType::Prefill);
        assert_eq!(spec.bootstrap_port, Some(8998));
        assert_eq!(spec.kv_connector.as_deref(), Some("NixlConnector"));
        assert_eq!(spec.kv_engine_id.as_deref(), Some("engine-7"));
        // A decode has no bootstrap port; IPv6 is bracketed.
        let v6 = pod(
            "Running",
            "True",
            Some("fd00::7"),
            json!({"sglang.ai/bootstrap-port": "8998"}),
        );
        let spec = worker_spec(&v6, WorkerType::Decode, &reading()).expect("serving");
        assert_eq!(spec.url, "http://[fd00::7]:80");
        assert_eq!(spec.bootstrap_port, None);
        // A bad bootstrap port is left out, not fatal.
        let bad = pod(
            "Running",
            "True",
            Some("10.0.0.8"),
            json!({"sglang.ai/bootstrap-port": "x"}),
        );
        let spec = worker_spec(&bad, WorkerType::Prefill, &reading()).expect("serving");
        assert_eq!(spec.bootstrap_port, None);
    }
}
