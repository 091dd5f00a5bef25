# The C++ library, its tests, examples and benchmarks in a release-with-assertions build.
set -euo pipefail
cd "$ROOT"
# -g1 (line tables and functions: enough for a backtrace) instead of -g: a quarter less compile time.
cmake -S . -B build/cpp -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_INSTALL_PREFIX="$ROOT/build/install" \
  -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O2 -g1 -DNDEBUG" -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O2 -g1 -DNDEBUG" >/dev/null
cmake --build build/cpp -j "$JOBS"
ctest --test-dir build/cpp -j "$JOBS" --output-on-failure --timeout 300
# The benchmark binary runs (a smoke test; numbers are in BENCHMARKS.md).
./build/cpp/bench/header_bench --benchmark_filter='BM_OpenHeader/1000$' --benchmark_min_time=0.05 >/dev/null
python - <<'PY'
import numpy as np
from safetensors.numpy import save_file
save_file({"embed": np.arange(12, dtype=np.float32).reshape(3, 4), "ids": np.arange(5, dtype=np.int64)},
          "build/cpp/example.safetensors", metadata={"source": "10-cpp.sh"})
PY
./build/cpp/examples/inspect_file build/cpp/example.safetensors
./build/cpp/examples/inspect_file build/cpp/example.safetensors --pread | grep -q "2 tensors, 88 bytes of data"
