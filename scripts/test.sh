#!/usr/bin/env bash
# Sets everything up (scripts/setup.sh), then runs every test stage in scripts/test.d in order: the C++
# suite, the install/consumer check, sanitizer builds, fuzzing and the Python suite. Exits non-zero on the
# first failing stage. `bash scripts/test.sh STAGE...` runs only stages whose file name contains STAGE.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
export ROOT

bash scripts/setup.sh

export PATH="$ROOT/.venv/bin:$PATH"   # the pinned cmake, ninja and python
export CMAKE_GENERATOR=Ninja
JOBS=${JOBS:-$(nproc)}
export JOBS

summary=()
start_all=$SECONDS
for stage in scripts/test.d/*.sh; do
  name=$(basename "$stage" .sh)
  if (($#)); then
    selected=0
    for want in "$@"; do [[ $name == *"$want"* ]] && selected=1; done
    ((selected)) || continue
  fi
  printf '\n\033[1m=== %s ===\033[0m\n' "$name"
  t0=$SECONDS
  if ! bash "$stage"; then
    printf '\n\033[31mFAILED: %s (after %ds)\033[0m\n' "$name" $((SECONDS - t0))
    exit 1
  fi
  summary+=("$(printf '%-28s %5ds' "$name" $((SECONDS - t0)))")
done
printf '\n\033[1m=== all stages passed (%ds) ===\033[0m\n' $((SECONDS - start_all))
printf '  %s\n' "${summary[@]}"
