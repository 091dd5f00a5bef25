#!/usr/bin/env bash
# The checks that need an NVIDIA GPU, as one script for the device machine (no network there; its python3
# has torch with CUDA and the reference safetensors): build this package against that torch, run the CUDA
# tests, then the GPU load benchmark (bench/gpu_load.py: ours vs the reference, against the pinned
# host-to-device ceiling) -- in under 7 minutes.
#
#   here:   bash scripts/gpu-check.sh --prepare     # fetches the simdjson packages into .gpu/ (git-ignored)
#   there:  bash scripts/gpu-check.sh               # with .gpu carried along; results in $OUT (or build/gpu)
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "${1:-}" = --prepare ]; then
  mkdir -p .gpu
  grep -qx '/.gpu/' .git/info/exclude 2>/dev/null || echo '/.gpu/' >> .git/info/exclude
  (cd .gpu && rm -f ./*.deb && apt-get download libsimdjson-dev libsimdjson14)
  # The reference's release candidate, for its CUDA prefetch (bench/gpu_load.py --reference-rc).
  rm -rf .gpu/ref-rc && python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --platform manylinux2014_x86_64 -d .gpu/wheels safetensors==0.9.0rc1 && \
    python3 -m pip install -q --no-deps --target .gpu/ref-rc .gpu/wheels/safetensors-0.9.0rc1-*.whl
  ls -l .gpu
  exit 0
fi

PY=${PYTHON:-python3}
RESULTS=${OUT:-build/gpu}
mkdir -p "$RESULTS"
start=$SECONDS
stamp() { printf '[gpu-check %3ds] %s\n' $((SECONDS - start)) "$*"; }

nvidia-smi -L
stamp "unpacking simdjson"
mkdir -p /tmp/simdjson
for deb in .gpu/*.deb; do dpkg -x "$deb" /tmp/simdjson; done
export CMAKE_PREFIX_PATH=/tmp/simdjson/usr
export LD_LIBRARY_PATH=/tmp/simdjson/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}

stamp "building the package against $($PY -c 'import torch; print("torch", torch.__version__)')"
$PY -m pip install -q --no-build-isolation --no-deps --target /tmp/st \
  -Cminimum-version=0.10 -Cbuild-dir=/tmp/st-build -Ccmake.define.SAFETENSORS_WERROR=OFF . 2>&1 | tail -20
export PYTHONPATH=/tmp/st
$PY -c 'import safetensors; assert "+cpp" in safetensors.__version__, safetensors.__file__; print(safetensors.__file__)'

stamp "GPU tests"
$PY -m pytest -q -p no:cacheprovider tests/python/devices/test_cuda.py tests/python/frameworks/test_torch.py \
  tests/python/api/test_api.py tests/python/prefetch/test_prefetch.py \
  2>&1 | tee "$RESULTS/gpu_tests.log" | tail -15

stamp "distributed load over NCCL, one GPU per rank"
ngpu=$(nvidia-smi -L | wc -l)
worlds=1; [ "$ngpu" -ge 2 ] && worlds=1,2; [ "$ngpu" -ge 4 ] && worlds=1,2,4
PYTHONUNBUFFERED=1 $PY bench/distributed_load.py --device cuda --worlds "$worlds" --size-mib 1024 --reps 2 \
  2>&1 | tee "$RESULTS/distributed.log" | tail -12

stamp "GPU load benchmark"
PYTHONUNBUFFERED=1 $PY bench/gpu_load.py --out "$RESULTS" 2>&1 | tee "$RESULTS/gpu_bench.log"
stamp "done"
