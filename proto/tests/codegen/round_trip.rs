//! The generated client and server talk to each other: a tonic SGLang scheduler on
//! 127.0.0.1:0 answers a unary `HealthCheck`, a server-streaming `Generate` of two messages, a
//! `GetTokenizer` stream of the shared `common` type, and leaves the rest UNIMPLEMENTED (the
//! methods it does not implement, and other engines' services).

use std::net::SocketAddr;

use pdgate_proto::common::{GetTokenizerChunk, GetTokenizerRequest};
use pdgate_proto::sglang::generate_response::Response as GenerateEvent;
use pdgate_proto::sglang::sglang_scheduler_client::SglangSchedulerClient;
use pdgate_proto::sglang::sglang_scheduler_server::{SglangScheduler, SglangSchedulerServer};
use pdgate_proto::sglang::{
    DisaggregatedParams, GenerateComplete, GenerateRequest, GenerateResponse, GenerateStreamChunk,
    GetModelInfoRequest, HealthCheckRequest, HealthCheckResponse, TokenizedInput,
};
use pdgate_proto::vllm::vllm_engine_client::VllmEngineClient;
use tokio_stream::wrappers::TcpListenerStream;
use tokio_stream::StreamExt;
use tonic::codegen::BoxStream;
use tonic::transport::{Channel, Server};
use tonic::{Code, Request, Response, Status, Streaming};

/// Answers every `Generate` with the prompt's first token as a chunk, then a completion that
/// carries what it was sent (the room), so the test sees the request's fields survive the wire.
struct EchoScheduler;

#[tonic::async_trait]
impl SglangScheduler for EchoScheduler {
    async fn health_check(
        &self,
        _request: Request<HealthCheckRequest>,
    ) -> Result<Response<HealthCheckResponse>, Status> {
        Ok(Response::new(HealthCheckResponse {
            healthy: true,
            message: "ok".to_owned(),
        }))
    }

    async fn generate(
        &self,
        request: Request<GenerateRequest>,
    ) -> Result<Response<BoxStream<GenerateResponse>>, Status> {
        let request = request.into_inner();
        let prompt = request.tokenized.map(|t| t.input_ids).unwrap_or_default();
        let room = request
            .disaggregated_params
            .ok_or_else(|| Status::invalid_argument("no disaggregated_params"))?
            .bootstrap_room;
        let prompt_tokens = prompt.len() as u32;
        let chunk = GenerateResponse {
            request_id: request.request_id.clone(),
            response: Some(GenerateEvent::Chunk(GenerateStreamChunk {
                token_ids: vec![prompt[0]],
                prompt_tokens,
                completion_tokens: 1,
                ..Default::default()
            })),
        };
        let complete = GenerateResponse {
            request_id: request.request_id,
            response: Some(GenerateEvent::Complete(GenerateComplete {
                output_ids: vec![prompt[0], room as u32],
                finish_reason: "stop".to_owned(),
                prompt_tokens,
                completion_tokens: 2,
                ..Default::default()
            })),
        };
        let events = tokio_stream::iter([Ok(chunk), Ok(complete)]);
        Ok(Response::new(Box::pin(events)))
    }

    async fn get_tokenizer(
        &self,
        _request: Request<GetTokenizerRequest>,
    ) -> Result<Response<BoxStream<GetTokenizerChunk>>, Status> {
        let last = GetTokenizerChunk {
            data: b"PK".to_vec(),
            sha256: "digest".to_owned(),
        };
        Ok(Response::new(Box::pin(tokio_stream::iter([Ok(last)]))))
    }
}

/// Serves `EchoScheduler` on a free loopback port until the returned sender is dropped.
async fn serve_echo_scheduler() -> (SocketAddr, tokio::sync::oneshot::Sender<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    // One service per port, served without tonic's `router` feature (axum): a path of another
    // service falls through to the generated server's UNIMPLEMENTED answer.
    tokio::spawn(Server::builder().serve_with_incoming_shutdown(
        SglangSchedulerServer::new(EchoScheduler),
        TcpListenerStream::new(listener),
        async {
            let _ = stopped.await;
        },
    ));
    (addr, stop)
}

async fn connect(addr: SocketAddr) -> Channel {
    Channel::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .expect("connect to the loopback server")
}

/// Every message of a server stream that must start and end without an error.
async fn read_all<T>(call: Result<Response<Streaming<T>>, Status>) -> Vec<T> {
    call.expect("the call starts")
        .into_inner()
        .map(|item| item.expect("a stream item, not an error"))
        .collect()
        .await
}

#[tokio::test]
async fn sglang_client_and_server_round_trip() {
    let (addr, _stop) = serve_echo_scheduler().await;
    let mut client = SglangSchedulerClient::new(connect(addr).await);

    let health = client
        .health_check(HealthCheckRequest {})
        .await
        .unwrap()
        .into_inner();
    assert!(health.healthy);
    assert_eq!(health.message, "ok");

    let request = GenerateRequest {
        request_id: "req-1".to_owned(),
        tokenized: Some(TokenizedInput {
            original_text: "hi".to_owned(),
            input_ids: vec![7, 8, 9],
        }),
        disaggregated_params: Some(DisaggregatedParams {
            bootstrap_host: "127.0.0.1".to_owned(),
            bootstrap_port: 8998,
            bootstrap_room: 42,
        }),
        stream: true,
        ..Default::default()
    };
    let events = read_all(client.generate(request).await).await;

    assert_eq!(events.len(), 2);
    assert!(events.iter().all(|event| event.request_id == "req-1"));
    match &events[0].response {
        Some(GenerateEvent::Chunk(chunk)) => {
            assert_eq!(chunk.token_ids, [7]);
            assert_eq!(chunk.prompt_tokens, 3);
        }
        other => panic!("first event should be a chunk, got {other:?}"),
    }
    match &events[1].response {
        Some(GenerateEvent::Complete(complete)) => {
            assert_eq!(complete.output_ids, [7, 42]);
            assert_eq!(complete.finish_reason, "stop");
        }
        other => panic!("second event should be the completion, got {other:?}"),
    }

    let chunks = read_all(client.get_tokenizer(GetTokenizerRequest {}).await).await;
    assert_eq!(chunks.len(), 1);
    assert_eq!(chunks[0].sha256, "digest");
}

#[tokio::test]
async fn rpcs_a_server_leaves_out_answer_unimplemented() {
    let (addr, _stop) = serve_echo_scheduler().await;
    let channel = connect(addr).await;

    // A method of the service that the server does not implement (the default stub).
    let status = SglangSchedulerClient::new(channel.clone())
        .get_model_info(GetModelInfoRequest {})
        .await
        .expect_err("EchoScheduler does not implement GetModelInfo");
    assert_eq!(status.code(), Code::Unimplemented);

    // Another engine's service: what runtime detection by HealthCheck relies on.
    let status = VllmEngineClient::new(channel)
        .health_check(pdgate_proto::vllm::HealthCheckRequest {})
        .await
        .expect_err("an SGLang server does not serve VllmEngine");
    assert_eq!(status.code(), Code::Unimplemented);
}
