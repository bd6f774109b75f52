# syntax=docker/dockerfile:1
# The Iris images, one target each (see docs/deploy-kubernetes.md):
#   docker build --target gateway -t iris/gateway .   # `iris` (gateway, tiny-model)
#   docker build --target encoder -t iris/encoder .   # `iris-encoder`
#   docker build --target engine  -t iris/engine  .   # `iris-engine` (reference engine)
# One builder stage compiles the three binaries (pure Rust: rustls, no
# OpenSSL or protoc); each image is distroless with glibc, running as the
# non-root user 65532.

# Any stable toolchain at or above the workspace rust-version.
ARG RUST_VERSION=1
FROM rust:${RUST_VERSION}-slim-bookworm AS build
WORKDIR /src
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked -p iris-gateway -p iris-encoder -p iris-engine \
    && mkdir -p /out \
    && cp target/release/iris target/release/iris-encoder target/release/iris-engine /out/ \
    && strip /out/*

FROM gcr.io/distroless/cc-debian12:nonroot AS runtime
USER 65532:65532
WORKDIR /home/nonroot

FROM runtime AS gateway
COPY --from=build /out/iris /usr/local/bin/iris
EXPOSE 8000
ENTRYPOINT ["/usr/local/bin/iris"]
CMD ["serve"]

FROM runtime AS encoder
COPY --from=build /out/iris-encoder /usr/local/bin/iris-encoder
EXPOSE 30100 8998
ENTRYPOINT ["/usr/local/bin/iris-encoder"]

FROM runtime AS engine
COPY --from=build /out/iris-engine /usr/local/bin/iris-engine
EXPOSE 30000 8998
ENTRYPOINT ["/usr/local/bin/iris-engine"]
