#!/usr/bin/env bash
# Unpacks a Debian 12 (bookworm) s390x root into build/s390x-root (or $SAFETENSORS_S390X_ROOT) for the
# big-endian stage (scripts/test.d/60-big-endian.sh): the s390x builds of what the C++ library and its tests
# link (simdjson, GoogleTest, glibc, libstdc++; libcurl, which the remote tests load) for the cross build (cmake/toolchain-s390x.cmake), and an
# s390x Python 3.11 with numpy for the Python checks, all run under qemu-s390x-static. The host tools
# (qemu-user-static, g++-s390x-linux-gnu, mmdebstrap) are in scripts/setup.sh's APT_PACKAGES.
#
# mmdebstrap's "extract" variant only unpacks the packages (and their dependencies): no maintainer script runs,
# so nothing is emulated here and the host's dpkg is untouched. Takes about a minute and ~200 MB; a second
# run with the same package list does nothing.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT_DIR=${SAFETENSORS_S390X_ROOT:-$PWD/build/s390x-root}
SUITE=bookworm
MIRROR=http://deb.debian.org/debian
PACKAGES=libsimdjson-dev,libgtest-dev,libcurl4-openssl-dev,python3,python3-dev,python3-numpy
STAMP="$SUITE $MIRROR $PACKAGES"

if [ -f "$ROOT_DIR/.safetensors-root" ] && [ "$(cat "$ROOT_DIR/.safetensors-root")" = "$STAMP" ]; then
  exit 0
fi
rm -rf "$ROOT_DIR"
mkdir -p "$(dirname "$ROOT_DIR")"
mmdebstrap --quiet --variant=extract --arch=s390x --mode=root --include="$PACKAGES" \
  --aptopt='Acquire::Languages "none"' "$SUITE" "$ROOT_DIR" "$MIRROR"
# The alternatives a maintainer script would have set up: numpy's BLAS and LAPACK.
ln -sf blas/libblas.so.3 "$ROOT_DIR/usr/lib/s390x-linux-gnu/libblas.so.3"
ln -sf lapack/liblapack.so.3 "$ROOT_DIR/usr/lib/s390x-linux-gnu/liblapack.so.3"
echo "$STAMP" > "$ROOT_DIR/.safetensors-root"
