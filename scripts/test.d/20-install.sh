# `cmake --install`, then a separate project finds the library with find_package(safetensors) and with
# pkg-config, links it and runs.
set -euo pipefail
cd "$ROOT"
rm -rf build/install build/consumer
cmake --install build/cpp >/dev/null
cmake -S tests/cmake/consumer -B build/consumer -DCMAKE_PREFIX_PATH="$ROOT/build/install" >/dev/null
cmake --build build/consumer -j "$JOBS"
ctest --test-dir build/consumer --output-on-failure
PKG_CONFIG_PATH="$ROOT/build/install/lib/pkgconfig" pkg-config --exists --print-errors safetensors
PKG_CONFIG_PATH="$ROOT/build/install/lib/pkgconfig" g++ -std=c++20 -o build/consumer/pkgconfig_consumer \
  tests/cmake/consumer/main.cc $(PKG_CONFIG_PATH="$ROOT/build/install/lib/pkgconfig" pkg-config --cflags --libs --static safetensors)
./build/consumer/pkgconfig_consumer
