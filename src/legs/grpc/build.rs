//! Building each engine's `GenerateRequest` for a leg (digest §2.7, §2.8, §2.13): the prompt
//! ids, the sampling parameters in the engine's own shape, and the leg's handoff fields.
//!
//! * SGLang: every sampling scalar is non-optional, so absent values are sent as the engine's
//!   defaults (proto3 zeros are not); string stops are removed (its gRPC worker runs with
//!   `skip_tokenizer_init` and refuses them) and those that are one token become stop ids — the
//!   gateway enforces the others while detokenizing. Room: `disaggregated_params`, an i32.
//! * TokenSpeed: every scalar optional; stops kept; the seed is `sampling_seed`. Room:
//!   `kv_bootstrap_info`, 63-bit.
//! * vLLM: stops kept; `top_k` 0 = off; the handoff travels as `kv_transfer_params_json` (or the
//!   legacy typed `kv_transfer_params` for Mooncake without an engine id).
//!
//! Detokenization is the gateway's: `skip_special_tokens` is always true on the wire.

use pdgate_convert::{Constraint, SamplingParams};
use pdgate_proto::{sglang, tokenspeed, vllm};

use super::engine::{EngineRequest, GenerateRequest};
use super::media::Processing;
use super::mm_inputs::{self, MediaLeg};
use super::prepare::Prepared;
use super::prompt_wire::IdsField;

/// SGLang's sampling defaults for fields the client left out.
const SGLANG_TEMPERATURE: f32 = 1.0;
const SGLANG_TOP_P: f32 = 1.0;
const SGLANG_TOP_K: i32 = -1;
const SGLANG_REPETITION_PENALTY: f32 = 1.0;

/// What one leg carries besides the prompt.
pub struct LegSpec<'a> {
    pub request_id: &'a str,
    /// Stream chunks back (else only `complete` messages).
    pub stream: bool,
    pub dp_rank: Option<i32>,
    /// The sample this leg carries when `n > 1` fans out (0 otherwise): TokenSpeed's pinned
    /// seed is offset by it, so samples differ.
    pub sample: u32,
    /// What the leg carries of the request's images (nothing without images).
    pub media: MediaLeg<'a>,
}

/// The rendezvous of a parallel (SGLang / TokenSpeed) pair.
#[derive(Clone, Debug)]
pub struct Bootstrap {
    pub host: String,
    pub port: u16,
    pub room: u64,
}

/// The SGLang leg: the same request on both legs, each with its DP rank.
pub fn sglang(p: &Prepared, leg: &LegSpec<'_>, bootstrap: &Bootstrap) -> GenerateRequest {
    let s = &p.gen.sampling;
    let mut stop_token_ids = s.stop_token_ids.clone();
    for id in &p.single_token_stops {
        if !stop_token_ids.contains(id) {
            stop_token_ids.push(*id);
        }
    }
    let logprobs = p.gen.logprobs;
    let msg = EngineRequest::Sglang(Box::new(sglang::GenerateRequest {
        request_id: leg.request_id.to_string(),
        // The prompt follows the message (`prompt_wire`).
        tokenized: None,
        sampling_params: Some(sglang::SamplingParams {
            temperature: s.temperature.unwrap_or(SGLANG_TEMPERATURE),
            top_p: s.top_p.unwrap_or(SGLANG_TOP_P),
            top_k: s.top_k.unwrap_or(SGLANG_TOP_K),
            min_p: s.min_p.unwrap_or(0.0),
            frequency_penalty: s.frequency_penalty.unwrap_or(0.0),
            presence_penalty: s.presence_penalty.unwrap_or(0.0),
            repetition_penalty: s.repetition_penalty.unwrap_or(SGLANG_REPETITION_PENALTY),
            max_new_tokens: s.max_new_tokens,
            stop: Vec::new(),
            stop_token_ids,
            skip_special_tokens: true,
            spaces_between_special_tokens: s.spaces_between_special_tokens,
            n: 1,
            min_new_tokens: s.min_new_tokens,
            ignore_eos: s.ignore_eos,
            no_stop_trim: s.no_stop_trim,
            stream_interval: None,
            logit_bias: logit_bias_by_string(s),
            custom_params: None,
            constraint: s.constraint.as_ref().map(|c| match c {
                Constraint::JsonObject => sglang::sampling_params::Constraint::JsonSchema(
                    r#"{"type":"object"}"#.to_string(),
                ),
                Constraint::JsonSchema(j) => {
                    sglang::sampling_params::Constraint::JsonSchema(j.clone())
                }
                Constraint::Regex(r) => sglang::sampling_params::Constraint::Regex(r.clone()),
                Constraint::Ebnf(e) => sglang::sampling_params::Constraint::EbnfGrammar(e.clone()),
                Constraint::StructuralTag(t) => {
                    sglang::sampling_params::Constraint::StructuralTag(t.clone())
                }
            }),
        }),
        return_logprob: logprobs.is_some(),
        logprob_start_len: -1,
        top_logprobs_num: logprobs.map_or(0, |l| l.top_logprobs as i32),
        disaggregated_params: Some(sglang::DisaggregatedParams {
            bootstrap_host: bootstrap.host.clone(),
            bootstrap_port: i32::from(bootstrap.port),
            // Minted below 2^31 for SGLang (its room is an int32).
            bootstrap_room: bootstrap.room as i32,
        }),
        data_parallel_rank: leg.dp_rank,
        stream: leg.stream,
        mm_inputs: p.media.as_ref().map(|m| mm_inputs::sglang(m, leg.media)),
        ..Default::default()
    }));
    GenerateRequest {
        msg,
        prompt: p.prompt_field(IdsField::Second),
    }
}

/// The TokenSpeed leg.
pub fn tokenspeed(p: &Prepared, leg: &LegSpec<'_>, bootstrap: &Bootstrap) -> GenerateRequest {
    let s = &p.gen.sampling;
    let logprobs = p.gen.logprobs;
    let msg = EngineRequest::TokenSpeed(Box::new(tokenspeed::GenerateRequest {
        request_id: leg.request_id.to_string(),
        // The prompt follows the message (`prompt_wire`).
        tokenized: None,
        sampling_params: Some(tokenspeed::SamplingParams {
            temperature: s.temperature,
            top_p: s.top_p,
            top_k: s.top_k,
            min_p: s.min_p,
            frequency_penalty: s.frequency_penalty,
            presence_penalty: s.presence_penalty,
            repetition_penalty: s.repetition_penalty,
            max_new_tokens: s.max_new_tokens,
            min_new_tokens: s.min_new_tokens,
            stop: s.stop.clone(),
            stop_token_ids: s.stop_token_ids.clone(),
            ignore_eos: s.ignore_eos,
            skip_special_tokens: true,
            spaces_between_special_tokens: s.spaces_between_special_tokens,
            n: 1,
            logit_bias: logit_bias_by_string(s),
            constraint: s.constraint.as_ref().map(|c| match c {
                Constraint::JsonObject => tokenspeed::sampling_params::Constraint::JsonSchema(
                    r#"{"type":"object"}"#.to_string(),
                ),
                Constraint::JsonSchema(j) => {
                    tokenspeed::sampling_params::Constraint::JsonSchema(j.clone())
                }
                Constraint::Regex(r) => tokenspeed::sampling_params::Constraint::Regex(r.clone()),
                Constraint::Ebnf(e) => {
                    tokenspeed::sampling_params::Constraint::EbnfGrammar(e.clone())
                }
                Constraint::StructuralTag(t) => {
                    tokenspeed::sampling_params::Constraint::StructuralTag(t.clone())
                }
            }),
            no_stop_trim: s.no_stop_trim,
            custom_params: None,
            sampling_seed: s
                .seed
                .map(|v| (v as u64).wrapping_add(u64::from(leg.sample))),
        }),
        return_logprob: logprobs.is_some(),
        logprob_start_len: None,
        top_logprobs_num: logprobs.map_or(0, |l| l.top_logprobs as i32),
        stream: leg.stream,
        kv_bootstrap_info: Some(tokenspeed::KvBootstrapInfo {
            bootstrap_host: bootstrap.host.clone(),
            bootstrap_port: i32::from(bootstrap.port),
            bootstrap_room: bootstrap.room as i64,
        }),
        data_parallel_rank: leg.dp_rank,
        mm_inputs: p
            .media
            .as_ref()
            .map(|m| mm_inputs::tokenspeed(m, leg.media)),
        encode_bootstrap_info: match leg.media {
            MediaLeg::Encoded(rvs) if p.media.is_some() => {
                Some(mm_inputs::tokenspeed_encode_info(rvs))
            }
            _ => None,
        },
        ..Default::default()
    }));
    GenerateRequest {
        msg,
        prompt: p.prompt_field(IdsField::First),
    }
}

/// The vLLM handoff a leg carries.
pub enum VllmHandoff {
    None,
    /// `kv_transfer_params_json`, passed to the connector as is.
    Json(String),
    /// Legacy Mooncake without an engine id: the prefill's bootstrap host and port.
    Legacy {
        host: String,
        port: u16,
    },
}

/// The vLLM decode leg (the client's request) with its handoff. `identity`: what the prefill
/// learned processing the request's media itself (its expanded prompt and pixel-less inputs),
/// which the decode takes instead of the gateway's prompt.
pub fn vllm_decode(
    p: &Prepared,
    leg: &LegSpec<'_>,
    handoff: VllmHandoff,
    identity: Option<&vllm::MediaIdentity>,
) -> GenerateRequest {
    let s = &p.gen.sampling;
    let mut req = vllm_request(
        p,
        leg,
        vllm_sampling(s, p.gen.logprobs.map(|l| l.top_logprobs)),
        handoff,
    );
    if let (Some(id), EngineRequest::Vllm(r)) = (identity, &mut req.msg) {
        req.prompt = bytes::Bytes::new();
        r.input = Some(vllm::generate_request::Input::Tokenized(
            vllm::TokenizedInput {
                original_text: String::new(),
                input_ids: id.prompt_token_ids.clone(),
            },
        ));
        r.media_refs = None;
        r.mm_inputs = id.mm_inputs.clone();
        r.extra_mm_inputs = id.extra_mm_inputs.clone();
    }
    req
}

/// The vLLM prefill leg: one token, one sample, no stops, EOS ignored, not streamed, tagged
/// with the connector's `kv_transfer_params` (digest §2.13 step 4).
pub fn vllm_prefill(p: &Prepared, leg: &LegSpec<'_>, tag: Option<String>) -> GenerateRequest {
    let mut sampling = vllm_sampling(&p.gen.sampling, None);
    sampling.max_tokens = Some(1);
    sampling.min_tokens = 0;
    sampling.n = 1;
    sampling.stop.clear();
    sampling.stop_token_ids.clear();
    sampling.ignore_eos = true;
    let leg = LegSpec {
        stream: false,
        ..*leg
    };
    vllm_request(
        p,
        &leg,
        sampling,
        tag.map_or(VllmHandoff::None, VllmHandoff::Json),
    )
}

fn vllm_request(
    p: &Prepared,
    leg: &LegSpec<'_>,
    sampling: vllm::SamplingParams,
    handoff: VllmHandoff,
) -> GenerateRequest {
    let (json, legacy) = match handoff {
        VllmHandoff::None => (None, None),
        VllmHandoff::Json(j) => (Some(j), None),
        VllmHandoff::Legacy { host, port } => (
            None,
            Some(vllm::KvTransferParams {
                remote_host: host,
                remote_port: u32::from(port),
            }),
        ),
    };
    let (mm_inputs, media_refs) = match &p.media {
        None => (None, None),
        Some(m) if m.processing == Processing::WorkerRefs => (
            None,
            // The worker processes the media where it runs the vision tower; a decode served
            // by the handoff takes the prefill's media identity instead (`vllm_decode`).
            matches!(leg.media, MediaLeg::Pixels).then(|| mm_inputs::vllm_media_refs(m)),
        ),
        Some(m) => (Some(mm_inputs::vllm(m, leg.media)), None),
    };
    let msg = EngineRequest::Vllm(Box::new(vllm::GenerateRequest {
        request_id: leg.request_id.to_string(),
        // The prompt follows the message (`prompt_wire`).
        input: None,
        sampling_params: Some(sampling),
        stream: leg.stream,
        kv_transfer_params: legacy,
        kv_transfer_params_json: json,
        data_parallel_rank: leg.dp_rank,
        mm_inputs,
        media_refs,
        ..Default::default()
    }));
    GenerateRequest {
        msg,
        prompt: p.prompt_field(IdsField::Second),
    }
}

fn vllm_sampling(s: &SamplingParams, top_logprobs: Option<u32>) -> vllm::SamplingParams {
    vllm::SamplingParams {
        temperature: s.temperature,
        top_p: s.top_p.unwrap_or(1.0),
        // vLLM: 0 disables top-k (SMG: max(0, k)).
        top_k: s.top_k.map_or(0, |k| k.max(0) as u32),
        min_p: s.min_p.unwrap_or(0.0),
        frequency_penalty: s.frequency_penalty.unwrap_or(0.0),
        presence_penalty: s.presence_penalty.unwrap_or(0.0),
        repetition_penalty: s.repetition_penalty.unwrap_or(1.0),
        max_tokens: s.max_new_tokens,
        min_tokens: s.min_new_tokens,
        stop: s.stop.clone(),
        stop_token_ids: s.stop_token_ids.clone(),
        skip_special_tokens: true,
        spaces_between_special_tokens: s.spaces_between_special_tokens,
        ignore_eos: s.ignore_eos,
        // vLLM samples `n` itself (it gets no handoff then); the prefill leg overrides it.
        n: s.n.max(1),
        logprobs: top_logprobs.map(|k| k.clamp(1, 20) as i32),
        prompt_logprobs: None,
        // The engine's seed is an i32: saturate (SMG).
        seed: s
            .seed
            .map(|v| v.clamp(i64::from(i32::MIN), i64::from(i32::MAX)) as i32),
        include_stop_str_in_output: s.no_stop_trim,
        logit_bias: s.logit_bias.iter().map(|(k, v)| (*k as i32, *v)).collect(),
        truncate_prompt_tokens: None,
        grammar_from_first_token: false,
        constraint: s.constraint.as_ref().map(|c| match c {
            Constraint::JsonObject => vllm::sampling_params::Constraint::JsonObject(true),
            Constraint::JsonSchema(j) => vllm::sampling_params::Constraint::JsonSchema(j.clone()),
            Constraint::Regex(r) => vllm::sampling_params::Constraint::Regex(r.clone()),
            Constraint::Ebnf(e) => vllm::sampling_params::Constraint::Grammar(e.clone()),
            Constraint::StructuralTag(t) => {
                vllm::sampling_params::Constraint::StructuralTag(t.clone())
            }
        }),
    }
}

fn logit_bias_by_string(s: &SamplingParams) -> std::collections::HashMap<String, f32> {
    s.logit_bias
        .iter()
        .map(|(k, v)| (k.to_string(), *v))
        .collect()
}
