# syntax=docker/dockerfile:1
# The Iris images, one target each (see docs/deploy-kubernetes.md):
#   docker build --target gateway      -t iris/gateway .        # `iris` (gateway, tiny-model)
#   docker build --target gateway-nixl -t iris/gateway-nixl .   # `iris` with the RDMA lane (NIXL)
#   docker build --target encoder      -t iris/encoder .        # `iris-encoder`
#   docker build --target engine       -t iris/engine  .        # `iris-engine` (reference engine)
# One builder stage compiles the three binaries (rustls, no OpenSSL or
# protoc; cmake and nasm build the vendored libjpeg-turbo); each image is
# distroless with glibc, running as the non-root user 65532. The
# gateway-nixl image adds NIXL's shared libraries, taken from the
# nixl-cu12 wheel as CI does (.ci/run, docs/transports.md).

# Any stable toolchain at or above the workspace rust-version.
ARG RUST_VERSION=1
# The NIXL library release the nixl-sys crate is built against.
ARG NIXL_VERSION=1.5.1

# crates/video links the system's FFmpeg libraries (libav*-dev with
# pkg-config; ffmpeg-sys-next's bindgen needs libclang).
FROM rust:${RUST_VERSION}-slim-bookworm AS toolchain
RUN apt-get update \
    && apt-get install -y --no-install-recommends cmake nasm pkg-config libclang-dev \
        libavformat-dev libavcodec-dev libavutil-dev libswscale-dev \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src

FROM toolchain AS build
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked -p iris-cli -p iris-encoder -p iris-engine \
    && mkdir -p /out \
    && cp target/release/iris target/release/iris-encoder target/release/iris-engine /out/ \
    && strip /out/* \
    && scripts/runtime-libs /out/iris /out/gateway-libs

# The gateway with feature `nixl` (nixl-sys runs bindgen: libclang, in the
# toolchain stage). Its own target directory, so the two builds' caches
# never mix features.
FROM toolchain AS build-nixl
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target-nixl \
    CARGO_TARGET_DIR=/src/target-nixl \
    cargo build --release --locked -p iris-cli --features iris-cli/nixl \
    && mkdir -p /out \
    && cp /src/target-nixl/release/iris /out/iris \
    && strip /out/iris \
    && scripts/runtime-libs /out/iris /out/gateway-libs

# NIXL's shared libraries (libnixl, libnixl_capi, the UCX plugin and the
# wheel's own UCX) without torch: only the wheel's two .libs folders,
# whose RPATHs are relative, so they work wherever they are copied.
FROM python:3.11-slim-bookworm AS nixl-libs
ARG NIXL_VERSION
RUN apt-get update \
    && apt-get install -y --no-install-recommends unzip \
    && rm -rf /var/lib/apt/lists/*
RUN python -m pip download --no-cache-dir --disable-pip-version-check --no-deps \
        --only-binary=:all: --python-version 3.11 --platform manylinux_2_28_x86_64 \
        "nixl-cu12==${NIXL_VERSION}" -d /wheel \
    && mkdir -p /opt/nixl \
    && unzip -q -o /wheel/nixl_cu12-*.whl '.nixl_cu12.mesonpy.libs/*' 'nixl_cu12.libs/*' -d /opt/nixl \
    && test -e /opt/nixl/.nixl_cu12.mesonpy.libs/libnixl_capi.so

FROM gcr.io/distroless/cc-debian12:nonroot AS runtime
USER 65532:65532
WORKDIR /home/nonroot

# The gateway's shared libraries beyond distroless' glibc and libstdc++
# (FFmpeg's libavformat59, libavcodec59, libavutil57, libswscale6 and what
# they link: dav1d, libvpx, ...), copied at their Debian paths.
FROM runtime AS gateway
COPY --from=build /out/gateway-libs/ /
COPY --from=build /out/iris /usr/local/bin/iris
EXPOSE 8000
ENTRYPOINT ["/usr/local/bin/iris"]
CMD ["serve"]

# `--nixl-lib` defaults to the bundled library; the loader path finds its
# neighbours (libnixl, the UCX plugin). 5600: the NIXL metadata listener
# (--rdma-listen-port).
FROM runtime AS gateway-nixl
COPY --from=nixl-libs /opt/nixl /opt/nixl
COPY --from=build-nixl /out/gateway-libs/ /
COPY --from=build-nixl /out/iris /usr/local/bin/iris
ENV LD_LIBRARY_PATH=/opt/nixl/.nixl_cu12.mesonpy.libs:/opt/nixl/nixl_cu12.libs \
    IRIS_NIXL_LIB=/opt/nixl/.nixl_cu12.mesonpy.libs/libnixl_capi.so
EXPOSE 8000 5600
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
