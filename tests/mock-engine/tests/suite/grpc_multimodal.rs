//! Media-aware gRPC mocks: the right pixels / embeddings reach the leg that computes the prompt
//! (and change its output), decode legs get none, and a gateway that sends too little or
//! expands wrongly fails loudly. The mocks read features back from the wire on their own
//! (`mock_engine::vision`); the tests predict them from the colours they encode.

use crate::common;

use std::io::Cursor;
use std::ops::Range;
use std::time::Duration;

use base64::Engine as _;
use common::grpc::*;
use common::SECS;
use mock_engine::{
    feature_of_rgb, wire_output_ids, EngineKind, MockEngine, MockEngineConfig, MockVision, Role,
    SamplingSpec,
};
use pdgate_proto::tokenspeed_encoder::token_speed_encoder_client::TokenSpeedEncoderClient;
use pdgate_proto::tokenspeed_encoder::{EncodeItemAssignment, EncodeRequest};
use tonic::Code;

/// The image placeholder token (outside the test vocabulary and the text ids).
const IMG: u32 = 900;
const RED: [u8; 3] = [240, 32, 16];
const BLUE: [u8; 3] = [16, 64, 224];
const GREEN: [u8; 3] = [32, 192, 48];

/// `[BOS, 501, IMG x4, 502, IMG x4, 503]`: two images at offsets 2 and 7.
fn prompt() -> Vec<u32> {
    let mut p = vec![1, 501];
    p.extend([IMG; 4]);
    p.push(502);
    p.extend([IMG; 4]);
    p.push(503);
    p
}

fn ranges() -> Vec<Range<usize>> {
    vec![2..6, 7..11]
}

fn items(colours: &[[u8; 3]]) -> Vec<(Range<usize>, u64)> {
    ranges()
        .into_iter()
        .zip(colours)
        .map(|(r, c)| (r, feature_of_rgb(*c)))
        .collect()
}

fn spec(e: &MockEngine, max_new: usize) -> SamplingSpec {
    SamplingSpec {
        max_new_tokens: max_new,
        ..e.sampling_spec()
    }
}

async fn mm_engine(engine: EngineKind, role: Role, ip: [u8; 4], v: MockVision) -> MockEngine {
    MockEngine::spawn(grpc_config(engine, role, ip).with_vision(v))
        .await
        .expect("spawn")
}

/// A solid colour as the processor's normalised float32 values of one channel plane.
fn normalised(v: &MockVision, rgb: [u8; 3], ch: usize) -> f32 {
    (rgb[ch] as f32 / 255.0 - v.image_mean[ch]) / v.image_std[ch]
}

fn f32_bytes(x: impl IntoIterator<Item = f32>) -> Vec<u8> {
    x.into_iter().flat_map(f32::to_le_bytes).collect()
}

/// `[N, 3, 4, 4]` pixels of solid colours.
fn chw(v: &MockVision, colours: &[[u8; 3]]) -> (Vec<u32>, Vec<u8>) {
    let mut x = Vec::new();
    for c in colours {
        for ch in 0..3 {
            x.extend(std::iter::repeat_n(normalised(v, *c, ch), 16));
        }
    }
    (vec![colours.len() as u32, 3, 4, 4], f32_bytes(x))
}

/// Qwen patch rows (temporal patch 2, patch 14), each image with grid `[1, 2, 2]` (4 rows),
/// and the int64 `[N, 3]` grid.
fn qwen(v: &MockVision, colours: &[[u8; 3]]) -> (Vec<u32>, Vec<u8>, Vec<u8>) {
    let per_channel = 2 * 14 * 14;
    let mut x = Vec::new();
    for c in colours {
        for _row in 0..4 {
            for ch in 0..3 {
                x.extend(std::iter::repeat_n(normalised(v, *c, ch), per_channel));
            }
        }
    }
    let grid: Vec<u8> = colours
        .iter()
        .flat_map(|_| [1i64, 2, 2])
        .flat_map(i64::to_le_bytes)
        .collect();
    (
        vec![4 * colours.len() as u32, 3 * per_channel as u32],
        f32_bytes(x),
        grid,
    )
}

fn png(rgb: [u8; 3]) -> Vec<u8> {
    let img = image::RgbImage::from_pixel(8, 8, image::Rgb(rgb));
    let mut out = Cursor::new(Vec::new());
    img.write_to(&mut out, image::ImageFormat::Png).unwrap();
    out.into_inner()
}

// ---------------------------------------------------------------------------------------------
// TokenSpeed

fn ts_tensor(shape: Vec<u32>, dtype: &str, bytes: Vec<u8>) -> tokenspeed::TensorData {
    tokenspeed::TensorData {
        shape,
        dtype: dtype.into(),
        payload: Some(tokenspeed::tensor_data::Payload::Inline(bytes)),
    }
}

/// One TokenSpeed item per colour (Qwen layout), with pixels when `pixels`.
fn ts_items(v: &MockVision, colours: &[[u8; 3]], pixels: bool) -> tokenspeed::MultimodalInputs {
    let items = colours
        .iter()
        .zip(ranges())
        .map(|(c, r)| {
            let (shape, bytes, grid) = qwen(v, &[*c]);
            tokenspeed::MultimodalItem {
                modality: pdgate_proto::common::Modality::Image as i32,
                content_hash: blake3::hash(&png(*c)).as_bytes().to_vec(),
                encoder_input: pixels.then(|| ts_tensor(shape, "float32", bytes)),
                model_specific_tensors: [(
                    "image_grid_thw".to_string(),
                    ts_tensor(vec![1, 3], "int64", grid),
                )]
                .into(),
                placeholders: vec![tokenspeed::PlaceholderRange {
                    offset: r.start as u32,
                    length: r.len() as u32,
                }],
                placeholder_token_id: Some(IMG),
            }
        })
        .collect();
    tokenspeed::MultimodalInputs { items }
}

/// Runs both legs of a TokenSpeed PD request; returns the decode's ids.
async fn ts_pd(
    p: &MockEngine,
    d: &MockEngine,
    prefill_mm: tokenspeed::MultimodalInputs,
    decode_mm: tokenspeed::MultimodalInputs,
) -> Result<Vec<u32>, tonic::Status> {
    let (mut pc, mut dc) = (tokenspeed_client(p).await, tokenspeed_client(d).await);
    let mut req = tokenspeed_request("ts-mm", &prompt(), 6, false);
    tokenspeed_pd(&mut req, p, room63());
    let mut preq = req.clone();
    preq.mm_inputs = Some(prefill_mm);
    let mut dreq = req;
    dreq.mm_inputs = Some(decode_mm);
    let (pr, dr) = tokio::join!(collect(pc.generate(preq)), collect(dc.generate(dreq)));
    pr?;
    Ok(tokenspeed_parts(dr?).1[0].output_ids.clone())
}

#[tokio::test]
async fn tokenspeed_pd_with_pixels_on_the_prefill_only_equals_the_media_reference() {
    let v = MockVision::qwen(IMG);
    let p = mm_engine(
        EngineKind::TokenSpeed,
        Role::Prefill,
        [127, 0, 90, 1],
        v.clone(),
    )
    .await;
    let d = mm_engine(
        EngineKind::TokenSpeed,
        Role::Decode,
        [127, 0, 90, 2],
        v.clone(),
    )
    .await;
    let want = d.reference_with_media(&prompt(), &items(&[RED, BLUE]), &spec(&d, 6), None);
    let got = ts_pd(
        &p,
        &d,
        ts_items(&v, &[RED, BLUE], true),
        ts_items(&v, &[RED, BLUE], false),
    )
    .await
    .expect("PD with images");
    assert_eq!(got, wire_output_ids(EngineKind::TokenSpeed, &want, false));
    assert_ne!(
        want.token_ids,
        d.reference(&prompt(), &spec(&d, 6), None).token_ids,
        "the images change the output"
    );

    // The prefill got the pixels and read the colours back; the decode got none.
    let prec = &p.wait_records(1, SECS).await[0];
    let pmm = prec.mm.as_ref().expect("prefill mm record");
    assert!(pmm.pixels);
    assert_eq!(pmm.items, 2);
    assert_eq!(pmm.placeholders, vec![[2, 4], [7, 4]]);
    assert_eq!(pmm.grid_thw, vec![[1, 2, 2], [1, 2, 2]]);
    assert_eq!(
        pmm.features,
        vec![Some(feature_of_rgb(RED)), Some(feature_of_rgb(BLUE))]
    );
    assert_eq!(pmm.hashes[0], blake3::hash(&png(RED)).to_hex().to_string());
    let dmm = d.wait_records(1, SECS).await[0].mm.clone().unwrap();
    assert!(!dmm.pixels);
    assert!(dmm.pixel_shapes.is_empty());
    assert_eq!(dmm.features, vec![None, None]);
    assert_eq!(d.stats().mm_pixel_requests, 0);

    // Other pixels on the prefill: another output.
    let other = ts_pd(
        &p,
        &d,
        ts_items(&v, &[GREEN, BLUE], true),
        ts_items(&v, &[RED, BLUE], false),
    )
    .await
    .unwrap();
    assert_ne!(other, got);
}

#[tokio::test]
async fn tokenspeed_prefill_without_pixels_is_refused() {
    let v = MockVision::qwen(IMG);
    let p = mm_engine(
        EngineKind::TokenSpeed,
        Role::Prefill,
        [127, 0, 90, 3],
        v.clone(),
    )
    .await;
    let mut pc = tokenspeed_client(&p).await;
    let mut req = tokenspeed_request("ts-no-pixels", &prompt(), 4, false);
    tokenspeed_pd(&mut req, &p, room63());
    req.mm_inputs = Some(ts_items(&v, &[RED, BLUE], false));
    let st = collect(pc.generate(req.clone())).await.unwrap_err();
    assert_eq!(st.code(), Code::InvalidArgument);
    assert_eq!(
        st.message(),
        "image placeholders at offset 2 have no pixel data"
    );
    // Placeholder ids with no item at all: the same refusal.
    req.mm_inputs = None;
    let st = collect(pc.generate(req)).await.unwrap_err();
    assert_eq!(st.code(), Code::InvalidArgument);
    assert!(
        st.message().contains("offset 2 have no pixel data"),
        "{st:?}"
    );
}

// ---------------------------------------------------------------------------------------------
// SGLang

fn sgl_mm(v: &MockVision, colours: &[[u8; 3]], pixels: bool) -> sglang::MultimodalInputs {
    let (shape, data) = chw(v, colours);
    sglang::MultimodalInputs {
        pixel_values: pixels.then(|| sglang::TensorData {
            data,
            shape,
            dtype: "float32".into(),
        }),
        im_token_id: Some(IMG),
        mm_placeholders: ranges()
            .into_iter()
            .map(|r| sglang::PlaceholderRange {
                offset: r.start as u32,
                length: r.len() as u32,
            })
            .collect(),
        modalities: vec!["image".into(); colours.len()],
        ..Default::default()
    }
}

#[tokio::test]
async fn sglang_pd_with_chw_pixels_on_the_prefill_equals_the_media_reference() {
    let v = MockVision::chw(IMG);
    let p = mm_engine(
        EngineKind::Sglang,
        Role::Prefill,
        [127, 0, 91, 1],
        v.clone(),
    )
    .await;
    let d = mm_engine(EngineKind::Sglang, Role::Decode, [127, 0, 91, 2], v.clone()).await;
    let (mut pc, mut dc) = (sglang_client(&p).await, sglang_client(&d).await);
    let run = |colours: [[u8; 3]; 2]| {
        let mut req = sglang_request("sgl-mm", &prompt(), 6, false);
        sglang_pd(&mut req, &p, room32());
        let mut preq = req.clone();
        preq.mm_inputs = Some(sgl_mm(&v, &colours, true));
        let mut dreq = req;
        dreq.mm_inputs = Some(sgl_mm(&v, &colours, false));
        (preq, dreq)
    };
    let (preq, dreq) = run([BLUE, RED]);
    let (pr, dr) = tokio::join!(collect(pc.generate(preq)), collect(dc.generate(dreq)));
    pr.unwrap();
    let got = sglang_parts(dr.unwrap()).1[0].output_ids.clone();
    let want = d.reference_with_media(&prompt(), &items(&[BLUE, RED]), &spec(&d, 6), None);
    assert_eq!(got, want.token_ids);
    let drec = &d.wait_records(1, SECS).await[0];
    assert!(!drec.mm.as_ref().unwrap().pixels);
    assert_eq!(drec.handoff.items[0].integrity.as_deref(), Some("ok"));
    assert!(p.records()[0].mm.as_ref().unwrap().pixels);
    assert_eq!(
        p.records()[0].mm.as_ref().unwrap().pixel_shapes,
        vec![vec![2, 3, 4, 4]]
    );

    // A gateway that expands wrongly: a placeholder range over a text token.
    let mut bad = sglang_request("sgl-bad", &prompt(), 4, false);
    sglang_pd(&mut bad, &p, room32());
    let mut mm = sgl_mm(&v, &[BLUE, RED], true);
    mm.mm_placeholders[1].length = 5;
    bad.mm_inputs = Some(mm);
    let st = collect(pc.generate(bad)).await.unwrap_err();
    assert_eq!(st.code(), Code::InvalidArgument);
    assert!(st.message().contains("not the image token"), "{st:?}");
}

// ---------------------------------------------------------------------------------------------
// vLLM

fn vllm_tensor(shape: Vec<u32>, dtype: &str, bytes: Vec<u8>) -> vllm::TensorData {
    vllm::TensorData {
        shape,
        dtype: dtype.into(),
        payload: Some(vllm::tensor_data::Payload::Inline(bytes)),
    }
}

fn hashes(colours: &[[u8; 3]]) -> Vec<String> {
    colours
        .iter()
        .map(|c| blake3::hash(&png(*c)).to_hex().to_string())
        .collect()
}

fn placeholders() -> Vec<vllm::PlaceholderRange> {
    ranges()
        .into_iter()
        .map(|r| vllm::PlaceholderRange {
            offset: r.start as u32,
            length: r.len() as u32,
        })
        .collect()
}

/// Router-side processing, Qwen layout: the prefill's `mm_inputs` (pixels when `pixels`).
fn vllm_mm(v: &MockVision, colours: &[[u8; 3]], pixels: bool) -> vllm::MultimodalInputs {
    let (shape, bytes, grid) = qwen(v, colours);
    vllm::MultimodalInputs {
        pixel_values: pixels.then(|| vllm_tensor(shape, "float32", bytes)),
        model_specific_tensors: [(
            "image_grid_thw".to_string(),
            vllm_tensor(vec![colours.len() as u32, 3], "int64", grid),
        )]
        .into(),
        im_token_id: Some(IMG),
        mm_placeholders: placeholders(),
        mm_hashes: hashes(colours),
        batched_keys: vec!["image_grid_thw".into()],
        flat_keys: [("pixel_values".to_string(), "image_grid_thw".to_string())].into(),
        modality: pdgate_proto::common::Modality::Image as i32,
        ..Default::default()
    }
}

/// The prefill leg of a NIXL handoff (capped at one token) with `mm`.
async fn vllm_prefill(
    p: &MockEngine,
    req: vllm::GenerateRequest,
) -> Result<vllm::GenerateComplete, tonic::Status> {
    let mut pc = vllm_client(p).await;
    let mut req = req;
    let sp = req.sampling_params.as_mut().unwrap();
    sp.max_tokens = Some(1);
    sp.ignore_eos = true;
    req.kv_transfer_params_json =
        Some(serde_json::json!({"do_remote_decode": true, "do_remote_prefill": false}).to_string());
    let (_, mut cs) = vllm_parts(collect(pc.generate(req)).await?);
    Ok(cs.remove(0))
}

#[tokio::test]
async fn vllm_pd_with_qwen_pixels_on_the_prefill_equals_the_media_reference() {
    let v = MockVision::qwen(IMG);
    let p = mm_engine(EngineKind::Vllm, Role::Prefill, [127, 0, 92, 1], v.clone()).await;
    let d = mm_engine(EngineKind::Vllm, Role::Decode, [127, 0, 92, 2], v.clone()).await;
    let mut preq = vllm_request("v-mm", &prompt(), 6, false);
    preq.mm_inputs = Some(vllm_mm(&v, &[RED, GREEN], true));
    let pcomplete = vllm_prefill(&p, preq).await.unwrap();
    assert!(pcomplete.media_identity.is_none(), "router-side processing");
    let mut dreq = vllm_request("v-mm", &prompt(), 6, false);
    dreq.mm_inputs = Some(vllm_mm(&v, &[RED, GREEN], false));
    dreq.kv_transfer_params_json = pcomplete.kv_transfer_params_json.clone();
    let mut dc = vllm_client(&d).await;
    let got = vllm_parts(collect(dc.generate(dreq.clone())).await.unwrap()).1[0]
        .output_ids
        .clone();
    let want = d.reference_with_media(&prompt(), &items(&[RED, GREEN]), &spec(&d, 6), None);
    assert_eq!(got, want.token_ids);
    let drec = &d.wait_records(1, SECS).await[0];
    assert_eq!(drec.handoff.items[0].integrity.as_deref(), Some("ok"));
    let dmm = drec.mm.as_ref().unwrap();
    assert!(!dmm.pixels);
    assert_eq!(dmm.hashes, hashes(&[RED, GREEN]));

    // A decode that must recompute (n > 1, no handoff) without pixels refuses.
    dreq.kv_transfer_params_json = None;
    dreq.sampling_params.as_mut().unwrap().n = 2;
    let st = collect(dc.generate(dreq)).await.unwrap_err();
    assert_eq!(st.code(), Code::InvalidArgument);
    assert_eq!(
        st.message(),
        "image placeholders at offset 2 have no pixel data"
    );
    // Missing pixels on the prefill: refused before any work.
    let mut preq = vllm_request("v-none", &prompt(), 6, false);
    preq.mm_inputs = Some(vllm_mm(&v, &[RED, GREEN], false));
    let st = vllm_prefill(&p, preq).await.unwrap_err();
    assert_eq!(st.code(), Code::InvalidArgument);
}

#[tokio::test]
async fn vllm_language_model_only_decode_takes_hashes_and_refuses_pixels() {
    let v = MockVision::chw(IMG);
    let p = mm_engine(EngineKind::Vllm, Role::Prefill, [127, 0, 93, 1], v.clone()).await;
    let d = mm_engine(
        EngineKind::Vllm,
        Role::Decode,
        [127, 0, 93, 2],
        v.clone().language_model_only(),
    )
    .await;
    let info = vllm_client(&d)
        .await
        .get_model_info(vllm::GetModelInfoRequest {})
        .await
        .unwrap()
        .into_inner();
    assert!(!info.supports_vision);
    let (shape, bytes) = chw(&v, &[BLUE, GREEN]);
    let full = vllm::MultimodalInputs {
        pixel_values: Some(vllm_tensor(shape, "float32", bytes)),
        im_token_id: Some(IMG),
        mm_placeholders: placeholders(),
        mm_hashes: hashes(&[BLUE, GREEN]),
        ..Default::default()
    };
    let mut preq = vllm_request("lmo", &prompt(), 5, false);
    preq.mm_inputs = Some(full.clone());
    let pcomplete = vllm_prefill(&p, preq).await.unwrap();

    let mut dc = vllm_client(&d).await;
    let mut dreq = vllm_request("lmo", &prompt(), 5, false);
    dreq.kv_transfer_params_json = pcomplete.kv_transfer_params_json.clone();
    dreq.mm_inputs = Some(full);
    let st = collect(dc.generate(dreq.clone())).await.unwrap_err();
    assert_eq!(st.code(), Code::InvalidArgument);
    assert!(st.message().contains("--language-model-only"), "{st:?}");
    // Hashes and placeholders only: served from the handoff.
    dreq.mm_inputs = Some(vllm::MultimodalInputs {
        mm_placeholders: placeholders(),
        mm_hashes: hashes(&[BLUE, GREEN]),
        ..Default::default()
    });
    let got = vllm_parts(collect(dc.generate(dreq)).await.unwrap()).1[0]
        .output_ids
        .clone();
    let want = d.reference_with_media(&prompt(), &items(&[BLUE, GREEN]), &spec(&d, 5), None);
    assert_eq!(got, want.token_ids);
}

/// Serves `body` once per connection on `ip` over plain HTTP/1.1; returns the URL.
async fn serve_image(ip: [u8; 4], body: Vec<u8>) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let l = tokio::net::TcpListener::bind((std::net::Ipv4Addr::from(ip), 0))
        .await
        .unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            let body = body.clone();
            tokio::spawn(async move {
                let mut buf = vec![0u8; 4096];
                let _ = s.read(&mut buf).await;
                let head = format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: image/png\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
                    body.len()
                );
                let _ = s.write_all(head.as_bytes()).await;
                let _ = s.write_all(&body).await;
            });
        }
    });
    format!("http://{addr}/image.png")
}

#[tokio::test]
async fn vllm_worker_side_media_refs_return_the_identity_the_decode_is_served_with() {
    let v = MockVision::chw(IMG).with_worker_processing("inprocess", 3);
    let p = mm_engine(EngineKind::Vllm, Role::Prefill, [127, 0, 94, 1], v.clone()).await;
    let d = mm_engine(EngineKind::Vllm, Role::Decode, [127, 0, 94, 2], v.clone()).await;
    let info = vllm_client(&p)
        .await
        .get_server_info(vllm::GetServerInfoRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(info.mm_processor, "inprocess");
    assert_eq!(info.mm_media_ref_schemes, "http,https,data");

    // One unexpanded anchor per image: a data: URL and an http:// URL on loopback.
    let (red, blue) = (png(RED), png(BLUE));
    let data_url = format!(
        "data:image/png;base64,{}",
        base64::engine::general_purpose::STANDARD.encode(&red)
    );
    let http_url = serve_image([127, 0, 94, 3], blue.clone()).await;
    let anchors = [1, 501, IMG, 502, IMG, 503];
    let mut preq = vllm_request("refs", &anchors, 6, false);
    preq.media_refs = Some(vllm::MediaRefs {
        items: [&data_url, &http_url]
            .iter()
            .map(|u| vllm::MediaRef {
                modality: pdgate_proto::common::Modality::Image as i32,
                url: u.to_string(),
            })
            .collect(),
    });
    let pcomplete = vllm_prefill(&p, preq.clone()).await.unwrap();
    let identity = pcomplete.media_identity.expect("media identity");
    let expanded = vec![1, 501, IMG, IMG, IMG, 502, IMG, IMG, IMG, 503];
    assert_eq!(identity.prompt_token_ids, expanded);
    let mm = identity.mm_inputs.expect("identity mm_inputs");
    assert!(mm.pixel_values.is_none());
    assert_eq!(mm.im_token_id, Some(IMG));
    assert_eq!(
        mm.mm_hashes,
        vec![
            blake3::hash(&red).to_hex().to_string(),
            blake3::hash(&blue).to_hex().to_string()
        ]
    );
    let prec = &p.wait_records(1, SECS).await[0];
    let pmm = prec.mm.as_ref().unwrap();
    assert!(pmm.media_identity_returned);
    assert_eq!(pmm.media_refs, vec![data_url.clone(), http_url.clone()]);
    assert_eq!(pmm.placeholders, vec![[2, 3], [6, 3]]);

    // The decode, given the identity (expanded ids, no pixels), serves from the handoff.
    let mut dreq = vllm_request("refs", &identity.prompt_token_ids, 6, false);
    dreq.mm_inputs = Some(mm);
    dreq.kv_transfer_params_json = pcomplete.kv_transfer_params_json.clone();
    let got = vllm_parts(collect(vllm_client(&d).await.generate(dreq)).await.unwrap()).1[0]
        .output_ids
        .clone();
    let media = [(2..5, feature_of_rgb(RED)), (6..9, feature_of_rgb(BLUE))];
    let want = d.reference_with_media(&expanded, &media, &spec(&d, 6), None);
    assert_eq!(got, want.token_ids);

    // No handoff (n > 1): the worker computes the prompt from the fetched media itself.
    let mut n2 = preq;
    n2.sampling_params.as_mut().unwrap().n = 2;
    let (_, cs) = vllm_parts(collect(vllm_client(&d).await.generate(n2)).await.unwrap());
    for (i, c) in cs.iter().enumerate() {
        let sample = d.reference_with_media(&expanded, &media, &spec(&d, 6), Some(i));
        assert_eq!(c.output_ids, sample.token_ids, "sample {i}");
    }
    assert_eq!(d.stats().media_fetches, 2);
}

// ---------------------------------------------------------------------------------------------
// EPD (TokenSpeed)

async fn encoder(ip: [u8; 4], v: MockVision) -> MockEngine {
    mm_engine(EngineKind::TokenSpeed, Role::Encode, ip, v).await
}

async fn encoder_client(e: &MockEngine) -> TokenSpeedEncoderClient<tonic::transport::Channel> {
    TokenSpeedEncoderClient::new(channel(e).await)
}

/// An `Encode` of item `i` of `mm` under `room`.
fn encode_request(mm: &tokenspeed::MultimodalInputs, i: usize, room: i64) -> EncodeRequest {
    EncodeRequest {
        request_id: format!("enc-{i}"),
        mm_inputs: Some(tokenspeed::MultimodalInputs {
            items: vec![mm.items[i].clone()],
        }),
        items: vec![EncodeItemAssignment {
            bootstrap_room: room,
        }],
    }
}

fn assignment(e: &MockEngine, i: u32, room: i64) -> tokenspeed::EncodeItemBootstrapInfo {
    tokenspeed::EncodeItemBootstrapInfo {
        item_index: i,
        bootstrap_host: e.host(),
        bootstrap_port: e.bootstrap_port().unwrap() as i32,
        bootstrap_room: room,
    }
}

#[tokio::test]
async fn epd_prefill_fetches_each_item_from_its_encoder_and_matches_the_reference() {
    let v = MockVision::qwen(IMG);
    let e1 = encoder([127, 0, 95, 1], v.clone()).await;
    let e2 = encoder([127, 0, 95, 2], v.clone()).await;
    let p = mm_engine(
        EngineKind::TokenSpeed,
        Role::Prefill,
        [127, 0, 95, 3],
        v.clone(),
    )
    .await;
    let d = mm_engine(
        EngineKind::TokenSpeed,
        Role::Decode,
        [127, 0, 95, 4],
        v.clone(),
    )
    .await;
    let spec_ = e1.worker_spec();
    assert_eq!(spec_["worker_type"], "encode");
    assert_eq!(spec_["url"], format!("grpc://{}:{}", e1.host(), e1.port()));
    assert_eq!(spec_["bootstrap_port"], e1.bootstrap_port().unwrap());

    let with_pixels = ts_items(&v, &[GREEN, RED], true);
    let (r1, r2) = (room63(), room63());
    let a1 = encoder_client(&e1)
        .await
        .encode(encode_request(&with_pixels, 0, r1))
        .await
        .unwrap()
        .into_inner();
    let a2 = encoder_client(&e2)
        .await
        .encode(encode_request(&with_pixels, 1, r2))
        .await
        .unwrap()
        .into_inner();
    assert!(a1.accepted && a2.accepted);

    // The prefill gets items without pixels plus where each embedding waits.
    let (mut pc, mut dc) = (tokenspeed_client(&p).await, tokenspeed_client(&d).await);
    let mut req = tokenspeed_request("epd", &prompt(), 6, false);
    tokenspeed_pd(&mut req, &p, room63());
    req.mm_inputs = Some(ts_items(&v, &[GREEN, RED], false));
    let mut preq = req.clone();
    preq.encode_bootstrap_info = Some(tokenspeed::EncodeBootstrapInfo {
        items: vec![assignment(&e1, 0, r1), assignment(&e2, 1, r2)],
    });
    let (pr, dr) = tokio::join!(collect(pc.generate(preq)), collect(dc.generate(req)));
    pr.expect("EPD prefill");
    let got = tokenspeed_parts(dr.unwrap()).1[0].output_ids.clone();
    let want = d.reference_with_media(&prompt(), &items(&[GREEN, RED]), &spec(&d, 6), None);
    assert_eq!(got, wire_output_ids(EngineKind::TokenSpeed, &want, false));

    let pmm = p.wait_records(1, SECS).await[0].mm.clone().unwrap();
    assert!(!pmm.pixels, "an EPD prefill gets no pixels");
    assert_eq!(
        pmm.features,
        vec![Some(feature_of_rgb(GREEN)), Some(feature_of_rgb(RED))]
    );
    assert_eq!(pmm.encode_assignments[1].3, r2);
    assert_eq!(p.stats().embeddings_received, 2);
    let enc = e2.records()[0].encode.clone().expect("encode record");
    assert_eq!(enc.room, Some(r2));
    assert_eq!(enc.feature, Some(feature_of_rgb(RED)));
    assert!(enc.had_pixels);
    assert_eq!(
        enc.content_hash,
        blake3::hash(&png(RED)).to_hex().to_string()
    );
    assert!(
        e1.wait_for(SECS, |e| e.stats().embeddings_fetched == 1)
            .await
    );
    assert_eq!(e1.stats().embeddings_pending, 0);
}

#[tokio::test]
async fn epd_prefill_whose_room_was_never_encoded_fails_after_its_timeout() {
    let v = MockVision::qwen(IMG);
    let e = encoder([127, 0, 96, 1], v.clone()).await;
    let p = MockEngine::spawn(MockEngineConfig {
        bootstrap_timeout: Duration::from_millis(400),
        ..grpc_config(EngineKind::TokenSpeed, Role::Both, [127, 0, 96, 2]).with_vision(v.clone())
    })
    .await
    .unwrap();
    let mut req = tokenspeed_request("epd-lost", &prompt(), 4, false);
    let mut mm = ts_items(&v, &[RED, BLUE], false);
    // Item 1 brings its pixels; item 0's embedding never comes.
    mm.items[1] = ts_items(&v, &[RED, BLUE], true).items[1].clone();
    req.mm_inputs = Some(mm);
    req.encode_bootstrap_info = Some(tokenspeed::EncodeBootstrapInfo {
        items: vec![assignment(&e, 0, 12345)],
    });
    let t0 = std::time::Instant::now();
    let st = collect(tokenspeed_client(&p).await.generate(req.clone()))
        .await
        .unwrap_err();
    assert_eq!(st.code(), Code::Internal);
    assert!(st.message().contains("EmbeddingTransferError"), "{st:?}");
    assert!(st.message().contains("bootstrap_room 12345"), "{st:?}");
    assert!(t0.elapsed() >= Duration::from_millis(400));
    // Neither pixels nor an assignment: refused at once.
    req.encode_bootstrap_info = None;
    let st = collect(tokenspeed_client(&p).await.generate(req))
        .await
        .unwrap_err();
    assert_eq!(st.code(), Code::InvalidArgument);
    assert_eq!(
        st.message(),
        "image placeholders at offset 2 have no pixel data"
    );
}

#[tokio::test]
async fn encoder_takes_one_item_per_call_and_registers_like_a_worker() {
    let v = MockVision::qwen(IMG);
    let e = MockEngine::spawn(MockEngineConfig {
        bootstrap_timeout: Duration::from_millis(300),
        ..grpc_config(EngineKind::TokenSpeed, Role::Encode, [127, 0, 97, 1]).with_vision(v.clone())
    })
    .await
    .unwrap();
    let mut ec = encoder_client(&e).await;
    let mm = ts_items(&v, &[RED, BLUE], true);
    let two = EncodeRequest {
        request_id: "two".into(),
        mm_inputs: Some(mm.clone()),
        items: vec![
            EncodeItemAssignment { bootstrap_room: 1 },
            EncodeItemAssignment { bootstrap_room: 2 },
        ],
    };
    let st = ec.encode(two).await.unwrap_err();
    assert_eq!(st.code(), Code::InvalidArgument);
    let mut no_pixels = encode_request(&ts_items(&v, &[RED], false), 0, 3);
    no_pixels.request_id = "bare".into();
    assert_eq!(
        ec.encode(no_pixels).await.unwrap_err().code(),
        Code::InvalidArgument
    );
    // An embedding nobody fetches expires.
    ec.encode(encode_request(&mm, 0, 4)).await.unwrap();
    assert!(
        e.wait_for(SECS, |e| e.stats().embeddings_expired == 1)
            .await
    );
    // A fault fails the next Encode.
    e.inject(mock_engine::Fault::GrpcStatus {
        code: mock_engine::GrpcCode::Unavailable,
        message: None,
        count: Some(1),
        matcher: Default::default(),
    })
    .await;
    let st = ec.encode(encode_request(&mm, 0, 5)).await.unwrap_err();
    assert_eq!(st.code(), Code::Unavailable);

    // The scheduler's info RPCs answer, Generate does not.
    let mut sc = tokenspeed_client(&e).await;
    assert!(
        sc.health_check(tokenspeed::HealthCheckRequest {})
            .await
            .unwrap()
            .into_inner()
            .healthy
    );
    let loads = sc
        .get_loads(tokenspeed::GetLoadsRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert!(loads.loads.is_empty());
    let info = sc
        .get_server_info(tokenspeed::GetServerInfoRequest {})
        .await
        .unwrap()
        .into_inner();
    let args = mock_engine::struct_to_json(&info.server_args.unwrap());
    assert_eq!(args["disaggregation_mode"], "encode");
    let st = collect(sc.generate(tokenspeed_request("gen", &[1, 2], 2, false)))
        .await
        .unwrap_err();
    assert_eq!(st.code(), Code::FailedPrecondition);
    let records = e.records();
    assert_eq!(records.len(), 4, "one record per Encode call");
    assert!(records.iter().all(|r| r.encode.is_some()));
}

#[tokio::test]
async fn text_requests_on_a_vision_engine_are_unchanged() {
    let v = MockVision::chw(IMG);
    let e = mm_engine(EngineKind::Sglang, Role::Both, [127, 0, 98, 1], v).await;
    let text = [1, 501, 502, 503];
    let out = collect(
        sglang_client(&e)
            .await
            .generate(sglang_request("t", &text, 5, false)),
    )
    .await
    .unwrap();
    let want = e.reference(&text, &spec(&e, 5), None);
    assert_eq!(sglang_parts(out).1[0].output_ids, want.token_ids);
    assert!(e.records()[0].mm.is_none());
    assert_eq!(e.reference_with_media(&text, &[], &spec(&e, 5), None), want);
}
