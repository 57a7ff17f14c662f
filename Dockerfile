# raygate operator image: the static (musl) release binary on an empty base.
#
# This is the one image definition: CI builds it with buildah (scripts/build-image,
# e2e/tests/image.rs runs it as the chart's pod) and scripts/release ships it. No
# base image is pulled and nothing runs at build time: the build context holds
# only the binary, compiled first by
#   cargo build --release --locked --target x86_64-unknown-linux-musl -p raygate --bin raygate
# (scripts/build-image does that, with reproducible flags, and stages the context).
#
#   scripts/build-image                      # buildah (what CI runs)
#   scripts/build-image --engine docker      # the same file with `docker build`
#
# See docs/docker.md.

FROM scratch

ARG VERSION=dev
ARG REVISION=unknown

LABEL org.opencontainers.image.title="raygate" \
      org.opencontainers.image.description="Capacity gate for KubeRay RayService upgrades on GPU clusters" \
      org.opencontainers.image.source="https://github.com/raygate/raygate" \
      org.opencontainers.image.url="https://github.com/raygate/raygate" \
      org.opencontainers.image.documentation="https://github.com/raygate/raygate/blob/main/docs/docker.md" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}"

# Statically linked (musl, rustls with ring): no libc, no shell, no CA bundle. The
# apiserver's CA is the mounted ServiceAccount's ca.crt, and raygate dials nothing else.
COPY raygate /raygate

# Numeric, so the chart's runAsNonRoot can verify it; the chart runs it as 65532 too.
USER 65532:65532
EXPOSE 8080 8081
ENTRYPOINT ["/raygate", "run"]
