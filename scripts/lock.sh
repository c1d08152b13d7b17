#!/bin/sh
# The image's hash-pinned lock files (Dockerfile), generated from pyproject.toml by uv:
#   requirements.lock        [project] dependencies: what the final stage installs, pip --require-hashes
#   requirements-build.lock  [build-system] requires: what the build stage builds the wheel with
# Both resolve for the image: CPython 3.11 on Linux (the platform tag of Debian 12's glibc 2.36); each pin lists
# the sha256 of every file PyPI has for that version, so amd64 and arm64 builds check the same lock.
#
#   scripts/lock.sh           regenerate both (after changing dependencies in pyproject.toml)
#   scripts/lock.sh --check   exit 1 if either differs from what regeneration gives today (needs PyPI)
#
# Needs uv (pip install uv==0.13.9; UV=/path/to/uv to choose one). tests/test_compose.py checks offline that
# every dependency in pyproject.toml has a hashed pin in requirements.lock that satisfies it.
set -eu
cd "$(dirname "$0")/.."
UV="${UV:-uv}"
command -v "$UV" >/dev/null 2>&1 || { echo "scripts/lock.sh: uv not found (pip install uv==0.13.9)" >&2; exit 2; }
out="${1:-}"
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
compile() { # compile SRC OUT
  UV_CUSTOM_COMPILE_COMMAND="scripts/lock.sh" "$UV" pip compile --quiet --generate-hashes --no-config \
    --index-url https://pypi.org/simple --python-version 3.11 --python-platform x86_64-manylinux_2_36 \
    --output-file "$2" "$1"
}
python3 - "$dir/build.in" <<'EOF'
import sys, tomllib
with open("pyproject.toml", "rb") as fh:
    requires = tomllib.load(fh)["build-system"]["requires"]
open(sys.argv[1], "w").write("".join(r + "\n" for r in requires))
EOF
compile pyproject.toml "$dir/requirements.lock"
compile "$dir/build.in" "$dir/requirements-build.lock"
sed -i "s#$dir/build.in#pyproject.toml [build-system]#" "$dir/requirements-build.lock"
if [ "$out" = "--check" ]; then
  status=0
  for f in requirements.lock requirements-build.lock; do
    if ! diff -u "$f" "$dir/$f"; then
      echo "scripts/lock.sh: $f is out of date: run scripts/lock.sh and commit the result" >&2
      status=1
    fi
  done
  exit $status
fi
cp "$dir/requirements.lock" "$dir/requirements-build.lock" .
echo "scripts/lock.sh: wrote requirements.lock and requirements-build.lock"
