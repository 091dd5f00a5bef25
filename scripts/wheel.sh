#!/usr/bin/env bash
# Builds the sdist and self-contained binary wheels of the Python package into dist/ (or $SAFETENSORS_WHEEL_OUT):
# Linux x86_64, aarch64, s390x and ppc64le, one wheel per CPython version, each tagged with the manylinux policy
# that `auditwheel show` finds it satisfies, which must be manylinux_2_17 (dist/auditwheel-show.txt keeps what it
# said).
#
#   bash scripts/wheel.sh          # needs: Debian 12 as scripts/setup.sh leaves it (mmdebstrap), root, network
#                                  # to PyPI and the Debian mirror; no compiler of the machine is used
#   bash scripts/wheel.sh --tag ABI  # prints the Python-ABI pair of a wheel for ABI (cp311, cp314t, abi3):
#                                  # cp311-cp311, cp314-cp314t, cp312-abi3 (stage 70-wheels finds wheels by it)
#   bash scripts/wheel.sh --suites DEB  # prints the Debian releases whose headers the matrix's wheels for that
#                                  # architecture (Debian's name) are built against (stage 70 tests them there)
#
# How (README, "Wheels"):
# - The wheels are built from the sdist (unpacked), as a user's `pip install` of the sdist would build.
# - Compiler: zig's clang (PyPI `ziglang`) targeting glibc 2.17 (manylinux2014) for every architecture, so the
#   others are cross-built here and nothing runs under emulation. zig links its own libc++ statically.
# - simdjson: built from Debian's source package of the version Debian 12 ships (the one the development build
#   links), its single-header amalgamation compiled into the module (cmake/SafetensorsSimdjson.cmake).
# - Python headers: each Debian release's libpython3.X-dev, unpacked (never installed) for each architecture
#   (forky, Debian testing, for 3.14: the mirror reached here may serve its Release file past its Valid-Until
#   date, so that date is not checked there; its signature is);
#   3.10 and 3.12, which no Debian release ships, from this machine's pyenv builds, for x86_64 only (no aarch64
#   headers of them are available here). A version whose headers are missing is skipped with a note.
#   3.13t and 3.14t (free-threaded, the cp313-cp313t and cp314-cp314t wheels): from the free-threaded CPythons
#   scripts/python-ft.sh builds from Debian's python3.13 and python3.14 sources (cached; stage 55 tests with
#   3.14t), for aarch64 cross-built (--arch aarch64); no release ships a free-threaded Python. None is built for
#   s390x or ppc64le.
# - The module is built once per architecture, then re-linked per Python version: only the binding and
#   nanobind depend on the version (one CMake build tree per architecture, reconfigured per version).
# JOBS (default 2) sets the build's parallelism. SAFETENSORS_WHEEL_MATRIX=all (the default) builds every wheel of
# TARGETS; =ci (CI's default: .ci/run sets CI=true) every x86_64 wheel, cp311 for each other architecture and
# aarch64's cp314t (the other wheels are the same code re-linked against another Python's headers, and each
# takes minutes of emulated tests in stage 70-wheels).
set -euo pipefail
shopt -s inherit_errexit  # a failure inside $(...) fails the script too
# The one rule for a wheel's tag pair: the Python tag has no t (cp314t -> cp314-cp314t); the stable-ABI build is
# for 3.12 and later.
tag_pair() { if [ "$1" = abi3 ]; then echo cp312-abi3; else echo "${1%t}-$1"; fi; }
if [ "${1:-}" = --tag ]; then
  tag_pair "$2"
  exit 0
fi
cd "$(dirname "$0")/.."
ROOT=$PWD
OUT=${SAFETENSORS_WHEEL_OUT:-$ROOT/dist}
B=$ROOT/build/wheels
JOBS=${JOBS:-2}
MIRROR=http://deb.debian.org/debian
# The glibc the modules link against: 2.17 (manylinux2014); for ppc64le zig provides 2.19 at the oldest, whose
# symbols a module uses still carry that architecture's first version (2.17), so auditwheel finds the same policy.
glibc() { [ "$1" = ppc64le ] && echo 2.19 || echo 2.17; }
# simdjson: the release Debian 12 packages (libsimdjson-dev 3.0.1-1 in scripts/setup.sh's list), from Debian's
# source package; the checksum is the one its .dsc lists.
SIMDJSON_VERSION=3.0.1
SIMDJSON_SHA256=156b1bc5eb0561b2bd166b46d191fd3d95a3e709cc63761477d3b7aec2b6e9ed
# ARCH PYTHON HEADERS [abi3]: where each wheel's Python headers come from (a Debian release, pyenv, or the
# free-threaded build); abi3: the module built against the stable ABI of 3.12 (cp312-abi3, for every later Python
# too), from headers of that version or a newer one. s390x and ppc64le have no 3.13 wheel: the Debian mirror
# reached here lacks part of Debian 13's packages for those two architectures (404 for its point-release glibc).
TARGETS=(
  "x86_64 3.10 pyenv"
  "x86_64 3.11 bookworm"
  "x86_64 3.12 pyenv"
  "x86_64 3.13 trixie"
  "x86_64 3.14 forky"
  "x86_64 3.13t ft"
  "x86_64 3.14t ft"
  "aarch64 3.13t ft"
  "aarch64 3.14t ft"
  "aarch64 3.11 bookworm"
  "aarch64 3.13 trixie"
  "aarch64 3.14 forky"
  "x86_64 3.12 pyenv abi3"
  "aarch64 3.13 trixie abi3"
  "s390x 3.11 bookworm"
  "s390x 3.14 forky"
  "ppc64le 3.11 bookworm"
  "ppc64le 3.14 forky"
)

MATRIX=${SAFETENSORS_WHEEL_MATRIX:-$([ "${CI:-}" = true ] && echo ci || echo all)}
in_matrix() {  # ARCH VERSION KIND: whether MATRIX builds that wheel of TARGETS
  [ "$MATRIX" = all ] || [ "$1" = x86_64 ] || [ "$2 $3" = "3.11 " ] || [ "$2" = 3.14t ]
}

log() { printf '\033[1m[wheel]\033[0m %s\n' "$*"; }
source scripts/arches.sh
if [ "${1:-}" = --suites ]; then
  for target in "${TARGETS[@]}"; do
    read -r t_arch version source kind <<<"$target"
    if [ "$(arch_debian "$t_arch")" = "$2" ] && in_matrix "$t_arch" "$version" "$kind" &&
      [ "$source" != pyenv ] && [ "$source" != ft ]; then
      echo "$source"
    fi
  done | awk '!seen[$0]++'
  exit 0
fi

mkdir -p "$B" "$OUT"
rm -f "$OUT"/safetensors-*.whl "$OUT"/safetensors-*.tar.gz "$OUT/auditwheel-show.txt"

# --- tools: a venv of the pinned build tools (constraints.txt), apart from the development venv
if [ ! -x "$B/venv/bin/python" ]; then
  log "creating $B/venv (requirements-wheel.txt)"
  "${PYTHON:-python3}" -m venv "$B/venv"
fi
"$B/venv/bin/python" -m pip --disable-pip-version-check -q install -c constraints.txt -r requirements-wheel.txt
export PATH="$B/venv/bin:$PATH"
ZIG=$(python -c 'import os, ziglang; print(os.path.join(os.path.dirname(ziglang.__file__), "zig"))')
# zig's caches (its libc++ and glibc stubs per target) stay in the build tree, not in $HOME.
export ZIG_GLOBAL_CACHE_DIR="$B/zig-cache" ZIG_LOCAL_CACHE_DIR="$B/zig-cache"

# --- the sdist, then the tree the wheels are built from
log "sdist"
python -m build --sdist --no-isolation --outdir "$OUT" . >"$B/sdist.log" 2>&1 || { cat "$B/sdist.log"; exit 1; }
SDIST=$(ls "$OUT"/safetensors-*.tar.gz)
rm -rf "$B/src" "$B/metadata"
mkdir -p "$B/src" "$B/metadata"
tar xzf "$SDIST" -C "$B/src"
SRC=$(ls -d "$B"/src/safetensors-*)
# METADATA and entry_points.txt exactly as the build backend writes them for a wheel of this sdist.
DIST_INFO=$(python -c 'import sys; from pyproject_hooks import BuildBackendHookCaller as H
print(H(sys.argv[1], "scikit_build_core.build").prepare_metadata_for_build_wheel(sys.argv[2]))' \
  "$SRC" "$B/metadata" 2>>"$B/sdist.log" | tail -n 1)

# --- simdjson's amalgamation, from Debian's source package
SIMDJSON="$B/simdjson-$SIMDJSON_VERSION"
if [ ! -f "$SIMDJSON/simdjson.cpp" ]; then
  log "simdjson $SIMDJSON_VERSION (Debian source package)"
  tarball="$B/simdjson_$SIMDJSON_VERSION.orig.tar.gz"
  python -c 'import sys, urllib.request; urllib.request.urlretrieve(sys.argv[1], sys.argv[2])' \
    "$MIRROR/pool/main/s/simdjson/simdjson_$SIMDJSON_VERSION.orig.tar.gz" "$tarball"
  echo "$SIMDJSON_SHA256  $tarball" | sha256sum -c --quiet
  mkdir -p "$SIMDJSON"
  tar xzf "$tarball" -C "$SIMDJSON" --strip-components=2 \
    "simdjson-$SIMDJSON_VERSION/singleheader/simdjson.cpp" "simdjson-$SIMDJSON_VERSION/singleheader/simdjson.h"
  rm -f "$tarball"
fi

# --- Python headers: $B/python/ARCH-VERSION/python3.X, with that architecture's own pyconfig.h
headers() {  # ARCH VERSION SOURCE -> prints the include directory, or nothing when there is none
  local arch=$1 version=$2 source=$3 dir="$B/python/$1-$2/python$2"
  if [ ! -f "$dir/Python.h" ]; then
    rm -rf "$(dirname "$dir")"
    mkdir -p "$(dirname "$dir")"
    if [ "$source" = ft ]; then
      local prefix
      prefix=$(bash scripts/python-ft.sh --version "${version%t}" --arch "$arch" --prefix | tail -n 1)
      cp -r "$prefix/include/python$version" "$dir"
    elif [ "$source" = pyenv ]; then
      local prefix
      prefix=$(ls -d "${PYENV_ROOT:-$HOME/.pyenv}/versions/$version".* 2>/dev/null | sort -V | tail -n 1) || true
      [ -n "$prefix" ] && [ -f "$prefix/include/python$version/Python.h" ] || return 0
      cp -r "$prefix/include/python$version" "$dir"
    else
      # Only unpacked (mmdebstrap's extract variant: no maintainer script runs), then the headers are kept.
      local tmp="$B/python/root-$arch-$source"
      rm -rf "$tmp"
      mmdebstrap --quiet --variant=extract --arch="$(arch_debian "$arch")" --mode=root \
        --include="libpython$version-dev" --aptopt='Acquire::Languages "none"' \
        --aptopt="$([ "$source" = forky ] && echo 'Acquire::Check-Valid-Until "false"' || echo 'Acquire::Languages "none"')" \
        "$source" "$tmp" "$MIRROR" >&2
      cp -r "$tmp/usr/include/python$version" "$dir"
      # Debian's pyconfig.h picks the multiarch one by the compiler's target; this directory is for one target.
      cp "$tmp/usr/include/$(arch_triplet "$arch")/python$version/pyconfig.h" "$dir/pyconfig.h"
      rm -rf "$tmp"
    fi
  fi
  echo "$dir"
}

# --- zig as the C/C++ compiler of each architecture, for its glibc
zig_tools() {  # ARCH -> $B/zig/ARCH/{cc,c++,ar,ranlib}
  local d="$B/zig/$1"
  mkdir -p "$d"
  for tool in cc c++; do
    printf '#!/bin/sh\nexec "%s" %s -target %s-linux-gnu.%s "$@"\n' "$ZIG" "$tool" \
      "$(arch_triplet "$1" | cut -d- -f1)" "$(glibc "$1")" >"$d/$tool"
  done
  for tool in ar ranlib; do printf '#!/bin/sh\nexec "%s" %s "$@"\n' "$ZIG" "$tool" >"$d/$tool"; done
  chmod +x "$d"/*
}

NANOBIND_DIR=$(python -m nanobind --cmake_dir)
# libcurl's headers (Debian's libcurl4-openssl-dev, from scripts/setup.sh): the remote source loads libcurl at run
# time (src/remote/curl_api.h), so the wheels only compile against its declarations, which are the same for every
# architecture (curl/system.h picks its types from the compiler's own macros).
# Copied to a directory of their own: the multiarch directory they live in also holds the host's glibc headers,
# which must not shadow zig's.
CURL_INCLUDE=$B/curl-include
rm -rf "$CURL_INCLUDE"
mkdir -p "$CURL_INCLUDE"
cp -r "$(dirname "$(dpkg -L libcurl4-openssl-dev | grep '/curl/curl.h$' | head -n 1)")" "$CURL_INCLUDE/"
# The free-threaded wheels come last: their headers come from scripts/python-ft.sh, which CI prepares in the
# background (scripts/test.sh) and which holds its lock until done. Build trees are kept across the passes.
declare -A configured=()
for pass in "x86_64 base" "aarch64 base" "s390x base" "ppc64le base" "x86_64 ft" "aarch64 ft"; do
  read -r arch which <<<"$pass"
  zig_tools "$arch"
  Z="$B/zig/$arch"
  BUILD="$B/build-$arch"
  for target in "${TARGETS[@]}"; do
    read -r t_arch version source kind <<<"$target"
    [ "$t_arch" = "$arch" ] || continue
    [ "$which" = "$([ "$source" = ft ] && echo ft || echo base)" ] || continue
    if ! in_matrix "$arch" "$version" "$kind"; then
      log "$arch cp${version/./} ${kind}: left out (SAFETENSORS_WHEEL_MATRIX=ci)"
      continue
    fi
    include=$(headers "$arch" "$version" "$source")
    if [ -z "$include" ]; then
      log "SKIPPED $arch cp${version/./}: no Python $version headers ($source)"
      continue
    fi
    tag=$(tag_pair "cp${version/./}")  # cp314t for 3.14t: the ABI tag
    soabi="cpython-${version/./}-$(arch_triplet "$arch")"
    module="_safetensors_cpp.$soabi.so"
    stable=OFF
    if [ "$kind" = abi3 ]; then
      tag=$(tag_pair abi3) module=_safetensors_cpp.abi3.so stable=ON
    fi
    log "$arch $tag: building (headers: $source $version)"
    # The library and simdjson do not depend on the Python version: only the binding and nanobind rebuild.
    python_args=(-U 'Python_*' -U '_Python_*' -DPython_INCLUDE_DIR="$include" -DSAFETENSORS_STABLE_ABI="$stable"
                 -DSKBUILD_SOABI="$soabi" -DSKBUILD_SOSABI=abi3)
    if [ -n "${configured[$arch]:-}" ]; then
      cmake "$BUILD" "${python_args[@]}" >"$BUILD.log"
    else
      rm -rf "$BUILD"
      cmake -S "$SRC" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release \
        -DCMAKE_SYSTEM_NAME=Linux -DCMAKE_SYSTEM_PROCESSOR="$arch" \
        -DCMAKE_C_COMPILER="$Z/cc" -DCMAKE_CXX_COMPILER="$Z/c++" -DCMAKE_AR="$Z/ar" -DCMAKE_RANLIB="$Z/ranlib" \
        -DSAFETENSORS_SIMDJSON_SOURCE="$SIMDJSON" -DSAFETENSORS_CURL_INCLUDE_DIR="$CURL_INCLUDE" -DSAFETENSORS_WERROR=OFF \
        -DSAFETENSORS_BUILD_PYTHON=ON -DSAFETENSORS_PYTHON_HEADERS_ONLY=ON -Dnanobind_DIR="$NANOBIND_DIR" \
        -DSAFETENSORS_BUILD_TESTS=OFF -DSAFETENSORS_BUILD_BENCHMARKS=OFF -DSAFETENSORS_BUILD_EXAMPLES=OFF \
        -DSAFETENSORS_INSTALL=OFF "${python_args[@]}" >"$BUILD.log"
      configured[$arch]=1
    fi
    ninja -C "$BUILD" -j "$JOBS" _safetensors_cpp >>"$BUILD.log" || { tail -n 40 "$BUILD.log"; exit 1; }
    module="$BUILD/python/$module"

    # A provisional linux_ARCH wheel, the policy auditwheel finds for it, then the wheel under that tag (plus the
    # legacy alias pip versions before 20.3 know).
    rm -rf "$B/provisional"
    provisional=$(python scripts/wheel_assemble.py "$SRC" "$B/metadata/$DIST_INFO" "$module" \
      "$tag-linux_$arch" "$B/provisional")
    policy=$(auditwheel show "$provisional" 2>/dev/null | tr -s ' \n' ' ' |
      sed -n 's/.*consistent with the following platform tag: "\([^"]*\)".*/\1/p')
    # Every wheel is manylinux2014 (README, "Wheels"): a module that needs a newer glibc symbol fails here.
    case $policy in
      manylinux_2_17_*) platform="$policy.manylinux2014_$arch" ;;
      *) echo "auditwheel show found ${policy:-no manylinux policy}, not manylinux_2_17, for $provisional:"
         auditwheel show "$provisional"; exit 1 ;;
    esac
    wheel=$(python scripts/wheel_assemble.py "$SRC" "$B/metadata/$DIST_INFO" "$module" "$tag-$platform" "$OUT")
    auditwheel show "$wheel" >>"$OUT/auditwheel-show.txt" 2>/dev/null
    echo >>"$OUT/auditwheel-show.txt"
    log "$(basename "$wheel") ($(du -k "$wheel" | cut -f1) KiB)"
  done
done

log "done: $OUT"
ls -l "$OUT"
