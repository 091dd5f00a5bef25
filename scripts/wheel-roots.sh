#!/usr/bin/env bash
# Unpacks the bare systems the wheel stage (scripts/test.d/70-wheels.sh) installs each wheel into: Debian roots
# with a Python, pip, and the distribution's numpy, pytest and hypothesis (ml_dtypes where Debian has it), and
# nothing of this project, for x86_64 (amd64) and, run under qemu-user (qemu-ARCH-static), aarch64 (arm64), s390x
# and ppc64le (ppc64el). Each is unpacked by mmdebstrap's extract variant (no maintainer script runs, nothing is
# emulated), then given what those scripts or the host would have provided: the CA bundle and resolver of this
# machine, so that pip there reaches PyPI, and for an emulated architecture the static qemu the stage runs it
# with.
#
#   bash scripts/wheel-roots.sh DIR SUITE ARCH   -> DIR/SUITE-ARCH (a second run with the same list does nothing)
#
# Suites: bookworm (Debian 12: Python 3.11, glibc 2.36, the oldest glibc with a Python the wheels are for),
# trixie (Debian 13: Python 3.13), forky (testing: Python 3.14). forky moves, so what it holds can change.
set -euo pipefail
source "$(dirname "$0")/arches.sh"
DIR=$1 NAME=$2 SUITE=$2 ARCH=$3
MIRROR=http://deb.debian.org/debian
# dash: /bin/sh, which every real system has (pip's build runs ninja, which runs commands through it).
case $SUITE in
  bookworm | trixie) PACKAGES=dash,python3,python3-pip,python3-numpy,python3-pytest,python3-hypothesis ;;
  # PyPI's torch and numpy 2 wheels need the system's libstdc++ (ours needs none: the stage checks it).
  bookworm-pypi) SUITE=bookworm PACKAGES=dash,python3,python3-pip,python3-numpy,python3-pytest,python3-hypothesis,libstdc++6 ;;
  forky) PACKAGES=dash,python3.14,python3-pip,python3-numpy,python3-pytest,python3-hypothesis,python3-ml-dtypes ;;
  # The sdist's build: what README lists for building from source, and numpy for the checks after.
  sdist) SUITE=bookworm PACKAGES=dash,python3,python3-pip,python3-dev,g++,libsimdjson-dev,libcurl4-openssl-dev,python3-numpy ;;
  *) echo "unknown suite $SUITE" >&2; exit 2 ;;
esac
# Testing's Release file carries a Valid-Until date, and the mirror this machine reaches can serve one older than
# that: its signature is still checked, its freshness is not (stable releases carry no such date).
valid_until() { [ "$1" = forky ] && echo 'Acquire::Check-Valid-Until "false"' || echo 'Acquire::Languages "none"'; }
ROOT_DIR="$DIR/$NAME-$ARCH"
STAMP="$SUITE $ARCH $MIRROR $PACKAGES"
if [ -f "$ROOT_DIR/.safetensors-root" ] && [ "$(cat "$ROOT_DIR/.safetensors-root")" = "$STAMP" ]; then
  exit 0
fi
rm -rf "$ROOT_DIR"
mkdir -p "$DIR"
unpack() {
  mmdebstrap --quiet --variant=extract --arch="$ARCH" --mode=root --include="$PACKAGES" \
    --aptopt='Acquire::Languages "none"' --aptopt="$(valid_until "$SUITE")" "$SUITE" "$ROOT_DIR" "$MIRROR"
}
# One more try after a failed download (the mirror is reached through the network).
unpack || { rm -rf "$ROOT_DIR"; sleep 10; unpack; }
# Debian 13 and later ship files under /usr only; the links from / that base-files would make (merged /usr).
for dir in bin sbin lib lib64; do
  if [ ! -e "$ROOT_DIR/$dir" ] && [ -d "$ROOT_DIR/usr/$dir" ]; then ln -s "usr/$dir" "$ROOT_DIR/$dir"; fi
done
mkdir -p "$ROOT_DIR/proc" "$ROOT_DIR/dev" "$ROOT_DIR/tmp" "$ROOT_DIR/etc/ssl/certs"
chmod 1777 "$ROOT_DIR/tmp"
cp /etc/ssl/certs/ca-certificates.crt "$ROOT_DIR/etc/ssl/certs/"
cp -L /etc/resolv.conf "$ROOT_DIR/etc/resolv.conf"
# The alternatives a maintainer script would have set up: numpy's BLAS and LAPACK.
triplet=$(arch_triplet "$(arch_of "$ARCH")")
ln -sf blas/libblas.so.3 "$ROOT_DIR/usr/lib/$triplet/libblas.so.3"
ln -sf lapack/liblapack.so.3 "$ROOT_DIR/usr/lib/$triplet/liblapack.so.3"
emulator=$(arch_qemu "$ARCH")
if [ -n "$emulator" ]; then cp "/usr/bin/$emulator" "$ROOT_DIR/usr/bin/"; fi
echo "$STAMP" >"$ROOT_DIR/.safetensors-root"
