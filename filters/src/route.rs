//! The PD data-plane routes: which client paths pdgate serves in PD mode, the upstream path each
//! maps to, and the `endpoint` label its metrics carry.

/// A client route served by the PD router.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Route {
    /// SGLang native `/generate`.
    Generate,
    /// OpenAI `/v1/chat/completions`.
    ChatCompletions,
    /// OpenAI `/v1/completions`.
    Completions,
    /// Anthropic `/v1/messages`.
    Messages,
    /// OpenAI `/v1/responses`.
    Responses,
    /// `/v1/rerank` and its alias `/rerank`.
    Rerank,
    /// Anthropic `/v1/messages/count_tokens` (one prefill worker, no decode leg).
    CountTokens,
}

impl Route {
    /// Every route, for tables and tests.
    pub const ALL: [Route; 7] = [
        Route::Generate,
        Route::ChatCompletions,
        Route::Completions,
        Route::Messages,
        Route::Responses,
        Route::Rerank,
        Route::CountTokens,
    ];

    /// Client path (exact, without query string) → route; `None` for anything else.
    pub fn from_path(path: &str) -> Option<Route> {
        Some(match path {
            "/generate" => Route::Generate,
            "/v1/chat/completions" => Route::ChatCompletions,
            "/v1/completions" => Route::Completions,
            "/v1/messages" => Route::Messages,
            "/v1/responses" => Route::Responses,
            "/v1/rerank" | "/rerank" => Route::Rerank,
            "/v1/messages/count_tokens" => Route::CountTokens,
            _ => return None,
        })
    }

    /// The path sent to the engines (both legs): the route's own path; `/rerank` goes to `/v1/rerank`.
    pub fn upstream_path(self) -> &'static str {
        match self {
            Route::Generate => "/generate",
            Route::ChatCompletions => "/v1/chat/completions",
            Route::Completions => "/v1/completions",
            Route::Messages => "/v1/messages",
            Route::Responses => "/v1/responses",
            Route::Rerank => "/v1/rerank",
            Route::CountTokens => "/v1/messages/count_tokens",
        }
    }

    /// The metrics `endpoint` label.
    pub fn metric_endpoint(self) -> &'static str {
        match self {
            Route::Generate => "generate",
            Route::ChatCompletions => "chat",
            Route::Completions => "completions",
            Route::Messages => "messages",
            Route::Responses => "responses",
            Route::Rerank => "rerank",
            Route::CountTokens => "count_tokens",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_map_to_routes_exactly() {
        assert_eq!(Route::from_path("/generate"), Some(Route::Generate));
        assert_eq!(
            Route::from_path("/v1/chat/completions"),
            Some(Route::ChatCompletions)
        );
        assert_eq!(
            Route::from_path("/v1/completions"),
            Some(Route::Completions)
        );
        assert_eq!(Route::from_path("/v1/messages"), Some(Route::Messages));
        assert_eq!(Route::from_path("/v1/responses"), Some(Route::Responses));
        assert_eq!(Route::from_path("/v1/rerank"), Some(Route::Rerank));
        assert_eq!(Route::from_path("/rerank"), Some(Route::Rerank));
        assert_eq!(
            Route::from_path("/v1/messages/count_tokens"),
            Some(Route::CountTokens)
        );
    }

    #[test]
    fn unknown_or_decorated_paths_are_not_routes() {
        for p in [
            "",
            "/",
            "/generate/",
            "/v1/chat/completions?x=1",
            "/V1/completions",
            "/v1/embeddings",
            "//generate",
        ] {
            assert_eq!(Route::from_path(p), None, "{p}");
        }
    }

    #[test]
    fn rerank_alias_goes_upstream_as_v1_rerank() {
        assert_eq!(
            Route::from_path("/rerank").unwrap().upstream_path(),
            "/v1/rerank"
        );
    }

    #[test]
    fn upstream_path_round_trips_for_every_route() {
        for r in Route::ALL {
            assert_eq!(Route::from_path(r.upstream_path()), Some(r));
        }
    }

    #[test]
    fn metric_endpoints_are_distinct() {
        let mut labels: Vec<_> = Route::ALL.iter().map(|r| r.metric_endpoint()).collect();
        labels.sort();
        labels.dedup();
        assert_eq!(labels.len(), Route::ALL.len());
        assert_eq!(Route::ChatCompletions.metric_endpoint(), "chat");
    }
}
