//! n>1 over SGLang's HTTP rendezvous, one dispatch per sample (`pdgate_filters::fanout` says
//! which requests fan out and how their answers merge): each sample gets its own rooms and its
//! own request id (`<id>-<j>`), all go out at once to the attempt's pair, they fail fast
//! together — the first failure drops every other leg, which aborts them on the engines — and
//! their answers merge into one: a JSON answer, or one SSE stream whose events carry their
//! sample's index, with one usage chunk and one `[DONE]` at the end.

use std::ops::Range;
use std::sync::Arc;
use std::time::Instant;

use bytes::{Bytes, BytesMut};
use futures::stream::{FuturesUnordered, StreamExt};
use pdgate_filters::errors::ErrorCode;
use pdgate_filters::fanout::{self, SampleEvent};
use pdgate_filters::handoff::sglang::{self, DpRanks, Leg};
use pdgate_filters::logprobs::{merge_event, merge_json, PrefillLogprobs};
use pdgate_filters::sse::SseSplitter;
use pingora::proxy::Session;

use super::client::{spliced_body, LegError, LegErrorKind, OpenLeg};
use super::dispatch::Attempt;
use super::parallel::{self, open_sample, OpenSample, PdLabels, Rendezvous, SampleLegs};
use super::prefill::Abandoning;
use super::relay;
use super::request::PdRequest;
use crate::gateway::{Gateway, Settings};
use crate::ledger::{Handoff, Kind};
use crate::metrics::METRICS;
use crate::proxy::ctx::RequestCtx;
use crate::reply::{self, Reply, JSON};
use crate::trace::LegFacts;
use crate::workers::select::Pair;
use crate::workers::InFlight;

/// One fanned-out attempt: `n` rendezvous on `pair`, merged into one answer.
pub async fn attempt(
    gw: &Gateway,
    s: &Settings,
    session: &mut Session,
    ctx: &mut RequestCtx,
    req: &PdRequest,
    pair: &Pair,
) -> Attempt {
    let n = req.facts.n;
    let Rendezvous {
        dp_place,
        target,
        dp,
    } = Rendezvous::of(s.dp_aware, pair);
    let labels = PdLabels::new(ctx, pair);
    let mut handoffs: Vec<Arc<Handoff>> = Vec::new();
    let mut opening = FuturesUnordered::new();
    for j in 0..n {
        // One room per prompt of the sample: a chat sample is one prompt (its `n` is what
        // classify counted as the batch).
        let per_sample = match req.route {
            pdgate_filters::Route::ChatCompletions => None,
            _ => req.facts.batch,
        };
        let rooms = parallel::mint_rooms(per_sample, dp_place);
        let first_room = rooms.as_slice().first().copied().unwrap_or(0);
        if j == 0 {
            ctx.room = Some(first_room);
        }
        let fields = fanout::sample_fields(req.route, &req.body, &req.top, j);
        let fields: Vec<(&str, &[u8])> = fields.iter().map(|(k, v)| (*k, v.as_slice())).collect();
        let body = |leg| {
            spliced_body(&req.body, |out| {
                sglang::leg_body_into(out, &req.body, &req.top, &target, &rooms, leg, &dp, &fields)
            })
        };
        let prefill_body = body(Leg::Prefill);
        // Without DP ranks both legs carry the same bytes.
        let decode_body = if dp == DpRanks::default() {
            prefill_body.clone()
        } else {
            body(Leg::Decode)
        };
        let id = format!("{}-{j}", ctx.request_id);
        let handoff = gw
            .ledger
            .open(Kind::Room, first_room, &id, &pair.prefill, &pair.decode);
        handoffs.push(handoff.clone());
        let facts = LegFacts {
            room: Some(first_room),
            sample: Some(j),
        };
        // The engines get the sample's id without the minted route prefix (as the request's).
        let headers = req
            .forward
            .with_request_id(id.get(ctx.engine_request_id_from..).unwrap_or(&id));
        let legs = SampleLegs::new(
            ctx,
            pair,
            [prefill_body, decode_body],
            headers,
            handoff,
            facts,
        );
        let labels = &labels;
        opening.push(async move {
            (
                j as usize,
                open_sample(gw, s, req, pair, labels, legs).await,
            )
        });
    }
    ctx.connector = Some("bootstrap");
    ctx.kv_verdict = crate::legs::handoff::KvVerdict::of_bootstrap_decode(&pair.decode);
    log::debug!(
        "request {} fans out {n} samples on {} -> {}",
        ctx.request_id,
        pair.prefill.url(),
        pair.decode.url()
    );
    let dispatched = Instant::now();

    // Every sample's two heads; the first failure ends the attempt and drops the rest.
    let mut open: Vec<Option<OpenSample>> = (0..n).map(|_| None).collect();
    let mut waiting = open.len();
    while waiting > 0 {
        tokio::select! {
            o = opening.next() => match o {
                Some((j, Ok(sample))) => {
                    open[j] = Some(sample);
                    waiting -= 1;
                }
                Some((_, Err(reply))) => return failed(&handoffs, Attempt::Refused(reply)),
                None => break,
            },
            _ = session.read_body_or_idle(true) => return failed(&handoffs, Attempt::ClientGone),
        }
    }
    drop(opening);
    let samples: Vec<Live> = open
        .into_iter()
        .flatten()
        .map(|o| Live::new(o, s.stream_idle_timeout))
        .collect();
    let run = Run {
        gw,
        req,
        pair,
        n,
        dispatched,
        deadline: tokio::time::Instant::from_std(ctx.started + s.request_timeout),
    };
    let outcome = if req.facts.stream {
        Box::pin(run.stream(session, ctx, samples)).await
    } else {
        Box::pin(run.whole(session, ctx, samples)).await
    };
    if let Some(ttft) = ctx.ttft {
        METRICS
            .pd_ttft
            .with(&labels.as_array(), |m| m.observe(ttft.as_secs_f64()));
    }
    failed(&handoffs, outcome)
}

/// Marks every rendezvous abnormal unless the answer went out in full.
fn failed(handoffs: &[Arc<Handoff>], outcome: Attempt) -> Attempt {
    if !matches!(outcome, Attempt::Answered) {
        for h in handoffs {
            h.failed();
        }
    }
    outcome
}

/// One sample's decode, being relayed.
struct Live {
    leg: OpenLeg,
    /// Its prefill (detached), driven while the decode is; its failure counts while the decode
    /// has produced nothing (then its KV cannot come).
    /// Cancelled if the sample ends before its decode had its KV (see [`Abandoning`]).
    prefill: Abandoning,
    logprobs: Option<PrefillLogprobs>,
    splitter: SseSplitter,
    saw_done: bool,
    _in_flight: InFlight,
}

impl Live {
    /// Holds the sample's prefill detached (it drains on its own once muted; see
    /// [`Abandoning`]) and takes its decode for the relay.
    fn new(o: OpenSample, stall: std::time::Duration) -> Live {
        let mut prefill = o.prefill;
        prefill.detach();
        let mut leg = o.decode;
        leg.set_read_timeout(Some(stall));
        Live {
            leg,
            prefill: Abandoning(Some(prefill)),
            logprobs: o.logprobs.flatten(),
            splitter: SseSplitter::new(),
            saw_done: false,
            _in_flight: o._decode_in_flight,
        }
    }
}

/// What waiting on one sample's decode gave.
enum Next {
    Chunk(Result<Option<Bytes>, LegError>),
    /// Its prefill failed before the decode produced anything.
    PrefillFailed,
}

async fn next(j: usize, mut live: Live) -> (usize, Live, Next) {
    let next = tokio::select! {
        c = live.leg.next_chunk() => Next::Chunk(c),
        _ = relay::prefill_failed(&mut live.prefill.0) => Next::PrefillFailed,
    };
    (j, live, next)
}

/// The relay of every sample of one attempt.
struct Run<'a> {
    gw: &'a Gateway,
    req: &'a PdRequest,
    pair: &'a Pair,
    n: u64,
    dispatched: Instant,
    deadline: tokio::time::Instant,
}

impl Run<'_> {
    /// Non-streamed: every sample's answer read whole (the client watched, the total deadline
    /// kept) before one merged answer goes out; a sample that fails is the attempt's refusal
    /// (it may be retried: nothing reached the client).
    async fn whole(
        &self,
        session: &mut Session,
        ctx: &mut RequestCtx,
        samples: Vec<Live>,
    ) -> Attempt {
        let limit = self.gw.settings().max_payload_size;
        let status = samples.first().map_or(200, |l| l.leg.status());
        let mut reads: FuturesUnordered<_> = samples
            .into_iter()
            .enumerate()
            .map(|(j, mut live)| async move {
                let read = tokio::select! {
                    b = live.leg.read_to_end(limit) => Next::Chunk(b.map(Some)),
                    _ = relay::prefill_failed(&mut live.prefill.0) => Next::PrefillFailed,
                };
                (j, live, read)
            })
            .collect();
        let mut done: Vec<Option<(Live, Bytes)>> = (0..self.n).map(|_| None).collect();
        let mut left = done.len();
        while left > 0 {
            let (j, live, read) = tokio::select! {
                r = reads.next() => match r {
                    Some(r) => r,
                    None => break,
                },
                _ = session.read_body_or_idle(true) => return Attempt::ClientGone,
                _ = tokio::time::sleep_until(self.deadline) => {
                    return Attempt::Refused(Reply::error(
                        ErrorCode::Timeout,
                        "the samples' answers did not complete within request_timeout_secs",
                    ).retryable(true));
                }
            };
            match read {
                Next::Chunk(Ok(body)) => {
                    self.pair.decode.record_leg(Some(live.leg.status()));
                    // A whole answer means the KV arrived: its prefill drains to its end.
                    let mut live = live;
                    live.prefill.mute();
                    done[j] = Some((live, body.unwrap_or_default()));
                    left -= 1;
                }
                Next::Chunk(Err(e)) => {
                    self.pair.decode.record_leg(None);
                    return Attempt::Refused(relay::unread_answer(&e));
                }
                Next::PrefillFailed => {
                    return Attempt::Refused(parallel::prefill_failed_after_head())
                }
            }
        }
        drop(reads);
        let done: Vec<(Live, Bytes)> = done.into_iter().flatten().collect();
        // Each sample's prompt logprobs come from its own prefill.
        let bodies: Vec<Bytes> = done
            .iter()
            .map(|(live, body)| {
                live.logprobs
                    .as_ref()
                    .and_then(|lp| merge_json(body, lp))
                    .map_or_else(|| body.clone(), Bytes::from)
            })
            .collect();
        let refs: Vec<&[u8]> = bodies.iter().map(|b| b.as_ref()).collect();
        let Some(merged) = fanout::merge_answers(self.req.route, &refs) else {
            return Attempt::Refused(Reply::error(
                ErrorCode::DecodeRequestFailed,
                "the samples' answers are not of the route's shape and could not be merged",
            ));
        };
        if ctx.ttft.is_none() {
            ctx.ttft = Some(self.dispatched.elapsed());
        }
        let reply = relay::routed_to(Reply::body(status, JSON, merged), &self.pair.decode);
        if reply::send(session, ctx, reply).await.is_err() {
            return Attempt::ClientGone;
        }
        for (live, _) in done {
            self.gw
                .client
                .release(live.leg, &self.pair.decode.peer)
                .await;
        }
        Attempt::Answered
    }

    /// Streamed: one SSE stream, each sample's events as they come with their merged index;
    /// each sample's `[DONE]` and usage chunk held back until every sample ended, then one
    /// merged usage chunk and one `[DONE]`. A sample that fails ends the stream with an error
    /// event and drops the others.
    async fn stream(
        &self,
        session: &mut Session,
        ctx: &mut RequestCtx,
        samples: Vec<Live>,
    ) -> Attempt {
        let Some(first) = samples.first() else {
            return Attempt::Refused(Reply::error(ErrorCode::InternalError, "no sample"));
        };
        let status = first.leg.status();
        let head = match relay::stream_head(first.leg.head(), status, ctx, &self.pair.decode) {
            Ok(h) => h,
            Err(e) => {
                return Attempt::Refused(Reply::error(ErrorCode::InternalError, e.to_string()))
            }
        };
        if relay::start_stream(session, ctx, head, status, false)
            .await
            .is_err()
        {
            return Attempt::ClientGone;
        }
        let mut pending: FuturesUnordered<_> = samples
            .into_iter()
            .enumerate()
            .map(|(j, live)| next(j, live))
            .collect();
        let mut usages: Vec<Option<Vec<u8>>> = (0..self.n).map(|_| None).collect();
        let mut usage_frame: Option<(Vec<u8>, Range<usize>)> = None;
        let mut finished: Vec<OpenLeg> = Vec::new();
        loop {
            let (j, mut live, got) = tokio::select! {
                r = pending.next() => match r {
                    Some(r) => r,
                    None => break,
                },
                _ = session.read_body_or_idle(true) => return Attempt::ClientGone,
                _ = tokio::time::sleep_until(self.deadline) => {
                    let e = LegError {
                        kind: LegErrorKind::Timeout,
                        detail: "the request ran past request_timeout_secs".into(),
                    };
                    return self.end_with_error(session, ctx, &e).await;
                }
            };
            let chunk = match got {
                Next::Chunk(Ok(Some(c))) => c,
                Next::Chunk(Ok(None)) => {
                    self.pair.decode.record_leg(Some(status));
                    if let Some(rest) = live.splitter.finish() {
                        if let Some(a) = self
                            .forward(
                                session,
                                ctx,
                                j,
                                &mut live,
                                &rest,
                                &mut usages,
                                &mut usage_frame,
                            )
                            .await
                        {
                            return a;
                        }
                    }
                    if live.leg.is_done() {
                        finished.push(live.leg);
                    }
                    continue;
                }
                // The engine did not end its body after `[DONE]`: the sample is complete.
                Next::Chunk(Err(_)) if live.saw_done => {
                    if let Some(span) = live.leg.trace_mut() {
                        span.complete();
                    }
                    self.pair.decode.record_leg(Some(status));
                    continue;
                }
                Next::Chunk(Err(e)) => {
                    self.pair.decode.record_leg(None);
                    return self.end_with_error(session, ctx, &e).await;
                }
                Next::PrefillFailed => {
                    let e = LegError {
                        kind: LegErrorKind::Body,
                        detail: format!(
                            "sample {j}: the prefill leg failed before the KV was handed over"
                        ),
                    };
                    return self.end_with_error(session, ctx, &e).await;
                }
            };
            let mut events = Vec::new();
            live.splitter.push(&chunk, &mut events);
            let mut out = BytesMut::new();
            for ev in events {
                self.sample_event(j, &mut live, &ev, &mut out, &mut usages, &mut usage_frame);
            }
            if !out.is_empty() {
                if let Some(a) = self.write(session, ctx, &mut live, out.freeze()).await {
                    return a;
                }
            }
            pending.push(next(j, live));
        }
        let mut tail = Vec::new();
        if let Some((chunk, range)) = usage_frame {
            let all: Option<Vec<&[u8]>> = usages.iter().map(|u| u.as_deref()).collect();
            if let Some(frame) = all.and_then(|all| fanout::usage_chunk(&chunk, range, &all)) {
                tail.extend_from_slice(&frame);
            }
        }
        tail.extend_from_slice(b"data: [DONE]\n\n");
        if relay::write_last(session, Some(Bytes::from(tail)))
            .await
            .is_err()
        {
            return Attempt::ClientGone;
        }
        for leg in finished {
            self.gw.client.release(leg, &self.pair.decode.peer).await;
        }
        Attempt::Answered
    }

    /// One event of sample `j` into the merged stream's `out` (or held back).
    fn sample_event(
        &self,
        j: usize,
        live: &mut Live,
        ev: &[u8],
        out: &mut BytesMut,
        usages: &mut [Option<Vec<u8>>],
        usage_frame: &mut Option<(Vec<u8>, Range<usize>)>,
    ) {
        let merged = live.logprobs.as_ref().and_then(|lp| merge_event(ev, lp));
        let ev = merged.as_deref().unwrap_or(ev);
        match fanout::sample_event(self.req.route, ev, self.n, j as u64) {
            SampleEvent::Forward(b) => out.extend_from_slice(&b),
            SampleEvent::Done => {
                live.saw_done = true;
                live.leg.set_read_timeout(Some(relay::AFTER_DONE_GRACE));
            }
            SampleEvent::Usage { chunk, usage } => {
                usages[j] = Some(chunk[usage.clone()].to_vec());
                if j == 0 {
                    *usage_frame = Some((chunk, usage));
                }
            }
        }
    }

    /// The leftover of a sample's stream (an unterminated last event), forwarded.
    #[allow(clippy::too_many_arguments)]
    async fn forward(
        &self,
        session: &mut Session,
        ctx: &mut RequestCtx,
        j: usize,
        live: &mut Live,
        rest: &[u8],
        usages: &mut [Option<Vec<u8>>],
        usage_frame: &mut Option<(Vec<u8>, Range<usize>)>,
    ) -> Option<Attempt> {
        let mut out = BytesMut::new();
        self.sample_event(j, live, rest, &mut out, usages, usage_frame);
        if out.is_empty() {
            return None;
        }
        self.write(session, ctx, live, out.freeze()).await
    }

    /// Writes merged output of a sample; the first output of a sample means its KV arrived.
    async fn write(
        &self,
        session: &mut Session,
        ctx: &mut RequestCtx,
        live: &mut Live,
        out: Bytes,
    ) -> Option<Attempt> {
        if ctx.ttft.is_none() {
            ctx.ttft = Some(self.dispatched.elapsed());
        }
        live.prefill.mute();
        if relay::write_piece(session, Some(out), false).await.is_err() {
            return Some(Attempt::ClientGone);
        }
        None
    }

    async fn end_with_error(
        &self,
        session: &mut Session,
        ctx: &mut RequestCtx,
        e: &LegError,
    ) -> Attempt {
        match relay::end_stream_with_error(session, ctx, e).await {
            relay::RelayEnd::StreamError(why) => Attempt::EndedWithError(why),
            _ => Attempt::ClientGone,
        }
    }
}
