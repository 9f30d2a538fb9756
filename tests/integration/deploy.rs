//! The deployment artifacts agree with the gateway: `deploy/kubernetes` renders (`kubectl
//! kustomize`, offline), its ConfigMap holds a config `pdgate check` accepts, and the Deployment's
//! ports, probes, mounts, service account and RBAC match that config and the gateway's routes.
//! The Dockerfile runs what the Deployment runs.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde::Deserialize;
use serde_yaml::Value;

use crate::harness::pdgate_bin;

fn repo(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(path)
}

fn documents(text: &str) -> Vec<Value> {
    serde_yaml::Deserializer::from_str(text)
        .map(|doc| Value::deserialize(doc).expect("valid YAML"))
        .filter(|v| !v.is_null())
        .collect()
}

/// Every object `kubectl kustomize deploy/kubernetes` renders. Without kubectl (setup.sh
/// installs it when it can), the kustomization's resources are read as kustomize would lay
/// them out for these files: each object in the kustomization's namespace.
fn rendered() -> Vec<Value> {
    let dir = repo("deploy/kubernetes");
    if let Ok(out) = Command::new("kubectl").arg("kustomize").arg(&dir).output() {
        assert!(
            out.status.success(),
            "kubectl kustomize failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        return documents(&String::from_utf8(out.stdout).unwrap());
    }
    eprintln!("kubectl not found: reading the kustomization's resources directly");
    let k: Value =
        serde_yaml::from_str(&std::fs::read_to_string(dir.join("kustomization.yaml")).unwrap())
            .unwrap();
    let namespace = k["namespace"].clone();
    let mut all = Vec::new();
    for file in k["resources"].as_sequence().unwrap() {
        let text = std::fs::read_to_string(dir.join(text(file))).unwrap();
        for mut o in documents(&text) {
            o["metadata"]["namespace"] = namespace.clone();
            all.push(o);
        }
    }
    all
}

fn object<'a>(all: &'a [Value], kind: &str, name: &str) -> &'a Value {
    all.iter()
        .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind} {name} in deploy/kubernetes"))
}

fn text(v: &Value) -> &str {
    v.as_str().unwrap_or_else(|| panic!("not a string: {v:?}"))
}

#[test]
fn the_kubernetes_manifests_render_and_agree_with_the_gateway() {
    let all = rendered();
    for o in &all {
        assert!(
            o["apiVersion"].is_string() && o["metadata"]["name"].is_string(),
            "{o:?}"
        );
    }
    let namespace =
        text(&object(&all, "Deployment", "pdgate")["metadata"]["namespace"]).to_string();

    // The config: accepted by `pdgate check`, and scoped to the namespace the Role covers.
    let conf_text = text(&object(&all, "ConfigMap", "pdgate-config")["data"]["pdgate.yaml"]);
    let conf_path = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("deploy-pdgate.yaml");
    std::fs::write(&conf_path, conf_text).unwrap();
    let check = Command::new(pdgate_bin())
        .args(["check", "-c"])
        .arg(&conf_path)
        .output()
        .unwrap();
    assert!(
        check.status.success(),
        "the ConfigMap's config is refused: {}",
        String::from_utf8_lossy(&check.stderr)
    );
    let conf: Value = serde_yaml::from_str(conf_text).unwrap();
    let gw = &conf["gateway"];
    assert_eq!(text(&gw["service_discovery_namespace"]), namespace);

    // The Deployment runs that config, on its ports, probed on the gateway's routes.
    let dep = object(&all, "Deployment", "pdgate");
    let pod = &dep["spec"]["template"]["spec"];
    let c = &pod["containers"][0];
    let args: Vec<&str> = c["args"].as_sequence().unwrap().iter().map(text).collect();
    assert_eq!(args, ["run", "-c", "/etc/pdgate/pdgate.yaml"]);
    let mount = c["volumeMounts"]
        .as_sequence()
        .unwrap()
        .iter()
        .find(|m| m["mountPath"] == "/etc/pdgate")
        .expect("the config mount");
    let volume = pod["volumes"]
        .as_sequence()
        .unwrap()
        .iter()
        .find(|v| v["name"] == mount["name"])
        .unwrap();
    assert_eq!(volume["configMap"]["name"], "pdgate-config");
    let port = |name: &str| {
        c["ports"]
            .as_sequence()
            .unwrap()
            .iter()
            .find(|p| p["name"] == name)
            .and_then(|p| p["containerPort"].as_u64())
            .unwrap_or_else(|| panic!("no {name} port"))
    };
    assert_eq!(Some(port("http")), gw["port"].as_u64());
    assert_eq!(Some(port("metrics")), gw["prometheus_port"].as_u64());
    assert_eq!(c["livenessProbe"]["httpGet"]["path"], "/liveness");
    assert_eq!(c["readinessProbe"]["httpGet"]["path"], "/readiness");
    // The grace period covers the gateway's own.
    let grace = conf["grace_period_seconds"].as_u64().unwrap();
    assert!(pod["terminationGracePeriodSeconds"].as_u64().unwrap() > grace);
    // Pingora writes its pid file and upgrade socket: they must be on the writable /tmp.
    assert_eq!(c["securityContext"]["readOnlyRootFilesystem"], true);
    for key in ["pid_file", "upgrade_sock"] {
        assert!(text(&conf[key]).starts_with("/tmp/"), "{key}");
    }

    // Discovery's RBAC: the Deployment's service account may get, list and watch pods.
    let sa = text(&pod["serviceAccountName"]);
    object(&all, "ServiceAccount", sa);
    let binding = all
        .iter()
        .find(|o| {
            o["kind"] == "RoleBinding"
                && o["subjects"]
                    .as_sequence()
                    .is_some_and(|s| s.iter().any(|x| x["name"] == sa))
        })
        .expect("a RoleBinding for the service account");
    let role = object(&all, "Role", text(&binding["roleRef"]["name"]));
    let rule = role["rules"]
        .as_sequence()
        .unwrap()
        .iter()
        .find(|r| {
            r["resources"]
                .as_sequence()
                .unwrap()
                .iter()
                .any(|x| x == "pods")
        })
        .expect("a rule on pods");
    for verb in ["get", "list", "watch"] {
        assert!(
            rule["verbs"]
                .as_sequence()
                .unwrap()
                .iter()
                .any(|v| v == verb),
            "{verb}"
        );
    }
    object(&all, "PodDisruptionBudget", "pdgate");
    let svc = object(&all, "Service", "pdgate");
    assert_eq!(
        svc["spec"]["selector"],
        dep["spec"]["selector"]["matchLabels"]
    );

    // The image runs the same command and is health-checked on /liveness.
    let dockerfile = std::fs::read_to_string(repo("Dockerfile")).unwrap();
    assert!(dockerfile.contains(r#"CMD ["run", "-c", "/etc/pdgate/pdgate.yaml"]"#));
    assert!(dockerfile.contains("/liveness"));
    assert!(dockerfile.contains("USER 10001"));
}
