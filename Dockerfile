# syntax=docker/dockerfile:1
# podha operator image: a static-ish Rust binary on distroless (glibc, no shell, non-root).
#   docker build -t <registry>/podha:0.1.0 .
# Needs BuildKit (the default builder since Docker 23) for the cache mounts.

ARG RUST_VERSION=1.89

FROM rust:${RUST_VERSION}-bookworm AS builder
WORKDIR /src
# The whole workspace is needed (Cargo.lock, the sim crate's manifest); .dockerignore keeps
# target/, .sim/ and .git/ out of the context.
COPY . .
# Cache the crates.io registry and the target directory between builds; the binary is copied
# out of the cache mount so that the next stage can see it.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/usr/local/cargo/git \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked -p podha --bin podha \
 && install -D -m 0755 target/release/podha /out/podha

FROM gcr.io/distroless/cc-debian12:nonroot
LABEL org.opencontainers.image.title="podha" \
      org.opencontainers.image.description="Kubernetes operator that fails stateful pods over when their node dies" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=builder /out/podha /podha
# distroless's nonroot user, numeric so that runAsNonRoot can verify it; the chart sets the same ids.
USER 65532:65532
EXPOSE 8080
ENTRYPOINT ["/podha"]
CMD ["run"]
