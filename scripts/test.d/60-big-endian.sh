# Big-endian hosts, under qemu user-mode emulation: the C++ library and its whole test suite
# cross-built for s390x (cmake/toolchain-s390x.cmake, libraries from the Debian s390x root that
# scripts/s390x-root.sh unpacks) and run by ctest through qemu-s390x-static; the byte-order golden file
# (tests/cpp/cross_host_file) written on this host is checked on s390x and the reverse, and the two files are
# identical; then the Python package, its native module cross-built against the root's Python 3.11, on the
# root's s390x Python with numpy (tests/big_endian/check_numpy.py), with files exchanged both ways again.
# SAFETENSORS_BIG_ENDIAN_PYTHON=0 leaves the Python part out.
set -euo pipefail
cd "$ROOT"
bash scripts/s390x-root.sh
S390X_ROOT=${SAFETENSORS_S390X_ROOT:-$ROOT/build/s390x-root}
export SAFETENSORS_S390X_ROOT=$S390X_ROOT
QEMU=(qemu-s390x-static -L "$S390X_ROOT")
# -g1 instead of -g (as 10-cpp): a quarter less compile time.
CROSS=(-DCMAKE_TOOLCHAIN_FILE="$ROOT/cmake/toolchain-s390x.cmake" -DSAFETENSORS_BUILD_LIBTORCH=OFF
       -DSAFETENSORS_BUILD_BENCHMARKS=OFF -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O2 -g1 -DNDEBUG"
       -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O2 -g1 -DNDEBUG")

# One build tree for the tests and (unless SAFETENSORS_BIG_ENDIAN_PYTHON=0) the native module for the root's
# Python, so the library is compiled once: nanobind from the venv, Python's headers from the root, copied with
# the root's multiarch pyconfig.h in place of the one that includes it (as scripts/wheel.sh does).
PY_ARGS=()
if [ "${SAFETENSORS_BIG_ENDIAN_PYTHON:-1}" = 1 ]; then
  PY_INCLUDE=$ROOT/build/s390x-python-include/python3.11
  rm -rf "$PY_INCLUDE"
  mkdir -p "$(dirname "$PY_INCLUDE")"
  cp -r "$S390X_ROOT/usr/include/python3.11" "$PY_INCLUDE"
  cp "$S390X_ROOT/usr/include/s390x-linux-gnu/python3.11/pyconfig.h" "$PY_INCLUDE/pyconfig.h"
  PY_ARGS=(-DSAFETENSORS_BUILD_PYTHON=ON -DPython_EXECUTABLE="$ROOT/.venv/bin/python"
           -DPython_INCLUDE_DIR="$PY_INCLUDE" -Dnanobind_DIR="$(python -m nanobind --cmake_dir)")
fi
cmake -S . -B build/s390x "${CROSS[@]}" "${PY_ARGS[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build/s390x -j "$JOBS"
ctest --test-dir build/s390x -j "$JOBS" --output-on-failure --timeout 600

# Files across hosts, byte for byte: the host's build of cross_host_file (10-cpp's build tree, or a new one).
[ -f build/cpp/build.ninja ] || cmake -S . -B build/cpp -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build/cpp -j "$JOBS" --target cross_host_file
X=build/big-endian
rm -rf "$X"
mkdir -p "$X"
build/cpp/tests/cpp/cross_host_file write "$X/cpp-little.safetensors"
"${QEMU[@]}" build/s390x/tests/cpp/cross_host_file write "$X/cpp-big.safetensors"
"${QEMU[@]}" build/s390x/tests/cpp/cross_host_file check "$X/cpp-little.safetensors"
build/cpp/tests/cpp/cross_host_file check "$X/cpp-big.safetensors"
cmp "$X/cpp-little.safetensors" "$X/cpp-big.safetensors"

[ "${SAFETENSORS_BIG_ENDIAN_PYTHON:-1}" = 1 ] || exit 0
# The module is named by the venv's (x86-64) tag; the s390x Python looks for its own, so it is renamed into a
# package directory.
SITE=build/s390x/site
rm -rf "$SITE"
mkdir -p "$SITE/safetensors"
cp python/safetensors/*.py "$SITE/safetensors/"
cp build/s390x/python/_safetensors_cpp*.so "$SITE/safetensors/_safetensors_cpp.cpython-311-s390x-linux-gnu.so"
# Bytecode is written (into the root and $SITE): a second import of numpy under qemu takes 1 s, not 20.
S390X_PYTHON=(env -u PYTHONDONTWRITEBYTECODE PYTHONPATH="$ROOT/$SITE" "${QEMU[@]}" "$S390X_ROOT/usr/bin/python3")
"${S390X_PYTHON[@]}" -c 'import sys; assert sys.byteorder == "big", sys.byteorder'
python tests/big_endian/check_numpy.py write "$X"
"${S390X_PYTHON[@]}" tests/big_endian/check_numpy.py write "$X"
"${S390X_PYTHON[@]}" tests/big_endian/check_numpy.py check "$X"
python tests/big_endian/check_numpy.py check "$X"
cmp "$X/numpy-little.safetensors" "$X/numpy-big.safetensors"
