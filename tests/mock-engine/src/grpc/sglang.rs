//! `sglang.grpc.scheduler.SglangScheduler`, as the smg-grpc-servicer SGLang servicer behaves
//! with `skip_tokenizer_init` (how gRPC workers run): token ids only, string `stop` and
//! `min_new_tokens` refused, the room in `disaggregated_params` (int32), `Abort` by one id.

use std::sync::Arc;

use pdgate_proto::sglang::generate_complete::MatchedStop as WireMatched;
use pdgate_proto::sglang::generate_response::Response as WireEvent;
use pdgate_proto::sglang::sglang_scheduler_server::{SglangScheduler, SglangSchedulerServer};
use pdgate_proto::sglang::{
    AbortRequest, AbortResponse, AggregateMetrics, DisaggregationMetrics, GenerateComplete,
    GenerateRequest, GenerateResponse, GenerateStreamChunk, GetLoadsRequest, GetLoadsResponse,
    GetModelInfoRequest, GetModelInfoResponse, GetServerInfoRequest, GetServerInfoResponse,
    HealthCheckRequest, HealthCheckResponse, InputLogProbs, InputTokenLogProb, MemoryMetrics,
    MultimodalInputs, OutputLogProbs, QueueMetrics, SamplingParams, SchedulerLoad, TensorData,
    TopLogProbs,
};
use serde_json::{json, Value};
use tonic::codegen::BoxStream;
use tonic::{Request, Response, Status};

use super::generate::{
    self, build_job, GenOut, InputLogprobs, JobRequest, MatchedStop, OutputLogprobs, Prepared,
    WireRules,
};
use super::{
    bootstrap_items, check_prompt, count_rpc, disaggregation_mode, iso8601_now, py_list_repr,
    rank_loads, timestamp, to_struct, unhealthy,
};
use crate::config::MockEngineConfig;
use crate::engine::Shared;
use crate::fake_model::SamplingSpec;
use crate::job::LogprobOpts;
use crate::records::{GrpcBootstrap, GrpcRequest, GrpcSampling, MmRecord};
use crate::vision::{
    no_vision, placeholders_plan, plan, GridRows, MediaPlan, PendingMedia, TensorView,
};

const GENERATE_PATH: &str = "/sglang.grpc.scheduler.SglangScheduler/Generate";
/// SGLang's `SamplingParams.max_new_tokens` default.
const DEFAULT_MAX_NEW_TOKENS: u32 = 128;
const VERSION: &str = "0.0.0-mock";

#[derive(Clone)]
pub(crate) struct SglangService {
    shared: Arc<Shared>,
}

pub(super) fn service(shared: &Arc<Shared>) -> SglangSchedulerServer<SglangService> {
    SglangSchedulerServer::new(SglangService {
        shared: shared.clone(),
    })
}

#[tonic::async_trait]
impl SglangScheduler for SglangService {
    async fn generate(
        &self,
        request: Request<GenerateRequest>,
    ) -> Result<Response<BoxStream<GenerateResponse>>, Status> {
        let rid = request.get_ref().request_id.clone();
        let cfg = &self.shared.cfg;
        generate::serve(
            &self.shared,
            GENERATE_PATH,
            request,
            record_of,
            |req| prepare(cfg, req),
            move |ev| encode(&rid, ev),
        )
        .await
    }

    async fn health_check(
        &self,
        _request: Request<HealthCheckRequest>,
    ) -> Result<Response<HealthCheckResponse>, Status> {
        count_rpc(&self.shared, "HealthCheck");
        Ok(Response::new(if unhealthy(&self.shared) {
            HealthCheckResponse {
                healthy: false,
                message: "Health check timeout after 20s".into(),
            }
        } else {
            HealthCheckResponse {
                healthy: true,
                message: "Health check passed".into(),
            }
        }))
    }

    async fn abort(
        &self,
        request: Request<AbortRequest>,
    ) -> Result<Response<AbortResponse>, Status> {
        count_rpc(&self.shared, "Abort");
        let req = request.into_inner();
        let reason = (!req.reason.is_empty()).then(|| req.reason.clone());
        self.shared
            .grpc
            .abort(std::slice::from_ref(&req.request_id), reason);
        // The request manager forwards the abort to the scheduler whether or not it knows the
        // id, and reports success either way.
        Ok(Response::new(AbortResponse {
            success: true,
            message: format!("Request {} aborted", req.request_id),
        }))
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
            tokenizer_path: cfg.tokenizer_path.clone().unwrap_or_default(),
            is_generation: true,
            weight_version: "default".into(),
            served_model_name: cfg.model.clone(),
            max_context_length: cfg.max_model_len as i32,
            vocab_size: vocab.vocab_size() as i32,
            model_type: "mock".into(),
            eos_token_ids: vocab.eos_ids().iter().map(|&e| e as i32).collect(),
            max_req_input_len: cfg.max_model_len as i32,
            architectures: vec!["MockForCausalLM".into()],
            supports_vision: cfg.vision.as_ref().is_some_and(|v| v.supports_vision()),
            ..Default::default()
        }))
    }

    async fn get_server_info(
        &self,
        _request: Request<GetServerInfoRequest>,
    ) -> Result<Response<GetServerInfoResponse>, Status> {
        count_rpc(&self.shared, "GetServerInfo");
        let sh = &self.shared;
        Ok(Response::new(GetServerInfoResponse {
            server_args: Some(to_struct(&server_args(sh))),
            scheduler_info: Some(to_struct(&json!({
                "max_total_num_tokens": sh.cfg.kv_tokens,
                "max_req_input_len": sh.cfg.max_model_len,
                "is_generation": true,
            }))),
            active_requests: sh.grpc.live_calls() as i32,
            is_paused: false,
            last_receive_timestamp: 0.0,
            uptime_seconds: sh.grpc.uptime_secs(),
            sglang_version: VERSION.into(),
            server_type: "grpc".into(),
            start_time: Some(timestamp(sh.grpc.started())),
            max_total_num_tokens: sh.cfg.kv_tokens as i32,
        }))
    }

    async fn get_loads(
        &self,
        request: Request<GetLoadsRequest>,
    ) -> Result<Response<GetLoadsResponse>, Status> {
        count_rpc(&self.shared, "GetLoads");
        let req = request.into_inner();
        let sections = load_sections(&req.include)?;
        let sh = &self.shared;
        let cfg = &sh.cfg;
        let want = |s: &str| sections.iter().any(|x| x == s || x == "all");
        let loads: Vec<SchedulerLoad> = rank_loads(sh, req.dp_rank)
            .into_iter()
            .map(|l| {
                let live = l.dp_rank == 0;
                SchedulerLoad {
                    dp_rank: l.dp_rank as i32,
                    num_running_reqs: l.running as i32,
                    num_waiting_reqs: l.waiting as i32,
                    num_total_reqs: (l.running + l.waiting) as i32,
                    num_used_tokens: l.used_tokens as i32,
                    max_total_num_tokens: l.max_total_tokens as i32,
                    token_usage: l.token_usage,
                    max_running_requests: cfg.max_running_requests as i32,
                    memory: want("memory").then(|| MemoryMetrics {
                        token_capacity: cfg.kv_tokens as i32,
                        ..Default::default()
                    }),
                    disaggregation: want("disagg").then(|| DisaggregationMetrics {
                        mode: disaggregation_mode(cfg.role).into(),
                        prefill_prealloc_queue_reqs: if live {
                            sh.sgl.count("prefill") as i32
                        } else {
                            0
                        },
                        decode_transfer_queue_reqs: if live {
                            sh.sgl.count("decode") as i32
                        } else {
                            0
                        },
                        ..Default::default()
                    }),
                    queues: want("queues").then(|| QueueMetrics {
                        waiting: l.waiting as i32,
                        ..Default::default()
                    }),
                    ..Default::default()
                }
            })
            .collect();
        let n = loads.len().max(1) as f64;
        let (running, waiting) = loads.iter().fold((0, 0), |(r, w), l| {
            (r + l.num_running_reqs, w + l.num_waiting_reqs)
        });
        let aggregate = AggregateMetrics {
            total_running_reqs: running,
            total_waiting_reqs: waiting,
            total_reqs: running + waiting,
            avg_token_usage: loads.iter().map(|l| l.token_usage).sum::<f64>() / n,
            ..Default::default()
        };
        Ok(Response::new(GetLoadsResponse {
            timestamp: iso8601_now(),
            version: VERSION.into(),
            dp_rank_count: loads.len() as i32,
            loads,
            aggregate: Some(aggregate),
        }))
    }
}

/// The `include` sections of `GetLoads` (empty = all), refused as the request manager does.
fn load_sections(include: &[String]) -> Result<Vec<String>, Status> {
    const VALID: [&str; 7] = ["all", "core", "disagg", "lora", "memory", "queues", "spec"];
    if include.is_empty() {
        return Ok(vec!["all".into()]);
    }
    let mut invalid: Vec<String> = include
        .iter()
        .filter(|s| !VALID.contains(&s.as_str()))
        .cloned()
        .collect();
    if !invalid.is_empty() {
        invalid.sort();
        invalid.dedup();
        let valid: Vec<String> = VALID.iter().map(|s| s.to_string()).collect();
        return Err(Status::invalid_argument(format!(
            "Invalid include sections: {}. Valid options: {}",
            py_list_repr(&invalid),
            py_list_repr(&valid)
        )));
    }
    Ok(include.to_vec())
}

/// The server arguments a gateway reads (SGLang `ServerArgs` keys).
fn server_args(sh: &Shared) -> Value {
    let cfg = &sh.cfg;
    json!({
        "model_path": cfg.model, "served_model_name": cfg.model,
        "tokenizer_path": cfg.tokenizer_path.clone().unwrap_or_else(|| cfg.model.clone()),
        "host": cfg.bind_ip.to_string(), "port": sh.api_addr.port(),
        "grpc_mode": true, "skip_tokenizer_init": cfg.grpc.skip_tokenizer_init,
        "disaggregation_mode": disaggregation_mode(cfg.role),
        "disaggregation_bootstrap_port": sh.bootstrap_addr.map(|a| a.port()).unwrap_or(cfg.default_bootstrap_port),
        "disaggregation_transfer_backend": cfg.connector.as_str(),
        "dp_size": cfg.dp_size, "tp_size": cfg.tp_size, "pp_size": 1,
        "page_size": cfg.page_size, "kv_cache_dtype": cfg.kv_cache_dtype,
        "attention_backend": null,
        "max_running_requests": cfg.max_running_requests,
        "context_length": cfg.max_model_len, "max_total_tokens": cfg.kv_tokens,
        "load_balance_method": cfg.load_balance_method, "is_embedding": false,
        "vocab_size": cfg.output_vocab.vocab_size(), "weight_version": "default",
    })
}

fn sampling_record(sp: &SamplingParams) -> GrpcSampling {
    GrpcSampling {
        max_new_tokens: sp.max_new_tokens,
        min_new_tokens: sp.min_new_tokens,
        stop: sp.stop.clone(),
        stop_token_ids: sp.stop_token_ids.clone(),
        ignore_eos: sp.ignore_eos,
        n: sp.n,
        seed: None,
        temperature: Some(sp.temperature),
        top_p: Some(sp.top_p),
        top_k: Some(sp.top_k),
        min_p: Some(sp.min_p),
        frequency_penalty: Some(sp.frequency_penalty),
        presence_penalty: Some(sp.presence_penalty),
        repetition_penalty: Some(sp.repetition_penalty),
        skip_special_tokens: sp.skip_special_tokens,
        no_stop_trim: sp.no_stop_trim,
        logprobs: None,
        prompt_logprobs: None,
    }
}

fn tensor_view(t: &TensorData) -> TensorView<'_> {
    TensorView {
        shape: &t.shape,
        dtype: &t.dtype,
        bytes: Some(&t.data),
    }
}

/// The request's `mm_inputs`, when it carries any media.
fn mm_inputs(req: &GenerateRequest) -> Option<&MultimodalInputs> {
    req.mm_inputs.as_ref().filter(|m| {
        m.pixel_values.is_some()
            || !m.mm_placeholders.is_empty()
            || !m.model_specific_tensors.is_empty()
            || !m.image_data.is_empty()
            || !m.image_urls.is_empty()
    })
}

fn grid_of(m: &MultimodalInputs) -> GridRows {
    m.model_specific_tensors
        .get("image_grid_thw")
        .map(|g| tensor_view(g).grid())
        .transpose()
}

/// The request's media as they arrived (`None`: text only).
fn mm_record(req: &GenerateRequest) -> Option<MmRecord> {
    let m = mm_inputs(req)?;
    Some(MmRecord {
        items: m.mm_placeholders.len(),
        pixels: m.pixel_values.is_some(),
        pixel_shapes: m.pixel_values.iter().map(|t| t.shape.clone()).collect(),
        grid_thw: grid_of(m).ok().flatten().unwrap_or_default(),
        placeholders: m
            .mm_placeholders
            .iter()
            .map(|p| [p.offset, p.length])
            .collect(),
        im_token_id: m.im_token_id,
        ..MmRecord::default()
    })
}

/// One placeholder per image; the features come from `pixel_values` (all images on dim 0).
fn media_plan(
    cfg: &MockEngineConfig,
    req: &GenerateRequest,
    ids: &[u32],
) -> Result<MediaPlan, Status> {
    let m = mm_inputs(req);
    let Some(v) = cfg.vision.as_ref() else {
        return match m {
            None => Ok(MediaPlan::default()),
            Some(_) => Err(no_vision()),
        };
    };
    let Some(m) = m else {
        return plan(
            cfg.role,
            ids,
            Vec::new(),
            Some(v.image_token_id),
            PendingMedia::Nothing,
        );
    };
    let ranges: Vec<(u32, u32)> = m
        .mm_placeholders
        .iter()
        .map(|p| (p.offset, p.length))
        .collect();
    let pixels = m
        .pixel_values
        .as_ref()
        .map(|t| (tensor_view(t), grid_of(m)));
    placeholders_plan(
        cfg.role,
        v,
        ids,
        &ranges,
        pixels,
        m.im_token_id.unwrap_or(v.image_token_id),
    )
}

fn record_of(
    req: &GenerateRequest,
    metadata: std::collections::BTreeMap<String, String>,
) -> (GrpcRequest, Option<MmRecord>) {
    let r = GrpcRequest {
        request_id: req.request_id.clone(),
        input_ids: req
            .tokenized
            .as_ref()
            .map(|t| t.input_ids.clone())
            .unwrap_or_default(),
        text: None,
        stream: req.stream,
        sampling: sampling_record(&req.sampling_params.clone().unwrap_or_default()),
        bootstrap: req.disaggregated_params.as_ref().map(|d| GrpcBootstrap {
            host: d.bootstrap_host.clone(),
            port: d.bootstrap_port,
            room: d.bootstrap_room as i64,
        }),
        kv_transfer_params_json: None,
        kv_transfer_params_legacy: None,
        data_parallel_rank: req.data_parallel_rank,
        return_logprob: req.return_logprob,
        logprob_start_len: Some(req.logprob_start_len),
        top_logprobs_num: req.top_logprobs_num,
        metadata,
    };
    (r, mm_record(req))
}

/// The servicer's conversion and the scheduler's checks, in their order.
fn prepare(cfg: &MockEngineConfig, req: &GenerateRequest) -> Result<Prepared, Status> {
    let tokenized = req
        .tokenized
        .as_ref()
        .ok_or_else(|| Status::invalid_argument("Tokenized input must be provided"))?;
    let sp = req.sampling_params.clone().unwrap_or_default();
    if cfg.grpc.skip_tokenizer_init {
        // SamplingParams.normalize without a tokenizer (`raise_if_tokenizer_required`).
        if !sp.stop.is_empty() {
            return Err(Status::invalid_argument(format!(
                "stop={} is unavailable when skip_tokenizer_init=True (requires tokenizer to decode tokens to text for matching).",
                py_list_repr(&sp.stop)
            )));
        }
        if sp.min_new_tokens > 0 {
            return Err(Status::invalid_argument(format!(
                "min_new_tokens={} is unavailable when skip_tokenizer_init=True (requires tokenizer for eos_token_id).",
                sp.min_new_tokens
            )));
        }
    }
    let max_new = sp.max_new_tokens.unwrap_or(DEFAULT_MAX_NEW_TOKENS);
    if sp.min_new_tokens > max_new {
        return Err(Status::invalid_argument(format!(
            "min_new_tokens must be in [0, max_new_tokens({max_new})], got {}.",
            sp.min_new_tokens
        )));
    }
    let ids = tokenized.input_ids.clone();
    check_prompt(cfg, &ids)?;
    let media = media_plan(cfg, req, &ids)?;
    let bootstrap = bootstrap_items(
        cfg,
        req.disaggregated_params.as_ref().map(|d| {
            (
                d.bootstrap_host.as_str(),
                d.bootstrap_port,
                d.bootstrap_room as i64,
            )
        }),
        req.data_parallel_rank,
    )?;
    let top = req.top_logprobs_num.max(0) as usize;
    let spec = SamplingSpec {
        max_new_tokens: max_new as usize,
        min_new_tokens: sp.min_new_tokens as usize,
        ignore_eos: sp.ignore_eos,
        stop: sp.stop.clone(),
        stop_token_ids: sp.stop_token_ids.clone(),
        seed: None,
        top_logprobs: top,
        ..cfg.sampling_spec()
    };
    let job = build_job(
        &cfg.model,
        JobRequest {
            request_id: req.request_id.clone(),
            prompt_ids: ids,
            spec,
            n: sp.n,
            stream: req.stream,
            logprobs: LogprobOpts {
                return_logprob: req.return_logprob,
                start: req.logprob_start_len.max(0) as usize,
                top,
                text_in_logprobs: false,
            },
            media: media.spans.clone(),
        },
    );
    Ok(Prepared {
        job,
        body: json!({}),
        bootstrap,
        rules: WireRules {
            stream: req.stream,
            no_stop_trim: sp.no_stop_trim,
            input_logprobs: req.return_logprob && req.logprob_start_len >= 0,
            output_logprobs: req.return_logprob,
        },
        media,
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
        token_ids_logprobs: Vec::new(),
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

fn encode(rid: &str, ev: GenOut) -> GenerateResponse {
    let response = match ev {
        GenOut::Chunk(c) => WireEvent::Chunk(GenerateStreamChunk {
            token_ids: c.token_ids,
            prompt_tokens: c.prompt_tokens,
            completion_tokens: c.completion_tokens,
            cached_tokens: c.cached_tokens,
            output_logprobs: c.output_logprobs.map(output_logprobs),
            input_logprobs: c.input_logprobs.map(input_logprobs),
            index: c.index,
            ..Default::default()
        }),
        GenOut::Complete(c) => WireEvent::Complete(GenerateComplete {
            output_ids: c.output_ids,
            finish_reason: c.finish_reason.into(),
            prompt_tokens: c.prompt_tokens,
            completion_tokens: c.completion_tokens,
            cached_tokens: c.cached_tokens,
            output_logprobs: c.output_logprobs.map(output_logprobs),
            input_logprobs: c.input_logprobs.map(input_logprobs),
            index: c.index,
            matched_stop: c.matched.map(|m| match m {
                MatchedStop::TokenId(t) => WireMatched::MatchedTokenId(t),
                MatchedStop::Text(s) => WireMatched::MatchedStopStr(s),
            }),
            ..Default::default()
        }),
    };
    GenerateResponse {
        request_id: rid.to_string(),
        response: Some(response),
    }
}
