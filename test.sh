#!/usr/bin/env bash
# Runs every test of tilefarm. On a fresh machine it first installs what the tests run
# against, pinned and cached under ~/.cache/tilefarm: the MinIO server (a ~5 minute build)
# and nats-server, built from the nats-server/v2 module pinned in go.mod; and Blender 3.4.1
# from Debian (about 40 s), unless TILEFARM_BLENDER already names one; OpenImageIO's tools and
# Python module from Debian, the independent reader of Blender's multilayer EXRs; and Chromium
# from Debian, for the web monitor's browser tests, unless TILEFARM_CHROMIUM already names one.
# Extra arguments go to `go test` (e.g. ./test.sh -run Farm ./internal/...).
set -euo pipefail
cd "$(dirname "$0")"

CACHE="${XDG_CACHE_HOME:-${HOME:-/root}/.cache}/tilefarm"

MINIO_VERSION=v0.0.0-20260212201848-7aac2a2c5b7c
MINIO_DIR="$CACHE/minio-$MINIO_VERSION"
if [ ! -x "$MINIO_DIR/minio" ]; then
  echo "installing MinIO $MINIO_VERSION into $MINIO_DIR (first run only, takes a few minutes)..."
  mkdir -p "$MINIO_DIR"
  (cd "$MINIO_DIR" && GOBIN="$MINIO_DIR" GOFLAGS=-mod=mod go install "github.com/minio/minio@$MINIO_VERSION")
fi
export TILEFARM_MINIO="$MINIO_DIR/minio"

NATS_VERSION=$(go list -m -f '{{.Version}}' github.com/nats-io/nats-server/v2)
NATS_DIR="$CACHE/nats-server-$NATS_VERSION"
if [ ! -x "$NATS_DIR/nats-server" ]; then
  echo "building nats-server $NATS_VERSION into $NATS_DIR (first run only)..."
  mkdir -p "$NATS_DIR"
  go build -o "$NATS_DIR/nats-server" github.com/nats-io/nats-server/v2
fi
export TILEFARM_NATS_SERVER="$NATS_DIR/nats-server"

BLENDER_VERSION=3.4.1
BLENDER_PACKAGE="blender=3.4.1+dfsg-2+b1"
if [ -z "${TILEFARM_BLENDER:-}" ]; then
  if ! command -v blender >/dev/null; then
    echo "installing Blender $BLENDER_VERSION from Debian (first run only, about 40 s)..."
    if ! command -v apt-get >/dev/null || [ "$(id -u)" -ne 0 ]; then
      echo "test.sh: Blender $BLENDER_VERSION is needed: install it (apt-get install $BLENDER_PACKAGE) or set TILEFARM_BLENDER" >&2
      exit 1
    fi
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q "$BLENDER_PACKAGE" >/dev/null ||
      { apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q "$BLENDER_PACKAGE" >/dev/null; }
  fi
  TILEFARM_BLENDER=$(command -v blender)
fi
if ! "$TILEFARM_BLENDER" --version 2>/dev/null | grep -q "^Blender $BLENDER_VERSION\b"; then
  echo "test.sh: $TILEFARM_BLENDER is not Blender $BLENDER_VERSION, which the tests and DESIGN's measured facts pin" >&2
  exit 1
fi
export TILEFARM_BLENDER

# OpenImageIO (oiiotool and its Python module, with numpy): the tests' independent reader of
# Blender's multilayer EXRs, channel by channel.
if ! command -v oiiotool >/dev/null || ! /usr/bin/python3 -c 'import OpenImageIO, numpy' 2>/dev/null; then
  echo "installing OpenImageIO's tools from Debian for the Blender output tests (first run only)..."
  if ! command -v apt-get >/dev/null || [ "$(id -u)" -ne 0 ]; then
    echo "test.sh: OpenImageIO is needed: install it (apt-get install openimageio-tools python3-openimageio python3-numpy)" >&2
    exit 1
  fi
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q openimageio-tools python3-openimageio python3-numpy >/dev/null ||
    { apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q openimageio-tools python3-openimageio python3-numpy >/dev/null; }
fi

# nftables: the partition tests run each process of a farm as a host in its own network
# namespace and cut links between them with nft (as root, which CI is).
if ! command -v nft >/dev/null; then
  echo "installing nftables from Debian for the partition tests (first run only)..."
  if ! command -v apt-get >/dev/null || [ "$(id -u)" -ne 0 ]; then
    echo "test.sh: nft is needed by the partition tests, which run as root: install it (apt-get install nftables)" >&2
    exit 1
  fi
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q nftables >/dev/null ||
    { apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q nftables >/dev/null; }
fi

if [ -z "${TILEFARM_CHROMIUM:-}" ]; then
  if ! command -v chromium >/dev/null; then
    echo "installing Chromium from Debian for the web tests (first run only)..."
    if ! command -v apt-get >/dev/null || [ "$(id -u)" -ne 0 ]; then
      echo "test.sh: Chromium is needed by the web tests: install it (apt-get install chromium) or set TILEFARM_CHROMIUM" >&2
      exit 1
    fi
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium >/dev/null ||
      { apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium >/dev/null; }
  fi
  TILEFARM_CHROMIUM=$(command -v chromium)
fi
export TILEFARM_CHROMIUM

if [ $# -eq 0 ]; then
  set -- ./...
fi
go vet ./...
exec go test -count=1 -timeout 30m "$@"
