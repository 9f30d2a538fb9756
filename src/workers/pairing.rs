//! Prefill/decode pairing: a descriptor per worker (runtime, transport, KV layout facts, engine
//! version, explicit protocol) and the compatibility rule of `--pd-pairing-mode`, as the spec
//! defines them ("Prefill/Decode Pairing"). Compatibility is worked out when the fleet changes
//! (the registry snapshot keeps, per prefill, the decodes it may pair with), never per request.
//!
//! Above the mode sits the connection: an HTTP leg and a gRPC leg never pair, in any mode (one
//! request runs one pipeline: the HTTP legs forward the client's JSON, the gRPC legs carry
//! tokens), and under `off` two gRPC legs still share one runtime (spec: "gRPC still keeps both
//! legs on one runtime").

use std::fmt::Write as _;

use pdgate_filters::handoff::moriio;
use pdgate_filters::handoff::vllm::Connector;

use crate::config::{label, PairingMode, RuntimeType};

use super::worker::Worker;

/// The KV layout facts, each compared on its own: (component name, label, key abbreviation).
const LAYOUT: [(&str, &str, &str); 4] = [
    ("kv_cache_dtype", label::KV_CACHE_DTYPE, "dtype"),
    ("page_size", label::PAGE_SIZE, "page"),
    ("attention_backend", label::ATTENTION_BACKEND, "attn"),
    ("model_dtype", label::MODEL_DTYPE, "model"),
];

/// What a worker reports about its KV transfer protocol; `None` = unknown.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Descriptor {
    /// Reached over gRPC (`grpc://`) rather than HTTP.
    pub grpc: bool,
    pub runtime: Option<&'static str>,
    pub transport: Option<String>,
    pub layout: [Option<String>; 4],
    pub version: Option<String>,
    /// Explicit pairing protocol (the label wins over the spec field).
    pub protocol: Option<String>,
}

impl Descriptor {
    pub fn of(w: &Worker) -> Descriptor {
        let labels = w.labels();
        let get = |k: &str| {
            labels
                .get(k)
                .map(|v| v.trim().to_string())
                .filter(|v| !v.is_empty())
        };
        let runtime = w.known_runtime();
        let transport = match runtime {
            Some(RuntimeType::Vllm) => vllm_transport(w),
            Some(RuntimeType::Tokenspeed) => Some(
                get(label::DISAGGREGATION_TRANSFER_BACKEND)
                    .map_or_else(|| "mooncake".to_string(), |t| t.to_ascii_lowercase()),
            ),
            Some(RuntimeType::Sglang) => {
                get(label::DISAGGREGATION_TRANSFER_BACKEND).map(|t| t.to_ascii_lowercase())
            }
            _ => None,
        };
        let mut layout: [Option<String>; 4] = Default::default();
        for (slot, (_, key, _)) in layout.iter_mut().zip(LAYOUT) {
            *slot = get(key);
        }
        // vLLM calls the page size its block size.
        if layout[1].is_none() {
            layout[1] =
                get(label::BLOCK_SIZE).or_else(|| w.spec.kv_block_size.map(|b| b.to_string()));
        }
        Descriptor {
            grpc: w.is_grpc(),
            runtime: runtime.map(RuntimeType::as_str),
            transport,
            layout,
            version: get(label::VERSION),
            protocol: w.pairing_protocol().map(str::to_string),
        }
    }

    /// The `pd_pairing` key of `GET /workers`: the explicit protocol, or
    /// `runtime/transport/layout` with `?` for an unknown part. The layout lists the facts that
    /// are known (`dtype=auto,attn=flash_attn`), `?` when none is — as SMG 1.13.0 renders it
    /// (`sglang/?/?` for an HTTP SGLang worker).
    pub fn key(&self) -> String {
        if let Some(p) = &self.protocol {
            return p.clone();
        }
        let mut k = format!(
            "{}/{}/",
            self.runtime.unwrap_or("?"),
            self.transport.as_deref().unwrap_or("?")
        );
        let layout_start = k.len();
        for (value, (_, _, abbr)) in self.layout.iter().zip(LAYOUT) {
            if let Some(value) = value {
                if k.len() > layout_start {
                    k.push(',');
                }
                let _ = write!(k, "{abbr}={value}");
            }
        }
        if k.len() == layout_start {
            k.push('?');
        }
        k
    }
}

/// A vLLM worker's transport: its connector reduced to `nixl`, `mooncake`, `moriio` (with the
/// mode: `moriio-read` / `moriio-write`), any other name lower-cased; none registered: unknown.
fn vllm_transport(w: &Worker) -> Option<String> {
    let name = w.kv_connector()?;
    Some(match Connector::from_name(Some(name)) {
        Connector::Nixl => "nixl".into(),
        Connector::Mooncake => "mooncake".into(),
        Connector::MoriIo => match w.label(moriio::LABEL_MODE).map(str::trim) {
            Some(m) if m.eq_ignore_ascii_case("read") => "moriio-read".into(),
            Some(m) if m.eq_ignore_ascii_case("write") => "moriio-write".into(),
            _ => "moriio".into(),
        },
        Connector::Passthrough => name.to_ascii_lowercase(),
    })
}

/// Why a prefill and a decode do not pair: the components that differ (or are unknown where
/// `strict` needs them).
pub type Mismatch = Vec<&'static str>;

/// Whether a prefill may hand its KV to a decode under `mode`.
pub fn compatible(mode: PairingMode, p: &Descriptor, d: &Descriptor) -> Result<(), Mismatch> {
    let differs =
        |a: &Option<&str>, b: &Option<&str>| matches!((a, b), (Some(x), Some(y)) if x != y);
    if p.grpc != d.grpc {
        return Err(vec!["connection_mode"]);
    }
    if mode == PairingMode::Off {
        return if p.grpc && differs(&p.runtime, &d.runtime) {
            Err(vec!["runtime"])
        } else {
            Ok(())
        };
    }
    let strict = mode == PairingMode::Strict;
    let mut diff = Mismatch::new();
    if differs(&p.runtime, &d.runtime) || (strict && (p.runtime.is_none() || d.runtime.is_none())) {
        diff.push("runtime");
    }
    match (&p.protocol, &d.protocol) {
        // Two explicit protocols decide alone (only the runtime is compared besides).
        (Some(a), Some(b)) => {
            if a != b {
                diff.push("pairing_protocol");
            }
            return if diff.is_empty() { Ok(()) } else { Err(diff) };
        }
        (Some(_), None) | (None, Some(_)) if strict => diff.push("pairing_protocol"),
        _ => {}
    }
    let (pt, dt) = (p.transport.as_deref(), d.transport.as_deref());
    if differs(&pt, &dt) || (strict && (pt.is_none() || dt.is_none())) {
        diff.push("transport");
    }
    for (i, (name, _, _)) in LAYOUT.iter().enumerate() {
        let (a, b) = (p.layout[i].as_deref(), d.layout[i].as_deref());
        if differs(&a, &b) || (strict && a.is_some() != b.is_some()) {
            diff.push(name);
        }
    }
    if strict && differs(&p.version.as_deref(), &d.version.as_deref()) {
        diff.push("version");
    }
    if diff.is_empty() {
        Ok(())
    } else {
        Err(diff)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn desc(runtime: &'static str, transport: &str, dtype: Option<&str>) -> Descriptor {
        Descriptor {
            runtime: Some(runtime),
            transport: Some(transport.into()),
            layout: [dtype.map(str::to_string), Some("16".into()), None, None],
            ..Descriptor::default()
        }
    }

    #[test]
    fn lenient_refuses_only_facts_both_legs_report_differently() {
        let p = desc("sglang", "mooncake", Some("fp8"));
        assert_eq!(
            compatible(
                PairingMode::Lenient,
                &p,
                &desc("sglang", "mooncake", Some("fp8"))
            ),
            Ok(())
        );
        assert_eq!(
            compatible(
                PairingMode::Lenient,
                &p,
                &desc("sglang", "mooncake", Some("auto"))
            ),
            Err(vec!["kv_cache_dtype"])
        );
        assert_eq!(
            compatible(PairingMode::Lenient, &p, &desc("sglang", "mooncake", None)),
            Ok(())
        );
        assert_eq!(
            compatible(
                PairingMode::Lenient,
                &p,
                &desc("sglang", "nixl", Some("fp8"))
            ),
            Err(vec!["transport"])
        );
        assert_eq!(
            compatible(PairingMode::Off, &p, &desc("vllm", "nixl", Some("auto"))),
            Ok(())
        );
    }

    #[test]
    fn strict_also_refuses_unknowns_and_one_sided_facts() {
        let p = desc("sglang", "mooncake", Some("fp8"));
        assert_eq!(
            compatible(PairingMode::Strict, &p, &desc("sglang", "mooncake", None)),
            Err(vec!["kv_cache_dtype"])
        );
        let unknown = Descriptor::default();
        let e = compatible(PairingMode::Strict, &p, &unknown).unwrap_err();
        assert!(e.contains(&"runtime") && e.contains(&"transport"));
        let mut v1 = desc("sglang", "mooncake", Some("fp8"));
        v1.version = Some("0.5.1".into());
        let mut v2 = v1.clone();
        v2.version = Some("0.5.2".into());
        assert_eq!(compatible(PairingMode::Lenient, &v1, &v2), Ok(()));
        assert_eq!(
            compatible(PairingMode::Strict, &v1, &v2),
            Err(vec!["version"])
        );
    }

    #[test]
    fn explicit_protocols_decide_alone_when_both_legs_have_one() {
        let mut p = desc("vllm", "nixl", Some("fp8"));
        let mut d = desc("vllm", "mooncake", Some("auto"));
        p.protocol = Some("team-a".into());
        d.protocol = Some("team-a".into());
        assert_eq!(compatible(PairingMode::Strict, &p, &d), Ok(()));
        d.protocol = Some("team-b".into());
        assert_eq!(
            compatible(PairingMode::Lenient, &p, &d),
            Err(vec!["pairing_protocol"])
        );
        d.protocol = None;
        // One-sided: lenient falls back to the facts, strict refuses.
        assert!(compatible(PairingMode::Lenient, &p, &d)
            .unwrap_err()
            .contains(&"transport"));
        assert!(compatible(PairingMode::Strict, &p, &d)
            .unwrap_err()
            .contains(&"pairing_protocol"));
    }

    #[test]
    fn an_http_leg_never_pairs_with_a_grpc_leg_in_any_mode() {
        let http = desc("sglang", "mooncake", Some("fp8"));
        let grpc = Descriptor {
            grpc: true,
            ..http.clone()
        };
        for mode in [PairingMode::Off, PairingMode::Lenient, PairingMode::Strict] {
            assert_eq!(
                compatible(mode, &grpc, &http),
                Err(vec!["connection_mode"]),
                "{mode:?}"
            );
            assert_eq!(
                compatible(mode, &http, &grpc),
                Err(vec!["connection_mode"]),
                "{mode:?}"
            );
            assert_eq!(compatible(mode, &grpc, &grpc), Ok(()), "{mode:?}");
        }
    }

    #[test]
    fn off_still_keeps_two_grpc_legs_on_one_runtime() {
        let p = Descriptor {
            grpc: true,
            ..desc("sglang", "mooncake", None)
        };
        let d = Descriptor {
            grpc: true,
            ..desc("tokenspeed", "mooncake", None)
        };
        assert_eq!(compatible(PairingMode::Off, &p, &d), Err(vec!["runtime"]));
        let (hp, hd) = (
            desc("sglang", "mooncake", None),
            desc("tokenspeed", "mooncake", None),
        );
        assert_eq!(
            compatible(PairingMode::Off, &hp, &hd),
            Ok(()),
            "HTTP as before"
        );
    }

    #[test]
    fn key_shows_unknown_parts_as_question_marks() {
        let d = desc("vllm", "nixl", Some("auto"));
        assert_eq!(d.key(), "vllm/nixl/dtype=auto,page=16");
        assert_eq!(Descriptor::default().key(), "?/?/?");
        let sparse = Descriptor {
            runtime: Some("vllm"),
            layout: [Some("auto".into()), None, Some("flash_attn".into()), None],
            ..Descriptor::default()
        };
        assert_eq!(sparse.key(), "vllm/?/dtype=auto,attn=flash_attn");
        let p = Descriptor {
            protocol: Some("proto-x".into()),
            ..Descriptor::default()
        };
        assert_eq!(p.key(), "proto-x");
    }
}
