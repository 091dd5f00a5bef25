# The whole C++ suite under ASan + UBSan, and the threaded tests (and all of the engine's) under TSan (clang).
set -euo pipefail
cd "$ROOT"
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
cmake -S . -B build/asan -DCMAKE_BUILD_TYPE=Debug -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ \
  -DSAFETENSORS_SANITIZE=address,undefined -DSAFETENSORS_BUILD_BENCHMARKS=OFF >/dev/null
cmake --build build/asan -j "$JOBS"
ctest --test-dir build/asan -j "$JOBS" --output-on-failure --timeout 600

export TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1
cmake -S . -B build/tsan -DCMAKE_BUILD_TYPE=Debug -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ \
  -DSAFETENSORS_SANITIZE=thread -DSAFETENSORS_BUILD_BENCHMARKS=OFF -DSAFETENSORS_BUILD_EXAMPLES=OFF >/dev/null
cmake --build build/tsan -j "$JOBS" --target file_test writer_test sharded_test engine_test remote_test direct_source_test
ctest --test-dir build/tsan -j "$JOBS" --output-on-failure --timeout 600 -R 'Thread|Parallel|Concurrent|ReadMany|Engine|RemoteSource'
