#!/usr/bin/env bash
# Builds the libFuzzer harnesses (clang, ASan + UBSan + coverage) into build/fuzz and runs each for SECONDS
# (default 60) on the committed seeds, fuzz/corpus/<harness>, and the regression inputs,
# fuzz/regressions/<harness>. New coverage goes to build/fuzz/corpus/<harness> (kept between runs); a crash,
# leak, sanitizer report, timeout or over-large allocation leaves its input in build/fuzz/artifacts/ and
# makes the script fail. Prints the executions of each harness.
#
#   bash scripts/fuzz.sh [SECONDS] [HARNESS...]      FUZZ_JOBS=N runs N harnesses at a time (default 1)
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
SECONDS_PER_HARNESS=${1:-60}
shift $(($# > 0 ? 1 : 0))
HARNESSES=("$@")
((${#HARNESSES[@]})) || HARNESSES=(header read slice roundtrip index fault)
FUZZ_JOBS=${FUZZ_JOBS:-1}
BUILD=build/fuzz
[ -x "$ROOT/.venv/bin/cmake" ] && export PATH="$ROOT/.venv/bin:$PATH"

cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ \
  -DSAFETENSORS_SANITIZE=address,undefined,fuzzer-no-link -DSAFETENSORS_LIBFUZZER=ON \
  -DSAFETENSORS_BUILD_BENCHMARKS=OFF -DSAFETENSORS_BUILD_EXAMPLES=OFF -DSAFETENSORS_INSTALL=OFF >/dev/null
cmake --build "$BUILD" -j "${JOBS:-$(nproc)}" --target "${HARNESSES[@]/#/fuzz_}"

export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:allocator_may_return_null=0
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1

run_one() {
  local h=$1 work="$BUILD/corpus/$1" artifacts="$BUILD/artifacts/$1" log="$BUILD/logs/$1.log"
  mkdir -p "$work" "$artifacts" "$(dirname "$log")"
  local dict=()
  [ "$h" != slice ] && dict=(-dict=fuzz/safetensors.dict)
  local extra=(fuzz/corpus/"$h")
  [ -d fuzz/regressions/"$h" ] && extra+=(fuzz/regressions/"$h")
  # -malloc_limit_mb: inputs are a few KiB, so an allocation of 256 MiB means a size taken from the file
  # on trust. -timeout: one input running 10 s is a hang.
  local rc=0
  "$BUILD/fuzz/fuzz_$h" "${dict[@]}" -max_total_time="$SECONDS_PER_HARNESS" -timeout=10 -rss_limit_mb=2048 \
    -malloc_limit_mb=256 -print_final_stats=1 -artifact_prefix="$artifacts/" "$work" "${extra[@]}" \
    >"$log" 2>&1 || rc=$?
  local execs
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  if ((rc != 0)); then
    printf '%-10s FAILED (exit %d) after %s executions; log: %s\n' "$h" "$rc" "${execs:-?}" "$log"
    grep -E 'ERROR|FUZZ_CHECK|SUMMARY|Test unit written' "$log" | head -20 || true
    return 1
  fi
  printf '%-10s %12s executions in %ss, corpus %s inputs\n' "$h" "$execs" "$SECONDS_PER_HARNESS" \
    "$(find "$work" -type f | wc -l)"
}

failed=0
pids=()
for h in "${HARNESSES[@]}"; do
  run_one "$h" &
  pids+=($!)
  if ((${#pids[@]} >= FUZZ_JOBS)); then
    wait "${pids[0]}" || failed=1
    pids=("${pids[@]:1}")
  fi
done
for p in "${pids[@]}"; do wait "$p" || failed=1; done
exit $failed
