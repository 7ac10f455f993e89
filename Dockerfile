# syntax=docker/dockerfile:1
#
# Images of tilefarm (README.md, "Running with Docker Compose"):
#
#   docker build -t tilefarm .                                 coordinator and tileworker (default)
#   docker build --target tileworker-blender -t tilefarm-blender .   the same, plus Blender 3.4.1
#   docker build --target minio -t tilefarm-minio .            MinIO, built from source
#
# Every render node of a farm must run the same build (manifests and checkpoints record the Go
# version and GOAMD64), so build once and run that image everywhere; pin the Go release with
# --build-arg GO_VERSION=1.26.N to rebuild the same toolchain later. No secret is baked in: NATS
# credentials, the API token and S3 keys come from volumes and the environment at run time.

ARG GO_VERSION=1.26

FROM golang:${GO_VERSION} AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/go/pkg/mod \
    go mod download
COPY . .
RUN --mount=type=cache,target=/go/pkg/mod \
    --mount=type=cache,target=/root/.cache/go-build \
    CGO_ENABLED=0 go build -trimpath -buildvcs=false -o /out/ ./cmd/coordinator ./cmd/tileworker

# MinIO publishes no images any more; this builds the version test.sh installs, the one the
# store conformance tests run against.
FROM golang:${GO_VERSION} AS minio-build
ARG MINIO_VERSION=v0.0.0-20260212201848-7aac2a2c5b7c
RUN --mount=type=cache,target=/go/pkg/mod \
    --mount=type=cache,target=/root/.cache/go-build \
    CGO_ENABLED=0 GOBIN=/out GOFLAGS=-mod=mod go install -trimpath "github.com/minio/minio@${MINIO_VERSION}"

# A shell is kept: the compose file's credentials step redirects what 'coordinator credentials'
# prints, and the healthchecks speak HTTP through bash's /dev/tcp.
FROM debian:bookworm-slim AS runtime
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates \
    && rm -rf /var/lib/apt/lists/* \
    && groupadd --gid 10001 tilefarm \
    && useradd --uid 10001 --gid 10001 --home-dir /data --no-create-home --shell /usr/sbin/nologin tilefarm \
    && install -d -o 10001 -g 10001 -m 0755 /data /nats-accounts \
    && install -d -o 10001 -g 10001 -m 0700 /creds /worker-creds
# Named volumes mounted on these directories start with their owner and mode.
WORKDIR /data
USER 10001:10001

FROM runtime AS minio
COPY --from=minio-build /out/minio /usr/local/bin/minio
EXPOSE 9000 9001
CMD ["minio", "server", "/data", "--address", ":9000", "--console-address", ":9001"]

# A render node for Blender scenes: Debian bookworm's Blender is 3.4.1, the version the tests pin.
FROM runtime AS tileworker-blender
USER root
# ffmpeg encodes each completed job's preview movie (docs/design.md, "Preview movie").
RUN apt-get update \
    && apt-get install -y --no-install-recommends blender=3.4.1+dfsg-2+b1 ffmpeg \
    && rm -rf /var/lib/apt/lists/*
USER 10001:10001
ENV TILEFARM_BLENDER=/usr/bin/blender
COPY --from=build /out/coordinator /out/tileworker /usr/local/bin/
EXPOSE 9101
CMD ["tileworker", "--help"]

# The default target, last so that a plain 'docker build' makes it: no Blender.
FROM runtime AS tilefarm
# ffmpeg encodes each completed job's preview movie (docs/design.md, "Preview movie").
USER root
RUN apt-get update \
    && apt-get install -y --no-install-recommends ffmpeg \
    && rm -rf /var/lib/apt/lists/*
USER 10001:10001
COPY --from=build /out/coordinator /out/tileworker /usr/local/bin/
EXPOSE 7070 9101
CMD ["coordinator", "--help"]
