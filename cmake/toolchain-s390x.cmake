# Cross-compiles for s390x (IBM Z: big-endian, 64-bit) with Debian's s390x-linux-gnu toolchain and runs the
# results under qemu user-mode emulation, so ctest runs the whole suite on a big-endian "host".
#
#   cmake -S . -B build/s390x -DCMAKE_TOOLCHAIN_FILE=cmake/toolchain-s390x.cmake
#
# The s390x builds of the libraries (simdjson, GoogleTest, and the glibc/libstdc++ they run on) come from an
# unpacked Debian root, scripts/s390x-root.sh's output: SAFETENSORS_S390X_ROOT in the environment, else
# build/s390x-root. An environment variable rather than a cache entry, so that try_compile sees it too.
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR s390x)
set(CMAKE_C_COMPILER s390x-linux-gnu-gcc)
set(CMAKE_CXX_COMPILER s390x-linux-gnu-g++)

if(DEFINED ENV{SAFETENSORS_S390X_ROOT})
  set(_safetensors_s390x_root "$ENV{SAFETENSORS_S390X_ROOT}")
else()
  get_filename_component(_safetensors_s390x_root "${CMAKE_CURRENT_LIST_DIR}/../build/s390x-root" ABSOLUTE)
endif()
if(NOT EXISTS "${_safetensors_s390x_root}/usr/lib/s390x-linux-gnu")
  message(FATAL_ERROR "no s390x root at ${_safetensors_s390x_root}: run scripts/s390x-root.sh first")
endif()

# Libraries, headers and package configs only from the s390x root; programs (the build tools) from the host.
set(CMAKE_FIND_ROOT_PATH "${_safetensors_s390x_root}")
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE ONLY)

# -L: the guest's absolute paths (the dynamic loader /lib/ld64.so.1, libc, libstdc++, libsimdjson) resolve
# inside the root first. ctest and gtest_discover_tests run every test binary through this.
set(CMAKE_CROSSCOMPILING_EMULATOR qemu-s390x-static -L "${_safetensors_s390x_root}")
unset(_safetensors_s390x_root)
