//! The route table of the data port: which endpoint a method + path is, before anything else
//! happens. Unknown paths are 404, a known path with the wrong method 405 — both answered by us,
//! never forwarded.

use http::Method;
use pdgate_filters::Route;

/// What a request is for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Endpoint {
    /// A generation route served by a prefill/decode pair.
    Pd(Route),
    /// `/v1/messages/count_tokens`: one prefill worker, no decode leg, no bootstrap fields.
    CountTokens,
    /// `/v1/embeddings`, `/v1/classify`: not served in PD mode (501).
    NotInPd,
    Health,
    /// `/health_generate`: one pair checked end to end.
    HealthGenerate,
    Liveness,
    Readiness,
    /// `GET /v1/models`: the registered workers' models.
    Models,
    /// `GET /v1/models/{id}`: one of them (the id as sent, percent-encoded or not; model ids
    /// such as `org/name` keep their slash).
    Model(String),
    /// `GET /get_server_info`: the first prefill worker's answer.
    ServerInfo,
    /// `GET /get_model_info`: the first prefill worker's answer, with the client's headers.
    ModelInfo,
    /// `GET /get_loads`: every worker's load report, asked now.
    Loads,
    /// `POST /flush_cache`: every worker flushes its cache (admin).
    FlushCache,
    /// `/workers` (list; register).
    Workers,
    /// `/workers/{id}`.
    Worker(String),
    /// `POST /reload`: re-read the config file (as SIGHUP).
    Reload,
    /// `GET /debug/handoffs`: rendezvous whose legs have not all ended (admin-protected).
    DebugHandoffs,
    /// `GET /debug/capacity`: the P:D capacity advice (admin-protected).
    DebugCapacity,
}

impl Endpoint {
    /// The `path` label of HTTP-level metrics: the route template, never the raw path (SMG
    /// 1.13.0's templates, `/v1/models/{*id}` included).
    pub fn metric_path(&self) -> &'static str {
        match self {
            Endpoint::Pd(r) => r.upstream_path(),
            Endpoint::CountTokens => "/v1/messages/count_tokens",
            Endpoint::NotInPd => "unsupported",
            Endpoint::Health => "/health",
            Endpoint::HealthGenerate => "/health_generate",
            Endpoint::Models => "/v1/models",
            Endpoint::Model(_) => "/v1/models/{*id}",
            Endpoint::ServerInfo => "/get_server_info",
            Endpoint::ModelInfo => "/get_model_info",
            Endpoint::Loads => "/get_loads",
            Endpoint::FlushCache => "/flush_cache",
            Endpoint::Liveness => "/liveness",
            Endpoint::Readiness => "/readiness",
            Endpoint::Workers => "/workers",
            Endpoint::Worker(_) => "/workers/{id}",
            Endpoint::Reload => "/reload",
            Endpoint::DebugHandoffs => "/debug/handoffs",
            Endpoint::DebugCapacity => "/debug/capacity",
        }
    }

    /// Routes that need the API key when one is configured (serving and worker API, and
    /// `/get_loads`, which asks every engine and names each worker). The model list and the
    /// engines' info are public, as SMG's.
    pub fn needs_api_key(&self) -> bool {
        matches!(
            self,
            Endpoint::Pd(_)
                | Endpoint::CountTokens
                | Endpoint::Loads
                | Endpoint::FlushCache
                | Endpoint::Workers
                | Endpoint::Worker(_)
                | Endpoint::Reload
                | Endpoint::DebugHandoffs
                | Endpoint::DebugCapacity
        )
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RouteRefusal {
    NotFound,
    /// The path exists; these methods are allowed.
    MethodNotAllowed(&'static str),
}

pub fn resolve(method: &Method, path: &str) -> Result<Endpoint, RouteRefusal> {
    let get_only = |e: Endpoint| {
        if method == Method::GET || method == Method::HEAD {
            Ok(e)
        } else {
            Err(RouteRefusal::MethodNotAllowed("GET, HEAD"))
        }
    };
    let post_only = |e: Endpoint| {
        if method == Method::POST {
            Ok(e)
        } else {
            Err(RouteRefusal::MethodNotAllowed("POST"))
        }
    };
    match path {
        "/health" => get_only(Endpoint::Health),
        "/health_generate" => get_only(Endpoint::HealthGenerate),
        "/v1/models" => get_only(Endpoint::Models),
        "/get_server_info" => get_only(Endpoint::ServerInfo),
        "/get_model_info" => get_only(Endpoint::ModelInfo),
        "/get_loads" => get_only(Endpoint::Loads),
        "/flush_cache" => post_only(Endpoint::FlushCache),
        "/liveness" => get_only(Endpoint::Liveness),
        "/readiness" => get_only(Endpoint::Readiness),
        "/v1/embeddings" | "/v1/classify" => post_only(Endpoint::NotInPd),
        "/reload" => post_only(Endpoint::Reload),
        "/debug/handoffs" => get_only(Endpoint::DebugHandoffs),
        "/debug/capacity" => get_only(Endpoint::DebugCapacity),
        "/workers" => {
            if method == Method::GET || method == Method::POST {
                Ok(Endpoint::Workers)
            } else {
                Err(RouteRefusal::MethodNotAllowed("GET, POST"))
            }
        }
        _ => {
            if let Some(id) = path.strip_prefix("/v1/models/") {
                if id.is_empty() {
                    return Err(RouteRefusal::NotFound);
                }
                return get_only(Endpoint::Model(id.to_string()));
            }
            if let Some(id) = path.strip_prefix("/workers/") {
                if id.is_empty() || id.contains('/') {
                    return Err(RouteRefusal::NotFound);
                }
                return if [Method::GET, Method::DELETE, Method::PATCH, Method::PUT].contains(method)
                {
                    Ok(Endpoint::Worker(id.to_string()))
                } else {
                    Err(RouteRefusal::MethodNotAllowed("GET, PUT, PATCH, DELETE"))
                };
            }
            match Route::from_path(path) {
                Some(Route::CountTokens) => post_only(Endpoint::CountTokens),
                Some(r) => post_only(Endpoint::Pd(r)),
                None => Err(RouteRefusal::NotFound),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generation_routes_are_post_only() {
        assert_eq!(
            resolve(&Method::POST, "/v1/chat/completions"),
            Ok(Endpoint::Pd(Route::ChatCompletions))
        );
        assert_eq!(
            resolve(&Method::GET, "/v1/chat/completions"),
            Err(RouteRefusal::MethodNotAllowed("POST"))
        );
        assert_eq!(
            resolve(&Method::POST, "/rerank"),
            Ok(Endpoint::Pd(Route::Rerank))
        );
    }

    #[test]
    fn unknown_paths_are_not_found() {
        assert_eq!(
            resolve(&Method::POST, "/v1/chat"),
            Err(RouteRefusal::NotFound)
        );
        assert_eq!(
            resolve(&Method::GET, "/workers/a/b"),
            Err(RouteRefusal::NotFound)
        );
    }

    #[test]
    fn one_model_is_a_get_with_its_id_slashes_kept() {
        assert_eq!(
            resolve(&Method::GET, "/v1/models/org/name"),
            Ok(Endpoint::Model("org/name".into()))
        );
        assert_eq!(
            resolve(&Method::POST, "/v1/models/m"),
            Err(RouteRefusal::MethodNotAllowed("GET, HEAD"))
        );
        assert_eq!(
            resolve(&Method::GET, "/v1/models/"),
            Err(RouteRefusal::NotFound)
        );
    }

    #[test]
    fn embeddings_are_refused_in_pd_mode() {
        assert_eq!(
            resolve(&Method::POST, "/v1/embeddings"),
            Ok(Endpoint::NotInPd)
        );
    }
}
