//! Preparing a request for gRPC legs, once per client request (not per attempt): the client
//! body converted to an engine-neutral generation request (`pdgate-convert`, reading only the
//! fields it needs from the one scan), the chat template rendered and the prompt tokenized
//! (`pdgate-tokenize`; large prompts off the reactor), and the stop strings that are single
//! tokens (SGLang's gRPC worker refuses string stops; the gateway enforces the rest).

use std::sync::Arc;

use pdgate_convert::{convert_request, GenerationRequest, Input, Prompt};
use pdgate_filters::errors::ErrorCode;
use pdgate_tokenize::{ChatInput, Tokenizer};
use serde_json::{Map, Value};

use super::prompt_wire::{IdsField, PromptWire};
use crate::gateway::Gateway;
use crate::legs::request::PdRequest;
use crate::reply::Reply;
use crate::workers::select::Pair;

/// Prompts at least this long are encoded on the blocking pool, so one huge prompt cannot stall
/// the streams sharing the reactor (≈ 1–2 ms of encoding at the measured 4–7 MB/s).
const OFF_REACTOR_BYTES: usize = 8 * 1024;

/// A request ready for gRPC legs.
pub struct Prepared {
    pub gen: GenerationRequest,
    pub tokenizer: Arc<Tokenizer>,
    /// The prompt's token ids.
    pub prompt_ids: Vec<u32>,
    /// `prompt_ids` as the legs' prompt field, encoded once for all of them
    /// ([`Prepared::prompt_field`]).
    prompt_wire: PromptWire,
    /// The prompt as text (the rendered chat, or the client's text): the engines' logs
    /// (`original_text`) and completions `echo`.
    pub prompt_text: String,
    /// Stop strings that encode to exactly one token, as stop token ids (SGLang).
    pub single_token_stops: Vec<u32>,
    /// Unix seconds the response reports as `created`.
    pub created: u64,
    /// The request's images (chat and messages routes), placeholders already expanded in
    /// `prompt_ids`.
    pub media: Option<Arc<super::media::Media>>,
}

/// Converts and tokenizes `req` for `pair` (its prefill's reported tokenizer path is the
/// fallback source). `Err`: the client's answer.
pub async fn prepare(gw: &Gateway, req: &PdRequest, pair: &Pair) -> Result<Arc<Prepared>, Reply> {
    let gen = convert_request(req.route, &req.body, &req.top)
        .map_err(|e| Reply::error_with_status(e.status(), e.code(), e.to_string()))?;
    let tokenizer = gw
        .models
        .tokenizer(|| pair.prefill.tokenizer_source())
        .await
        .map_err(|why| Reply::error(ErrorCode::TokenizerUnavailable, why))?;
    let mut media = None;
    let (prompt_text, prompt_ids) = match &gen.input {
        Input::Chat(chat) => {
            let kwargs = template_kwargs(chat.chat_template_kwargs.as_ref(), chat.thinking);
            let tools = chat
                .tools
                .as_ref()
                .and_then(Value::as_array)
                .map(Vec::as_slice);
            let text = tokenizer
                .render_chat(&ChatInput {
                    messages: &chat.messages,
                    tools,
                    documents: None,
                    add_generation_prompt: chat.add_generation_prompt,
                    continue_final_message: chat.continue_final_message,
                    template_kwargs: kwargs.as_ref(),
                })
                .map_err(|e| {
                    Reply::error(
                        ErrorCode::InvalidRequest,
                        format!("the chat template could not render these messages: {e}"),
                    )
                })?;
            // The template already wrote the special tokens (BOS and turn markers).
            let mut ids = encode(&tokenizer, text.clone(), false).await?;
            if !chat.media.is_empty() {
                media =
                    Some(super::media::prepare(gw, pair, &chat.media, &mut ids, &tokenizer).await?);
            }
            (text, ids)
        }
        Input::Prompts { prompts, .. } => match prompts.as_slice() {
            [Prompt::Text(text)] => {
                // As the engines' own HTTP servers tokenize a text prompt: special tokens added.
                let ids = encode(&tokenizer, text.clone(), true).await?;
                (text.clone(), ids)
            }
            [Prompt::TokenIds(ids)] => {
                let text = tokenizer.decode(ids, false).unwrap_or_default();
                (text, ids.clone())
            }
            _ => return Err(Reply::error(
                ErrorCode::FeatureNotSupported,
                "batched prompts are not supported over gRPC PD yet; send one prompt per request",
            )),
        },
    };
    if prompt_ids.is_empty() {
        return Err(Reply::error(
            ErrorCode::InvalidRequest,
            "the prompt is empty after tokenization",
        ));
    }
    let single_token_stops = gen
        .sampling
        .stop
        .iter()
        .filter_map(|s| tokenizer.single_token_id(s).ok().flatten())
        .collect();
    let created = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    Ok(Arc::new(Prepared {
        gen,
        tokenizer,
        prompt_ids,
        prompt_wire: PromptWire::default(),
        prompt_text,
        single_token_stops,
        created,
        media,
    }))
}

impl Prepared {
    /// The legs' prompt field (`GenerateRequest.tokenized` with [`Prepared::prompt_ids`]) for
    /// the engine's `TokenizedInput` layout, encoded on the first leg that asks.
    pub fn prompt_field(&self, layout: IdsField) -> bytes::Bytes {
        self.prompt_wire.field(&self.prompt_ids, layout)
    }
}

/// `chat_template_kwargs` with the client's thinking preference as `enable_thinking`, unless
/// the kwargs set it themselves (they win).
fn template_kwargs(
    kwargs: Option<&Map<String, Value>>,
    thinking: Option<bool>,
) -> Option<Map<String, Value>> {
    match (kwargs, thinking) {
        (None, None) => None,
        (k, t) => {
            let mut m = k.cloned().unwrap_or_default();
            if let Some(t) = t {
                m.entry("enable_thinking").or_insert(Value::Bool(t));
            }
            Some(m)
        }
    }
}

async fn encode(tok: &Arc<Tokenizer>, text: String, special: bool) -> Result<Vec<u32>, Reply> {
    let result = if text.len() >= OFF_REACTOR_BYTES {
        let tok = tok.clone();
        tokio::task::spawn_blocking(move || tok.encode(&text, special))
            .await
            .map_err(|e| Reply::error(ErrorCode::InternalError, format!("tokenizing: {e}")))?
    } else {
        tok.encode(&text, special)
    };
    result.map_err(|e| {
        Reply::error(
            ErrorCode::InvalidRequest,
            format!("the prompt could not be tokenized: {e}"),
        )
    })
}
