# syntax=docker/dockerfile:1
#
# raygate operator image: a release build in a Rust builder stage, then only
# the binary on distroless/cc (glibc, CA certificates, no shell, no package
# manager), running as the numeric non-root user 65532.
#
# NOTE: this repository's development and CI machines have no Docker engine, so
# this file is linted (hadolint, e2e/tests/packaging.rs) but never built there.
# What CI builds and tests is the same release binary:
#   cargo build --release --locked -p raygate --bin raygate
# Build the image where an engine (or BuildKit/buildah/kaniko) exists:
#   docker build -t ghcr.io/raygate/raygate:0.1.0 .
# See docs/docker.md.

ARG RUST_VERSION=1.95
ARG DEBIAN_RELEASE=bookworm

FROM rust:${RUST_VERSION}-${DEBIAN_RELEASE} AS build
WORKDIR /src
# The whole workspace (see .dockerignore): Cargo.lock pins every dependency,
# and the e2e member must be present for the workspace to resolve.
COPY . .
# Registry and target caches persist between builds; the binary is copied out
# of the cache mount so the next stage can see it.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked -p raygate --bin raygate \
    && install -D -m 0755 target/release/raygate /out/raygate

# distroless/cc matches the builder's glibc (Debian 12): the binary links only
# libc, libm and libgcc_s, and uses rustls with the image's CA bundle.
FROM gcr.io/distroless/cc-debian12:nonroot
LABEL org.opencontainers.image.title="raygate" \
      org.opencontainers.image.description="Capacity gate for KubeRay RayService upgrades on GPU clusters" \
      org.opencontainers.image.source="https://github.com/raygate/raygate" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=build /out/raygate /raygate
# 65532 is distroless' "nonroot"; numeric so runAsNonRoot can verify it.
USER 65532:65532
EXPOSE 8080
ENTRYPOINT ["/raygate", "run"]
