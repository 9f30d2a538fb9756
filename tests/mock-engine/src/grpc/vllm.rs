//! `vllm.grpc.engine.VllmEngine`, as the smg-grpc-servicer vLLM servicer behaves: token ids or
//! `text` in, the connector's handoff in `kv_transfer_params_json` (preferred) or the legacy
//! typed `kv_transfer_params` (passed to the connector as `{remote_host, remote_port}`), the
//! prefill's handoff back in `GenerateComplete.kv_transfer_params_json`, per-message counters,
//! `Abort` by a list of ids, and a KV load failure finishing the request with
//! `finish_reason: "error"`.

use std::sync::Arc;

use pdgate_proto::common::Modality;
use pdgate_proto::vllm::generate_complete::MatchedStop as WireMatched;
use pdgate_proto::vllm::generate_request::Input;
use pdgate_proto::vllm::generate_response::Response as WireEvent;
use pdgate_proto::vllm::tensor_data::Payload;
use pdgate_proto::vllm::vllm_engine_server::{VllmEngine, VllmEngineServer};
use pdgate_proto::vllm::{
    AbortRequest, AbortResponse, GenerateComplete, GenerateRequest, GenerateResponse,
    GenerateStreamChunk, GetLoadsRequest, GetLoadsResponse, GetModelInfoRequest,
    GetModelInfoResponse, GetServerInfoRequest, GetServerInfoResponse, HealthCheckRequest,
    HealthCheckResponse, InputLogProbs, InputTokenLogProb, KvTransferParams, OutputLogProbs,
    SamplingParams, SchedulerLoad, TopLogProbs,
};
use pdgate_proto::vllm::{MediaIdentity, MediaRef, MultimodalInputs, PlaceholderRange, TensorData};
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
use crate::records::{GrpcRequest, GrpcSampling, LegacyKvParams, MmRecord};
use crate::vision::{
    no_vision, placeholders_plan, plan, GridRows, MediaPlan, MockVision, PendingMedia, TensorView,
};

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
        let cfg = &sh.cfg;
        let connector = kv_connector_name(cfg.connector);
        let mm_processor = cfg.vision.as_ref().and_then(|v| v.mm_processor.clone());
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
                (false, _) | (_, Role::Both | Role::Encode) => "",
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
            mm_processor: mm_processor.clone().unwrap_or_default(),
            mm_media_ref_schemes: if mm_processor.is_some() {
                "http,https,data".into()
            } else {
                String::new()
            },
            mm_processor_source: if mm_processor.is_some() {
                "flag".into()
            } else {
                String::new()
            },
            mm_item_limits: if cfg.vision.is_some() {
                "image=8".into()
            } else {
                String::new()
            },
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

fn grid_of(m: &MultimodalInputs) -> GridRows {
    m.model_specific_tensors
        .get("image_grid_thw")
        .map(|g| tensor_view(g).grid())
        .transpose()
}

fn media_refs(req: &GenerateRequest) -> &[MediaRef] {
    req.media_refs.as_ref().map_or(&[][..], |r| &r.items[..])
}

/// The request's media as they arrived (`None`: text only).
fn mm_record(req: &GenerateRequest) -> Option<MmRecord> {
    let refs = media_refs(req);
    let m = req.mm_inputs.as_ref();
    if m.is_none() && refs.is_empty() {
        return None;
    }
    let m = m.cloned().unwrap_or_default();
    Some(MmRecord {
        items: m.mm_placeholders.len().max(refs.len()),
        pixels: m.pixel_values.is_some(),
        pixel_shapes: m.pixel_values.iter().map(|t| t.shape.clone()).collect(),
        grid_thw: grid_of(&m).ok().flatten().unwrap_or_default(),
        hashes: m.mm_hashes.clone(),
        placeholders: m
            .mm_placeholders
            .iter()
            .map(|p| [p.offset, p.length])
            .collect(),
        im_token_id: m.im_token_id,
        media_refs: refs.iter().map(|r| r.url.clone()).collect(),
        ..MmRecord::default()
    })
}

/// Router-side processing: placeholders, hashes and (prefill) `pixel_values`; worker-side
/// processing: `media_refs` fetched before the job runs; `--language-model-only`: hashes and
/// placeholders only.
fn media_plan(
    cfg: &MockEngineConfig,
    req: &GenerateRequest,
    ids: &[u32],
) -> Result<MediaPlan, Status> {
    let refs = media_refs(req);
    let m = req.mm_inputs.as_ref();
    let Some(v) = cfg.vision.as_ref() else {
        if m.is_none() && refs.is_empty() {
            return Ok(MediaPlan::default());
        }
        return Err(no_vision());
    };
    if v.language_model_only {
        let mut got = Vec::new();
        if m.is_some_and(|m| m.pixel_values.is_some()) {
            got.push("pixel_values");
        }
        if m.is_some_and(|m| !m.model_specific_tensors.is_empty()) {
            got.push("model_specific_tensors");
        }
        if !refs.is_empty() {
            got.push("media_refs");
        }
        if !got.is_empty() {
            return Err(Status::invalid_argument(format!(
                "this worker runs --language-model-only: it takes mm_hashes and mm_placeholders only, got {}",
                got.join(", ")
            )));
        }
    }
    if !refs.is_empty() {
        return media_refs_plan(cfg, v, req, ids, refs);
    }
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
    if !m.mm_hashes.is_empty() && m.mm_hashes.len() != ranges.len() {
        return Err(Status::invalid_argument(format!(
            "{} mm_hashes for {} mm_placeholders",
            m.mm_hashes.len(),
            ranges.len()
        )));
    }
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

/// Worker-side processing: the prompt holds one unexpanded anchor per `media_refs` item.
fn media_refs_plan(
    cfg: &MockEngineConfig,
    v: &MockVision,
    req: &GenerateRequest,
    ids: &[u32],
    refs: &[MediaRef],
) -> Result<MediaPlan, Status> {
    if req.mm_inputs.is_some() {
        return Err(Status::invalid_argument(
            "media_refs and mm_inputs are mutually exclusive",
        ));
    }
    if v.mm_processor.is_none() {
        return Err(Status::invalid_argument(
            "media_refs need worker-side multimodal processing (--mm-processor), which this worker does not run",
        ));
    }
    if !matches!(req.input, Some(Input::Tokenized(_))) {
        return Err(Status::invalid_argument(
            "media_refs require tokenized input",
        ));
    }
    let anchor = v.image_token_id;
    let anchors = ids.iter().filter(|&&t| t == anchor).count();
    if anchors != refs.len() {
        return Err(Status::invalid_argument(format!(
            "the prompt holds {anchors} image anchors (token {anchor}) for {} media_refs",
            refs.len()
        )));
    }
    Ok(MediaPlan {
        spans: Vec::new(),
        pending: PendingMedia::MediaRefs {
            urls: refs.iter().map(|r| r.url.clone()).collect(),
            image_token_id: anchor,
        },
        return_identity: cfg.role == Role::Prefill,
    })
}

fn record_of(
    cfg: &MockEngineConfig,
    req: &GenerateRequest,
    metadata: std::collections::BTreeMap<String, String>,
) -> (GrpcRequest, Option<MmRecord>) {
    let sp = req.sampling_params.clone().unwrap_or_default();
    let r = GrpcRequest {
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
    };
    (r, mm_record(req))
}

fn prepare(cfg: &MockEngineConfig, req: &GenerateRequest) -> Result<Prepared, Status> {
    let params = kv_params(req)?;
    let ids = prompt_ids(cfg, req);
    check_prompt(cfg, &ids)?;
    let media = media_plan(cfg, req, &ids)?;
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
            media: media.spans.clone(),
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
                media_identity: c.media_identity.map(|m| MediaIdentity {
                    prompt_token_ids: m.prompt_token_ids,
                    mm_inputs: Some(MultimodalInputs {
                        im_token_id: Some(m.im_token_id),
                        mm_placeholders: m
                            .placeholders
                            .iter()
                            .map(|&(offset, length)| PlaceholderRange { offset, length })
                            .collect(),
                        mm_hashes: m.hashes,
                        modality: Modality::Image as i32,
                        ..Default::default()
                    }),
                    extra_mm_inputs: Vec::new(),
                }),
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
