#!/usr/bin/env bash
# Benchmarks: this package against the reference safetensors 0.8.0, torch.save/torch.load and
# numpy, next to the machine's own ceilings (memcpy, first touch, warm/cold pread) measured in the same run.
# Sets everything up (scripts/setup.sh), then runs bench/run.py, which writes BENCHMARKS.md, the plot
# bench/results.png and every sample in bench/results.json; after the numbered cases, the sections that
# bench/'s other scripts measure (bench/suite/sections.py: remote loads, prefetch, the simulated NPU,
# distributed and sharded checkpoints, strided slices, fresh memory, threads on 3.14t).
#
#   bash scripts/bench.sh                  the full run (512 MiB and 2 GiB files, case 8 also 6 GiB, then every
#                                          section; about 3 hours on 2 CPUs, the sharded section 45 minutes
#                                          of it; 13 GiB of free disk in build/bench-results/tmp)
#   bash scripts/bench.sh --quick          small sizes, 3 repetitions, small sections (a smoke test, about 10
#                                          minutes after setup); writes build/bench-results/quick/ instead of
#                                          BENCHMARKS.md
#   bash scripts/bench.sh --cases 3,4      only some cases and no section (1 open, 2 lazy load, 3 warm load,
#                                          4 cold load, 5 save, 6 slicing, 7 get_tensor, 8 fresh-process loads
#                                          vs the peers of requirements-bench.txt, installed in build/bench-peers)
#   bash scripts/bench.sh --cases none --sections remote   one section again; the rest of the report stays
#   bash scripts/bench.sh --no-setup ...   skip scripts/setup.sh (an environment that is already set up)
#   bash scripts/bench.sh --help           every option (sizes, repetitions, temp dir, output)
#
# Run it on a quiet machine: other work on the CPUs or the disk shows up in every number (the report
# records the load average at the start and the end, and says when the machine was busy).
set -euo pipefail
cd "$(dirname "$0")/.."

setup=1
args=()
for a in "$@"; do
  case "$a" in
    --no-setup) setup=0 ;;
    -h|--help) setup=0; args+=("$a") ;;
    *) args+=("$a") ;;
  esac
done

if ((setup)); then
  # Keep the way the package is installed (a development checkout uses SAFETENSORS_EDITABLE=1), and leave
  # out the other frameworks, which the benchmarks do not use, unless asked for.
  site=$( [ -x .venv/bin/python ] && .venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])' || true)
  if [ -n "$site" ] && [ -f "$site/safetensors-dev.pth" ]; then export SAFETENSORS_EDITABLE=${SAFETENSORS_EDITABLE:-1}; fi
  SAFETENSORS_FRAMEWORKS=${SAFETENSORS_FRAMEWORKS:-0} bash scripts/setup.sh
  # The peers of case 8, benchmark-only: their own --target directory, pinned in requirements-bench.txt,
  # --no-deps so that torch and numpy stay .venv's. A failure only leaves them out (noted in the report).
  if [ ! -f build/bench-peers/.installed ] || [ requirements-bench.txt -nt build/bench-peers/.installed ]; then
    rm -rf build/bench-peers
    if .venv/bin/python -m pip --disable-pip-version-check -q install --no-deps --target build/bench-peers \
        -r requirements-bench.txt; then
      touch build/bench-peers/.installed
    else
      echo "[bench] the peers of requirements-bench.txt did not install: case 8 runs without them" >&2
    fi
  fi
fi

exec .venv/bin/python bench/run.py ${args[@]+"${args[@]}"}
