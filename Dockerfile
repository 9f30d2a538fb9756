# pdgate container image: `docker build -t pdgate .`
#
# Two stages: a Rust builder (Pingora needs cmake; the gRPC protos compile with protox, so no
# protoc), then a slim runtime with the binary, the example config, a non-root user and a
# HEALTHCHECK on /liveness. The binary is dynamically linked against glibc only.

FROM rust:1.95-slim-bookworm AS build
RUN apt-get update \
    && apt-get install -y --no-install-recommends cmake make g++ pkg-config perl \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
RUN cargo build --release --locked -p pdgate --bin pdgate \
    && strip target/release/pdgate

FROM debian:bookworm-slim
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates curl \
    && rm -rf /var/lib/apt/lists/* \
    && groupadd --system --gid 10001 pdgate \
    && useradd --system --uid 10001 --gid pdgate --home-dir /nonexistent --shell /usr/sbin/nologin pdgate
COPY --from=build /src/target/release/pdgate /usr/local/bin/pdgate
COPY conf/pdgate.yaml /etc/pdgate/pdgate.yaml
USER 10001:10001
EXPOSE 30000 29000
# /liveness answers as soon as the gateway serves; readiness (workers present) is the
# orchestrator's business (/readiness).
HEALTHCHECK --interval=10s --timeout=2s --start-period=10s --retries=3 \
    CMD curl -fsS http://127.0.0.1:30000/liveness || exit 1
# The example config runs with the demo's workers absent: mount your own over it.
ENTRYPOINT ["/usr/local/bin/pdgate"]
CMD ["run", "-c", "/etc/pdgate/pdgate.yaml"]
