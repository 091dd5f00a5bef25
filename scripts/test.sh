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

selected() {  # STAGE_NAME: whether the command line selects it (no arguments: every stage)
  local want
  ((${#ARGS[@]})) || return 0
  for want in "${ARGS[@]}"; do [[ $1 == *"$want"* ]] && return 0; done
  return 1
}
ARGS=("$@")

# The free-threaded CPython and its venv (scripts/python-ft.sh: minutes of compiling and a large download when
# its cache is cold) are prepared in the background from now on, at the lowest priority, so they take the CPU
# and network the stages before 55 leave idle (the Python suite uses less than one of the cores) rather than
# time of their own; stage 55's own call waits for this one (a lock) and finds them ready. Then the same for the
# ThreadSanitizer build stage 56 uses. Its log: build/python-ft.log. (Nice 15: ahead of the wheels below for the
# idle CPU, as it is needed first.)
background=()  # process groups started here, stopped when this script exits
trap 'for g in "${background[@]}"; do kill -- -"$g" 2>/dev/null || true; done' EXIT
mkdir -p build
# Starts COMMAND... in the background at niceness NICE, its output into LOG, in a session of its own (so that it
# can be stopped as a group). The kernel gives each session a scheduling group (autogroup) with an equal share
# of the CPU whatever its processes' nice values, so the group itself gets NICE too: else the background job
# takes half the CPU from the stages (measured: 10-cpp 550 s against 294 s alone).
start_background() {  # NICE LOG COMMAND...
  local nice=$1 log=$2
  shift 2
  setsid bash -c 'echo "$0" >/proc/self/autogroup 2>/dev/null || true; exec nice -n "$0" "$@"' "$nice" "$@" \
    >"$log" 2>&1 &
  background+=($!)
}
if selected 55-free-threaded || selected 56-tsan-free-threaded; then
  # Both interpreters, one after the other (stage 56's is the ThreadSanitizer build of the same one).
  start_background 15 build/python-ft.log bash -c 'bash scripts/python-ft.sh; bash scripts/python-ft.sh --tsan'
fi

# The wheels stage (zig cross-compiles, Debian roots downloaded and tested under chroot and qemu: CPU and
# network, nothing the other stages use or make) runs the same way, from the start, at the lowest priority, into
# build/stage-70-wheels.log: it takes the CPU the stages before it leave idle (the Python suite uses about one
# of the two cores) instead of 20-odd minutes at the end. At its turn in the order the run waits for it (at most
# the stage timeout from then) and prints its log. SAFETENSORS_WHEELS_BESIDE=0 runs it in its turn instead.
early_stage=scripts/test.d/70-wheels.sh
early_pid=""
if selected 70-wheels && [ "${SAFETENSORS_WHEELS_BESIDE:-1}" = 1 ] && [ -f "$early_stage" ]; then
  start_background 19 build/stage-70-wheels.log bash "$early_stage"
  early_pid=${background[-1]}
fi

# Waits for the stage started beside the others: its status, or 124 when it ran past the stage timeout from now.
wait_early() {
  local t0=$SECONDS status=0
  while kill -0 "$early_pid" 2>/dev/null && ((SECONDS - t0 < ${SAFETENSORS_STAGE_TIMEOUT:-1800})); do sleep 2; done
  if kill -0 "$early_pid" 2>/dev/null; then
    kill -- -"$early_pid" 2>/dev/null || true
    wait "$early_pid" || true
    status=124
  else
    wait "$early_pid" || status=$?
  fi
  cat build/stage-70-wheels.log
  return "$status"
}

summary=()
start_all=$SECONDS
for stage in scripts/test.d/*.sh; do
  name=$(basename "$stage" .sh)
  selected "$name" || continue
  printf '\n\033[1m=== %s (%s, %ds in) ===\033[0m\n' "$name" "$(date -u +%H:%M:%S)" $((SECONDS - start_all))
  t0=$SECONDS
  # A stage that hangs fails on its own, naming itself, long before CI's limit for the whole run.
  rc=0
  if [ -n "$early_pid" ] && [ "$stage" = "$early_stage" ]; then
    echo "(started beside the stages before it, at 0s; its output:)"
    wait_early || rc=$?
  else
    timeout --kill-after=30 "${SAFETENSORS_STAGE_TIMEOUT:-1800}" bash "$stage" || rc=$?
  fi
  if ((rc)); then
    ((rc == 124)) && printf '\n\033[31m%s ran past SAFETENSORS_STAGE_TIMEOUT (%ss) and was stopped\033[0m' \
      "$name" "${SAFETENSORS_STAGE_TIMEOUT:-1800}"
    printf '\n\033[31mFAILED: %s (after %ds; the stages before it:)\033[0m\n' "$name" $((SECONDS - t0))
    printf '  %s\n' "${summary[@]}"
    exit 1
  fi
  summary+=("$(printf '%-28s %5ds' "$name" $((SECONDS - t0)))")
  printf '\033[1m--- %s passed in %ds\033[0m\n' "$name" $((SECONDS - t0))
done
printf '\n\033[1m=== all stages passed (%ds) ===\033[0m\n' $((SECONDS - start_all))
printf '  %s\n' "${summary[@]}"
