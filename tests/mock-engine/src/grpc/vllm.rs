//! `vllm.grpc.engine.VllmEngine`, as the smg-grpc-servicer vLLM servicer behaves: token ids or
//! `text` in, the connector's handoff in `kv_transfer_params_json` (preferred) or the legacy
//! typed `kv_transfer_params` (passed to the connector as `{remote_host, remote_port}`), the
//! prefill's handoff back in `GenerateComplete.kv_transfer_params_json`, per-message counters,
//! `Abort` by a list of ids, and a KV load failure finishing the request with
//! `finish_reason: "error"`.

use std::sync::Arc;

use pdgate_proto::vllm::generate_complete::MatchedStop as WireMatched;
use pdgate_proto::vllm::generate_request::Input;
use pdgate_proto::vllm::generate_response::Response as WireEvent;
use pdgate_proto::vllm::vllm_engine_server::{VllmEngine, VllmEngineServer};
use pdgate_proto::vllm::{
    AbortRequest, AbortResponse, GenerateComplete, GenerateRequest, GenerateResponse,
    GenerateStreamChunk, GetLoadsRequest, GetLoadsResponse, GetModelInfoRequest,
    GetModelInfoResponse, GetServerInfoRequest, GetServerInfoResponse, HealthCheckRequest,
    HealthCheckResponse, InputLogProbs, InputTokenLogProb, KvTransferParams, OutputLogProbs,
    SamplingParams, SchedulerLoad, TopLogProbs,
};
use serde_json::{json, Map, Value};
use tonic::codegen::BoxStream;
use tonic::{Request, Response, Status};

use super::generate::{
    self, build_job, GenOut, InputLogprobs, JobRequest, MatchedStop, OutputLogprobs, Prepared,
    WireRules,
};
use super::{check_prompt, count_rpc, iso8601_now, rank_loads, unhealthy};
use crate::config::{Connector, MockEngineConfig, Role};
use crate::engine::Shared;
use crate::fake_model::{self, SamplingSpec};
use crate::job::LogprobOpts;
use crate::records::{GrpcRequest, GrpcSampling, LegacyKvParams};

const GENERATE_PATH: &str = "/vllm.grpc.engine.VllmEngine/Generate";
const VERSION: &str = "0.0.0-mock";
/// vLLM caps the logprobs a request may ask for (`max_logprobs` default).
const MAX_LOGPROBS: i32 = 20;

#[derive(Clone)]
pub(crate) struct VllmService {
    shared: Arc<Shared>,
}

pub(super) fn service(shared: &Arc<Shared>) -> VllmEngineServer<VllmService> {
    VllmEngineServer::new(VllmService {
        shared: shared.clone(),
    })
}

#[tonic::async_trait]
impl VllmEngine for VllmService {
    async fn generate(
        &self,
        request: Request<GenerateRequest>,
    ) -> Result<Response<BoxStream<GenerateResponse>>, Status> {
        let cfg = &self.shared.cfg;
        generate::serve(
            &self.shared,
            GENERATE_PATH,
            request,
            |req, metadata| record_of(cfg, req, metadata),
            |req| prepare(cfg, req),
            encode,
        )
        .await
    }

    async fn health_check(
        &self,
        _request: Request<HealthCheckRequest>,
    ) -> Result<Response<HealthCheckResponse>, Status> {
        count_rpc(&self.shared, "HealthCheck");
        let unhealthy = unhealthy(&self.shared);
        Ok(Response::new(HealthCheckResponse {
            healthy: !unhealthy,
            message: if unhealthy {
                "Engine is not alive"
            } else {
                "Health"
            }
            .into(),
        }))
    }

    async fn abort(
        &self,
        request: Request<AbortRequest>,
    ) -> Result<Response<AbortResponse>, Status> {
        count_rpc(&self.shared, "Abort");
        let req = request.into_inner();
        self.shared.grpc.abort(&req.request_ids, None);
        Ok(Response::new(AbortResponse {}))
    }

    async fn get_model_info(
        &self,
        _request: Request<GetModelInfoRequest>,
    ) -> Result<Response<GetModelInfoResponse>, Status> {
        count_rpc(&self.shared, "GetModelInfo");
        let cfg = &self.shared.cfg;
        let vocab = &cfg.output_vocab;
        Ok(Response::new(GetModelInfoResponse {
            model_path: cfg.model.clone(),
            is_generation: true,
            max_context_length: cfg.max_model_len,
            vocab_size: vocab.vocab_size(),
            served_model_name: cfg.model.clone(),
            tokenizer_path: cfg.tokenizer_path.clone().unwrap_or_default(),
            model_type: "mock".into(),
            architectures: vec!["MockForCausalLM".into()],
            eos_token_ids: vocab.eos_ids().iter().map(|&e| e as i32).collect(),
            max_req_input_len: cfg.max_model_len as i32,
            ..Default::default()
        }))
    }

    async fn get_server_info(
        &self,
        _request: Request<GetServerInfoRequest>,
    ) -> Result<Response<GetServerInfoResponse>, Status> {
        count_rpc(&self.shared, "GetServerInfo");
        let sh = &self.shared;
        let cfg = &sh.cfg;
        let connector = kv_connector_name(cfg.connector);
        let configured = cfg.role != Role::Both && !connector.is_empty();
        Ok(Response::new(GetServerInfoResponse {
            active_requests: sh.grpc.live_calls() as u32,
            is_paused: false,
            uptime_seconds: sh.grpc.uptime_secs(),
            server_type: "vllm-grpc".into(),
            kv_connector: if configured {
                connector.into()
            } else {
                "".into()
            },
            kv_role: match (configured, cfg.role) {
                (false, _) | (_, Role::Both) => "",
                (true, Role::Prefill) => "kv_producer",
                (true, Role::Decode) => "kv_consumer",
            }
            .into(),
            kv_engine_id: if configured {
                sh.engine_id()
            } else {
                String::new()
            },
            data_parallel_size: cfg.dp_size as i32,
            kv_cache_dtype: cfg.kv_cache_dtype.clone(),
            block_size: cfg.block_size as i32,
            model_dtype: "torch.bfloat16".into(),
            max_num_seqs: cfg.max_running_requests as i32,
            ..Default::default()
        }))
    }

    async fn get_loads(
        &self,
        _request: Request<GetLoadsRequest>,
    ) -> Result<Response<GetLoadsResponse>, Status> {
        count_rpc(&self.shared, "GetLoads");
        // One rank, core metrics only, no `max_running_requests`: as the servicer reports.
        let loads: Vec<SchedulerLoad> = rank_loads(&self.shared, Some(0))
            .into_iter()
            .map(|l| SchedulerLoad {
                dp_rank: 0,
                num_running_reqs: l.running as i32,
                num_waiting_reqs: l.waiting as i32,
                num_total_reqs: (l.running + l.waiting) as i32,
                token_usage: l.token_usage,
                ..Default::default()
            })
            .collect();
        Ok(Response::new(GetLoadsResponse {
            timestamp: iso8601_now(),
            version: VERSION.into(),
            dp_rank_count: 1,
            loads,
        }))
    }
}

/// The connector class name vLLM reports for our connector.
fn kv_connector_name(c: Connector) -> &'static str {
    match c {
        Connector::Nixl => "NixlConnector",
        Connector::Mooncake => "MooncakeConnector",
        Connector::MoriioRead | Connector::MoriioWrite => "MoRIIOConnector",
        Connector::Fake | Connector::None => "",
    }
}

/// `params_from_request`: the JSON field first, then the legacy typed field.
fn kv_params(req: &GenerateRequest) -> Result<Option<Map<String, Value>>, Status> {
    if let Some(raw) = &req.kv_transfer_params_json {
        let v: Value = serde_json::from_str(raw).map_err(|e| {
            Status::invalid_argument(format!("Invalid kv_transfer_params_json: {e}"))
        })?;
        return match v {
            Value::Object(m) => Ok(Some(m)),
            _ => Err(Status::invalid_argument(
                "kv_transfer_params_json must be a JSON object",
            )),
        };
    }
    if let Some(p) = &req.kv_transfer_params {
        if p.remote_host.is_empty() || !(1..=65535).contains(&p.remote_port) {
            return Err(Status::invalid_argument(
                "Invalid kv_transfer_params: remote_host must be set and remote_port must be in [1, 65535].",
            ));
        }
        let mut m = Map::new();
        m.insert("remote_host".into(), json!(p.remote_host));
        m.insert("remote_port".into(), json!(p.remote_port));
        return Ok(Some(m));
    }
    Ok(None)
}

fn sampling_record(sp: &SamplingParams) -> GrpcSampling {
    GrpcSampling {
        max_new_tokens: sp.max_tokens,
        min_new_tokens: sp.min_tokens,
        stop: sp.stop.clone(),
        stop_token_ids: sp.stop_token_ids.clone(),
        ignore_eos: sp.ignore_eos,
        n: sp.n,
        seed: sp.seed.map(|s| s as i64 as u64),
        temperature: sp.temperature,
        top_p: Some(sp.top_p),
        top_k: Some(sp.top_k as i32),
        min_p: Some(sp.min_p),
        frequency_penalty: Some(sp.frequency_penalty),
        presence_penalty: Some(sp.presence_penalty),
        repetition_penalty: Some(sp.repetition_penalty),
        skip_special_tokens: sp.skip_special_tokens,
        no_stop_trim: false,
        logprobs: sp.logprobs,
        prompt_logprobs: sp.prompt_logprobs,
    }
}

/// The prompt ids: `tokenized`, or `text` through the mock's own tokenizer.
fn prompt_ids(cfg: &MockEngineConfig, req: &GenerateRequest) -> Vec<u32> {
    match &req.input {
        Some(Input::Tokenized(t)) => t.input_ids.clone(),
        Some(Input::Text(s)) => fake_model::encode_prompt(&cfg.model, s),
        None => Vec::new(),
    }
}

fn record_of(
    cfg: &MockEngineConfig,
    req: &GenerateRequest,
    metadata: std::collections::BTreeMap<String, String>,
) -> GrpcRequest {
    let sp = req.sampling_params.clone().unwrap_or_default();
    GrpcRequest {
        request_id: req.request_id.clone(),
        input_ids: prompt_ids(cfg, req),
        text: match &req.input {
            Some(Input::Text(s)) => Some(s.clone()),
            _ => None,
        },
        stream: req.stream,
        sampling: sampling_record(&sp),
        bootstrap: None,
        kv_transfer_params_json: req.kv_transfer_params_json.clone(),
        kv_transfer_params_legacy: req.kv_transfer_params.as_ref().map(|p| LegacyKvParams {
            remote_host: p.remote_host.clone(),
            remote_port: p.remote_port,
        }),
        data_parallel_rank: req.data_parallel_rank,
        return_logprob: sp.logprobs.is_some(),
        logprob_start_len: None,
        top_logprobs_num: sp.logprobs.unwrap_or(0),
        metadata,
    }
}

fn prepare(cfg: &MockEngineConfig, req: &GenerateRequest) -> Result<Prepared, Status> {
    let params = kv_params(req)?;
    let ids = prompt_ids(cfg, req);
    check_prompt(cfg, &ids)?;
    let sp = req.sampling_params.clone().unwrap_or_default();
    if sp.max_tokens == Some(0) {
        return Err(Status::invalid_argument(
            "max_tokens must be at least 1, got 0.",
        ));
    }
    // Unset: whatever the context window leaves.
    let max_tokens = sp
        .max_tokens
        .unwrap_or_else(|| cfg.max_model_len.saturating_sub(ids.len() as u32));
    if sp.min_tokens > max_tokens {
        return Err(Status::invalid_argument(format!(
            "min_tokens must be less than or equal to max_tokens={max_tokens}, got {}.",
            sp.min_tokens
        )));
    }
    let top = sp
        .logprobs
        .map(|k| {
            if k < 0 {
                MAX_LOGPROBS
            } else {
                k.min(MAX_LOGPROBS)
            }
        })
        .unwrap_or(0) as usize;
    let spec = SamplingSpec {
        max_new_tokens: max_tokens as usize,
        min_new_tokens: sp.min_tokens as usize,
        ignore_eos: sp.ignore_eos,
        stop: sp.stop.clone(),
        stop_token_ids: sp.stop_token_ids.clone(),
        seed: sp.seed.map(|s| s as i64 as u64),
        top_logprobs: top,
        ..cfg.sampling_spec()
    };
    let want_logprobs = sp.logprobs.is_some() || sp.prompt_logprobs.is_some();
    let job = build_job(
        &cfg.model,
        JobRequest {
            request_id: req.request_id.clone(),
            prompt_ids: ids,
            spec,
            n: sp.n,
            stream: req.stream,
            logprobs: LogprobOpts {
                return_logprob: want_logprobs,
                start: 0,
                top,
                text_in_logprobs: false,
            },
        },
    );
    let body = match params {
        Some(p) => json!({ "kv_transfer_params": p }),
        None => json!({}),
    };
    Ok(Prepared {
        job,
        body,
        bootstrap: Vec::new(),
        rules: WireRules {
            stream: req.stream,
            no_stop_trim: false,
            input_logprobs: sp.prompt_logprobs.is_some(),
            output_logprobs: sp.logprobs.is_some(),
        },
    })
}

fn top_logprobs(top: Vec<super::generate::TopLogprobs>) -> Vec<TopLogProbs> {
    top.into_iter()
        .map(|t| TopLogProbs {
            values: t.values,
            token_ids: t.token_ids,
        })
        .collect()
}

fn output_logprobs(lp: OutputLogprobs) -> OutputLogProbs {
    OutputLogProbs {
        token_logprobs: lp.token_logprobs,
        token_ids: lp.token_ids,
        top_logprobs: top_logprobs(lp.top),
    }
}

fn input_logprobs(lp: InputLogprobs) -> InputLogProbs {
    InputLogProbs {
        token_logprobs: lp
            .token_logprobs
            .into_iter()
            .map(|value| InputTokenLogProb { value })
            .collect(),
        token_ids: lp.token_ids,
        top_logprobs: top_logprobs(lp.top),
    }
}

/// `params_to_response_fields`: the JSON, plus the legacy typed mirror when the params carry a
/// valid `remote_host` / `remote_port` (the NIXL shape).
fn response_params(p: Option<Value>) -> (Option<KvTransferParams>, Option<String>) {
    let Some(p) = p.filter(|p| p.as_object().is_some_and(|m| !m.is_empty())) else {
        return (None, None);
    };
    let legacy = match (
        p.get("remote_host").and_then(Value::as_str),
        p.get("remote_port").and_then(Value::as_u64),
    ) {
        (Some(h), Some(port)) if !h.is_empty() && (1..=65535).contains(&port) => {
            Some(KvTransferParams {
                remote_host: h.to_string(),
                remote_port: port as u32,
            })
        }
        _ => None,
    };
    (legacy, Some(p.to_string()))
}

fn encode(ev: GenOut) -> GenerateResponse {
    let response = match ev {
        GenOut::Chunk(c) => WireEvent::Chunk(GenerateStreamChunk {
            token_ids: c.token_ids,
            prompt_tokens: c.prompt_tokens,
            completion_tokens: c.completion_tokens,
            cached_tokens: c.cached_tokens,
            output_logprobs: c.output_logprobs.map(output_logprobs),
            input_logprobs: c.input_logprobs.map(input_logprobs),
            index: c.index,
        }),
        GenOut::Complete(c) => {
            let (legacy, json) = response_params(c.kv_transfer_params);
            WireEvent::Complete(GenerateComplete {
                output_ids: c.output_ids,
                finish_reason: c.finish_reason.into(),
                prompt_tokens: c.prompt_tokens,
                completion_tokens: c.completion_tokens,
                cached_tokens: c.cached_tokens,
                output_logprobs: c.output_logprobs.map(output_logprobs),
                input_logprobs: c.input_logprobs.map(input_logprobs),
                index: c.index,
                kv_transfer_params: legacy,
                kv_transfer_params_json: json,
                matched_stop: c.matched.map(|m| match m {
                    MatchedStop::TokenId(t) => WireMatched::MatchedTokenId(t),
                    MatchedStop::Text(s) => WireMatched::MatchedStopStr(s),
                }),
                ..Default::default()
            })
        }
    };
    GenerateResponse {
        response: Some(response),
    }
}
