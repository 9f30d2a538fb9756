//! `--otlp-traces-endpoint`: where the OpenTelemetry exporter sends spans. SMG documents one
//! form, `<ip>:<port>` (OTLP/gRPC); pdgate also takes a URL, so the same key can name an
//! OTLP/HTTP collector:
//!
//! | value | protocol | exporter target |
//! |---|---|---|
//! | `host:port`, `grpc://host:port`, `http://host:port` | OTLP/gRPC | `http://host:port` |
//! | `http://host:port/v1/traces` (any path) | OTLP/HTTP protobuf | the URL as given |
//!
//! TLS (`https://`, `grpcs://`) is refused: the gateway has no TLS stack (Pingora is built
//! without one), so a collector is reached over plaintext, typically an agent on loopback.

/// The OTLP wire protocol of an endpoint.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OtlpProtocol {
    /// `opentelemetry.proto.collector.trace.v1.TraceService/Export` over HTTP/2.
    Grpc,
    /// `POST <path>` with an `application/x-protobuf` body over HTTP/1.1.
    HttpProtobuf,
}

impl OtlpProtocol {
    pub fn as_str(self) -> &'static str {
        match self {
            OtlpProtocol::Grpc => "grpc",
            OtlpProtocol::HttpProtobuf => "http/protobuf",
        }
    }
}

/// A parsed `--otlp-traces-endpoint`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OtlpEndpoint {
    pub protocol: OtlpProtocol,
    /// What the exporter is given: `http://host:port` (gRPC) or the whole URL (HTTP).
    pub url: String,
}

impl OtlpEndpoint {
    /// Parses one of the forms in the module doc; `Err` says what is wrong and what is expected.
    pub fn parse(value: &str) -> Result<OtlpEndpoint, String> {
        const FORMS: &str = "expected host:port or grpc://host:port (OTLP/gRPC), or \
                             http://host:port/v1/traces (OTLP/HTTP protobuf)";
        let value = value.trim();
        if value.is_empty() {
            return Err(format!("is empty; {FORMS}"));
        }
        let (scheme, rest) = match value.split_once("://") {
            Some((scheme, rest)) => (Some(scheme.to_ascii_lowercase()), rest),
            None => (None, value),
        };
        let (authority, path) = match rest.find('/') {
            Some(i) => rest.split_at(i),
            None => (rest, ""),
        };
        let has_path = !path.is_empty() && path != "/";
        let protocol = match scheme.as_deref() {
            None if has_path || !path.is_empty() => {
                return Err(format!(
                    "'{value}' has a path but no scheme; write http://{rest} for OTLP/HTTP, or \
                     drop the path for OTLP/gRPC"
                ))
            }
            None | Some("grpc") if has_path => {
                return Err(format!(
                    "'{value}': an OTLP/gRPC endpoint has no path; {FORMS}"
                ))
            }
            None | Some("grpc") => OtlpProtocol::Grpc,
            Some("http") if has_path => OtlpProtocol::HttpProtobuf,
            Some("http") => OtlpProtocol::Grpc,
            Some("https" | "grpcs") => {
                return Err(format!(
                    "'{value}': TLS to the collector is not supported (pdgate has no TLS stack); \
                     send to a collector or agent over plaintext, e.g. on loopback"
                ))
            }
            Some(other) => return Err(format!("'{value}': unknown scheme '{other}'; {FORMS}")),
        };
        check_authority(authority).map_err(|why| format!("'{value}': {why}; {FORMS}"))?;
        if !pdgate_filters::ascii::all_visible(path.as_bytes()) {
            return Err(format!("'{value}': the path has a space or a control byte"));
        }
        let url = match protocol {
            OtlpProtocol::Grpc => format!("http://{authority}"),
            OtlpProtocol::HttpProtobuf => format!("http://{authority}{path}"),
        };
        Ok(OtlpEndpoint { protocol, url })
    }
}

/// `host:port` with a non-zero port; an IPv6 host in brackets.
fn check_authority(authority: &str) -> Result<(), String> {
    let (host, port) = match authority.strip_prefix('[') {
        Some(v6) => {
            let (host, rest) = v6
                .split_once(']')
                .ok_or("an IPv6 host needs its closing ']'")?;
            host.parse::<std::net::Ipv6Addr>()
                .map_err(|_| format!("'{host}' is not an IPv6 address"))?;
            let port = rest.strip_prefix(':').ok_or("the port is missing")?;
            (host, port)
        }
        None => authority.rsplit_once(':').ok_or("the port is missing")?,
    };
    if host.is_empty() {
        return Err("the host is missing".into());
    }
    if host.contains(':') && !authority.starts_with('[') {
        return Err("write an IPv6 host in brackets, e.g. [::1]:4317".into());
    }
    if !host
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b'_' | b':'))
    {
        return Err(format!("'{host}' is not a host name or address"));
    }
    match port.parse::<u16>() {
        Ok(0) | Err(_) => Err(format!("'{port}' is not a port number (1-65535)")),
        Ok(_) => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(value: &str) -> (OtlpProtocol, String) {
        let e = OtlpEndpoint::parse(value).unwrap_or_else(|e| panic!("{value}: {e}"));
        (e.protocol, e.url)
    }

    #[test]
    fn otlp_endpoint_forms_pick_the_protocol() {
        use OtlpProtocol::{Grpc, HttpProtobuf};
        assert_eq!(ok("localhost:4317"), (Grpc, "http://localhost:4317".into()));
        assert_eq!(ok("10.0.0.7:4317"), (Grpc, "http://10.0.0.7:4317".into()));
        assert_eq!(ok(" [::1]:4317 "), (Grpc, "http://[::1]:4317".into()));
        assert_eq!(ok("grpc://otel:4317"), (Grpc, "http://otel:4317".into()));
        assert_eq!(ok("GRPC://otel:4317/"), (Grpc, "http://otel:4317".into()));
        assert_eq!(ok("http://otel:4317"), (Grpc, "http://otel:4317".into()));
        assert_eq!(
            ok("http://otel:4318/v1/traces"),
            (HttpProtobuf, "http://otel:4318/v1/traces".into())
        );
        assert_eq!(
            ok("http://[::1]:4318/custom/traces"),
            (HttpProtobuf, "http://[::1]:4318/custom/traces".into())
        );
    }

    #[test]
    fn bad_otlp_endpoints_say_why() {
        for (value, why) in [
            ("", "is empty"),
            ("localhost", "the port is missing"),
            ("localhost:", "is not a port number"),
            ("localhost:0", "is not a port number"),
            ("localhost:99999", "is not a port number"),
            (":4317", "the host is missing"),
            ("::1:4317", "brackets"),
            ("[::1:4317", "closing ']'"),
            ("[nope]:4317", "not an IPv6 address"),
            ("otel:4318/v1/traces", "no scheme"),
            ("grpc://otel:4317/v1/traces", "has no path"),
            ("https://otel:4318/v1/traces", "TLS"),
            ("grpcs://otel:4317", "TLS"),
            ("udp://otel:4317", "unknown scheme"),
            ("http://ot el:4318/v1/traces", "not a host name"),
            ("http://otel:4318/v1/tr aces", "a space or a control byte"),
            (
                "http://otel:4318/v1/traces\u{7f}",
                "a space or a control byte",
            ),
            ("http://otel:4318/v1/tracés", "a space or a control byte"),
        ] {
            let err = OtlpEndpoint::parse(value).expect_err(value);
            assert!(err.contains(why), "{value:?}: {err}");
        }
    }
}
