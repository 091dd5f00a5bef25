#!/usr/bin/env bash
# Installs everything this project needs on a fresh Debian machine (apt packages, a project-local venv in
# .venv, the reference implementation in .ref) and builds and installs the Python package into the venv.
# Idempotent: a second run only rebuilds what changed. Python versions: constraints.txt.
set -euo pipefail
cd "$(dirname "$0")/.."

APT_PACKAGES=(
  g++ pkg-config
  libsimdjson-dev libgtest-dev libbenchmark-dev   # the C++ library and its tests (versions: Debian 12)
  libcurl4-openssl-dev                            # remote sources: libcurl's headers; libcurl is loaded at run time
  openssl                                         # tests: a self-signed certificate for the HTTPS test server
  clang libclang-rt-14-dev llvm                   # sanitizers and libFuzzer
  clang-format-14                                 # the C/C++ style check (scripts/test.d/05-lint.sh)
  fuse3 libfuse3-3                                # fusermount3 + libfuse3 for the FUSE fault tests (mfusepy)
  qemu-user-static g++-s390x-linux-gnu mmdebstrap # the big-endian stage (s390x under qemu: scripts/s390x-root.sh)
)

log() { printf '\033[1m[setup]\033[0m %s\n' "$*"; }

missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  log "apt-get install ${missing[*]}"
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  log "creating .venv"
  "$PYTHON" -m venv .venv
fi
PIP=(.venv/bin/python -m pip --disable-pip-version-check -q)
"${PIP[@]}" install -c constraints.txt -r requirements-build.txt

log "building and installing the safetensors package"
# No build isolation: the pinned build tools above are used, and the CMake build in build/py-* is reused.
"${PIP[@]}" install --no-build-isolation --no-deps -c constraints.txt .
# SAFETENSORS_EDITABLE=1 (the development loop): Python files are used from python/safetensors directly
# (the native module is copied next to them; re-run this script after changing C++). It is a plain path
# entry, not an import hook, so PYTHONPATH=.ref still selects the reference in differential tests.
if [ "${SAFETENSORS_EDITABLE:-0}" = 1 ]; then
  SITE=$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  for so in "$SITE"/safetensors/_safetensors_cpp*.so; do
    # A new file renamed over the old one: processes that have the old module loaded keep their mapping.
    cp "$so" "python/safetensors/.$(basename "$so").tmp"
    mv -f "python/safetensors/.$(basename "$so").tmp" "python/safetensors/$(basename "$so")"
  done
  rm -rf "$SITE/safetensors"
  echo "$PWD/python" > "$SITE/safetensors-dev.pth"
else
  rm -f "$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/safetensors-dev.pth" \
    python/safetensors/_safetensors_cpp*.so
fi

# The test and demo dependencies come after the package, so their `safetensors>=...` requirements (from
# transformers) are met by this package instead of pulling the reference from PyPI.
"${PIP[@]}" install -c constraints.txt -r requirements-dev.txt

# JAX, TensorFlow, PaddlePaddle and MLX, CPU builds, for their modules' tests (which skip without them).
# A fresh machine takes about 1.5-2 minutes and 2.8 GB for these; SAFETENSORS_FRAMEWORKS=0 leaves them out.
if [ "${SAFETENSORS_FRAMEWORKS:-1}" = 1 ]; then
  log "installing the other frameworks (requirements-frameworks.txt)"
  "${PIP[@]}" install -c constraints.txt -r requirements-frameworks.txt
fi

if [ ! -f .ref/safetensors/__init__.py ]; then
  log "installing the reference implementation into .ref"
  "${PIP[@]}" install --no-deps --target .ref -c constraints.txt safetensors
fi
# The reference's release candidate, for the API-surface comparison (0.9.0rc1 adds get_tensor_meta, TensorMeta,
# PySafeSlice, PrefetchLoader and safe_open.prefetch). A constraints file holds one version per name, so this
# second pin lives here.
REFERENCE_RC=0.9.0rc1
if [ ! -f .ref-rc/safetensors/__init__.py ]; then
  log "installing the reference's release candidate $REFERENCE_RC into .ref-rc"
  "${PIP[@]}" install --no-deps --target .ref-rc "safetensors==$REFERENCE_RC"
fi
log "ready: $(.venv/bin/python -c 'import safetensors, sys; print("safetensors", safetensors.__version__, "from", safetensors.__file__)')"
