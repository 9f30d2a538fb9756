//! `tokenspeed.grpc.scheduler.TokenSpeedScheduler`, as the smg-grpc-servicer TokenSpeed
//! servicer behaves: SGLang's bootstrap-room handoff with a 63-bit room in
//! `kv_bootstrap_info`, placement by `room % dp_size` (or the optional `data_parallel_rank`
//! pin), optional sampling scalars, stop strings kept, `sampling_seed`, and a matched trailing
//! stop token dropped from `output_ids` unless `no_stop_trim`.

use std::sync::Arc;

use pdgate_proto::common::Modality;
use pdgate_proto::tokenspeed::generate_complete::MatchedStop as WireMatched;
use pdgate_proto::tokenspeed::generate_response::Response as WireEvent;
use pdgate_proto::tokenspeed::tensor_data::Payload;
use pdgate_proto::tokenspeed::token_speed_scheduler_server::{
    TokenSpeedScheduler, TokenSpeedSchedulerServer,
};
use pdgate_proto::tokenspeed::{
    AbortRequest, AbortResponse, AggregateMetrics, GenerateComplete, GenerateRequest,
    GenerateResponse, GenerateStreamChunk, GetLoadsRequest, GetLoadsResponse, GetModelInfoRequest,
    GetModelInfoResponse, GetServerInfoRequest, GetServerInfoResponse, HealthCheckRequest,
    HealthCheckResponse, OutputLogProbs, SamplingParams, SchedulerLoad, TopLogProbs,
};
use pdgate_proto::tokenspeed::{EncodeItemBootstrapInfo, MultimodalItem, TensorData};
use serde_json::{json, Value};
use tonic::codegen::BoxStream;
use tonic::{Request, Response, Status};

use super::generate::{
    self, build_job, GenOut, JobRequest, MatchedStop, OutputLogprobs, Prepared, WireRules,
};
use super::{
    bootstrap_items, check_prompt, count_rpc, disaggregation_mode, iso8601_now, rank_loads,
    timestamp, to_struct, unhealthy,
};
use crate::config::{MockEngineConfig, Role};
use crate::engine::Shared;
use crate::fake_model::SamplingSpec;
use crate::job::LogprobOpts;
use crate::records::{GrpcBootstrap, GrpcRequest, GrpcSampling, MmRecord};
use crate::vision::{
    computes_prompt, features_of_pixels, hex, no_vision, plan, EmbeddingFetch, MediaPlan,
    MediaSpan, MockVision, PendingMedia, TensorView,
};

const GENERATE_PATH: &str = "/tokenspeed.grpc.scheduler.TokenSpeedScheduler/Generate";
/// The engine's `max_new_tokens` when the request leaves it unset (SGLang's default).
const DEFAULT_MAX_NEW_TOKENS: u32 = 128;
const VERSION: &str = "0.0.0-mock";

#[derive(Clone)]
pub(crate) struct TokenSpeedService {
    shared: Arc<Shared>,
}

pub(super) fn service(shared: &Arc<Shared>) -> TokenSpeedSchedulerServer<TokenSpeedService> {
    TokenSpeedSchedulerServer::new(TokenSpeedService {
        shared: shared.clone(),
    })
}

#[tonic::async_trait]
impl TokenSpeedScheduler for TokenSpeedService {
    async fn generate(
        &self,
        request: Request<GenerateRequest>,
    ) -> Result<Response<BoxStream<GenerateResponse>>, Status> {
        if self.shared.cfg.role == Role::Encode {
            count_rpc(&self.shared, "Generate");
            return Err(Status::failed_precondition(
                "this worker runs disaggregation_mode=encode: it serves TokenSpeedEncoder.Encode, not Generate",
            ));
        }
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
        let resp = match (unhealthy(&self.shared), self.shared.cfg.role) {
            (true, _) => HealthCheckResponse {
                healthy: false,
                message: "Health check timeout after 20s".into(),
            },
            // Disaggregated workers answer a shallow liveness probe.
            (false, Role::Prefill | Role::Decode | Role::Encode) => HealthCheckResponse {
                healthy: true,
                message: "Health check passed (disaggregation worker; shallow probe)".into(),
            },
            (false, Role::Both) => HealthCheckResponse {
                healthy: true,
                message: "Health check passed".into(),
            },
        };
        Ok(Response::new(resp))
    }

    async fn abort(
        &self,
        request: Request<AbortRequest>,
    ) -> Result<Response<AbortResponse>, Status> {
        count_rpc(&self.shared, "Abort");
        let req = request.into_inner();
        let reason = (!req.reason.is_empty()).then(|| req.reason.clone());
        // The servicer counts the scheduler requests it aborts (`{rid}-n{i}` per sample).
        let samples: usize = self
            .shared
            .grpc
            .abort(std::slice::from_ref(&req.request_id), reason)
            .len();
        let resp = if samples > 0 {
            AbortResponse {
                success: true,
                message: format!("Aborted {samples} request(s) for {}", req.request_id),
            }
        } else {
            AbortResponse {
                success: false,
                message: format!("Request {} not found", req.request_id),
            }
        };
        Ok(Response::new(resp))
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
            served_model_name: cfg.model.clone(),
            model_type: "mock".into(),
            architectures: vec!["MockForCausalLM".into()],
            max_context_length: cfg.max_model_len as i32,
            max_req_input_len: cfg.max_model_len as i32,
            vocab_size: vocab.vocab_size() as i32,
            eos_token_ids: vocab.eos_ids().iter().map(|&e| e as i32).collect(),
            model_dtype: "bfloat16".into(),
            multimodal_encoder_dtype: "bfloat16".into(),
            supports_vision: cfg.vision.as_ref().is_some_and(|v| v.supports_vision()),
            supports_multimodal: cfg.vision.as_ref().is_some_and(|v| v.supports_vision()),
            supported_modalities: if cfg.vision.as_ref().is_some_and(|v| v.supports_vision()) {
                vec![Modality::Image as i32]
            } else {
                Vec::new()
            },
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
                "shm_namespace_id": "",
            }))),
            active_requests: sh.grpc.live_calls() as i32,
            is_paused: false,
            uptime_seconds: sh.grpc.uptime_secs(),
            max_total_num_tokens: sh.cfg.kv_tokens as i32,
            tokenspeed_version: VERSION.into(),
            start_time: Some(timestamp(sh.grpc.started())),
            constrained_decoding: String::new(),
        }))
    }

    async fn get_loads(
        &self,
        request: Request<GetLoadsRequest>,
    ) -> Result<Response<GetLoadsResponse>, Status> {
        count_rpc(&self.shared, "GetLoads");
        let req = request.into_inner();
        // An encode worker runs no scheduler: it reports no loads.
        let ranks = if self.shared.cfg.role == Role::Encode {
            Vec::new()
        } else {
            rank_loads(&self.shared, req.dp_rank)
        };
        // The servicer leaves `max_running_requests` unset: the running window is the server
        // info's `max_num_seqs`.
        let loads: Vec<SchedulerLoad> = ranks
            .into_iter()
            .map(|l| SchedulerLoad {
                dp_rank: l.dp_rank as i32,
                num_running_reqs: l.running as i32,
                num_waiting_reqs: l.waiting as i32,
                num_total_reqs: (l.running + l.waiting) as i32,
                num_used_tokens: l.used_tokens as i32,
                max_total_num_tokens: l.max_total_tokens as i32,
                token_usage: l.token_usage,
                ..Default::default()
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
            version: "tokenspeed".into(),
            dp_rank_count: loads.len() as i32,
            loads,
            aggregate: Some(aggregate),
        }))
    }
}

/// TokenSpeed `ServerArgs` keys a gateway reads (the bare `model` / `tokenizer` names; the
/// running window is `max_num_seqs`).
fn server_args(sh: &Shared) -> Value {
    let cfg = &sh.cfg;
    json!({
        "model": cfg.model, "served_model_name": cfg.model,
        "tokenizer": cfg.tokenizer_path.clone().unwrap_or_else(|| cfg.model.clone()),
        "host": cfg.bind_ip.to_string(), "port": sh.api_addr.port(),
        "disaggregation_mode": disaggregation_mode(cfg.role),
        "disaggregation_bootstrap_port": sh.bootstrap_addr.map(|a| a.port()).unwrap_or(cfg.default_bootstrap_port),
        "disaggregation_transfer_backend": cfg.connector.as_str(),
        "dp_size": cfg.dp_size, "tp_size": cfg.tp_size, "pp_size": 1,
        "page_size": cfg.page_size, "kv_cache_dtype": cfg.kv_cache_dtype,
        "max_num_seqs": cfg.max_running_requests,
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
        seed: sp.sampling_seed,
        temperature: sp.temperature,
        top_p: sp.top_p,
        top_k: sp.top_k,
        min_p: sp.min_p,
        frequency_penalty: sp.frequency_penalty,
        presence_penalty: sp.presence_penalty,
        repetition_penalty: sp.repetition_penalty,
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
        bytes: match &t.payload {
            Some(Payload::Inline(b)) => Some(b),
            _ => None,
        },
    }
}

fn mm_items(req: &GenerateRequest) -> (&[MultimodalItem], &[EncodeItemBootstrapInfo]) {
    (
        req.mm_inputs.as_ref().map_or(&[][..], |m| &m.items[..]),
        req.encode_bootstrap_info
            .as_ref()
            .map_or(&[][..], |e| &e.items[..]),
    )
}

/// The request's media as they arrived (`None`: text only).
fn mm_record(req: &GenerateRequest) -> Option<MmRecord> {
    let (items, assignments) = mm_items(req);
    if items.is_empty() && assignments.is_empty() {
        return None;
    }
    Some(MmRecord {
        items: items.len(),
        pixels: items.iter().any(|i| i.encoder_input.is_some()),
        pixel_shapes: items
            .iter()
            .filter_map(|i| i.encoder_input.as_ref().map(|t| t.shape.clone()))
            .collect(),
        grid_thw: items
            .iter()
            .filter_map(|i| i.model_specific_tensors.get("image_grid_thw"))
            .flat_map(|t| tensor_view(t).grid().unwrap_or_default())
            .collect(),
        hashes: items.iter().map(|i| hex(&i.content_hash)).collect(),
        placeholders: items
            .iter()
            .flat_map(|i| i.placeholders.iter().map(|p| [p.offset, p.length]))
            .collect(),
        im_token_id: items.iter().find_map(|i| i.placeholder_token_id),
        encode_assignments: assignments
            .iter()
            .map(|a| {
                (
                    a.item_index,
                    a.bootstrap_host.clone(),
                    a.bootstrap_port,
                    a.bootstrap_room,
                )
            })
            .collect(),
        ..MmRecord::default()
    })
}

/// The feature of one item's `encoder_input` (exactly one image).
pub(super) fn item_feature(
    v: &MockVision,
    item: &MultimodalItem,
    what: &str,
) -> Result<Option<u64>, Status> {
    let Some(t) = &item.encoder_input else {
        return Ok(None);
    };
    let grid = item
        .model_specific_tensors
        .get("image_grid_thw")
        .map(|g| tensor_view(g).grid())
        .transpose()
        .map_err(|e| Status::invalid_argument(format!("{what}: {e}")))?;
    let features = features_of_pixels(v, &tensor_view(t), grid.as_deref())
        .map_err(|e| Status::invalid_argument(format!("{what}: {e}")))?;
    match features[..] {
        [f] => Ok(Some(f)),
        _ => Err(Status::invalid_argument(format!(
            "{what}: encoder_input holds {} images, expected one",
            features.len()
        ))),
    }
}

/// Each item's placeholder and feature: from its `encoder_input`, or (EPD prefill) from the
/// encode worker its `encode_bootstrap_info` entry names.
fn media_plan(
    cfg: &MockEngineConfig,
    req: &GenerateRequest,
    ids: &[u32],
) -> Result<MediaPlan, Status> {
    let (items, assignments) = mm_items(req);
    let Some(v) = cfg.vision.as_ref() else {
        if items.is_empty() && assignments.is_empty() {
            return Ok(MediaPlan::default());
        }
        return Err(no_vision());
    };
    if let Some(a) = assignments
        .iter()
        .find(|a| a.item_index as usize >= items.len())
    {
        return Err(Status::invalid_argument(format!(
            "encode_bootstrap_info names item {} of a request with {} multimodal items",
            a.item_index,
            items.len()
        )));
    }
    let mut declared = Vec::new();
    let mut fetches = Vec::new();
    for (i, item) in items.iter().enumerate() {
        let what = format!("mm_inputs.items[{i}]");
        let [ph] = item.placeholders[..] else {
            return Err(Status::invalid_argument(format!(
                "{what} must carry exactly one placeholder range, got {}",
                item.placeholders.len()
            )));
        };
        let feature = item_feature(v, item, &what)?;
        let assigned = assignments.iter().find(|a| a.item_index as usize == i);
        if let (None, Some(a), true) = (feature, assigned, computes_prompt(cfg.role)) {
            let port = u16::try_from(a.bootstrap_port)
                .ok()
                .filter(|p| *p > 0)
                .ok_or_else(|| {
                    Status::invalid_argument(format!(
                        "encode_bootstrap_info for item {i}: bootstrap_port must be in [1, 65535], got {}",
                        a.bootstrap_port
                    ))
                })?;
            if a.bootstrap_room < 0 {
                return Err(Status::invalid_argument(format!(
                    "encode_bootstrap_info for item {i}: bootstrap_room must be non-negative, got {}",
                    a.bootstrap_room
                )));
            }
            fetches.push(EmbeddingFetch {
                offset: ph.offset as usize,
                item_index: i as u32,
                host: a.bootstrap_host.clone(),
                port,
                room: a.bootstrap_room as u64,
            });
        }
        declared.push(MediaSpan {
            range: ph.offset as usize..(ph.offset + ph.length) as usize,
            feature,
        });
    }
    let token = items
        .iter()
        .find_map(|i| i.placeholder_token_id)
        .unwrap_or(v.image_token_id);
    let pending = if fetches.is_empty() {
        PendingMedia::Nothing
    } else {
        PendingMedia::Embeddings(fetches)
    };
    plan(cfg.role, ids, declared, Some(token), pending)
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
        bootstrap: req.kv_bootstrap_info.as_ref().map(|b| GrpcBootstrap {
            host: b.bootstrap_host.clone(),
            port: b.bootstrap_port,
            room: b.bootstrap_room,
        }),
        kv_transfer_params_json: None,
        kv_transfer_params_legacy: None,
        data_parallel_rank: req.data_parallel_rank,
        return_logprob: req.return_logprob,
        logprob_start_len: req.logprob_start_len,
        top_logprobs_num: req.top_logprobs_num,
        metadata,
    };
    (r, mm_record(req))
}

fn prepare(cfg: &MockEngineConfig, req: &GenerateRequest) -> Result<Prepared, Status> {
    let tokenized = req
        .tokenized
        .as_ref()
        .ok_or_else(|| Status::invalid_argument("GenerateRequest.tokenized is required"))?;
    let ids = tokenized.input_ids.clone();
    check_prompt(cfg, &ids)?;
    let media = media_plan(cfg, req, &ids)?;
    let sp = req.sampling_params.clone().unwrap_or_default();
    let max_new = sp.max_new_tokens.unwrap_or(DEFAULT_MAX_NEW_TOKENS);
    if sp.min_new_tokens > max_new {
        return Err(Status::invalid_argument(format!(
            "min_new_tokens must be in [0, max_new_tokens({max_new})], got {}.",
            sp.min_new_tokens
        )));
    }
    let bootstrap = bootstrap_items(
        cfg,
        req.kv_bootstrap_info.as_ref().map(|b| {
            (
                b.bootstrap_host.as_str(),
                b.bootstrap_port,
                b.bootstrap_room,
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
        seed: sp.sampling_seed,
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
                start: req.logprob_start_len.unwrap_or(0).max(0) as usize,
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
            // The TokenSpeed proto has no prompt logprobs.
            input_logprobs: false,
            output_logprobs: req.return_logprob,
        },
        media,
    })
}

fn output_logprobs(lp: OutputLogprobs) -> OutputLogProbs {
    OutputLogProbs {
        token_logprobs: lp.token_logprobs,
        token_ids: lp.token_ids,
        top_logprobs: lp
            .top
            .into_iter()
            .map(|t| TopLogProbs {
                values: t.values,
                token_ids: t.token_ids,
            })
            .collect(),
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
            index: c.index,
            weight_version: None,
        }),
        GenOut::Complete(c) => WireEvent::Complete(GenerateComplete {
            output_ids: c.output_ids,
            finish_reason: c.finish_reason.into(),
            prompt_tokens: c.prompt_tokens,
            completion_tokens: c.completion_tokens,
            cached_tokens: c.cached_tokens,
            output_logprobs: c.output_logprobs.map(output_logprobs),
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
