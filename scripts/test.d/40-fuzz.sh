# Fuzzing: the libFuzzer harnesses (clang, ASan + UBSan) built into build/fuzz and run for 60 s each on the
# seed corpus and regression inputs, two at a time (the stage stays under six minutes). Any crash,
# sanitizer report, hang or check failure fails the stage; the corpus replay also runs in every ctest build.
set -euo pipefail
cd "$ROOT"
FUZZ_JOBS=${FUZZ_JOBS:-2} bash scripts/fuzz.sh "${FUZZ_SECONDS:-60}"
