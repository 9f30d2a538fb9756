//! The gRPC mocks: a client drives both legs of a PD pair by hand, the way a gateway must, and
//! gets exactly the single-worker reference; broken legs fail the way the engines' servicers
//! fail. Also the per-engine wire rules, header timing, `Abort`, faults and the info RPCs.

use crate::common;

use std::time::{Duration, Instant};

use common::grpc::*;
use common::SECS;
use mock_engine::{
    wire_output_ids, EngineKind, Fault, FaultMatch, GrpcCode, MockEngine, MockEngineConfig,
    OutputVocab, Role, SamplingSpec,
};
use tonic::Code;

const PROMPT: [u32; 6] = [1, 501, 502, 503, 504, 505];

fn spec(e: &MockEngine, max_new: usize) -> SamplingSpec {
    SamplingSpec {
        max_new_tokens: max_new,
        ..e.sampling_spec()
    }
}

// ---------------------------------------------------------------------------------------------
// SGLang

#[tokio::test]
async fn sglang_grpc_pd_pair_reproduces_the_reference() {
    let p = grpc_engine(EngineKind::Sglang, Role::Prefill, [127, 0, 3, 1]).await;
    let d = grpc_engine(EngineKind::Sglang, Role::Decode, [127, 0, 3, 2]).await;
    let both = grpc_engine(EngineKind::Sglang, Role::Both, [127, 0, 3, 3]).await;
    let reference = d.reference(&PROMPT, &spec(&d, 8), None);
    assert_eq!(reference.token_ids.len(), 8);
    assert!(reference.token_ids.iter().all(|t| (1000..1100).contains(t)));
    let (mut pc, mut dc, mut bc) = (
        sglang_client(&p).await,
        sglang_client(&d).await,
        sglang_client(&both).await,
    );
    for stream in [false, true] {
        let room = room32();
        let mut req = sglang_request(&format!("rid-{stream}"), &PROMPT, 8, stream);
        sglang_pd(&mut req, &p, room);
        let (pr, dr) = tokio::join!(
            collect(pc.generate(req.clone())),
            collect(dc.generate(req.clone()))
        );
        let (pchunks, pcomplete) = sglang_parts(pr.expect("prefill leg"));
        let (dchunks, dcomplete) = sglang_parts(dr.expect("decode leg"));
        // The prefill answers with t0 at length 0 once the KV is with the decode.
        assert_eq!(pcomplete.len(), 1);
        assert_eq!(pcomplete[0].output_ids, vec![reference.token_ids[0]]);
        assert_eq!(pcomplete[0].finish_reason, "length");
        assert_eq!(pchunks.len(), usize::from(stream));
        // The decode's tokens are the reference's.
        assert_eq!(dcomplete.len(), 1);
        let c = &dcomplete[0];
        assert_eq!(c.finish_reason, "length");
        assert_eq!(c.completion_tokens, 8);
        assert_eq!(c.prompt_tokens, PROMPT.len() as u32);
        assert_eq!(c.matched_stop, None);
        if stream {
            let ids: Vec<u32> = dchunks.iter().flat_map(|c| c.token_ids.clone()).collect();
            assert_eq!(ids, reference.token_ids);
            // Running totals per chunk; the complete repeats the last delta.
            let totals: Vec<u32> = dchunks.iter().map(|c| c.completion_tokens).collect();
            assert_eq!(totals, (1..=8).collect::<Vec<u32>>());
            assert_eq!(c.output_ids, vec![*reference.token_ids.last().unwrap()]);
        } else {
            assert!(dchunks.is_empty());
            assert_eq!(c.output_ids, reference.token_ids);
        }
        // The single worker agrees.
        let single = collect(bc.generate(sglang_request("solo", &PROMPT, 8, false)))
            .await
            .unwrap();
        assert_eq!(sglang_parts(single).1[0].output_ids, reference.token_ids);
    }
    let precs = p.wait_records(2, SECS).await;
    let drecs = d.wait_records(2, SECS).await;
    for (pr, dr) in precs.iter().zip(&drecs) {
        assert_eq!(pr.handoff.room, dr.handoff.room);
        assert_eq!(
            dr.handoff.peer_addr,
            Some(format!("{}:{}", p.host(), p.bootstrap_port().unwrap()))
        );
        assert_eq!(dr.handoff.kv_source.as_deref(), Some("remote"));
        assert_eq!(dr.handoff.items[0].integrity.as_deref(), Some("ok"));
        assert_eq!(dr.outcome.grpc_code.as_deref(), Some("OK"));
        let g = dr.grpc.as_ref().expect("a gRPC record");
        assert_eq!(g.input_ids, PROMPT.to_vec());
        assert_eq!(g.sampling.max_new_tokens, Some(8));
        assert_eq!(
            g.bootstrap.as_ref().map(|b| b.room),
            pr.grpc.as_ref().unwrap().bootstrap.as_ref().map(|b| b.room)
        );
        assert_eq!(dr.path, "/sglang.grpc.scheduler.SglangScheduler/Generate");
        assert!(!dr.outcome.cancelled && !dr.outcome.aborted);
    }
    assert!(p.wait_idle(SECS).await && d.wait_idle(SECS).await);
}

#[tokio::test]
async fn sglang_grpc_legs_in_different_rooms_time_out() {
    let p = grpc_engine(EngineKind::Sglang, Role::Prefill, [127, 0, 3, 4]).await;
    let d = grpc_engine(EngineKind::Sglang, Role::Decode, [127, 0, 3, 5]).await;
    let (mut pc, mut dc) = (sglang_client(&p).await, sglang_client(&d).await);
    let mut preq = sglang_request("rid-rooms", &PROMPT, 4, true);
    let mut dreq = preq.clone();
    sglang_pd(&mut preq, &p, 11);
    sglang_pd(&mut dreq, &p, 12);
    let t0 = Instant::now();
    let (pr, dr) = tokio::join!(collect(pc.generate(preq)), collect(dc.generate(dreq)));
    let (pe, de) = (pr.unwrap_err(), dr.unwrap_err());
    assert_eq!((pe.code(), de.code()), (Code::Internal, Code::Internal));
    assert!(
        pe.message()
            .contains("Request 11 timed out after 2s in KVPoll.Bootstrapping"),
        "{pe:?}"
    );
    assert!(
        de.message()
            .contains("Request 12 timed out after 2s in KVPoll.WaitingForInput"),
        "{de:?}"
    );
    assert!(t0.elapsed() >= Duration::from_millis(1900));
    let dr = &d.wait_records(1, SECS).await[0];
    assert_eq!(dr.outcome.grpc_code.as_deref(), Some("INTERNAL"));
    assert_eq!(dr.outcome.head_at_ms, None, "nothing was sent: no headers");
    assert!(p.wait_idle(SECS).await && d.wait_idle(SECS).await);
}

#[tokio::test]
async fn sglang_grpc_decode_pointed_at_a_wrong_host_fails() {
    let p = grpc_engine(EngineKind::Sglang, Role::Prefill, [127, 0, 3, 6]).await;
    let d = grpc_engine(EngineKind::Sglang, Role::Decode, [127, 0, 3, 7]).await;
    // The same decode with the knob that reports a rendezvous that never completed as
    // UNAVAILABLE.
    let mut cfg = grpc_config(EngineKind::Sglang, Role::Decode, [127, 0, 3, 8]);
    cfg.grpc.kv_timeout_code = GrpcCode::Unavailable;
    let d2 = MockEngine::spawn(cfg).await.unwrap();
    let mut req = sglang_request("rid-host", &PROMPT, 4, false);
    sglang_pd(&mut req, &p, room32());
    req.disaggregated_params.as_mut().unwrap().bootstrap_host = "127.0.3.99".into();
    let addr = format!("127.0.3.99:{}", p.bootstrap_port().unwrap());
    for (e, code) in [(&d, Code::Internal), (&d2, Code::Unavailable)] {
        let err = collect(sglang_client(e).await.generate(req.clone()))
            .await
            .unwrap_err();
        assert_eq!(err.code(), code);
        assert_eq!(
            err.message(),
            format!("Could not fetch prefill parallel info from {addr} after 3 attempts")
        );
    }
    assert_eq!(d.records()[0].handoff.peer_addr.as_deref(), Some(&*addr));
    // SGLang's warmup host: no transfer, the decode runs over KV that never arrived.
    let mut fake = sglang_request("rid-fake", &PROMPT, 6, false);
    fake.disaggregated_params = Some(sglang::DisaggregatedParams {
        bootstrap_host: "2.2.2.2".into(),
        bootstrap_port: 8998,
        bootstrap_room: 1,
    });
    let (_, c) = sglang_parts(
        collect(sglang_client(&d).await.generate(fake))
            .await
            .unwrap(),
    );
    assert_eq!(c[0].output_ids.len(), 6);
    assert_ne!(
        c[0].output_ids,
        d.reference(&PROMPT, &spec(&d, 6), None).token_ids,
        "garbage is never the reference"
    );
    let rec = d.records().pop().unwrap();
    assert_eq!(rec.handoff.kv_source.as_deref(), Some("fake"));
    // A decode leg without a host is refused outright.
    req.disaggregated_params.as_mut().unwrap().bootstrap_host = String::new();
    let err = collect(sglang_client(&d).await.generate(req))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert_eq!(
        err.message(),
        "Invalid request: Disaggregated request received without bootstrap host."
    );
}

#[tokio::test]
async fn sglang_grpc_refuses_what_a_skip_tokenizer_init_worker_refuses() {
    let d = grpc_engine(EngineKind::Sglang, Role::Decode, [127, 0, 3, 9]).await;
    let mut c = sglang_client(&d).await;
    let mut req = sglang_request("rid-stop", &PROMPT, 4, true);
    req.disaggregated_params = Some(sglang::DisaggregatedParams {
        bootstrap_host: "127.0.3.99".into(),
        bootstrap_port: 8998,
        bootstrap_room: room32(),
    });
    req.sampling_params.as_mut().unwrap().stop = vec!["</s>".into(), "it's".into()];
    let err = collect(c.generate(req.clone())).await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert_eq!(
        err.message(),
        r#"stop=['</s>', "it's"] is unavailable when skip_tokenizer_init=True (requires tokenizer to decode tokens to text for matching)."#
    );
    let mut req2 = req.clone();
    req2.sampling_params.as_mut().unwrap().stop.clear();
    req2.sampling_params.as_mut().unwrap().min_new_tokens = 2;
    let err = collect(c.generate(req2)).await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(err.message().starts_with("min_new_tokens=2 is unavailable"));
    // No room on a PD leg, no tokenized input.
    let mut req3 = sglang_request("rid-noroom", &PROMPT, 4, true);
    let err = collect(c.generate(req3.clone())).await.unwrap_err();
    assert_eq!(
        (err.code(), err.message()),
        (
            Code::InvalidArgument,
            "Invalid request: Disaggregated request received without bootstrap room id."
        )
    );
    req3.tokenized = None;
    let err = collect(c.generate(req3)).await.unwrap_err();
    assert_eq!(
        (err.code(), err.message()),
        (Code::InvalidArgument, "Tokenized input must be provided")
    );
    // Every refusal is recorded, with the request as sent.
    let recs = d.wait_records(4, SECS).await;
    assert_eq!(recs.len(), 4);
    assert!(recs
        .iter()
        .all(|r| r.outcome.grpc_code.as_deref() == Some("INVALID_ARGUMENT")));
    assert_eq!(
        recs[0].grpc.as_ref().unwrap().sampling.stop,
        vec!["</s>".to_string(), "it's".to_string()]
    );
    // A servicer with a tokenizer takes the string stop.
    let mut cfg = grpc_config(EngineKind::Sglang, Role::Both, [127, 0, 3, 10]);
    cfg.grpc.skip_tokenizer_init = false;
    let both = MockEngine::spawn(cfg).await.unwrap();
    let mut req4 = sglang_request("rid-ok", &PROMPT, 4, false);
    req4.sampling_params.as_mut().unwrap().stop = vec!["</s>".into()];
    assert!(collect(sglang_client(&both).await.generate(req4))
        .await
        .is_ok());
}

#[tokio::test]
async fn grpc_response_headers_go_out_with_the_first_message() {
    // Each "at once" below is bounded by half the first token's delay: a loaded machine's
    // stall must not pass for a deferred header, nor fail an immediate one.
    const TTFT: Duration = Duration::from_millis(1000);
    const AT_ONCE: Duration = Duration::from_millis(500);
    let slow = MockEngineConfig {
        ttft_ms: TTFT.as_millis() as u64,
        ..grpc_config(EngineKind::Sglang, Role::Both, [127, 0, 3, 11])
    };
    let deferred = MockEngine::spawn(slow.clone()).await.unwrap();
    let mut eager_cfg = slow;
    eager_cfg.bind_ip = [127, 0, 3, 12].into();
    eager_cfg.grpc.headers_at_once = true;
    let eager = MockEngine::spawn(eager_cfg).await.unwrap();

    // grpc.aio: `generate().await` returns only when the first message is ready.
    let mut c = sglang_client(&deferred).await;
    let t0 = Instant::now();
    let resp = c
        .generate(sglang_request("rid-late", &PROMPT, 3, true))
        .await
        .expect("the call starts");
    let headers_after = t0.elapsed();
    assert!(headers_after >= TTFT - AT_ONCE / 10, "{headers_after:?}");
    let mut s = resp.into_inner();
    let first = s.message().await.unwrap().expect("a first message");
    assert!(first.response.is_some());
    assert!(
        t0.elapsed() - headers_after < AT_ONCE,
        "the first message came with the headers"
    );
    let rec = &deferred.wait_records(1, SECS).await[0];
    let head = rec.outcome.head_at_ms.unwrap();
    assert!(
        head - rec.arrive_ms >= (TTFT - AT_ONCE / 10).as_millis() as f64,
        "{rec:?}"
    );

    // The knob: headers at once, the first message later.
    let mut c = sglang_client(&eager).await;
    let t0 = Instant::now();
    let resp = c
        .generate(sglang_request("rid-eager", &PROMPT, 3, true))
        .await
        .expect("the call starts");
    assert!(t0.elapsed() < AT_ONCE);
    let mut s = resp.into_inner();
    s.message().await.unwrap().expect("a first message");
    assert!(t0.elapsed() >= TTFT - AT_ONCE / 10);

    // A refusal before any message is trailers-only: the call itself fails.
    let mut bad = sglang_request("rid-bad", &PROMPT, 3, true);
    bad.tokenized = None;
    let err = sglang_client(&deferred)
        .await
        .generate(bad)
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
}

#[tokio::test]
async fn sglang_grpc_abort_ends_a_waiting_decode_and_is_recorded() {
    let d = grpc_engine(EngineKind::Sglang, Role::Decode, [127, 0, 3, 13]).await;
    let p = grpc_engine(EngineKind::Sglang, Role::Prefill, [127, 0, 3, 14]).await;
    let mut req = sglang_request("rid-abort", &PROMPT, 4, true);
    sglang_pd(&mut req, &p, room32());
    // Only the decode leg is sent: it waits for KV that never comes.
    let mut dc = sglang_client(&d).await;
    let call = tokio::spawn(async move { collect(dc.generate(req)).await });
    assert!(
        d.wait_for(SECS, |e| e.stats().requests_in_flight == 1)
            .await
    );
    tokio::time::sleep(Duration::from_millis(50)).await;
    let resp = sglang_client(&d)
        .await
        .abort(sglang::AbortRequest {
            request_id: "rid-abort".into(),
            reason: "Stream dropped".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert!(resp.success);
    assert_eq!(resp.message, "Request rid-abort aborted");
    let err = call.await.unwrap().unwrap_err();
    assert_eq!(
        (err.code(), err.message()),
        (Code::Internal, "Request aborted")
    );
    let rec = &d.wait_records(1, SECS).await[0];
    assert!(rec.outcome.aborted && !rec.outcome.cancelled, "{rec:?}");
    assert_eq!(rec.outcome.grpc_code.as_deref(), Some("INTERNAL"));
    let aborts = d.aborts();
    assert_eq!(aborts.len(), 1);
    assert_eq!(aborts[0].request_ids, vec!["rid-abort".to_string()]);
    assert_eq!(aborts[0].reason.as_deref(), Some("Stream dropped"));
    assert_eq!(aborts[0].aborted_seqs, vec![rec.seq]);
    // An abort for an id nobody runs is still recorded (and still "succeeds", as SGLang's).
    let resp = sglang_client(&d)
        .await
        .abort(sglang::AbortRequest {
            request_id: "nobody".into(),
            reason: String::new(),
        })
        .await
        .unwrap()
        .into_inner();
    assert!(resp.success);
    assert_eq!(d.aborts()[1].aborted_seqs, Vec::<u64>::new());
    assert!(d.wait_idle(SECS).await);
}

#[tokio::test]
async fn grpc_client_hang_up_is_recorded_as_cancelled() {
    let cfg = MockEngineConfig {
        itl_ms: 50,
        ..grpc_config(EngineKind::Sglang, Role::Both, [127, 0, 3, 15])
    };
    let e = MockEngine::spawn(cfg).await.unwrap();
    let mut c = sglang_client(&e).await;
    let mut s = c
        .generate(sglang_request("rid-gone", &PROMPT, 50, true))
        .await
        .unwrap()
        .into_inner();
    s.message().await.unwrap().unwrap();
    drop(s);
    let rec = &e.wait_records(1, SECS).await[0];
    assert!(rec.outcome.cancelled && !rec.outcome.aborted, "{rec:?}");
    assert_eq!(rec.outcome.grpc_code, None);
    assert!(e.aborts().is_empty());
    assert!(e.wait_idle(SECS).await);
}

#[tokio::test]
async fn grpc_faults_fail_start_fail_mid_stream_and_hang() {
    let e = grpc_engine(EngineKind::Sglang, Role::Both, [127, 0, 3, 16]).await;
    let mut c = sglang_client(&e).await;
    e.inject(Fault::GrpcStatus {
        code: GrpcCode::ResourceExhausted,
        message: Some("busy".into()),
        count: Some(1),
        matcher: FaultMatch::default(),
    })
    .await;
    let err = collect(c.generate(sglang_request("f1", &PROMPT, 4, true)))
        .await
        .unwrap_err();
    assert_eq!(
        (err.code(), err.message()),
        (Code::ResourceExhausted, "busy")
    );
    // An HTTP-status fault maps through the servicer's table (SGLang: 503 -> UNAVAILABLE).
    e.inject(Fault::FailStatus {
        status: 503,
        body: None,
        count: Some(1),
        matcher: FaultMatch::default(),
    })
    .await;
    let err = collect(c.generate(sglang_request("f2", &PROMPT, 4, true)))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::Unavailable);

    // Mid-stream: k chunks, then the status.
    e.inject(Fault::FailAfterTokens {
        tokens: 3,
        code: GrpcCode::Internal,
        message: None,
        count: Some(1),
        matcher: FaultMatch::default(),
    })
    .await;
    let mut s = c
        .generate(sglang_request("f3", &PROMPT, 10, true))
        .await
        .unwrap()
        .into_inner();
    let mut chunks = 0;
    let err = loop {
        match s.message().await {
            Ok(Some(_)) => chunks += 1,
            Ok(None) => panic!("the stream ended without the fault"),
            Err(e) => break e,
        }
    };
    assert_eq!(chunks, 3);
    assert_eq!(err.code(), Code::Internal);

    // Hang: nothing, not even headers, until the client gives up.
    e.inject(Fault::Hang {
        count: Some(1),
        matcher: FaultMatch {
            route: Some("/sglang.grpc.scheduler.SglangScheduler/Generate".into()),
            role: None,
        },
    })
    .await;
    let mut c2 = c.clone();
    let hung = tokio::time::timeout(
        Duration::from_millis(300),
        c2.generate(sglang_request("f4", &PROMPT, 4, true)),
    )
    .await;
    assert!(hung.is_err(), "a hung call never starts");
    let recs = e.wait_records(4, SECS).await;
    let r = recs
        .iter()
        .find(|r| r.grpc.as_ref().unwrap().request_id == "f4");
    let r = r.expect("the hung call is recorded");
    assert!(r.outcome.cancelled);
    assert!(r.handoff.timeline.iter().any(|(_, ev)| ev == "fault:hang"));
    // The next call is served again.
    assert!(collect(c.generate(sglang_request("f5", &PROMPT, 2, false)))
        .await
        .is_ok());
}

#[tokio::test]
async fn sglang_grpc_n_samples_interleave_with_their_index() {
    let e = MockEngine::spawn(MockEngineConfig {
        itl_ms: 1,
        ..grpc_config(EngineKind::Sglang, Role::Both, [127, 0, 3, 17])
    })
    .await
    .unwrap();
    let mut req = sglang_request("rid-n", &PROMPT, 5, true);
    req.sampling_params.as_mut().unwrap().n = 3;
    let (chunks, completes) = sglang_parts(
        collect(sglang_client(&e).await.generate(req.clone()))
            .await
            .unwrap(),
    );
    assert_eq!(completes.len(), 3);
    for i in 0..3u32 {
        let want = e
            .reference(&PROMPT, &spec(&e, 5), Some(i as usize))
            .token_ids;
        let got: Vec<u32> = chunks
            .iter()
            .filter(|c| c.index == i)
            .flat_map(|c| c.token_ids.clone())
            .collect();
        assert_eq!(got, want, "sample {i}");
    }
    let mut indexes: Vec<u32> = completes.iter().map(|c| c.index).collect();
    indexes.sort();
    assert_eq!(indexes, vec![0, 1, 2]);
    // Non-stream: one complete per index, in index order.
    req.stream = false;
    let (_, completes) = sglang_parts(
        collect(sglang_client(&e).await.generate(req))
            .await
            .unwrap(),
    );
    assert_eq!(
        completes.iter().map(|c| c.index).collect::<Vec<_>>(),
        vec![0, 1, 2]
    );
    assert_eq!(
        completes[2].output_ids,
        e.reference(&PROMPT, &spec(&e, 5), Some(2)).token_ids
    );
}

#[tokio::test]
async fn sglang_grpc_info_rpcs_describe_the_engine() {
    let mut cfg = grpc_config(EngineKind::Sglang, Role::Prefill, [127, 0, 3, 18]);
    cfg.dp_size = 2;
    cfg.tokenizer_path = Some("/fixtures/tok".into());
    cfg.max_model_len = 4096;
    cfg.max_running_requests = 17;
    let p = MockEngine::spawn(cfg).await.unwrap();
    let mut c = sglang_client(&p).await;
    let h = c
        .health_check(sglang::HealthCheckRequest {})
        .await
        .unwrap()
        .into_inner();
    assert!(h.healthy);
    let m = c
        .get_model_info(sglang::GetModelInfoRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(m.served_model_name, "mock-model");
    assert_eq!(m.max_context_length, 4096);
    assert_eq!(m.eos_token_ids, vec![7]);
    assert_eq!(m.tokenizer_path, "/fixtures/tok");
    assert_eq!(m.vocab_size, 1100);
    let s = c
        .get_server_info(sglang::GetServerInfoRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(s.server_type, "grpc");
    assert!(!s.sglang_version.is_empty());
    let args = mock_engine::struct_to_json(s.server_args.as_ref().unwrap());
    assert_eq!(args["disaggregation_mode"], "prefill");
    assert_eq!(args["disaggregation_transfer_backend"], "mooncake");
    assert_eq!(
        args["disaggregation_bootstrap_port"],
        p.bootstrap_port().unwrap()
    );
    assert_eq!(args["max_running_requests"], 17);
    assert_eq!(args["dp_size"], 2);
    assert_eq!(args["tp_size"], 1);
    assert_eq!(args["page_size"], 1);
    assert_eq!(args["kv_cache_dtype"], "auto");
    assert_eq!(args["context_length"], 4096);
    // Loads: one row per DP rank; a waiting prefill leg shows up live.
    let mut req = sglang_request("rid-load", &PROMPT, 2, false);
    sglang_pd(&mut req, &p, 4); // rank 0; no decode comes
    let mut c2 = c.clone();
    let waiting = tokio::spawn(async move { collect(c2.generate(req)).await });
    assert!(p.wait_for(SECS, |e| e.rooms().len() == 1).await);
    let l = c
        .get_loads(sglang::GetLoadsRequest {
            dp_rank: None,
            include: vec![
                "core".into(),
                "disagg".into(),
                "queues".into(),
                "memory".into(),
            ],
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(l.dp_rank_count, 2);
    assert_eq!(l.loads[0].max_running_requests, 17);
    assert_eq!(l.loads[0].num_waiting_reqs, 1);
    assert_eq!(l.loads[0].num_running_reqs, 0);
    assert_eq!(l.loads[0].disaggregation.as_ref().unwrap().mode, "prefill");
    assert_eq!(
        l.loads[0]
            .disaggregation
            .as_ref()
            .unwrap()
            .prefill_prealloc_queue_reqs,
        1
    );
    assert_eq!(l.loads[0].queues.as_ref().unwrap().waiting, 1);
    assert!(l.loads[0].speculative.is_none());
    assert_eq!(l.aggregate.as_ref().unwrap().total_waiting_reqs, 1);
    let err = c
        .get_loads(sglang::GetLoadsRequest {
            dp_rank: None,
            include: vec!["bogus".into()],
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    waiting.abort();
    // Unhealthy on demand; the counters saw every RPC.
    p.inject(Fault::Unhealthy).await;
    let h = c
        .health_check(sglang::HealthCheckRequest {})
        .await
        .unwrap()
        .into_inner();
    assert!(!h.healthy);
    let stats = p.stats();
    assert_eq!(stats.rpc_calls["HealthCheck"], 2);
    assert_eq!(stats.rpc_calls["GetLoads"], 2);
    p.reset().await;
    assert!(
        c.health_check(sglang::HealthCheckRequest {})
            .await
            .unwrap()
            .into_inner()
            .healthy
    );
}

// ---------------------------------------------------------------------------------------------
// TokenSpeed

#[tokio::test]
async fn tokenspeed_grpc_pd_pair_reproduces_the_reference_with_a_63_bit_room() {
    let p = grpc_engine(EngineKind::TokenSpeed, Role::Prefill, [127, 0, 4, 1]).await;
    let d = grpc_engine(EngineKind::TokenSpeed, Role::Decode, [127, 0, 4, 2]).await;
    let (mut pc, mut dc) = (tokenspeed_client(&p).await, tokenspeed_client(&d).await);
    let room = room63() | (1 << 62); // well past int32
    for (stream, seed) in [(true, None), (false, Some(42u64))] {
        let mut req = tokenspeed_request("ts-1", &PROMPT, 6, stream);
        req.sampling_params.as_mut().unwrap().sampling_seed = seed;
        tokenspeed_pd(&mut req, &p, room + i64::from(stream));
        let (pr, dr) = tokio::join!(
            collect(pc.generate(req.clone())),
            collect(dc.generate(req.clone()))
        );
        let (_, pcomplete) = tokenspeed_parts(pr.expect("prefill leg"));
        let (dchunks, dcomplete) = tokenspeed_parts(dr.expect("decode leg"));
        let want = d.reference(
            &PROMPT,
            &SamplingSpec {
                seed,
                ..spec(&d, 6)
            },
            None,
        );
        assert_eq!(pcomplete[0].output_ids, vec![want.token_ids[0]]);
        let got: Vec<u32> = if stream {
            dchunks.iter().flat_map(|c| c.token_ids.clone()).collect()
        } else {
            dcomplete[0].output_ids.clone()
        };
        assert_eq!(got, wire_output_ids(EngineKind::TokenSpeed, &want, false));
        assert_eq!(dcomplete[0].completion_tokens, 6);
        if stream {
            assert_eq!(
                dchunks
                    .iter()
                    .map(|c| c.completion_tokens)
                    .collect::<Vec<_>>(),
                (1..=6).collect::<Vec<u32>>(),
                "running totals"
            );
        }
    }
    // The seed is honoured: it changes the output.
    assert_ne!(
        d.reference(&PROMPT, &spec(&d, 6), None).token_ids,
        d.reference(
            &PROMPT,
            &SamplingSpec {
                seed: Some(42),
                ..spec(&d, 6)
            },
            None
        )
        .token_ids
    );
    let drecs = d.wait_records(2, SECS).await;
    assert_eq!(
        drecs[0]
            .grpc
            .as_ref()
            .unwrap()
            .bootstrap
            .as_ref()
            .unwrap()
            .room,
        room + 1
    );
    assert_eq!(drecs[0].handoff.room, Some((room + 1) as u64));
    assert_eq!(drecs[1].grpc.as_ref().unwrap().sampling.seed, Some(42));
    assert_eq!(
        drecs[0].path,
        "/tokenspeed.grpc.scheduler.TokenSpeedScheduler/Generate"
    );
    assert!(p.wait_idle(SECS).await && d.wait_idle(SECS).await);
}

#[tokio::test]
async fn tokenspeed_grpc_places_the_room_on_room_mod_dp_size() {
    let mut cfg = grpc_config(EngineKind::TokenSpeed, Role::Prefill, [127, 0, 4, 3]);
    cfg.dp_size = 2;
    let p = MockEngine::spawn(cfg).await.unwrap();
    let d = grpc_engine(EngineKind::TokenSpeed, Role::Decode, [127, 0, 4, 4]).await;
    let (mut pc, mut dc) = (tokenspeed_client(&p).await, tokenspeed_client(&d).await);
    let room = (room63() | 1) & !(1 << 62); // odd: rank 1
    let mut req = tokenspeed_request("ts-dp", &PROMPT, 3, false);
    tokenspeed_pd(&mut req, &p, room);
    let (pr, dr) = tokio::join!(
        collect(pc.generate(req.clone())),
        collect(dc.generate(req.clone()))
    );
    assert!(pr.is_ok() && dr.is_ok());
    let prec = &p.wait_records(1, SECS).await[0];
    assert_eq!(prec.handoff.items[0].dp_rank, Some(1));
    // A pin that disagrees with the room fails the prefill (follow_bootstrap_room).
    let mut pinned = tokenspeed_request("ts-pin", &PROMPT, 3, false);
    tokenspeed_pd(&mut pinned, &p, room);
    pinned.data_parallel_rank = Some(0);
    let err = collect(pc.generate(pinned)).await.unwrap_err();
    assert_eq!(err.code(), Code::Internal);
    assert!(
        err.message()
            .starts_with("follow_bootstrap_room conflict: dispatched to dp_rank 0"),
        "{err:?}"
    );
    // No kv_bootstrap_info on a PD leg, an empty prompt: refused.
    let err = collect(pc.generate(tokenspeed_request("ts-no", &PROMPT, 3, false)))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    let err = collect(pc.generate(tokenspeed_request("ts-empty", &[], 3, false)))
        .await
        .unwrap_err();
    assert_eq!(
        (err.code(), err.message()),
        (
            Code::InvalidArgument,
            "GenerateRequest.tokenized.input_ids is empty"
        )
    );
}

#[tokio::test]
async fn tokenspeed_grpc_keeps_stop_strings_and_trims_stop_tokens() {
    // A vocabulary with texts: the engine matches stop strings as TokenSpeed does.
    let texts: Vec<(u32, String)> = (0..50).map(|i| (2000 + i, format!(" w{i}"))).collect();
    let vocab = OutputVocab::with_texts(texts, [9]);
    let e = MockEngine::spawn(
        grpc_config(EngineKind::TokenSpeed, Role::Both, [127, 0, 4, 5]).with_vocab(vocab.clone()),
    )
    .await
    .unwrap();
    let mut c = tokenspeed_client(&e).await;
    let base = e.reference(&PROMPT, &spec(&e, 8), None);
    let third = base.token_ids[2];
    // A stop string (the text of the third token).
    let stop = vocab.text_of(third).trim().to_string();
    let mut req = tokenspeed_request("ts-stop", &PROMPT, 8, false);
    req.sampling_params.as_mut().unwrap().stop = vec![stop.clone()];
    let (_, cs) = tokenspeed_parts(collect(c.generate(req)).await.unwrap());
    assert_eq!(cs[0].finish_reason, "stop");
    assert_eq!(
        cs[0].matched_stop,
        Some(tokenspeed::generate_complete::MatchedStop::MatchedStopStr(
            stop
        ))
    );
    assert_eq!(cs[0].output_ids, base.token_ids[..3].to_vec());
    // A stop token id: dropped from output_ids, still counted; kept with no_stop_trim.
    for no_stop_trim in [false, true] {
        let mut req = tokenspeed_request("ts-stopid", &PROMPT, 8, false);
        let sp = req.sampling_params.as_mut().unwrap();
        sp.stop_token_ids = vec![third];
        sp.no_stop_trim = no_stop_trim;
        let (_, cs) = tokenspeed_parts(collect(c.generate(req)).await.unwrap());
        let want = e.reference(
            &PROMPT,
            &SamplingSpec {
                stop_token_ids: vec![third],
                ..spec(&e, 8)
            },
            None,
        );
        assert_eq!(
            cs[0].output_ids,
            wire_output_ids(EngineKind::TokenSpeed, &want, no_stop_trim)
        );
        assert_eq!(cs[0].output_ids.len(), if no_stop_trim { 3 } else { 2 });
        assert_eq!(cs[0].completion_tokens, 3);
        assert_eq!(
            cs[0].matched_stop,
            Some(tokenspeed::generate_complete::MatchedStop::MatchedTokenId(
                third
            ))
        );
    }
}

#[tokio::test]
async fn tokenspeed_grpc_info_rpcs_and_abort() {
    let mut cfg = grpc_config(EngineKind::TokenSpeed, Role::Decode, [127, 0, 4, 6]);
    cfg.max_running_requests = 33;
    let d = MockEngine::spawn(cfg).await.unwrap();
    let mut c = tokenspeed_client(&d).await;
    let h = c
        .health_check(tokenspeed::HealthCheckRequest {})
        .await
        .unwrap()
        .into_inner();
    assert!(h.healthy && h.message.contains("shallow probe"));
    let s = c
        .get_server_info(tokenspeed::GetServerInfoRequest {})
        .await
        .unwrap()
        .into_inner();
    let args = mock_engine::struct_to_json(s.server_args.as_ref().unwrap());
    assert_eq!(args["max_num_seqs"], 33);
    assert!(args.get("max_running_requests").is_none());
    assert_eq!(args["disaggregation_mode"], "decode");
    assert_eq!(args["disaggregation_transfer_backend"], "mooncake");
    assert!(!s.tokenspeed_version.is_empty());
    let m = c
        .get_model_info(tokenspeed::GetModelInfoRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(m.eos_token_ids, vec![7]);
    // A decode waiting for KV is live in the loads, and Abort reaches it.
    let mut req = tokenspeed_request("ts-abort", &PROMPT, 3, true);
    req.kv_bootstrap_info = Some(tokenspeed::KvBootstrapInfo {
        bootstrap_host: "127.0.4.99".into(),
        bootstrap_port: 9,
        bootstrap_room: 5,
    });
    let mut c2 = c.clone();
    let call = tokio::spawn(async move { collect(c2.generate(req)).await });
    assert!(
        d.wait_for(SECS, |e| e.stats().requests_in_flight == 1)
            .await
    );
    let l = c
        .get_loads(tokenspeed::GetLoadsRequest {
            dp_rank: None,
            include: vec![],
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(l.loads.len(), 1);
    assert_eq!(l.loads[0].num_running_reqs + l.loads[0].num_waiting_reqs, 1);
    assert_eq!(
        l.loads[0].max_running_requests, 0,
        "the window is max_num_seqs"
    );
    let resp = c
        .abort(tokenspeed::AbortRequest {
            request_id: "ts-abort".into(),
            reason: "Stream dropped".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert!(resp.success, "{resp:?}");
    assert_eq!(resp.message, "Aborted 1 request(s) for ts-abort");
    let err = call.await.unwrap().unwrap_err();
    assert_eq!((err.code(), err.message()), (Code::Internal, "aborted"));
    let resp = c
        .abort(tokenspeed::AbortRequest {
            request_id: "ts-abort".into(),
            reason: String::new(),
        })
        .await
        .unwrap()
        .into_inner();
    assert!(!resp.success);
    assert_eq!(resp.message, "Request ts-abort not found");
    assert_eq!(d.aborts().len(), 2);
    assert!(d.records()[0].outcome.aborted);
}

// ---------------------------------------------------------------------------------------------
// vLLM

fn vllm_prefill_leg(rid: &str, params: serde_json::Value) -> vllm::GenerateRequest {
    let mut req = vllm_request(rid, &PROMPT, 1, false);
    req.sampling_params.as_mut().unwrap().ignore_eos = true;
    req.kv_transfer_params_json = Some(params.to_string());
    req
}

fn vllm_complete(msgs: Vec<vllm::GenerateResponse>) -> vllm::GenerateComplete {
    let (_, mut cs) = vllm_parts(msgs);
    assert_eq!(cs.len(), 1);
    cs.remove(0)
}

#[tokio::test]
async fn vllm_grpc_nixl_pair_reproduces_the_reference() {
    let p = grpc_engine(EngineKind::Vllm, Role::Prefill, [127, 0, 5, 1]).await;
    let d = grpc_engine(EngineKind::Vllm, Role::Decode, [127, 0, 5, 2]).await;
    let (mut pc, mut dc) = (vllm_client(&p).await, vllm_client(&d).await);
    let want = d.reference(&PROMPT, &spec(&d, 7), None);
    for stream in [false, true] {
        let rid = format!("v-{stream}");
        // Sequential legs: the prefill capped at one token hands its KV back...
        let pleg = vllm_prefill_leg(
            &rid,
            serde_json::json!({"do_remote_decode": true, "do_remote_prefill": false}),
        );
        let pc_ = vllm_complete(collect(pc.generate(pleg)).await.unwrap());
        assert_eq!(pc_.finish_reason, "length");
        assert_eq!(pc_.output_ids.len(), 1);
        let params: serde_json::Value =
            serde_json::from_str(pc_.kv_transfer_params_json.as_deref().unwrap()).unwrap();
        assert_eq!(params["do_remote_prefill"], true);
        assert_eq!(params["remote_engine_id"], p.engine_id());
        assert_eq!(params["remote_port"], p.side_channel_port().unwrap());
        let legacy = pc_.kv_transfer_params.expect("the legacy mirror");
        assert_eq!(legacy.remote_port, p.side_channel_port().unwrap() as u32);
        // ...the decode presents it unchanged and pulls.
        let mut dleg = vllm_request(&rid, &PROMPT, 7, stream);
        dleg.kv_transfer_params_json = pc_.kv_transfer_params_json.clone();
        let (chunks, complete) = vllm_parts(collect(dc.generate(dleg)).await.unwrap());
        let c = &complete[0];
        assert_eq!(
            c.cached_tokens,
            PROMPT.len() as u32,
            "KV came from the prefill"
        );
        assert_eq!(c.finish_reason, "length");
        if stream {
            let ids: Vec<u32> = chunks.iter().flat_map(|c| c.token_ids.clone()).collect();
            assert_eq!(ids, want.token_ids);
            assert!(chunks.iter().all(|c| c.completion_tokens == 1), "deltas");
            assert_eq!(c.output_ids, vec![*want.token_ids.last().unwrap()]);
            assert_eq!(c.completion_tokens, 1);
        } else {
            assert_eq!(c.output_ids, want.token_ids);
            assert_eq!(c.completion_tokens, 7);
        }
    }
    let drec = &d.wait_records(2, SECS).await[0];
    assert_eq!(drec.handoff.kv_source.as_deref(), Some("remote"));
    assert_eq!(drec.handoff.items[0].integrity.as_deref(), Some("ok"));
    assert_eq!(
        drec.parsed.kv_transfer_params.as_ref().unwrap()["do_remote_prefill"],
        true
    );
    let prec = &p.wait_records(2, SECS).await[0];
    assert_eq!(prec.grpc.as_ref().unwrap().sampling.max_new_tokens, Some(1));
    // The pull released the prefill's blocks.
    assert!(p.wait_for(SECS, |e| e.pinned().is_empty()).await);
}

#[tokio::test]
async fn vllm_grpc_decode_without_a_handoff_recomputes_and_a_bad_one_errors() {
    let p = grpc_engine(EngineKind::Vllm, Role::Prefill, [127, 0, 5, 3]).await;
    let d = grpc_engine(EngineKind::Vllm, Role::Decode, [127, 0, 5, 4]).await;
    let mut dc = vllm_client(&d).await;
    let want = d.reference(&PROMPT, &spec(&d, 5), None);
    // No params: a local recompute, right tokens, nothing cached.
    let c = vllm_complete(
        collect(dc.generate(vllm_request("v-none", &PROMPT, 5, false)))
            .await
            .unwrap(),
    );
    assert_eq!(
        (c.output_ids.clone(), c.cached_tokens),
        (want.token_ids.clone(), 0)
    );
    // Legacy typed params reach the connector as {remote_host, remote_port}: no remote prefill.
    let mut legacy = vllm_request("v-legacy", &PROMPT, 5, false);
    legacy.kv_transfer_params = Some(vllm::KvTransferParams {
        remote_host: p.host(),
        remote_port: 5600,
    });
    let c = vllm_complete(collect(dc.generate(legacy)).await.unwrap());
    assert_eq!(c.cached_tokens, 0);
    assert_eq!(
        d.records()[1].handoff.kv_source.as_deref(),
        Some("recompute")
    );
    // Params naming another engine: the load fails, the request finishes with "error".
    let pleg = vllm_prefill_leg(
        "v-bad",
        serde_json::json!({"do_remote_decode": true, "do_remote_prefill": false}),
    );
    let pcomplete = vllm_complete(collect(vllm_client(&p).await.generate(pleg)).await.unwrap());
    let mut params: serde_json::Value =
        serde_json::from_str(pcomplete.kv_transfer_params_json.as_deref().unwrap()).unwrap();
    params["remote_engine_id"] = "someone-else".into();
    for stream in [false, true] {
        let mut dleg = vllm_request("v-bad", &PROMPT, 5, stream);
        dleg.kv_transfer_params_json = Some(params.to_string());
        let (chunks, complete) = vllm_parts(collect(dc.generate(dleg)).await.unwrap());
        assert_eq!(complete[0].finish_reason, "error");
        assert!(complete[0].output_ids.is_empty());
        assert_eq!(chunks.len(), usize::from(stream));
    }
    let rec = d.records().pop().unwrap();
    assert!(rec
        .outcome
        .error
        .as_deref()
        .unwrap()
        .starts_with("Remote NIXL agent engine ID mismatch"));
    assert_eq!(rec.outcome.finish_reason.as_deref(), Some("error"));
    // Unusable params are the caller's error.
    for (json, msg) in [
        ("[1]", "kv_transfer_params_json must be a JSON object"),
        ("{", "Invalid kv_transfer_params_json: "),
    ] {
        let mut bad = vllm_request("v-json", &PROMPT, 5, false);
        bad.kv_transfer_params_json = Some(json.into());
        let err = collect(dc.generate(bad)).await.unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument);
        assert!(err.message().starts_with(msg), "{err:?}");
    }
    let mut bad = vllm_request("v-port", &PROMPT, 5, false);
    bad.kv_transfer_params = Some(vllm::KvTransferParams {
        remote_host: "h".into(),
        remote_port: 0,
    });
    let err = collect(dc.generate(bad)).await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    let mut bad = vllm_request("v-zero", &PROMPT, 0, false);
    bad.sampling_params.as_mut().unwrap().max_tokens = Some(0);
    let err = collect(dc.generate(bad)).await.unwrap_err();
    assert_eq!(err.message(), "max_tokens must be at least 1, got 0.");
}

#[tokio::test]
async fn vllm_grpc_mooncake_decode_pulls_by_transfer_id() {
    let mk = |role, ip| {
        grpc_config(EngineKind::Vllm, role, ip).with_connector(mock_engine::Connector::Mooncake)
    };
    let p = MockEngine::spawn(mk(Role::Prefill, [127, 0, 5, 5]))
        .await
        .unwrap();
    let d = MockEngine::spawn(mk(Role::Decode, [127, 0, 5, 6]))
        .await
        .unwrap();
    let tid = "xfer-0191a2b3-c4d5-7e6f-8a9b-0c1d2e3f4a5b";
    let pleg = vllm_prefill_leg(
        "v-mc",
        serde_json::json!({"do_remote_decode": true, "do_remote_prefill": false, "transfer_id": tid}),
    );
    let pcomplete = vllm_complete(collect(vllm_client(&p).await.generate(pleg)).await.unwrap());
    assert_eq!(
        pcomplete.kv_transfer_params_json, None,
        "Mooncake returns nothing"
    );
    let mut dleg = vllm_request("v-mc", &PROMPT, 6, true);
    dleg.kv_transfer_params_json = Some(
        serde_json::json!({"do_remote_decode": false, "do_remote_prefill": true, "transfer_id": tid,
            "remote_engine_id": p.engine_id(),
            "remote_bootstrap_addr": format!("http://{}:{}", p.host(), p.bootstrap_port().unwrap())})
        .to_string(),
    );
    let (chunks, complete) =
        vllm_parts(collect(vllm_client(&d).await.generate(dleg)).await.unwrap());
    let ids: Vec<u32> = chunks.iter().flat_map(|c| c.token_ids.clone()).collect();
    assert_eq!(ids, d.reference(&PROMPT, &spec(&d, 6), None).token_ids);
    assert_eq!(complete[0].cached_tokens, PROMPT.len() as u32);
    assert_eq!(d.records()[0].handoff.transfer_id.as_deref(), Some(tid));
}

#[tokio::test]
async fn vllm_grpc_info_rpcs_abort_and_text_input() {
    let mut cfg = grpc_config(EngineKind::Vllm, Role::Prefill, [127, 0, 5, 7]);
    cfg.dp_size = 2;
    cfg.max_running_requests = 64;
    cfg.engine_id = Some("engine-7".into());
    let p = MockEngine::spawn(cfg).await.unwrap();
    let mut c = vllm_client(&p).await;
    let s = c
        .get_server_info(vllm::GetServerInfoRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(s.kv_connector, "NixlConnector");
    assert_eq!(s.kv_role, "kv_producer");
    assert_eq!(s.kv_engine_id, "engine-7");
    assert_eq!(s.data_parallel_size, 2);
    assert_eq!(s.max_num_seqs, 64);
    assert_eq!(s.block_size, 16);
    assert_eq!(s.kv_cache_dtype, "auto");
    assert_eq!(s.server_type, "vllm-grpc");
    let m = c
        .get_model_info(vllm::GetModelInfoRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!((m.max_context_length, m.eos_token_ids), (32768, vec![7]));
    let l = c
        .get_loads(vllm::GetLoadsRequest {
            dp_rank: None,
            include: vec![],
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!((l.dp_rank_count, l.loads.len()), (1, 1));
    assert_eq!(l.loads[0].max_running_requests, 0, "vLLM reports no window");
    // `text` input goes through the engine's own tokenizer.
    let mut req = vllm_request("v-text", &PROMPT, 3, false);
    req.input = Some(vllm::generate_request::Input::Text("hello there".into()));
    let complete = vllm_complete(collect(c.generate(req)).await.unwrap());
    let ids = mock_engine::fake_model::encode_prompt("mock-model", "hello there");
    assert_eq!(complete.prompt_tokens, ids.len() as u32);
    assert_eq!(
        complete.output_ids,
        p.reference(&ids, &spec(&p, 3), None).token_ids
    );
    // Abort takes a list; an aborted stream finishes with "abort".
    p.inject(Fault::StallAfterHead {
        count: Some(1),
        matcher: FaultMatch::default(),
    })
    .await;
    let mut s = c
        .generate(vllm_request("v-abort", &PROMPT, 3, true))
        .await
        .expect("headers at once with stall_after_head")
        .into_inner();
    c.abort(vllm::AbortRequest {
        request_ids: vec!["v-abort".into(), "v-other".into()],
    })
    .await
    .unwrap();
    let mut last = None;
    while let Some(m) = s.message().await.unwrap() {
        last = Some(m);
    }
    match last.and_then(|m| m.response) {
        Some(vllm::generate_response::Response::Complete(c)) => {
            assert_eq!(c.finish_reason, "abort")
        }
        other => panic!("an abort complete, not {other:?}"),
    }
    let a = &p.aborts()[0];
    assert_eq!(
        a.request_ids,
        vec!["v-abort".to_string(), "v-other".to_string()]
    );
    assert_eq!((a.reason.clone(), a.aborted_seqs.len()), (None, 1));
    let rec = p.records().pop().unwrap();
    assert!(rec.outcome.aborted);
    assert_eq!(rec.outcome.grpc_code.as_deref(), Some("OK"));
}

// ---------------------------------------------------------------------------------------------
// Every engine

#[tokio::test]
async fn grpc_engines_serve_their_control_plane_and_die_like_a_process() {
    let e = grpc_engine(EngineKind::Vllm, Role::Both, [127, 0, 5, 8]).await;
    assert_eq!(
        e.grpc_url(),
        Some(format!("grpc://{}:{}", e.host(), e.port()))
    );
    assert_ne!(e.control_url(), e.api_url());
    let spec_ = e.worker_spec();
    assert_eq!(spec_["url"], e.grpc_url().unwrap());
    let r = mock_engine::client::get(&format!("{}/mock/stats", e.control_url()))
        .await
        .unwrap();
    assert_eq!(r.status, 200);
    let r = mock_engine::client::get(&format!("{}/v1/models", e.control_url()))
        .await
        .unwrap();
    assert_eq!(r.status, 404, "the engine itself answers on the gRPC port");
    // A fault posted to the control plane applies to gRPC calls.
    let r = mock_engine::client::post_json(
        &format!("{}/mock/faults", e.control_url()),
        &serde_json::json!({"kind": "grpc_status", "code": "UNAVAILABLE", "count": 1}),
    )
    .await
    .unwrap();
    assert_eq!(r.status, 200);
    let mut c = vllm_client(&e).await;
    let err = collect(c.generate(vllm_request("k0", &PROMPT, 2, false)))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::Unavailable);
    let r = mock_engine::client::get(&format!("{}/mock/requests", e.control_url()))
        .await
        .unwrap();
    assert_eq!(r.json()[0]["outcome"]["grpc_code"], "UNAVAILABLE");
    c.abort(vllm::AbortRequest {
        request_ids: vec!["k0".into()],
    })
    .await
    .unwrap();
    let r = mock_engine::client::get(&format!("{}/mock/aborts", e.control_url()))
        .await
        .unwrap();
    assert_eq!(r.json()[0]["request_ids"], serde_json::json!(["k0"]));
    // kill(): a call in flight fails and new connections are refused.
    e.inject(Fault::Hang {
        count: None,
        matcher: FaultMatch::default(),
    })
    .await;
    let mut c2 = c.clone();
    let call = tokio::spawn(async move { c2.generate(vllm_request("k1", &PROMPT, 2, true)).await });
    assert!(
        e.wait_for(SECS, |e| e.stats().requests_in_flight == 1)
            .await
    );
    e.kill();
    let res = tokio::time::timeout(SECS, call).await.unwrap().unwrap();
    assert!(res.is_err(), "the call dies with the engine");
    let again = tonic::transport::Channel::from_shared(e.api_url())
        .unwrap()
        .connect()
        .await;
    assert!(again.is_err(), "nothing listens any more");
}

#[tokio::test]
async fn tokenspeed_over_http_is_refused() {
    let cfg = MockEngineConfig {
        transport: mock_engine::Transport::Http,
        ..MockEngineConfig::test(EngineKind::TokenSpeed, Role::Both, [127, 0, 5, 9])
    };
    assert!(MockEngine::spawn(cfg).await.is_err());
}

#[tokio::test]
async fn binary_serves_a_grpc_tokenspeed_engine() {
    use std::io::BufRead;
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_mock-engine"))
        .args([
            "--engine",
            "tokenspeed",
            "--role",
            "both",
            "--host",
            "127.0.5.10",
            "--output-ids",
            "1000..1100",
            "--eos-ids",
            "7",
            "--tokenizer-path",
            "/fixtures/tok",
        ])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let field = |k: &str| {
        line.split_whitespace()
            .find_map(|f| f.strip_prefix(k))
            .unwrap_or_else(|| panic!("{k} in {line}"))
            .to_string()
    };
    let api = field("api=");
    let control = field("control=");
    assert!(api.starts_with("grpc://127.0.5.10:"), "{line}");
    assert!(control.starts_with("http://127.0.5.10:"), "{line}");
    let endpoint = api.replace("grpc://", "http://");
    let channel = tonic::transport::Channel::from_shared(endpoint)
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut c = tokenspeed::token_speed_scheduler_client::TokenSpeedSchedulerClient::new(channel);
    let m = c
        .get_model_info(tokenspeed::GetModelInfoRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(m.eos_token_ids, vec![7]);
    assert_eq!(m.tokenizer_path, "/fixtures/tok");
    let (_, complete) = tokenspeed_parts(
        collect(c.generate(tokenspeed_request("bin", &PROMPT, 4, false)))
            .await
            .unwrap(),
    );
    assert!(complete[0]
        .output_ids
        .iter()
        .all(|t| (1000..1100).contains(t)));
    let stats = mock_engine::client::get(&format!("{control}/mock/stats"))
        .await
        .unwrap();
    assert_eq!(stats.json()["requests_total"], 1);
    std::process::Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    let deadline = Instant::now() + SECS;
    while child.try_wait().unwrap().is_none() {
        assert!(Instant::now() < deadline, "mock-engine did not exit");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn grpc_eos_is_reported_the_way_each_engine_reports_it() {
    use mock_engine::fake_model::{Finish, Matched};
    let natural = |engine, ip| MockEngineConfig {
        natural_stop_every: 5,
        ..grpc_config(engine, Role::Both, ip)
    };
    let sg = MockEngine::spawn(natural(EngineKind::Sglang, [127, 0, 5, 11]))
        .await
        .unwrap();
    let vl = MockEngine::spawn(natural(EngineKind::Vllm, [127, 0, 5, 12]))
        .await
        .unwrap();
    let ts = MockEngine::spawn(natural(EngineKind::TokenSpeed, [127, 0, 5, 13]))
        .await
        .unwrap();
    let want = sg.reference(&PROMPT, &spec(&sg, 40), None);
    assert_eq!(want.finish, Finish::Stop(Matched::Token(7)), "{want:?}");
    assert_eq!(*want.token_ids.last().unwrap(), 7);
    assert!(want.token_ids.len() > 1, "{want:?}");

    let (_, c) = sglang_parts(
        collect(
            sglang_client(&sg)
                .await
                .generate(sglang_request("e", &PROMPT, 40, false)),
        )
        .await
        .unwrap(),
    );
    assert_eq!(c[0].finish_reason, "stop");
    assert_eq!(c[0].output_ids, want.token_ids, "SGLang keeps the EOS id");
    assert_eq!(
        c[0].matched_stop,
        Some(sglang::generate_complete::MatchedStop::MatchedTokenId(7))
    );

    let (_, c) = vllm_parts(
        collect(
            vllm_client(&vl)
                .await
                .generate(vllm_request("e", &PROMPT, 40, false)),
        )
        .await
        .unwrap(),
    );
    assert_eq!(c[0].finish_reason, "stop");
    assert_eq!(c[0].output_ids, want.token_ids);
    assert_eq!(c[0].matched_stop, None, "vLLM has no stop_reason for EOS");

    let (_, c) = tokenspeed_parts(
        collect(
            tokenspeed_client(&ts)
                .await
                .generate(tokenspeed_request("e", &PROMPT, 40, false)),
        )
        .await
        .unwrap(),
    );
    assert_eq!(c[0].output_ids, want.token_ids[..want.token_ids.len() - 1]);
    assert_eq!(c[0].completion_tokens as usize, want.token_ids.len());

    // ignore_eos runs to the cap.
    let mut req = sglang_request("e2", &PROMPT, 40, false);
    req.sampling_params.as_mut().unwrap().ignore_eos = true;
    let (_, c) = sglang_parts(
        collect(sglang_client(&sg).await.generate(req))
            .await
            .unwrap(),
    );
    assert_eq!(
        (c[0].finish_reason.as_str(), c[0].output_ids.len()),
        ("length", 40)
    );
    assert!(!c[0].output_ids.contains(&7));
}

#[tokio::test]
async fn grpc_logprobs_follow_each_servicer() {
    let sg = grpc_engine(EngineKind::Sglang, Role::Both, [127, 0, 5, 14]).await;
    let vl = grpc_engine(EngineKind::Vllm, Role::Both, [127, 0, 5, 15]).await;
    let want = sg.reference(
        &PROMPT,
        &SamplingSpec {
            top_logprobs: 2,
            ..spec(&sg, 4)
        },
        None,
    );
    // SGLang: prompt rows from logprob_start_len (first one empty), output rows with top-k.
    let mut req = sglang_request("lp", &PROMPT, 4, false);
    req.return_logprob = true;
    req.logprob_start_len = 0;
    req.top_logprobs_num = 2;
    let (_, c) = sglang_parts(
        collect(sglang_client(&sg).await.generate(req.clone()))
            .await
            .unwrap(),
    );
    let input = c[0].input_logprobs.as_ref().expect("prompt rows");
    assert_eq!(input.token_ids, PROMPT.to_vec());
    assert_eq!(input.token_logprobs[0].value, None);
    assert!(input.token_logprobs[1].value.is_some());
    let out = c[0].output_logprobs.as_ref().expect("output rows");
    assert_eq!(out.token_ids, want.token_ids);
    let lps: Vec<f32> = want.logprobs.iter().map(|&l| l as f32).collect();
    assert_eq!(out.token_logprobs, lps);
    assert_eq!(out.top_logprobs[0].token_ids.len(), 2);
    // logprob_start_len = -1 (what a gateway sends): no prompt rows.
    req.logprob_start_len = -1;
    let (_, c) = sglang_parts(
        collect(sglang_client(&sg).await.generate(req))
            .await
            .unwrap(),
    );
    assert!(c[0].input_logprobs.is_none() && c[0].output_logprobs.is_some());
    // vLLM streams: per-chunk deltas, prompt rows on the first chunk only.
    let mut req = vllm_request("lp", &PROMPT, 4, true);
    let sp = req.sampling_params.as_mut().unwrap();
    sp.logprobs = Some(2);
    sp.prompt_logprobs = Some(0);
    let (chunks, complete) =
        vllm_parts(collect(vllm_client(&vl).await.generate(req)).await.unwrap());
    assert!(chunks[0].input_logprobs.is_some());
    assert!(chunks[1..].iter().all(|c| c.input_logprobs.is_none()));
    assert!(chunks
        .iter()
        .all(|c| c.output_logprobs.as_ref().unwrap().token_ids == c.token_ids));
    assert!(complete[0].input_logprobs.is_some());
}
