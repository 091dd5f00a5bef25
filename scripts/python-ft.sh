#!/usr/bin/env bash
# A free-threaded CPython 3.14 (`--disable-gil`, "3.14t") and a venv of it with free-threaded wheels, for the
# free-threaded test stage (scripts/test.d/55-free-threaded.sh). Prints the venv's directory as its last line
# of standard output (with --prefix, the interpreter's installation prefix: its headers, for the wheel scripts);
# progress goes to standard error.
#
#   bash scripts/python-ft.sh [--prefix]          the interpreter of stage 55 and the cp314t wheel
#   bash scripts/python-ft.sh --tsan [--prefix]   the same interpreter built with clang under ThreadSanitizer
#                                                 (--with-thread-sanitizer), for stage 56: its venv has numpy
#                                                 and the build and test tools only, and CPython's own TSan
#                                                 suppressions are kept as PREFIX/tsan-suppressions.txt
#   bash scripts/python-ft.sh --version 3.13 [--prefix]   CPython 3.13t, for the cp313t wheel (its venv:
#                                                 numpy only)
#   bash scripts/python-ft.sh --arch aarch64 [--version 3.13] --prefix   the same CPython cross-built for aarch64
#                                                 (no venv here: it runs under qemu only), for the aarch64
#                                                 cp314t/cp313t wheels and their test in a Debian 12 arm64 root
#
# The interpreter is built from the upstream tarball of Debian's python3.X source package (Debian 12 has none;
# 3.13 from Debian 13's, 3.14 from testing's). The package is pinned by version and the tarball by its SHA-256
# (as the .dsc lists it) and both are fetched from Debian's pool, not with `apt-get source`: the mirror this
# machine reaches serves the pool without the source files of the version that testing's current Sources index
# names (a 404), and a pin does not move with its release. Debian's patches are not applied: they change install
# schemes for Debian's own layout, and this build lives in a prefix of its own.
#
# Everything is cached outside the repository, in ${SAFETENSORS_FT_CACHE:-/var/cache/safetensors-ft}:
#   cpython-3.14t-VERSION/   the interpreter (./configure --disable-gil, no PGO or LTO: build time)
#   venv-3.14t-VERSION/      its venv: numpy, pytest, hypothesis, the build tools (nanobind, scikit-build-core),
#                            and where they install, ml_dtypes, mfusepy and torch 2.13.0 (PyPI's cp314t wheel,
#                            the CUDA build, with its nvidia-* dependencies, 4.8 GB in all); versions from
#                            constraints.txt
#   cpython-3.14t-tsan-VERSION/, venv-3.14t-tsan-VERSION/   the ThreadSanitizer flavour (--tsan)
#   cpython-3.13t-VERSION/, venv-3.13t-VERSION/             3.13t (--version 3.13)
#   cpython-3.1Xt-aarch64-VERSION/, sysroot-arm64-bookworm/  the aarch64 cross build (--arch aarch64; the build
#                            Python is the x86_64 one of the same version) and the Debian 12 arm64 libraries it
#                            is built against, those of the root it is tested in (unpacked by mmdebstrap)
#   pip/                     pip's cache: a rebuilt venv downloads nothing again
# A stamp file in each marks it complete: a warm run checks the stamps and builds nothing, and asks no
# package index anything. The venv's stamp holds the requirement list and constraints.txt's hash, so a
# changed pin rebuilds the venv (not the interpreter). SAFETENSORS_FT_TORCH=0 leaves torch out.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
CACHE=${SAFETENSORS_FT_CACHE:-/var/cache/safetensors-ft}
JOBS=${JOBS:-$(nproc)}
mkdir -p "$CACHE"

log() { printf '\033[1m[python-ft]\033[0m %s\n' "$*" >&2; }

tsan=0 want_prefix=0 minor=3.14 arch=x86_64
while (($#)); do
  case $1 in
    --tsan) tsan=1 ;;
    --prefix) want_prefix=1 ;;
    --version) minor=$2; shift ;;
    --arch) arch=$2; shift ;;
    *) log "unknown argument $1"; exit 2 ;;
  esac
  shift
done
# Debian's python3.X source package: its version and the SHA-256 of its upstream tarball (as its .dsc lists it).
case $minor in
  3.14) CPYTHON_DEBIAN=3.14.7-1
        CPYTHON_ORIG_SHA256=3b48dac8fb59f62eaa67ac83c1eb12bda1b7a08406dd286e252c11a66be27f81 ;;
  3.13) CPYTHON_DEBIAN=3.13.5-2+deb13u5
        CPYTHON_ORIG_SHA256=93e583f243454e6e9e4588ca2c2662206ad961659863277afcdb96801647d640 ;;
  *) log "no free-threaded CPython $minor here (3.13, 3.14)"; exit 2 ;;
esac
((tsan)) && [ "$minor" != 3.14 ] && { log "--tsan is for 3.14"; exit 2; }
case $arch in
  x86_64) ;;
  aarch64) ((want_prefix && !tsan)) || { log "--arch aarch64 builds an interpreter only: --prefix, no --tsan"
                                          exit 2; } ;;
  *) log "no free-threaded CPython for $arch here (x86_64, aarch64)"; exit 2 ;;
esac
PACKAGE=python$minor
POOL=http://deb.debian.org/debian/pool/main/p/$PACKAGE
version=${CPYTHON_DEBIAN%-*}
flavour=${minor}t
CONFIGURE=(--disable-gil)
if ((tsan)); then
  # clang, as stage 30's TSan build: the extension built for this interpreter must use the same TSan runtime.
  flavour=3.14t-tsan
  CONFIGURE+=(--with-thread-sanitizer CC=clang CXX=clang++)
  # What this script runs on the instrumented interpreter (the build's own steps, ensurepip, pip) is not under
  # test: TSan reports nothing and does not change its exit status. Stage 56 sets its own options.
  export TSAN_OPTIONS="report_bugs=0 exitcode=0"
fi
if [ "$arch" = aarch64 ]; then
  flavour=${minor}t-aarch64
  SYSROOT=$CACHE/sysroot-arm64-bookworm
  SYSROOT_PACKAGES=libc6-dev,zlib1g-dev,libffi-dev,libssl-dev,libbz2-dev,liblzma-dev,libsqlite3-dev,uuid-dev
  SYSROOT_STAMP="$SYSROOT_PACKAGES, relative links"
  # Debian's cross compiler with the sysroot's headers and libraries (its multiarch directories); pkg-config
  # looks only there. /dev/ptmx, /dev/ptc and getaddrinfo cannot be probed for another machine: the answers
  # for Linux.
  CONFIGURE+=(--host=aarch64-linux-gnu --build=x86_64-linux-gnu CC="aarch64-linux-gnu-gcc --sysroot=$SYSROOT"
              ac_cv_file__dev_ptmx=yes ac_cv_file__dev_ptc=no ac_cv_buggy_getaddrinfo=no)
  export PKG_CONFIG_LIBDIR=$SYSROOT/usr/lib/aarch64-linux-gnu/pkgconfig:$SYSROOT/usr/share/pkgconfig
  export PKG_CONFIG_SYSROOT_DIR=$SYSROOT
fi
prefix=$CACHE/cpython-$flavour-$version
python=$prefix/bin/python${minor}t
# One run of each flavour at a time: scripts/test.sh starts two in the background early; a stage's own run
# waits for its flavour here, then finds everything built.
exec 9>"$CACHE/.lock-$flavour"
flock 9
if [ ! -f "$prefix/.complete" ]; then
  t0=$SECONDS
  BUILD_DEPS=(build-essential pkg-config dpkg-dev xz-utils libssl-dev zlib1g-dev libbz2-dev liblzma-dev
              libffi-dev libsqlite3-dev libreadline-dev libncurses-dev libgdbm-dev uuid-dev libzstd-dev
              libexpat1-dev)
  [ "$arch" = aarch64 ] && BUILD_DEPS+=(gcc-aarch64-linux-gnu qemu-user-static mmdebstrap)
  missing=()
  for p in "${BUILD_DEPS[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  if ((${#missing[@]})); then
    log "apt-get install ${missing[*]}"
    apt-get -o DPkg::Lock::Timeout=600 update -qq >&2
    DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends \
      "${missing[@]}" >&2
  fi
  work=$(mktemp -d "$CACHE/src.XXXXXX")
  trap 'rm -rf "$work"' EXIT
  orig=$work/${PACKAGE}_$version.orig.tar.xz
  log "downloading Debian's $PACKAGE $CPYTHON_DEBIAN source package"
  for f in "${PACKAGE}_$CPYTHON_DEBIAN.dsc" "${PACKAGE}_$version.orig.tar.xz"; do
    curl -fsS --retry 3 -o "$work/$f" "$POOL/$f"
  done
  echo "$CPYTHON_ORIG_SHA256  $orig" | sha256sum -c --quiet -
  grep -q "$CPYTHON_ORIG_SHA256 .* ${PACKAGE}_$version.orig.tar.xz" "$work/${PACKAGE}_$CPYTHON_DEBIAN.dsc"
  if [ "$arch" = aarch64 ] && [ "$(cat "$SYSROOT/.complete" 2>/dev/null)" != "$SYSROOT_STAMP" ]; then
    log "unpacking Debian 12 arm64 ($SYSROOT_PACKAGES) into $SYSROOT"
    rm -rf "$SYSROOT"
    mmdebstrap --quiet --variant=extract --arch=arm64 --mode=root --include="$SYSROOT_PACKAGES" \
      --aptopt='Acquire::Languages "none"' bookworm "$SYSROOT" http://deb.debian.org/debian >&2
    # Absolute links (libm.so -> /lib/aarch64-linux-gnu/libm.so.6) would name this machine's files: made
    # relative, inside the sysroot (else the linker silently takes libm.a and links libm's code statically).
    find "$SYSROOT/usr" "$SYSROOT/lib" -type l -lname '/*' | while read -r link; do
      ln -sfr "$SYSROOT$(readlink "$link")" "$link"
    done
    echo "$SYSROOT_STAMP" >"$SYSROOT/.complete"
  fi
  if [ "$arch" = aarch64 ]; then
    # The build Python: this script's x86_64 interpreter of the same version (only a cold build needs it).
    build_prefix=$(bash scripts/python-ft.sh --version "$minor" --prefix | tail -n 1)
    CONFIGURE+=(--with-build-python="$build_prefix/bin/python${minor}t")
  fi
  log "building CPython $version ${CONFIGURE[*]} into $prefix (from $(basename "$orig"))"
  tar -xJf "$orig" -C "$work"
  src=$(ls -d "$work"/Python-*/)
  rm -rf "$prefix"
  # (Each step chained: errexit does not apply inside an `if` condition.)
  if ! (
    cd "$src" &&
    # A cross build cannot run its own pip: the aarch64 root bootstraps pip from the bundled wheel.
    ./configure --prefix="$prefix" "${CONFIGURE[@]}" --disable-test-modules \
      --with-ensurepip="$([ "$arch" = aarch64 ] && echo no || echo install)" LDFLAGS="-Wl,-rpath,$prefix/lib" &&
    make -j "$JOBS" &&
    make install &&
    if ((tsan)); then cp Tools/tsan/suppressions_free_threading.txt "$prefix/tsan-suppressions.txt"; fi
  ) >"$work/build.log" 2>&1; then
    tail -n 40 "$work/build.log" >&2
    log "the CPython build failed"
    exit 1
  fi
  run_python=("$python")
  [ "$arch" = aarch64 ] && run_python=(qemu-aarch64-static -L "$SYSROOT" "$python")
  "${run_python[@]}" -c 'import sys, math, ssl, zlib, ctypes; assert not sys._is_gil_enabled()' || {
    log "the build did not give a free-threaded python$flavour with math, ssl, zlib and ctypes"; exit 1; }
  touch "$prefix/.complete"
  rm -rf "$work"
  trap - EXIT
  log "CPython $version built in $((SECONDS - t0)) s"
fi

if [ "$arch" = aarch64 ]; then echo "$prefix"; exit 0; fi

# The venv and its wheels. Wheels only: what has no free-threaded wheel is not compiled here. Frameworks that fail
# to install are left out and listed in the venv's `missing` file (their tests skip, naming why).
VENV=$CACHE/venv-$flavour-$version
REQS=(numpy pytest hypothesis nanobind scikit-build-core)
OPTIONAL=(ml_dtypes mfusepy)  # mfusepy: the FUSE test filesystem (tests/python/faultfs.py)
[ "${SAFETENSORS_FT_TORCH:-1}" = 1 ] && OPTIONAL+=(torch)
# Under TSan: the stress test's numpy paths (torch's own threads, uninstrumented, would only add noise). 3.13t
# serves the wheel check only.
if ((tsan)); then OPTIONAL=(); fi
if [ "$minor" = 3.13 ]; then REQS=(numpy) OPTIONAL=(); fi
want="${REQS[*]} ${OPTIONAL[*]} $(sha256sum constraints.txt | cut -c1-16)"
if [ "$(cat "$VENV/.complete" 2>/dev/null)" != "$want" ]; then
  t0=$SECONDS
  log "venv $VENV: ${REQS[*]} ${OPTIONAL[*]}"
  rm -rf "$VENV"
  "$python" -m venv "$VENV"
  PIP=("$VENV/bin/python" -m pip --disable-pip-version-check -q --cache-dir "$CACHE/pip")
  "${PIP[@]}" install --only-binary=:all: -c constraints.txt "${REQS[@]}" >&2
  : >"$VENV/missing"
  for r in "${OPTIONAL[@]}"; do
    if ! "${PIP[@]}" install --only-binary=:all: -c constraints.txt "$r" >&2; then
      log "$r: no free-threaded wheel installs (its tests skip)"
      echo "$r" >>"$VENV/missing"
    fi
  done
  echo "$want" >"$VENV/.complete"
  log "venv ready in $((SECONDS - t0)) s"
fi
"$VENV/bin/python" -c 'import sys; assert not sys._is_gil_enabled(), "the venv python has the GIL"'
if ((want_prefix)); then echo "$prefix"; else echo "$VENV"; fi
