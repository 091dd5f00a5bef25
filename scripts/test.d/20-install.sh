# `cmake --install`, then a separate project finds the library with find_package(safetensors) and with
# pkg-config, links it and runs: C++ programs, and C programs through the C API (safetensors/c.h).
set -euo pipefail
cd "$ROOT"
rm -rf build/install build/consumer build/consumer-c
cmake --install build/cpp >/dev/null
cmake -S tests/cmake/consumer -B build/consumer -DCMAKE_PREFIX_PATH="$ROOT/build/install" >/dev/null
cmake --build build/consumer -j "$JOBS"
ctest --test-dir build/consumer --output-on-failure
PKG_CONFIG_PATH="$ROOT/build/install/lib/pkgconfig" pkg-config --exists --print-errors safetensors
PKG_CONFIG_PATH="$ROOT/build/install/lib/pkgconfig" g++ -std=c++20 -o build/consumer/pkgconfig_consumer \
  tests/cmake/consumer/main.cc $(PKG_CONFIG_PATH="$ROOT/build/install/lib/pkgconfig" pkg-config --cflags --libs --static safetensors)
./build/consumer/pkgconfig_consumer
cmake -S tests/cmake/consumer/c_only -B build/consumer-c -DCMAKE_PREFIX_PATH="$ROOT/build/install" >/dev/null
cmake --build build/consumer-c -j "$JOBS"
ctest --test-dir build/consumer-c --output-on-failure
PKG_CONFIG_PATH="$ROOT/build/install/lib/pkgconfig" gcc -std=c11 -Wall -Wextra -Wpedantic -Werror \
  -o build/consumer/pkgconfig_c_consumer tests/cmake/consumer/main.c \
  $(PKG_CONFIG_PATH="$ROOT/build/install/lib/pkgconfig" pkg-config --cflags --libs --static safetensors-c)
./build/consumer/pkgconfig_c_consumer
