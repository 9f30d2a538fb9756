//! Multimodal PD and EPD over gRPC through the real binary: the gateway fetches (or is given)
//! images, preprocesses them with the model directory's processor (LLaVA's fixed resize,
//! Qwen2-VL's dynamic resolution), expands the placeholders, and sends pixels only to the leg
//! that runs the vision tower. The mock engines read the pixels back with their own fake
//! vision tower (the mean colour of the de-normalised pixels), so the answer equals the
//! single-worker reference only when the right image reached the right leg; their records
//! show what each leg received.

use std::io::Cursor;
use std::ops::Range;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use mock_engine::vision::{feature_of_rgb, MockVision};
use mock_engine::{EngineKind, MockEngine, MockEngineConfig, Role};
use pdgate_tokenize::fixture::{self, VisionFamily};
use pdgate_tokenize::{ChatInput, Tokenizer};
use serde_json::{json, Value};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpListener;

use crate::grpc_pd::vocab;
use crate::harness::{error_code, Gateway};

/// The fixture vision model of `family` (written once per test binary).
fn model_dir(family: VisionFamily) -> PathBuf {
    static DIRS: std::sync::Mutex<Vec<(VisionFamily, PathBuf)>> = std::sync::Mutex::new(Vec::new());
    let mut dirs = DIRS.lock().unwrap();
    if let Some((_, d)) = dirs.iter().find(|(f, _)| *f == family) {
        return d.clone();
    }
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("vision-{family:?}"));
    fixture::write_vision_model_dir(&dir, family).expect("write the vision fixture");
    dirs.push((family, dir.clone()));
    dir
}

fn tower(family: VisionFamily) -> MockVision {
    match family {
        VisionFamily::Llava => MockVision::chw(family.image_token_id()),
        VisionFamily::Qwen2Vl => MockVision::qwen(family.image_token_id()),
    }
}

/// A solid-colour image, `w`×`h`, encoded as PNG (or JPEG).
fn image(rgb: [u8; 3], w: u32, h: u32, jpeg: bool) -> Vec<u8> {
    let img = image::RgbImage::from_pixel(w, h, image::Rgb(rgb));
    let mut out = Cursor::new(Vec::new());
    let format = if jpeg {
        image::ImageFormat::Jpeg
    } else {
        image::ImageFormat::Png
    };
    img.write_to(&mut out, format)
        .expect("encode the test image");
    out.into_inner()
}

fn data_url(bytes: &[u8], mime: &str) -> String {
    format!(
        "data:{mime};base64,{}",
        base64::engine::general_purpose::STANDARD.encode(bytes)
    )
}

fn blake3_hex(bytes: &[u8]) -> String {
    mock_engine::vision::content_hash_hex(bytes)
}

/// Red-ish and blue-ish colours whose channels sit far from the feature's rounding edges.
const RED: [u8; 3] = [208, 48, 32];
const BLUE: [u8; 3] = [32, 96, 224];

async fn engine(
    engine: EngineKind,
    role: Role,
    ip: [u8; 4],
    vision: Option<MockVision>,
) -> MockEngine {
    let mut cfg = MockEngineConfig::grpc_test(engine, role, ip).with_vocab(vocab());
    if let Some(v) = vision {
        cfg = cfg.with_vision(v);
    }
    MockEngine::spawn(cfg).await.expect("spawn a gRPC mock")
}

/// A prefill and a decode of `kind`, both with `family`'s vision tower.
async fn pair(
    kind: EngineKind,
    family: VisionFamily,
    ips: ([u8; 4], [u8; 4]),
) -> (MockEngine, MockEngine) {
    let v = Some(tower(family));
    (
        engine(kind, Role::Prefill, ips.0, v.clone()).await,
        engine(kind, Role::Decode, ips.1, v).await,
    )
}

/// A vision prefill/decode pair of `kind` on `ips` and a ready gateway on them (`family`'s model).
async fn pd_fleet(
    kind: EngineKind,
    family: VisionFamily,
    ips: ([u8; 4], [u8; 4]),
) -> (MockEngine, MockEngine, Gateway) {
    let (p, d) = pair(kind, family, ips).await;
    let gw = gateway(&[p.worker_spec(), d.worker_spec()], family, "").await;
    (p, d, gw)
}

/// Two encoders, a prefill and a decode (TokenSpeed, `family`'s tower) on `ip` and the next
/// three addresses, in that order.
async fn epd_fleet(
    family: VisionFamily,
    ip: [u8; 4],
) -> (MockEngine, MockEngine, MockEngine, MockEngine) {
    let at = |k: u8| [ip[0], ip[1], ip[2], ip[3] + k];
    let kind = EngineKind::TokenSpeed;
    let e1 = engine(kind, Role::Encode, at(0), Some(tower(family))).await;
    let e2 = engine(kind, Role::Encode, at(1), Some(tower(family))).await;
    let (p, d) = pair(kind, family, (at(2), at(3))).await;
    (e1, e2, p, d)
}

/// A ready EPD gateway on `workers` with `family`'s model; `extra`: more `gateway:` lines.
async fn epd_gateway(workers: &[Value], family: VisionFamily, extra: &str) -> Gateway {
    let extra = format!(
        "  pd_disaggregation: false\n  epd_disaggregation: true\n  model_path: {}\n{extra}",
        model_dir(family).display()
    );
    let mut gw = Gateway::start(workers, &extra).await;
    gw.wait_ready().await;
    gw
}

async fn gateway(workers: &[Value], family: VisionFamily, extra: &str) -> Gateway {
    let extra = format!(
        "  model_path: {}\n  mm_allow_private_media_hosts: true\n{extra}",
        model_dir(family).display()
    );
    let mut gw = Gateway::start(workers, &extra).await;
    gw.wait_ready().await;
    gw
}

fn chat(parts: Vec<Value>, max_tokens: usize) -> Value {
    json!({"model": "mock-model", "max_tokens": max_tokens,
        "messages": [{"role": "user", "content": parts}]})
}

fn image_part(url: &str) -> Value {
    json!({"type": "image_url", "image_url": {"url": url}})
}

fn text_part(text: &str) -> Value {
    json!({"type": "text", "text": text})
}

/// What a single worker answers: the template rendered with `{"type":"image"}` parts, each
/// image's placeholder expanded to `tokens[i]`, and each range folding the image's colour.
fn expected_text(
    e: &MockEngine,
    family: VisionFamily,
    parts: &[Value],
    images: &[([u8; 3], usize)],
    max_tokens: usize,
) -> String {
    expected_seeded(e, family, parts, images, max_tokens, None)
}

/// [`expected_text`] with a pinned seed (TokenSpeed offsets it by the sample index).
fn expected_seeded(
    e: &MockEngine,
    family: VisionFamily,
    parts: &[Value],
    images: &[([u8; 3], usize)],
    max_tokens: usize,
    seed: Option<u64>,
) -> String {
    let tok = Tokenizer::from_dir(model_dir(family)).unwrap();
    let template_parts: Vec<Value> = parts
        .iter()
        .map(|p| {
            if p["type"] == "text" {
                p.clone()
            } else {
                json!({"type": "image"})
            }
        })
        .collect();
    let messages = vec![json!({"role": "user", "content": template_parts})];
    let text = tok
        .render_chat(&ChatInput::conversation(&messages))
        .unwrap();
    let ids = tok.encode(&text, false).unwrap();
    let (expanded, ranges) = expand(&ids, family.image_token_id(), images);
    let spec = mock_engine::fake_model::SamplingSpec {
        max_new_tokens: max_tokens,
        seed,
        ..e.sampling_spec()
    };
    let items: Vec<(Range<usize>, u64)> = ranges
        .into_iter()
        .zip(images)
        .map(|(r, (rgb, _))| (r, feature_of_rgb(*rgb)))
        .collect();
    let out = e.reference_with_media(&expanded, &items, &spec, None);
    tok.decode(&out.token_ids, true).unwrap()
}

/// The test's own placeholder expansion (the i-th image token becomes `images[i].1` copies).
fn expand(ids: &[u32], token: u32, images: &[([u8; 3], usize)]) -> (Vec<u32>, Vec<Range<usize>>) {
    let mut out = Vec::new();
    let mut ranges = Vec::new();
    let mut k = 0;
    for &t in ids {
        if t == token {
            let n = images[k].1;
            ranges.push(out.len()..out.len() + n);
            out.extend(std::iter::repeat_n(token, n));
            k += 1;
        } else {
            out.push(t);
        }
    }
    assert_eq!(
        k,
        images.len(),
        "the template wrote one placeholder per image"
    );
    (out, ranges)
}

fn mm_of(e: &MockEngine) -> Vec<mock_engine::records::MmRecord> {
    e.records()
        .into_iter()
        .filter(|r| r.grpc.is_some())
        .filter_map(|r| r.mm)
        .collect()
}

/// A loopback HTTP server answering every GET with `body` (counting connections).
struct MediaServer {
    port: u16,
    connections: Arc<AtomicUsize>,
}

impl MediaServer {
    async fn start(ip: [u8; 4], body: Vec<u8>, redirect_to: Option<String>) -> MediaServer {
        let listener = TcpListener::bind((std::net::Ipv4Addr::from(ip), 0))
            .await
            .unwrap();
        let port = listener.local_addr().unwrap().port();
        let connections = Arc::new(AtomicUsize::new(0));
        let seen = connections.clone();
        tokio::spawn(async move {
            loop {
                let Ok((mut conn, _)) = listener.accept().await else {
                    return;
                };
                seen.fetch_add(1, Ordering::SeqCst);
                let body = body.clone();
                let redirect_to = redirect_to.clone();
                tokio::spawn(async move {
                    let _ = crate::harness::read_request(&mut conn).await;
                    let head = match &redirect_to {
                        Some(to) => format!(
                            "HTTP/1.1 302 Found\r\nlocation: {to}\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
                        ),
                        None => format!(
                            "HTTP/1.1 200 OK\r\ncontent-type: image/png\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
                            body.len()
                        ),
                    };
                    let _ = conn.write_all(head.as_bytes()).await;
                    if redirect_to.is_none() {
                        let _ = conn.write_all(&body).await;
                    }
                    let _ = conn.shutdown().await;
                });
            }
        });
        MediaServer { port, connections }
    }

    fn connections(&self) -> usize {
        self.connections.load(Ordering::SeqCst)
    }
}

async fn pd_image_reaches_only_the_prefill(
    kind: EngineKind,
    family: VisionFamily,
    ips: ([u8; 4], [u8; 4]),
    tokens: usize,
) {
    let (p, d, gw) = pd_fleet(kind, family, ips).await;
    let png = image(RED, 56, 56, false);
    let parts = vec![
        image_part(&data_url(&png, "image/png")),
        text_part("What is it?"),
    ];
    let want = expected_text(&d, family, &parts, &[(RED, tokens)], 8);
    assert!(!want.is_empty());
    let r = gw
        .post("/v1/chat/completions", &chat(parts.clone(), 8))
        .await;
    assert_eq!(r.status, 200, "{}\n{}", r.text(), gw.log());
    assert_eq!(r.json()["choices"][0]["message"]["content"], want.as_str());
    // Streamed: the same text, event by event.
    let mut streamed = chat(parts.clone(), 8);
    streamed["stream"] = json!(true);
    let r = gw.post("/v1/chat/completions", &streamed).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(crate::grpc_pd::sse_text(&r.text()), want);
    // Another colour is another answer: the text depends on the pixels.
    let blue = image(BLUE, 56, 56, false);
    let other = vec![
        image_part(&data_url(&blue, "image/png")),
        text_part("What is it?"),
    ];
    let r2 = gw.post("/v1/chat/completions", &chat(other, 8)).await;
    assert_eq!(r2.status, 200, "{}", r2.text());
    assert_ne!(r2.json()["choices"][0]["message"]["content"], want.as_str());

    let (pm, dm) = (mm_of(&p), mm_of(&d));
    assert_eq!((pm.len(), dm.len()), (3, 3), "{pm:?}\n{dm:?}");
    assert!(pm.iter().all(|m| m.pixels && m.items == 1), "{pm:?}");
    assert!(dm.iter().all(|m| !m.pixels), "a decode got pixels: {dm:?}");
    assert_eq!(pm[0].placeholders[0][1] as usize, tokens, "{pm:?}");
    assert_eq!(dm[0].placeholders, pm[0].placeholders);
    if kind != EngineKind::Sglang {
        // TokenSpeed and vLLM carry per-image hashes: blake3 of the bytes as sent.
        assert_eq!(pm[0].hashes, vec![blake3_hex(&png)]);
        assert_eq!(dm[0].hashes, vec![blake3_hex(&png)]);
    }
    if family == VisionFamily::Qwen2Vl {
        // M-RoPE: the decode keeps the grid.
        assert_eq!(dm[0].grid_thw, vec![[1, 4, 4]], "{dm:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokenspeed_qwen2vl_pixels_reach_only_the_prefill() {
    pd_image_reaches_only_the_prefill(
        EngineKind::TokenSpeed,
        VisionFamily::Qwen2Vl,
        ([127, 0, 100, 1], [127, 0, 100, 2]),
        4,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sglang_llava_pixels_reach_only_the_prefill() {
    pd_image_reaches_only_the_prefill(
        EngineKind::Sglang,
        VisionFamily::Llava,
        ([127, 0, 100, 3], [127, 0, 100, 4]),
        4,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vllm_qwen2vl_pixels_reach_only_the_prefill() {
    pd_image_reaches_only_the_prefill(
        EngineKind::Vllm,
        VisionFamily::Qwen2Vl,
        ([127, 0, 100, 5], [127, 0, 100, 6]),
        4,
    )
    .await;
}

/// Two images, one by URL from a media server and one inline JPEG, in prompt order; the same
/// URL twice is fetched once; an Anthropic image block works the same way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn url_and_inline_images_keep_their_order() {
    let family = VisionFamily::Qwen2Vl;
    let (p, d, gw) = pd_fleet(
        EngineKind::TokenSpeed,
        family,
        ([127, 0, 100, 7], [127, 0, 100, 8]),
    )
    .await;
    // 112×56 (w×h): grid 1×4×8 → 8 tokens; the JPEG 56×56 → 4.
    let server = MediaServer::start([127, 0, 100, 9], image(BLUE, 112, 56, false), None).await;
    let url = format!("http://127.0.100.9:{}/blue.png", server.port);
    let jpeg = image(RED, 56, 56, true);
    let parts = vec![
        image_part(&url),
        text_part("and"),
        image_part(&data_url(&jpeg, "image/jpeg")),
        image_part(&url),
    ];
    let want = expected_text(&d, family, &parts, &[(BLUE, 8), (RED, 4), (BLUE, 8)], 8);
    let r = gw.post("/v1/chat/completions", &chat(parts, 8)).await;
    assert_eq!(r.status, 200, "{}\n{}", r.text(), gw.log());
    assert_eq!(r.json()["choices"][0]["message"]["content"], want.as_str());
    assert_eq!(
        server.connections(),
        1,
        "one URL, fetched once for the request"
    );
    let pm = mm_of(&p);
    assert_eq!(pm[0].items, 3);
    assert_eq!(pm[0].grid_thw, vec![[1, 4, 8], [1, 4, 4], [1, 4, 8]]);

    // Anthropic: a base64 image block.
    let png = image(RED, 56, 56, false);
    let body = json!({"model": "mock-model", "max_tokens": 8, "messages": [{"role": "user",
        "content": [{"type": "image", "source": {"type": "base64", "media_type": "image/png",
            "data": base64::engine::general_purpose::STANDARD.encode(&png)}},
            {"type": "text", "text": "What is it?"}]}]});
    let want = expected_text(
        &d,
        family,
        &[json!({"type": "image"}), text_part("What is it?")],
        &[(RED, 4)],
        8,
    );
    let r = gw.post("/v1/messages", &body).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["content"][0]["text"], want.as_str());
}

/// vLLM decode pools started `--language-model-only` take token ids, the handoff and image
/// hashes only; what they cannot serve is refused before any leg, with the spec's codes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn language_model_only_vllm_decodes() {
    // LLaVA: served, the decode gets hashes only.
    let family = VisionFamily::Llava;
    let p = engine(
        EngineKind::Vllm,
        Role::Prefill,
        [127, 0, 101, 1],
        Some(tower(family)),
    )
    .await;
    let d = engine(
        EngineKind::Vllm,
        Role::Decode,
        [127, 0, 101, 2],
        Some(tower(family).language_model_only()),
    )
    .await;
    let gw = gateway(&[p.worker_spec(), d.worker_spec()], family, "").await;
    let png = image(RED, 40, 30, false);
    let parts = vec![
        image_part(&data_url(&png, "image/png")),
        text_part("Describe."),
    ];
    let want = expected_text(&d, family, &parts, &[(RED, 4)], 8);
    let r = gw
        .post("/v1/chat/completions", &chat(parts.clone(), 8))
        .await;
    assert_eq!(r.status, 200, "{}\n{}", r.text(), gw.log());
    assert_eq!(r.json()["choices"][0]["message"]["content"], want.as_str());
    let dm = mm_of(&d);
    assert!(!dm[0].pixels && dm[0].grid_thw.is_empty(), "{dm:?}");
    assert_eq!(dm[0].hashes, vec![blake3_hex(&png)]);
    // n > 1 recomputes the prompt on the decode: refused.
    let mut body = chat(parts, 8);
    body["n"] = json!(2);
    let r = gw.post("/v1/chat/completions", &body).await;
    assert_eq!(r.status, 400, "{}", r.text());
    assert_eq!(error_code(&r), "pd_decode_language_model_only_n_samples");
    drop(gw);

    // Qwen2-VL (M-RoPE): refused.
    let family = VisionFamily::Qwen2Vl;
    let p = engine(
        EngineKind::Vllm,
        Role::Prefill,
        [127, 0, 101, 3],
        Some(tower(family)),
    )
    .await;
    let d = engine(
        EngineKind::Vllm,
        Role::Decode,
        [127, 0, 101, 4],
        Some(tower(family).language_model_only()),
    )
    .await;
    let gw = gateway(&[p.worker_spec(), d.worker_spec()], family, "").await;
    let png = image(RED, 56, 56, false);
    let r = gw
        .post(
            "/v1/chat/completions",
            &chat(vec![image_part(&data_url(&png, "image/png"))], 4),
        )
        .await;
    assert_eq!(r.status, 400, "{}", r.text());
    assert_eq!(error_code(&r), "pd_decode_language_model_only_mrope");
    // Worker-side processing with such a decode: refused too.
    drop(gw);
    let gw = gateway(
        &[p.worker_spec(), d.worker_spec()],
        family,
        "  mm_processing: worker\n",
    )
    .await;
    let r = gw
        .post(
            "/v1/chat/completions",
            &chat(vec![image_part(&data_url(&png, "image/png"))], 4),
        )
        .await;
    assert_eq!(r.status, 400, "{}", r.text());
    assert_eq!(error_code(&r), "pd_decode_language_model_only_media_refs");
    assert!(
        p.records()
            .iter()
            .all(|r| r.grpc.is_none() || r.mm.is_none()),
        "no leg went out"
    );
}

/// Worker-side processing (vLLM's `mm_processor`): the prefill gets the references and one
/// anchor per image, processes each image once and returns the media identity, which the
/// decode takes instead of pixels.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vllm_worker_side_processing_passes_the_media_identity() {
    let family = VisionFamily::Llava;
    let v = tower(family).with_worker_processing("inprocess", 6);
    let p = engine(
        EngineKind::Vllm,
        Role::Prefill,
        [127, 0, 101, 5],
        Some(v.clone()),
    )
    .await;
    let d = engine(EngineKind::Vllm, Role::Decode, [127, 0, 101, 6], Some(v)).await;
    // auto: the prefill reports an mm_processor, so the worker processes.
    let gw = gateway(&[p.worker_spec(), d.worker_spec()], family, "").await;
    let png = image(BLUE, 64, 48, false);
    let url = data_url(&png, "image/png");
    let parts = vec![image_part(&url), text_part("Describe.")];
    let want = expected_text(&d, family, &parts, &[(BLUE, 6)], 8);
    let r = gw.post("/v1/chat/completions", &chat(parts, 8)).await;
    assert_eq!(r.status, 200, "{}\n{}", r.text(), gw.log());
    assert_eq!(r.json()["choices"][0]["message"]["content"], want.as_str());
    let (pm, dm) = (mm_of(&p), mm_of(&d));
    assert_eq!(pm[0].media_refs, vec![url], "{pm:?}");
    assert!(pm[0].media_identity_returned, "{pm:?}");
    assert!(!pm[0].pixels);
    assert!(dm[0].media_refs.is_empty() && !dm[0].pixels, "{dm:?}");
    assert_eq!(dm[0].hashes, vec![blake3_hex(&png)]);
}

/// The refusals of the media pipeline: too many images, an image that does not decode, a URL
/// that does not answer, a text model, audio input.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn media_refusals_are_clear_400s() {
    let family = VisionFamily::Llava;
    let (p, d) = pair(
        EngineKind::TokenSpeed,
        family,
        ([127, 0, 101, 7], [127, 0, 101, 8]),
    )
    .await;
    let gw = gateway(
        &[p.worker_spec(), d.worker_spec()],
        family,
        "  mm_per_request_image_limit: 1\n",
    )
    .await;
    let png = data_url(&image(RED, 8, 8, false), "image/png");
    let cases = [
        (
            chat(vec![image_part(&png), image_part(&png)], 4),
            "too_many_images",
            "at most 1 images",
        ),
        (
            chat(
                vec![image_part("data:image/png;base64,bm90IGFuIGltYWdl")],
                4,
            ),
            "invalid_media",
            "image",
        ),
        (
            chat(vec![image_part("http://127.0.0.1:9/x.png")], 4),
            "media_fetch_failed",
            "127.0.0.1",
        ),
        (
            chat(vec![image_part("ftp://media.test/x.png")], 4),
            "media_fetch_failed",
            "ftp",
        ),
        (
            chat(
                vec![
                    json!({"type": "input_audio", "input_audio": {"data": "AA", "format": "wav"}}),
                ],
                4,
            ),
            "multimodal_not_supported",
            "audio",
        ),
    ];
    for (body, code, says) in cases {
        let r = gw.post("/v1/chat/completions", &body).await;
        assert_eq!(r.status, 400, "{code}: {}", r.text());
        assert_eq!(error_code(&r), code, "{}", r.text());
        assert!(r.text().contains(says), "{code}: {}", r.text());
    }
    assert!(
        mm_of(&p).is_empty() && mm_of(&d).is_empty(),
        "no leg went out"
    );
    drop(gw);

    // A text model (no preprocessor_config.json): images are not supported.
    let extra = format!("  model_path: {}\n", crate::grpc_pd::model_dir().display());
    let mut gw = Gateway::start(&[p.worker_spec(), d.worker_spec()], &extra).await;
    gw.wait_ready().await;
    let r = gw
        .post("/v1/chat/completions", &chat(vec![image_part(&png)], 4))
        .await;
    assert_eq!(r.status, 400, "{}", r.text());
    assert_eq!(error_code(&r), "multimodal_not_supported");
}

/// The media policy through the binary: without `--mm-allow-private-media-hosts`, every
/// spelling of a private or loopback address is refused before any connection, and with a
/// domain list a redirect to another host is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn media_urls_to_private_hosts_are_refused() {
    let family = VisionFamily::Llava;
    let (p, d) = pair(
        EngineKind::TokenSpeed,
        family,
        ([127, 0, 102, 1], [127, 0, 102, 2]),
    )
    .await;
    let extra = format!("  model_path: {}\n", model_dir(family).display());
    let mut gw = Gateway::start(&[p.worker_spec(), d.worker_spec()], &extra).await;
    gw.wait_ready().await;
    let server = MediaServer::start([127, 0, 0, 1], image(RED, 8, 8, false), None).await;
    let port = server.port;
    let mut urls = vec![
        format!("http://127.0.0.1:{port}/a.png"),
        format!("http://localhost:{port}/a.png"),
        format!("http://LOCALHOST.:{port}/a.png"),
        format!("http://2130706433:{port}/a.png"),
        format!("http://0x7f.0.0.1:{port}/a.png"),
        format!("http://0177.0.0.1:{port}/a.png"),
        format!("http://127.1:{port}/a.png"),
        format!("http://[::ffff:127.0.0.1]:{port}/a.png"),
        format!("http://[::1]:{port}/a.png"),
        "http://169.254.169.254/latest/meta-data/".to_string(),
        "http://10.0.0.1/a.png".to_string(),
        "http://192.168.1.1/a.png".to_string(),
        "http://[fe80::1]/a.png".to_string(),
        "http://0.0.0.0/a.png".to_string(),
        "file:///etc/passwd".to_string(),
    ];
    // A DNS name this machine resolves to loopback (its own host name, usually).
    if let Ok(host) = std::fs::read_to_string("/etc/hostname") {
        let host = host.trim().to_string();
        let loopback = tokio::net::lookup_host((host.as_str(), port))
            .await
            .map(|mut a| a.all(|a| a.ip().is_loopback()))
            .unwrap_or(false);
        if !host.is_empty() && loopback && !host.contains("localhost") {
            urls.push(format!("http://{host}:{port}/a.png"));
        } else {
            eprintln!("no non-localhost name resolves to loopback here; that case is unit-tested");
        }
    }
    for url in &urls {
        let r = gw
            .post("/v1/chat/completions", &chat(vec![image_part(url)], 4))
            .await;
        assert_eq!(r.status, 400, "{url}: {}", r.text());
        assert_eq!(error_code(&r), "media_fetch_failed", "{url}: {}", r.text());
    }
    assert_eq!(server.connections(), 0, "a refused URL was fetched");
    drop(gw);

    // Allowed domains: a redirect from the allowed host to another is refused (re-checked).
    let target = MediaServer::start([127, 0, 0, 1], image(RED, 8, 8, false), None).await;
    let redirector = MediaServer::start(
        [127, 0, 102, 3],
        Vec::new(),
        Some(format!("http://localhost:{}/b.png", target.port)),
    )
    .await;
    let extra = format!(
        "  model_path: {}\n  mm_allow_private_media_hosts: true\n  mm_allowed_media_domains: 127.0.102.3\n",
        model_dir(family).display()
    );
    let mut gw = Gateway::start(&[p.worker_spec(), d.worker_spec()], &extra).await;
    gw.wait_ready().await;
    let url = format!("http://127.0.102.3:{}/a.png", redirector.port);
    let r = gw
        .post("/v1/chat/completions", &chat(vec![image_part(&url)], 4))
        .await;
    assert_eq!(r.status, 400, "{}", r.text());
    assert_eq!(error_code(&r), "media_fetch_failed");
    assert_eq!(redirector.connections(), 1);
    assert_eq!(target.connections(), 0, "the redirect target was fetched");
    assert!(mm_of(&p).is_empty(), "no leg went out");
}

/// EPD on TokenSpeed: each image gets its own encode worker and room; the prefill gets the
/// rendezvous and no pixels; the decode no pixels; text-only requests skip the encoders.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn epd_encodes_each_image_on_its_encoder() {
    let family = VisionFamily::Qwen2Vl;
    let (e1, e2, p, d) = epd_fleet(family, [127, 0, 103, 1]).await;
    let workers = [
        e1.worker_spec(),
        e2.worker_spec(),
        p.worker_spec(),
        d.worker_spec(),
    ];
    let gw = epd_gateway(&workers, family, "  encode_policy: round_robin\n").await;
    let ready = gw.get("/readiness").await;
    assert_eq!(ready.json()["encode_healthy"], 2, "{}", ready.text());

    // Two images → two encoders (round robin), embeddings to the prefill, the right answer.
    let (red, blue) = (image(RED, 56, 56, false), image(BLUE, 112, 56, false));
    let parts = vec![
        image_part(&data_url(&red, "image/png")),
        image_part(&data_url(&blue, "image/png")),
        text_part("Compare."),
    ];
    let want = expected_text(&d, family, &parts, &[(RED, 4), (BLUE, 8)], 8);
    let r = gw.post("/v1/chat/completions", &chat(parts, 8)).await;
    assert_eq!(r.status, 200, "{}\n{}", r.text(), gw.log());
    assert_eq!(r.json()["choices"][0]["message"]["content"], want.as_str());
    let encodes = |e: &MockEngine| -> Vec<mock_engine::records::EncodeRecord> {
        e.records().into_iter().filter_map(|r| r.encode).collect()
    };
    let (en1, en2) = (encodes(&e1), encodes(&e2));
    assert_eq!((en1.len(), en2.len()), (1, 1), "{en1:?}\n{en2:?}");
    assert!(en1[0].had_pixels && en2[0].had_pixels);
    let mut hashes = vec![en1[0].content_hash.clone(), en2[0].content_hash.clone()];
    hashes.sort();
    let mut want_hashes = vec![blake3_hex(&red), blake3_hex(&blue)];
    want_hashes.sort();
    assert_eq!(hashes, want_hashes);
    let pm = mm_of(&p);
    assert!(!pm[0].pixels, "the EPD prefill got pixels: {pm:?}");
    assert_eq!(pm[0].encode_assignments.len(), 2, "{pm:?}");
    assert!(!mm_of(&d)[0].pixels);
    // Every rendezvous closes (the prefill drains in the background after the answer).
    let closed = async {
        loop {
            if gw.get("/debug/handoffs").await.json()["open"] == 0 {
                return;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(10), closed)
        .await
        .expect("every rendezvous closed");

    // Text-only: no encode leg.
    let r = gw
        .post(
            "/v1/chat/completions",
            &chat(vec![text_part("Hello there.")], 4),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(
        encodes(&e1).len() + encodes(&e2).len(),
        2,
        "text went to an encoder"
    );

    // /v1/responses is not served in EPD mode.
    let r = gw
        .post(
            "/v1/responses",
            &json!({"model": "mock-model", "input": "hi"}),
        )
        .await;
    assert_eq!(r.status, 501, "{}", r.text());

    // Encoders that refuse fail the request at once (after the retries) with their own code:
    // waiting for the prefill's embedding timeout would end it with a leg's timeout instead.
    for e in [&e1, &e2] {
        e.inject(mock_engine::Fault::GrpcStatus {
            code: mock_engine::GrpcCode::Unavailable,
            message: Some("encoder busy".into()),
            count: None,
            matcher: mock_engine::FaultMatch {
                route: Some("/tokenspeed.grpc.encoder.TokenSpeedEncoder/Encode".into()),
                role: None,
            },
        })
        .await;
    }
    let r = gw
        .post(
            "/v1/chat/completions",
            &chat(vec![image_part(&data_url(&red, "image/png"))], 4),
        )
        .await;
    assert_eq!(r.status, 503, "{}", r.text());
    assert_eq!(
        error_code(&r),
        "encode_worker_failed_to_start",
        "{}",
        r.text()
    );
    assert!(r.text().contains("encoder busy"), "{}", r.text());
    assert!(
        p.wait_idle(Duration::from_secs(10)).await,
        "{:?}",
        p.rooms()
    );
}

/// Consistent hashing (the default): the same image goes to the same encoder; with
/// `--mm-processing worker`, EPD refuses media.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn epd_repeated_image_goes_to_the_same_encoder() {
    let family = VisionFamily::Llava;
    let (e1, e2, p, d) = epd_fleet(family, [127, 0, 103, 5]).await;
    let workers = [
        e1.worker_spec(),
        e2.worker_spec(),
        p.worker_spec(),
        d.worker_spec(),
    ];
    let gw = epd_gateway(&workers, family, "").await;
    let count = |e: &MockEngine| e.records().iter().filter(|r| r.encode.is_some()).count();
    for rgb in [RED, BLUE, [48, 160, 96], [240, 224, 16]] {
        let png = image(rgb, 30, 30, false);
        let parts = vec![
            image_part(&data_url(&png, "image/png")),
            text_part("Again?"),
        ];
        let want = expected_text(&d, family, &parts, &[(rgb, 4)], 6);
        let before = (count(&e1), count(&e2));
        for _ in 0..3 {
            let r = gw
                .post("/v1/chat/completions", &chat(parts.clone(), 6))
                .await;
            assert_eq!(r.status, 200, "{}\n{}", r.text(), gw.log());
            assert_eq!(r.json()["choices"][0]["message"]["content"], want.as_str());
        }
        let after = (count(&e1), count(&e2));
        let moved = (after.0 - before.0, after.1 - before.1);
        assert!(
            moved == (3, 0) || moved == (0, 3),
            "{rgb:?} spread over encoders: {moved:?}"
        );
    }
    drop(gw);

    let gw = epd_gateway(&workers, family, "  mm_processing: worker\n").await;
    let png = image(RED, 30, 30, false);
    let r = gw
        .post(
            "/v1/chat/completions",
            &chat(vec![image_part(&data_url(&png, "image/png"))], 4),
        )
        .await;
    assert_eq!(r.status, 400, "{}", r.text());
    assert_eq!(error_code(&r), "multimodal_not_supported");
}

/// EPD readiness needs an encode worker; EPD refuses HTTP workers at startup, and encode
/// workers need EPD mode.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn epd_startup_rules_and_readiness() {
    let family = VisionFamily::Llava;
    let kind = EngineKind::TokenSpeed;
    let (p, d) = pair(kind, family, ([127, 0, 104, 1], [127, 0, 104, 2])).await;
    let extra = format!(
        "  pd_disaggregation: false\n  epd_disaggregation: true\n  model_path: {}\n",
        model_dir(family).display()
    );
    let gw = Gateway::start(&[p.worker_spec(), d.worker_spec()], &extra).await;
    // Prefill and decode alone are not enough in EPD mode.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let r = gw.get("/readiness").await;
        let v = r.json();
        if v["prefill_healthy"] == 1 && v["decode_healthy"] == 1 {
            assert_eq!(r.status, 503, "{}", r.text());
            assert_eq!(v["encode_healthy"], 0);
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "{}", r.text());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // An encode worker registered through the worker API makes it ready.
    let e = engine(kind, Role::Encode, [127, 0, 104, 3], Some(tower(family))).await;
    let r = gw.post("/workers", &e.worker_spec()).await;
    assert!(r.status < 300, "{}", r.text());
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while gw.get("/readiness").await.status != 200 {
        assert!(tokio::time::Instant::now() < deadline, "{}", gw.log());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    drop(gw);

    let out = std::process::Command::new(crate::harness::pdgate_bin())
        .args([
            "launch",
            "--epd-disaggregation",
            "--encode",
            "http://127.0.0.1:1",
            "8995",
        ])
        .args([
            "--prefill",
            "http://127.0.0.1:2",
            "--decode",
            "http://127.0.0.1:3",
        ])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("EPD runs only over gRPC"), "{err}");
    let out = std::process::Command::new(crate::harness::pdgate_bin())
        .args([
            "launch",
            "--pd-disaggregation",
            "--encode",
            "grpc://127.0.0.1:1",
        ])
        .args([
            "--prefill",
            "grpc://127.0.0.1:2",
            "--decode",
            "grpc://127.0.0.1:3",
        ])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("--epd-disaggregation"), "{err}");
}

/// EPD abort: while an encoder holds its item, the ledger shows the encode room (encoder →
/// prefill); when the client leaves, the encode call is cancelled, the prefill and decode
/// legs are dropped, and every rendezvous closes. The worker API lists the encode worker and
/// the selection metric counts the encode leg.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn epd_client_leaving_cancels_every_leg() {
    let family = VisionFamily::Llava;
    let kind = EngineKind::TokenSpeed;
    let e = engine(kind, Role::Encode, [127, 0, 104, 5], Some(tower(family))).await;
    // The prefill waits for its embedding longer than the client does.
    let mut cfg = MockEngineConfig::grpc_test(kind, Role::Prefill, [127, 0, 104, 6])
        .with_vocab(vocab())
        .with_vision(tower(family));
    cfg.bootstrap_timeout = Duration::from_secs(60);
    cfg.waiting_timeout = Duration::from_secs(60);
    let p = MockEngine::spawn(cfg).await.expect("spawn the prefill");
    let mut cfg = MockEngineConfig::grpc_test(kind, Role::Decode, [127, 0, 104, 7])
        .with_vocab(vocab())
        .with_vision(tower(family));
    cfg.bootstrap_timeout = Duration::from_secs(60);
    cfg.waiting_timeout = Duration::from_secs(60);
    let d = MockEngine::spawn(cfg).await.expect("spawn the decode");
    let workers = [e.worker_spec(), p.worker_spec(), d.worker_spec()];
    let gw = epd_gateway(&workers, family, "").await;
    let listed = gw.get("/workers").await.json();
    assert_eq!(listed["stats"]["encode_count"], 1, "{listed}");
    e.inject(mock_engine::Fault::Hang {
        count: Some(1),
        matcher: mock_engine::FaultMatch {
            route: Some("/tokenspeed.grpc.encoder.TokenSpeedEncoder/Encode".into()),
            role: None,
        },
    })
    .await;
    let png = image(BLUE, 30, 30, false);
    let body = chat(vec![image_part(&data_url(&png, "image/png"))], 4);
    let watch = async {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(8);
        loop {
            let h = gw.get("/debug/handoffs").await.json();
            let kinds: Vec<String> = h["handoffs"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|x| x["kind"].as_str().unwrap_or("").to_string())
                .collect();
            if kinds.iter().any(|k| k == "encode_room") {
                return h;
            }
            assert!(tokio::time::Instant::now() < deadline, "{h}");
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    };
    let gw_log = || gw.log();
    let (gave_up, seen) = tokio::join!(
        gw.post_and_give_up("/v1/chat/completions", &body, Duration::from_secs(6)),
        async {
            let seen = watch.await;
            seen
        }
    );
    let room = seen["handoffs"]
        .as_array()
        .unwrap()
        .iter()
        .find(|x| x["kind"] == "encode_room")
        .cloned()
        .unwrap();
    assert_eq!(room["encode"], e.worker_spec()["url"], "{room}");
    assert_eq!(room["prefill"], p.worker_spec()["url"], "{room}");
    // The client gives up after its patience: the prefill waits on an embedding that never
    // comes, so nothing answers before that.
    assert!(
        gave_up.is_err(),
        "the request answered: {gave_up:?}\n{:?}\n{:?}",
        p.records()
            .iter()
            .map(|r| (&r.outcome, &r.handoff.timeline))
            .collect::<Vec<_>>(),
        d.records()
            .iter()
            .map(|r| (&r.outcome, &r.handoff.timeline))
            .collect::<Vec<_>>()
    );
    let _ = gw_log;
    gw.saw_a_client_leave().await;
    let closed = mock_engine::wait_until(Duration::from_secs(10), || {
        e.records()
            .iter()
            .any(|r| r.encode.is_some() && r.outcome.cancelled)
    })
    .await;
    assert!(
        closed,
        "the encode call was not cancelled: {:?}",
        e.records()
    );
    // The prefill (waiting for its embedding) was dropped at once: its call ended by the
    // gateway, which sent the engine an Abort for it. (The decode, waiting for its KV, is
    // dropped at its first message or after the deferred-abort bound, as in PD.)
    for (leg, engine) in [("prefill", &p)] {
        let ended = mock_engine::wait_until(Duration::from_secs(10), || {
            let records = engine.records();
            !records.is_empty()
                && records
                    .iter()
                    .all(|r| r.outcome.cancelled || r.outcome.aborted)
                && !engine.aborts().is_empty()
        })
        .await;
        assert!(
            ended,
            "the {leg} leg was not dropped: {:?}\n{:?}",
            engine
                .records()
                .iter()
                .map(|r| &r.outcome)
                .collect::<Vec<_>>(),
            engine.aborts()
        );
    }
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let h = gw.get("/debug/handoffs").await.json();
        if h["open"] == 0 {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "{h}");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    let m = gw.metrics().await;
    assert!(
        m.lines()
            .any(|l| l.starts_with("smg_worker_selection_total")
                && l.contains("worker_type=\"encode\"")),
        "{m}"
    );
}

/// `n > 1` with an image on TokenSpeed fans out like text: one room per sample, the pixels on
/// each sample's prefill, none on the decodes, and each choice is its sample's reference (the
/// pinned seed offset by the sample index).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn image_samples_fan_out_with_pixels_on_each_prefill() {
    let family = VisionFamily::Qwen2Vl;
    let (p, d, gw) = pd_fleet(
        EngineKind::TokenSpeed,
        family,
        ([127, 0, 104, 9], [127, 0, 104, 10]),
    )
    .await;
    let png = image(RED, 56, 56, false);
    let parts = vec![
        image_part(&data_url(&png, "image/png")),
        text_part("Twice."),
    ];
    let mut body = chat(parts.clone(), 6);
    body["n"] = json!(2);
    body["seed"] = json!(7);
    let r = gw.post("/v1/chat/completions", &body).await;
    assert_eq!(r.status, 200, "{}\n{}", r.text(), gw.log());
    let v = r.json();
    for i in 0..2u64 {
        let want = expected_seeded(&d, family, &parts, &[(RED, 4)], 6, Some(7 + i));
        let i = i as usize;
        assert_eq!(
            v["choices"][i]["message"]["content"],
            want.as_str(),
            "sample {i}"
        );
    }
    assert_ne!(
        v["choices"][0]["message"]["content"],
        v["choices"][1]["message"]["content"]
    );
    let (pm, dm) = (mm_of(&p), mm_of(&d));
    assert_eq!((pm.len(), dm.len()), (2, 2), "{pm:?}\n{dm:?}");
    assert!(pm.iter().all(|m| m.pixels) && dm.iter().all(|m| !m.pixels));
}
