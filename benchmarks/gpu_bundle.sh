#!/usr/bin/env bash
# Packs the Python packages the lent GPU machine lacks into one tarball its `carry` can take (64 MiB at most).
# That machine has Python 3.12, torch, transformers, peft, accelerate, rich, pyyaml and psutil, but no network and
# none of the packages below (measured on the machine: `python3 -c "import vllm"` and the others fail).
#
#   benchmarks/gpu_bundle.sh [OUT] [NAME ...]    # OUT: .cache/gpu-site.tar.xz; NAMEs: PACKAGES below
#
# Each package is pinned to the version this environment's Python ($PYTHON, else .venv/bin/python, else python3)
# has installed, so the GPU runs what the tests ran. Wheels are cp312 manylinux ones (a package published only as
# source is built into a wheel here, which must then be pure Python); all are unzipped into one folder, Ray's
# Java jars and dashboard build are dropped (the loop starts Ray without its dashboard) and the folder is packed
# with xz. On the GPU machine:
#   mkdir -p /tmp/site && tar xJf .cache/gpu-site.tar.xz -C /tmp/site && export PYTHONPATH=/tmp/site:$PWD/src
set -euo pipefail

PACKAGES=(ray textarena openskill trueskill pydantic pydantic-core annotated-types typing-inspection jsonschema
  jsonschema-specifications referencing rpds-py openai distro jiter sniffio nltk chess python-dotenv websockets)
CARRY_LIMIT=$((64 * 1024 * 1024))

root=$(cd "$(dirname "$0")/.." && pwd)
out=$(realpath -m "${1:-$root/.cache/gpu-site.tar.xz}")
shift || true
names=("$@")
[ ${#names[@]} -gt 0 ] || names=("${PACKAGES[@]}")
python=${PYTHON:-$root/.venv/bin/python}
[ -x "$python" ] || python=python3

pinned() {  # NAME==VERSION as installed here, or NAME alone when it is not installed
  local version
  version=$("$python" -c "import importlib.metadata as m, sys; print(m.version(sys.argv[1]))" "$1" 2>/dev/null) \
    && echo "$1==$version" || echo "$1"
}

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fetch() {  # a cp312 wheel of NAME[==VERSION] into $work/wheels, else one built from its source if pure Python
  "$python" -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 \
    --platform manylinux2014_x86_64 --platform manylinux_2_28_x86_64 -d "$work/wheels" "$1" 2>/dev/null && return
  "$python" -m pip wheel --quiet --no-deps -w "$work/built" "$1"
  if ls "$work"/built/*.whl | grep -qv -- '-none-any\.whl$'; then
    echo "$1 has no cp312 wheel and is not pure Python: $(ls "$work"/built)" >&2
    exit 1
  fi
  mv "$work"/built/*.whl "$work/wheels/"
}

for name in "${names[@]}"; do
  fetch "$(pinned "$name")"
done
for wheel in "$work"/wheels/*.whl; do
  unzip -qo "$wheel" -d "$work/site"
done
rm -rf "$work/site/ray/jars" "$work/site/ray/dashboard/client/build"
mkdir -p "$(dirname "$out")"
tar -C "$work/site" -c . | xz -T0 > "$out"
size=$(stat -c %s "$out")
echo "$out: $((size / 1024 / 1024)) MiB, $(ls "$work"/wheels | wc -l) wheels: $(ls "$work"/wheels | tr '\n' ' ')"
if [ "$size" -gt "$CARRY_LIMIT" ]; then
  echo "over the 64 MiB carry limit" >&2
  exit 1
fi
