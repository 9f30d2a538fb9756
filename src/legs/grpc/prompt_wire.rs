//! The prompt's token ids encoded once per request, and a codec that sends each leg's
//! `GenerateRequest` as its own fields followed by those bytes.
//!
//! Both legs of a pair (and every sample of a fan-out) carry the same prompt, and its ids are
//! most of a request's bytes (≈ 800 varints for a 1 KB chat). prost walked them four times per
//! leg — the message's length, the nested message's length, the packed field's length, then
//! the encode — 5–7% of a gRPC request's CPU (`perf`, c=64). Here they are encoded in one pass,
//! once, into a [`Bytes`] every leg shares; the leg's message is encoded by prost without its
//! prompt field and the shared bytes are appended to it.
//!
//! Why appending is the same message: a protobuf parser accepts fields in any order, and the
//! prompt field (`tokenized`, number 2 in all three engines' `GenerateRequest`; for vLLM a
//! member of the `input` oneof) is absent from what prost encoded, so nothing merges with it and
//! no other oneof member competes. The bytes are exactly what prost writes for
//! `tokenized: Some(TokenizedInput { original_text: "", input_ids })`: the test below compares
//! them with prost's own encoding for each engine.

use std::marker::PhantomData;
use std::sync::OnceLock;

use bytes::{Buf, BufMut, Bytes};
use prost::encoding::{encode_varint, encoded_len_varint as varint_len};
use prost::Message;
use tonic::codec::{Codec, EncodeBuf, Encoder};
use tonic::Status;
use tonic_prost::ProstDecoder;

/// `GenerateRequest.tokenized`: field 2, length-delimited, in all three engines' protos.
const TOKENIZED_KEY: u8 = 2 << 3 | 2;

/// Where a `TokenizedInput` keeps its ids: field 2 for SGLang and vLLM (after
/// `original_text`), field 1 for TokenSpeed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IdsField {
    First = 1,
    Second = 2,
}

/// The request's prompt field, encoded on first use for each `TokenizedInput` layout.
#[derive(Default)]
pub struct PromptWire {
    encoded: [OnceLock<Bytes>; 2],
}

impl PromptWire {
    /// `GenerateRequest.tokenized` carrying `ids`, for the layout `field`; encoded once, so
    /// every call on one `PromptWire` must pass the same ids ([`Prepared::prompt_field`] is
    /// the one caller that does).
    ///
    /// [`Prepared::prompt_field`]: super::prepare::Prepared::prompt_field
    pub fn field(&self, ids: &[u32], field: IdsField) -> Bytes {
        self.encoded[field as usize - 1]
            .get_or_init(|| encode_tokenized(ids, field))
            .clone()
    }
}

/// `tokenized { input_ids: ids }` (empty `original_text`, which proto3 leaves out) as a
/// `GenerateRequest` field: key, length, and the nested message's packed ids.
///
/// One pass over the ids: they are written first, after room for the two heads (at most
/// [`HEADS`] bytes), and the heads, whose lengths are known only then, are written right-aligned
/// before them; the returned `Bytes` starts at the first head. (A first pass that sized the ids
/// was a sixth of this function's instructions.)
fn encode_tokenized(ids: &[u32], field: IdsField) -> Bytes {
    if ids.is_empty() {
        // proto3 writes no packed field for an empty list: an empty `TokenizedInput`.
        return Bytes::from_static(&[TOKENIZED_KEY, 0]);
    }
    let mut out = Vec::with_capacity(HEADS + 5 * ids.len());
    out.resize(HEADS, 0);
    // The ids in a plain loop: prost's `encode_varint` goes through `BufMut` per byte. (Built
    // in a word and stored 8 bytes at once, without a branch per byte, an id took 33
    // instructions against 16: not kept. Written into the reserved capacity, straight-line for
    // each length with one bounds check per id, a 1 KB chat's prompt took 12,731 against 12,053:
    // not kept either.)
    for &id in ids {
        let mut v = id;
        while v >= 0x80 {
            out.push(v as u8 | 0x80);
            v >>= 7;
        }
        out.push(v as u8);
    }
    let packed = out.len() - HEADS;
    let inner = 1 + varint_len(packed as u64) + packed;
    let mut heads = [0u8; HEADS];
    let mut h = &mut heads[..];
    h.put_u8(TOKENIZED_KEY);
    encode_varint(inner as u64, &mut h);
    h.put_u8((field as u8) << 3 | 2);
    encode_varint(packed as u64, &mut h);
    let len = HEADS - h.len();
    let start = HEADS - len;
    out[start..HEADS].copy_from_slice(&heads[..len]);
    let mut wire = Bytes::from(out);
    wire.advance(start);
    wire
}

/// The two heads before the ids at most: two keys and two 10-byte varint lengths.
const HEADS: usize = 22;

/// A leg's request: its message (without the prompt field) and the shared prompt bytes to
/// append (empty when the message carries its own input).
pub struct Outgoing<M> {
    pub msg: M,
    pub prompt: Bytes,
}

/// tonic's codec for a `Generate` call: [`Outgoing`] out, prost-decoded `R` in.
pub struct LegCodec<M, R>(PhantomData<fn(M) -> R>);

impl<M, R> Default for LegCodec<M, R> {
    fn default() -> Self {
        LegCodec(PhantomData)
    }
}

impl<M, R> Codec for LegCodec<M, R>
where
    M: Message + Send + 'static,
    R: Message + Default + Send + 'static,
{
    type Encode = Outgoing<M>;
    type Decode = R;
    type Encoder = OutgoingEncoder<M>;
    type Decoder = ProstDecoder<R>;

    fn encoder(&mut self) -> Self::Encoder {
        OutgoingEncoder(PhantomData)
    }

    fn decoder(&mut self) -> Self::Decoder {
        ProstDecoder::default()
    }
}

pub struct OutgoingEncoder<M>(PhantomData<fn(M)>);

impl<M: Message> Encoder for OutgoingEncoder<M> {
    type Item = Outgoing<M>;
    type Error = Status;

    fn encode(&mut self, item: Outgoing<M>, buf: &mut EncodeBuf<'_>) -> Result<(), Status> {
        // No `reserve` first: it would be one more length pass over the message, which prost's
        // `encode` makes itself; tonic's buffer starts at 8 KiB and grows as written.
        item.msg
            .encode(buf)
            .map_err(|e| Status::internal(format!("encoding the request: {e}")))?;
        buf.put_slice(&item.prompt);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pdgate_proto::{sglang, tokenspeed, vllm};

    fn id_sets() -> Vec<Vec<u32>> {
        vec![
            vec![],
            vec![0],
            vec![
                1,
                127,
                128,
                16_383,
                16_384,
                2_097_151,
                2_097_152,
                268_435_455,
                268_435_456,
                u32::MAX,
            ],
            (0..900).map(|i| i * 37 % 151_000).collect(),
        ]
    }

    /// `msg` encoded by prost, `prompt` appended, parsed back.
    fn with_prompt<M: Message + Default>(msg: &M, prompt: &[u8]) -> M {
        let mut wire = msg.encode_to_vec();
        wire.extend_from_slice(prompt);
        M::decode(&wire[..]).unwrap()
    }

    /// prost's encoding of the prompt field alone, as `field` 2 of the request.
    fn prost_field<M: Message>(field: &M) -> Vec<u8> {
        let mut alone = Vec::new();
        prost::encoding::message::encode(2, field, &mut alone);
        alone
    }

    /// Our prompt field is byte for byte what prost writes for it, for each engine's layout,
    /// and a message with it appended parses as the message with its prompt set.
    #[test]
    fn appended_prompt_is_what_prost_writes_for_the_field() {
        for ids in id_sets() {
            let wire = PromptWire::default();
            let sg = sglang::TokenizedInput {
                original_text: String::new(),
                input_ids: ids.clone(),
            };
            let prompt = wire.field(&ids, IdsField::Second);
            assert_eq!(&prompt[..], &prost_field(&sg)[..], "{} ids", ids.len());
            let msg = sglang::GenerateRequest {
                request_id: "r-1".into(),
                stream: true,
                ..Default::default()
            };
            let back = with_prompt(&msg, &prompt);
            assert_eq!(back.tokenized.as_ref(), Some(&sg));
            assert_eq!(back.request_id, "r-1");
            assert!(back.stream);
            // Encoded once: a second leg gets the same bytes.
            assert_eq!(wire.field(&ids, IdsField::Second).as_ptr(), prompt.as_ptr());

            let ts = tokenspeed::TokenizedInput {
                input_ids: ids.clone(),
                original_text: String::new(),
            };
            let prompt = wire.field(&ids, IdsField::First);
            assert_eq!(&prompt[..], &prost_field(&ts)[..]);
            let back = with_prompt(&tokenspeed::GenerateRequest::default(), &prompt);
            assert_eq!(back.tokenized, Some(ts));

            let vl = vllm::TokenizedInput {
                original_text: String::new(),
                input_ids: ids.clone(),
            };
            let back = with_prompt(
                &vllm::GenerateRequest::default(),
                &wire.field(&ids, IdsField::Second),
            );
            assert_eq!(
                back.input,
                Some(vllm::generate_request::Input::Tokenized(vl))
            );
        }
    }
}
