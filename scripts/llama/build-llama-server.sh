#!/usr/bin/env bash
# Produce llama.cpp's `llama-server` binary at OUT (default target/llama/llama-server).
#
#   bash scripts/llama/build-llama-server.sh [OUT] [--configure-only]
#
# In order, the first that applies:
#   1. OUT already exists and has the known sha256 below, or answers `--version`: kept.
#   2. $LLAMA_SERVER_PREBUILT, or ../shared/engines/llama-server beside the repo,
#      exists with the known sha256: copied to OUT.
#   3. Built from source: the llama.cpp tree vendored in the PyPI sdist of
#      llama-cpp-python 0.3.36 (llama.cpp commit 0c1e570), configured with the
#      flags below, `cmake --build build --target llama-server` (about 26 CPU
#      minutes; $LLAMA_BUILD_JOBS parallel jobs, default 2). cmake (and a C++
#      toolchain, when missing) come from apt-get, which needs root.
#      The unpacked source and build tree stay in $LLAMA_BUILD_ROOT (default
#      target/llama/src) so an interrupted build resumes.
# --configure-only stops case 3 after a successful cmake configure and removes
# the build folder (to check the script without the long compile).
#
# Logs go to stderr; nothing is printed on stdout.
set -euo pipefail

EXPECTED_SHA256=bed25a4fe93ffeeb2a889529d0dadfbe849f86ec6da845a7acceb0695ec97e57
SDIST_VERSION=0.3.36
SDIST_SHA256=832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e
CMAKE_FLAGS=(
  -DCMAKE_BUILD_TYPE=Release -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_TESTS=OFF
  -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF
  -DLLAMA_OPENSSL=OFF -DBUILD_SHARED_LIBS=OFF
  -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON
)

log() { echo "build-llama-server: $*" >&2; }
die() { log "error: $*"; exit 1; }

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
OUT=""
CONFIGURE_ONLY=0
for arg in "$@"; do
  case "$arg" in
    --configure-only) CONFIGURE_ONLY=1 ;;
    -h|--help) sed -n '2,22p' "${BASH_SOURCE[0]}" >&2; exit 0 ;;
    -*) die "unknown option $arg" ;;
    *) [ -z "$OUT" ] || die "one output path only"; OUT=$arg ;;
  esac
done
OUT=${OUT:-$ROOT/target/llama/llama-server}
case "$OUT" in /*) ;; *) OUT=$PWD/$OUT ;; esac

sha_of() { sha256sum "$1" | cut -d' ' -f1; }
works() { [ -x "$1" ] && "$1" --version >/dev/null 2>&1; }

install_to_out() { # copy $1 to $OUT atomically
  mkdir -p "$(dirname "$OUT")"
  cp "$1" "$OUT.tmp.$$"
  chmod 755 "$OUT.tmp.$$"
  mv -f "$OUT.tmp.$$" "$OUT"
}

# 1. Already there.
if [ "$CONFIGURE_ONLY" = 0 ] && [ -f "$OUT" ]; then
  if [ "$(sha_of "$OUT")" = "$EXPECTED_SHA256" ]; then
    log "$OUT is there (checksum matches)"; exit 0
  elif works "$OUT"; then
    log "$OUT is there and answers --version: $("$OUT" --version 2>&1 | head -1)"; exit 0
  else
    log "$OUT exists but does not run; replacing it"
  fi
fi

# 2. A known prebuilt binary.
if [ "$CONFIGURE_ONLY" = 0 ]; then
  for cand in ${LLAMA_SERVER_PREBUILT:+"$LLAMA_SERVER_PREBUILT"} "$ROOT/../shared/engines/llama-server"; do
    [ -f "$cand" ] || continue
    if [ "$(sha_of "$cand")" = "$EXPECTED_SHA256" ]; then
      install_to_out "$cand"
      works "$OUT" || die "copied $cand to $OUT but it does not answer --version"
      log "copied $cand to $OUT"; exit 0
    fi
    log "ignoring $cand: its sha256 is not $EXPECTED_SHA256"
  done
fi

# 3. Build from source.
as_root() {
  if [ "$(id -u)" = 0 ]; then "$@"
  elif command -v sudo >/dev/null 2>&1; then sudo -n "$@"
  else die "need root to run: $*"
  fi
}
APT_UPDATED=0
apt_install() {
  command -v apt-get >/dev/null 2>&1 || die "missing $*, and no apt-get to install it with"
  if [ "$APT_UPDATED" = 0 ]; then
    log "apt-get update"
    as_root env DEBIAN_FRONTEND=noninteractive apt-get update -q >&2 </dev/null
    APT_UPDATED=1
  fi
  log "apt-get install $*"
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "$@" >&2 </dev/null
}
command -v cmake >/dev/null 2>&1 || apt_install cmake
if ! command -v c++ >/dev/null 2>&1 || ! command -v make >/dev/null 2>&1; then
  apt_install build-essential
fi
PY=${PYTHON:-python3}
command -v "$PY" >/dev/null 2>&1 || die "python3 with pip is needed to download the source"

SRC_ROOT=${LLAMA_BUILD_ROOT:-$ROOT/target/llama/src}
mkdir -p "$SRC_ROOT"
SDIST=$SRC_ROOT/llama_cpp_python-$SDIST_VERSION.tar.gz
TREE=$SRC_ROOT/llama_cpp_python-$SDIST_VERSION
LLAMA=$TREE/vendor/llama.cpp

if [ ! -f "$LLAMA/CMakeLists.txt" ]; then
  if [ ! -f "$SDIST" ] || [ "$(sha_of "$SDIST")" != "$SDIST_SHA256" ]; then
    rm -f "$SDIST"
    log "pip download llama-cpp-python==$SDIST_VERSION (sdist, ~75 MB)"
    PIP_NO_INPUT=1 "$PY" -m pip download --disable-pip-version-check --no-deps \
      --no-binary llama-cpp-python "llama-cpp-python==$SDIST_VERSION" -d "$SRC_ROOT" >&2 </dev/null
  fi
  [ -f "$SDIST" ] || die "pip did not leave $SDIST"
  [ "$(sha_of "$SDIST")" = "$SDIST_SHA256" ] || die "$SDIST: sha256 is not $SDIST_SHA256"
  log "unpacking $SDIST"
  rm -rf "$TREE"
  tar -xzf "$SDIST" -C "$SRC_ROOT"
  [ -f "$LLAMA/CMakeLists.txt" ] || die "no vendor/llama.cpp in $SDIST"
fi

BUILD=$LLAMA/build
log "cmake configure in $BUILD"
cmake -S "$LLAMA" -B "$BUILD" "${CMAKE_FLAGS[@]}" >&2 </dev/null
if [ "$CONFIGURE_ONLY" = 1 ]; then
  rm -rf "$BUILD"
  log "configure-only: cmake configure succeeded; removed $BUILD"
  exit 0
fi
log "cmake --build --target llama-server -j${LLAMA_BUILD_JOBS:-2} (about 26 CPU minutes)"
cmake --build "$BUILD" --target llama-server -j"${LLAMA_BUILD_JOBS:-2}" >&2 </dev/null
BIN=$BUILD/bin/llama-server
[ -x "$BIN" ] || die "the build left no $BIN"
install_to_out "$BIN"
works "$OUT" || die "$OUT does not answer --version"
log "built $OUT: $("$OUT" --version 2>&1 | head -1)"
