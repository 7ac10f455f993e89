#!/usr/bin/env bash
# Runs every test of tilefarm. On a fresh machine it first installs the pinned MinIO server the
# storage tests run against (a ~5 minute build, cached afterwards under ~/.cache/tilefarm).
# Extra arguments go to `go test` (e.g. ./test.sh -run Farm ./internal/...).
set -euo pipefail
cd "$(dirname "$0")"

MINIO_VERSION=v0.0.0-20260212201848-7aac2a2c5b7c
MINIO_DIR="${XDG_CACHE_HOME:-${HOME:-/root}/.cache}/tilefarm/minio-$MINIO_VERSION"
if [ ! -x "$MINIO_DIR/minio" ]; then
  echo "installing MinIO $MINIO_VERSION into $MINIO_DIR (first run only, takes a few minutes)..."
  mkdir -p "$MINIO_DIR"
  (cd "$MINIO_DIR" && GOBIN="$MINIO_DIR" GOFLAGS=-mod=mod go install "github.com/minio/minio@$MINIO_VERSION")
fi
export TILEFARM_MINIO="$MINIO_DIR/minio"

if [ $# -eq 0 ]; then
  set -- ./...
fi
go vet ./...
exec go test -count=1 -timeout 30m "$@"
