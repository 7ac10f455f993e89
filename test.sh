#!/usr/bin/env bash
# Runs every test of tilefarm. On a fresh machine it first installs what the tests run
# against, pinned and cached under ~/.cache/tilefarm: the MinIO server (a ~5 minute build)
# and nats-server, built from the nats-server/v2 module pinned in go.mod; and Blender 3.4.1
# from Debian (about 40 s), unless TILEFARM_BLENDER already names one; OpenImageIO's tools and
# Python module from Debian, the independent reader of Blender's multilayer EXRs; and Chromium
# from Debian, for the web monitor's browser tests, unless TILEFARM_CHROMIUM already names one;
# and nftables from Debian, for the partition tests between network namespaces; and ffmpeg
# from Debian, the workers' encoder of preview movies and the tests' reader of them (ffprobe),
# unless TILEFARM_FFMPEG already names one. Blender's bundled Python scripts are compiled once
# where they are writable (Blender never caches their bytecode itself).
# Without arguments it also fuzzes every fuzz target for a few seconds (.ci/fuzz). Extra
# arguments go to `go test` alone (e.g. ./test.sh -run Farm ./internal/...).
set -euo pipefail
cd "$(dirname "$0")"

# apt_install WHAT HINT PACKAGE... installs Debian packages for the tests of WHAT, as root, or
# says what is needed (HINT) and stops.
apt_install() {
  local what=$1 hint=$2
  shift 2
  echo "installing $* from Debian for $what (first run only)..."
  if ! command -v apt-get >/dev/null || [ "$(id -u)" -ne 0 ]; then
    echo "test.sh: $hint: install it (apt-get install $*)" >&2
    exit 1
  fi
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q "$@" >/dev/null ||
    { apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q "$@" >/dev/null; }
}

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
    apt_install "the Blender tests (about 40 s)" "Blender $BLENDER_VERSION is needed (or set TILEFARM_BLENDER)" "$BLENDER_PACKAGE"
  fi
  TILEFARM_BLENDER=$(command -v blender)
fi
if ! "$TILEFARM_BLENDER" --version 2>/dev/null | grep -q "^Blender $BLENDER_VERSION\b"; then
  echo "test.sh: $TILEFARM_BLENDER is not Blender $BLENDER_VERSION, which the tests and DESIGN's measured facts pin" >&2
  exit 1
fi
export TILEFARM_BLENDER

# Blender runs its Python with bytecode writing off, so every Blender process compiles its
# ~1,400 bundled scripts anew: 0.9 s of the 2.3 s of CPU a bare start takes here, and the
# tests start a few hundred. Compiled once (by that Blender's own Python, so the bytecode is
# its version's), where the installed scripts are writable; Python checks each file against
# its source, so nothing Blender runs changes. Up to date, this costs one Blender start.
"$TILEFARM_BLENDER" -b --factory-startup --python-expr "import bpy, compileall, os, sys
d = bpy.utils.system_resource('SCRIPTS')
sys.exit(0 if not os.access(d, os.W_OK) or compileall.compile_dir(d, quiet=2, workers=0) else 1)" >/dev/null 2>&1 ||
  echo "test.sh: compiling $TILEFARM_BLENDER's scripts failed; its processes start slower" >&2

# The Blender lines artists use besides Debian's 3.4: Blender's own builds of 4.2 LTS, 4.5 LTS and
# 5.0 as the `bpy` module from PyPI (the newest patch release of each line with a wheel for this
# machine's Python 3.11), each in its own virtual environment under the cache, pinned by version
# and SHA-256 (pip refuses a wheel of another hash), with the numpy every bpy imports. A render
# node installs a line the same way (README, "Blender lines"). TILEFARM_BLENDER_<line> names a
# build already installed instead.
BPY_PYTHON=${TILEFARM_BPY_PYTHON:-python3}
NUMPY_PIN="numpy==1.26.4 --hash=sha256:666dbfb6ec68962c033a450943ded891bed2d54e6755e35e5835d63f4f6931d5"
# install_bpy LINE VERSION SHA256 exports TILEFARM_BLENDER_<LINE> as the Python of that line's venv.
install_bpy() {
  local line=$1 version=$2 sha=$3 var=TILEFARM_BLENDER_${1/./_}
  if [ -n "${!var:-}" ]; then
    export "$var"
    return
  fi
  local dir="$CACHE/bpy-$version"
  if [ ! -e "$dir/.installed" ]; then
    echo "installing Blender $version (bpy from PyPI, ~370 MB) into $dir (first run only)..."
    rm -rf "$dir"
    "$BPY_PYTHON" -m venv "$dir"
    printf 'bpy==%s --hash=sha256:%s\n%s\n' "$version" "$sha" "$NUMPY_PIN" >"$dir/requirements.txt"
    "$dir/bin/python" -m pip install -q --disable-pip-version-check --no-cache-dir --only-binary=:all: \
      --no-deps --require-hashes -r "$dir/requirements.txt"
    "$dir/bin/python" -c "import bpy, _cycles, sys; sys.exit(bpy.app.version_string.split()[0] != '$version')" 2>/dev/null ||
      { echo "test.sh: the bpy $version just installed in $dir does not import" >&2; exit 1; }
    touch "$dir/.installed"
  fi
  export "$var=$dir/bin/python"
}
install_bpy 4.2 4.2.23 9670c0c10b0307e518d4a6b015365a7d7adbfddf99f28889634fe12623ec95ff
install_bpy 4.5 4.5.15 19203fb7825b005d2024b2e724d600fc82550a6deea71fbcc4447244df9ea737
install_bpy 5.0 5.0.1 79c6e421f53ea24a5961d86eefb8141798eee708682415eb4f5a952c2abdeb8b

# OpenImageIO (oiiotool and its Python module, with numpy): the tests' independent reader of
# Blender's multilayer EXRs, channel by channel.
if ! command -v oiiotool >/dev/null || ! /usr/bin/python3 -c 'import OpenImageIO, numpy' 2>/dev/null; then
  apt_install "the Blender output tests" "OpenImageIO is needed" openimageio-tools python3-openimageio python3-numpy
fi

# nftables: the partition tests run each process of a farm as a host in its own network
# namespace and cut links between them with nft (as root, which CI is).
if ! command -v nft >/dev/null; then
  apt_install "the partition tests" "nft is needed by the partition tests, which run as root" nftables
fi

if [ -z "${TILEFARM_CHROMIUM:-}" ]; then
  if ! command -v chromium >/dev/null; then
    apt_install "the web tests" "Chromium is needed by the web tests (or set TILEFARM_CHROMIUM)" chromium
  fi
  TILEFARM_CHROMIUM=$(command -v chromium)
fi
export TILEFARM_CHROMIUM

# ffmpeg: workers encode each job's preview movie with it; ffprobe (same package) checks it.
if [ -z "${TILEFARM_FFMPEG:-}" ] || ! command -v ffprobe >/dev/null; then
  if ! command -v ffmpeg >/dev/null || ! command -v ffprobe >/dev/null; then
    apt_install "the preview movie tests" "ffmpeg is needed by the workers' preview movies (or set TILEFARM_FFMPEG)" ffmpeg
  fi
  TILEFARM_FFMPEG=${TILEFARM_FFMPEG:-$(command -v ffmpeg)}
fi
export TILEFARM_FFMPEG

# Wine runs the Windows builds of coordinator and tileworker against a Linux farm (the Windows
# tests in internal/e2e). Debian's Wine 8 lacks bcryptprimitives.dll, whose ProcessPrng Go's
# Windows runtime needs at start: a prefix made once gets a DLL forwarding it to advapi32's
# SystemFunction036 (RtlGenRandom), linked with MinGW's binutils from a one-line .def.
if [ -z "${TILEFARM_WINE:-}" ]; then
  if [ ! -x /usr/lib/wine/wine64 ] || ! command -v x86_64-w64-mingw32-ld >/dev/null; then
    apt_install "the Windows tests (about 15 s)" "Wine and MinGW's binutils are needed by the Windows tests (or set TILEFARM_WINE and TILEFARM_WINEPREFIX)" wine64 binutils-mingw-w64-x86-64
  fi
  TILEFARM_WINE=/usr/lib/wine/wine64
fi
WINE_DIR="$CACHE/wine-$(dpkg-query -W -f '${Version}' wine64 2>/dev/null || echo local)"
if [ -z "${TILEFARM_WINEPREFIX:-}" ]; then
  TILEFARM_WINEPREFIX="$WINE_DIR/prefix"
  if [ ! -f "$TILEFARM_WINEPREFIX/drive_c/windows/system32/bcryptprimitives.dll" ]; then
    echo "preparing a Wine prefix in $TILEFARM_WINEPREFIX (first run only)..."
    mkdir -p "$WINE_DIR"
    WINEPREFIX="$TILEFARM_WINEPREFIX" WINEDEBUG=-all "$TILEFARM_WINE" wineboot --init >/dev/null 2>&1 || true
    printf 'LIBRARY bcryptprimitives.dll\nEXPORTS\nProcessPrng = advapi32.SystemFunction036\n' >"$WINE_DIR/prng.def"
    x86_64-w64-mingw32-ld --dll --entry 0 -o "$TILEFARM_WINEPREFIX/drive_c/windows/system32/bcryptprimitives.dll" "$WINE_DIR/prng.def"
  fi
fi
export TILEFARM_WINE TILEFARM_WINEPREFIX

fuzz=false
if [ $# -eq 0 ]; then
  # Every package, the longest first (go test starts them in this order, -p at a time), so
  # none of them starts last and holds up the end.
  set -- ./internal/e2e ./internal/chaos ./bench/farmbench ./blender ./bench ./finalize ./...
  fuzz=true
fi
go vet ./...
if $fuzz; then
  # Every release target builds and vets (docs/operations.md, "Platforms"): code only one
  # system compiles never reaches the others' artists. About 50 s a target the first time,
  # seconds once the build cache has it.
  for target in linux/arm64 windows/amd64 windows/arm64 darwin/amd64 darwin/arm64; do
    if ! GOOS=${target%/*} GOARCH=${target#*/} go vet ./... || ! GOOS=${target%/*} GOARCH=${target#*/} go build ./cmd/...; then
      echo "test.sh: $target does not build or vet" >&2
      exit 1
    fi
  done
fi

# The farm's commands, built once for every package that starts a farm (farmtest.Build reads
# TILEFARM_BINS).
bins=$(mktemp -d "${TMPDIR:-/tmp}/tilefarm-bins.XXXXXX")
trap 'rm -rf "$bins"' EXIT
go build -o "$bins/" ./cmd/coordinator ./cmd/tileworker
export TILEFARM_BINS="$bins"

# With no arguments, every fuzz target also fuzzes for a few seconds ($TILEFARM_FUZZTIME,
# default 3s) on top of its corpus in testdata/fuzz: with one fuzzing process, beside the tests
# (most of whose time is waiting on farms), its report printed after theirs.
if $fuzz; then
  fuzzlog=$(mktemp "${TMPDIR:-/tmp}/tilefarm-fuzz.XXXXXX")
  trap 'rm -rf "$bins" "$fuzzlog"' EXIT
  TILEFARM_FUZZWORKERS=1 ./.ci/fuzz >"$fuzzlog" 2>&1 &
  fuzzing=$!
fi

# Several packages at once (-p) and several tests of a package at once (-parallel): the farm
# tests spend most of their time waiting, and each keeps to its own farm and ports.
status=0
go test -count=1 -timeout 30m -p 4 -parallel 8 "$@" || status=$?
if $fuzz; then
  wait "$fuzzing" || status=$((status == 0 ? 1 : status))
  cat "$fuzzlog"
fi
exit "$status"
