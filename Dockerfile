# podha's image: its static binary, built beforehand for each architecture, on an empty base.
# The binary is linked statically (rustls, no OpenSSL, no libc at run time) and talks only to
# the API server, whose CA comes with the ServiceAccount: the image needs nothing else.
#
#   make image        # this machine's architecture: builds the binary, then `docker build`
#
# or by hand, for every architecture at once (what the release workflow does):
#
#   target/dist/linux-amd64/podha, target/dist/linux-arm64/podha   (static builds)
#   docker buildx build --platform linux/amd64,linux/arm64 -t <registry>/podha:<version> .
#
# TARGETARCH is set by BuildKit (DOCKER_BUILDKIT=1 with Docker 20.10, the default builder
# since Docker 23); .dockerignore sends only target/dist/ as the context.
FROM scratch
ARG TARGETARCH
LABEL org.opencontainers.image.title="podha" \
      org.opencontainers.image.description="Kubernetes operator that fails stateful pods over when their node dies" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.source="https://github.com/podha/podha"
COPY target/dist/linux-${TARGETARCH}/podha /podha
# Numeric, so that runAsNonRoot can verify it; the chart sets the same ids.
USER 65532:65532
EXPOSE 8080
ENTRYPOINT ["/podha"]
CMD ["run"]
