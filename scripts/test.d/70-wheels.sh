# Wheels (README "Wheels"): scripts/wheel.sh builds the sdist and the x86_64, aarch64, s390x and ppc64le wheels;
# then each wheel is installed with pip into a bare system -- an unpacked Debian root (scripts/wheel-roots.sh)
# that has Python and the distribution's numpy, pytest and hypothesis and nothing of this project: no compiler,
# no -dev package, no simdjson -- entered with chroot (the other architectures through qemu-user, e.g.
# qemu-aarch64-static: no binfmt, so nothing there starts another program of that architecture). In each: pip
# chooses the wheel itself from the wheelhouse, tests/wheel/check_wheel.py (import, numpy round trips, torch
# round trips where torch is installed), the `safetensors` command, the dynamic loader's list of what the module
# needs (only glibc's libraries), and a subset of the package's own tests (tests/python). Torch 2.13.0 is
# installed (the CPU wheel on this machine's disk, its dependencies and numpy 2 from PyPI) for x86_64 Python
# 3.11, in the root bookworm-pypi (bookworm plus the libstdc++ that PyPI's torch and numpy 2 wheels need; ours
# needs none, which the plain roots show). Python 3.10 and 3.12 come from this machine's pyenv, the free-threaded
# ones from scripts/python-ft.sh, mounted read-only into that root (no Debian release ships them), with numpy
# from PyPI. Last, the sdist is built with pip in a Debian root holding only what README lists for it.
set -euo pipefail
cd "$ROOT"
source scripts/arches.sh
DIST=${SAFETENSORS_WHEEL_OUT:-$ROOT/dist}
T=$ROOT/build/wheel-test
ROOTS=$T/roots
TORCH_WHEEL=$(ls /opt/wheels/torch-2.13.0+cpu-cp311-cp311-manylinux_*_x86_64.whl 2>/dev/null | head -n 1 || true)
mkdir -p "$T"

# SAFETENSORS_WHEEL_MATRIX (scripts/wheel.sh): all (the default) tests every wheel in its roots and builds the
# sdist; ci (CI's default) tests the wheels the ci matrix builds (every x86_64 one, cp311 for each other
# architecture, aarch64 cp314t) and leaves the sdist build out (50-python builds the package from source with pip).
MATRIX=${SAFETENSORS_WHEEL_MATRIX:-$([ "${CI:-}" = true ] && echo ci || echo all)}
export SAFETENSORS_WHEEL_MATRIX=$MATRIX
EMULATED=(arm64 s390x ppc64el)  # the architectures run under qemu-user (Debian's names)
# The releases whose roots each of them is tested in: those its wheels in the matrix are built for.
emulated_suites() { bash scripts/wheel.sh --suites "$1"; }  # DEB

# The roots download while the wheels compile.
(
  for suite in bookworm trixie forky; do bash scripts/wheel-roots.sh "$ROOTS" "$suite" amd64; done
  for deb in "${EMULATED[@]}"; do
    for suite in $(emulated_suites "$deb"); do bash scripts/wheel-roots.sh "$ROOTS" "$suite" "$deb"; done
  done
  bash scripts/wheel-roots.sh "$ROOTS" bookworm-pypi amd64
  bash scripts/wheel-roots.sh "$ROOTS" bookworm-pypi arm64  # the aarch64 t wheels' root
  [ "$MATRIX" = ci ] || bash scripts/wheel-roots.sh "$ROOTS" sdist amd64
) >"$T/roots.log" 2>&1 &
roots_pid=$!
# SAFETENSORS_WHEELS_BUILT=1 tests what dist/ holds instead of building (for working on this stage).
if [ "${SAFETENSORS_WHEELS_BUILT:-0}" != 1 ] && ! bash scripts/wheel.sh; then
  wait "$roots_pid" || true
  exit 1
fi
wait "$roots_pid" || { cat "$T/roots.log"; exit 1; }
printf '\n\033[1m--- auditwheel show\033[0m\n'
cat "$DIST/auditwheel-show.txt"

# Runs a command inside ROOT (ARCH: Debian's name) in a clean environment (plus the given variables), with /proc
# and the given read-only bind mounts in a mount namespace of its own (they go away with it).
#   in_root ROOT ARCH [--bind HOST_DIR:ROOT_DIR | --bind-rw HOST_DIR:ROOT_DIR | --env NAME=VALUE]... -- COMMAND...
in_root() {
  local root=$1 arch=$2 binds=() envs=() emu=()
  shift 2
  while [ "$1" != -- ]; do
    case $1 in --bind) binds+=("$2:ro") ;; --bind-rw) binds+=("$2:rw") ;; --env) envs+=("$2") ;; esac
    shift 2
  done
  shift
  if [ "$arch" != amd64 ]; then
    emu=("/usr/bin/$(arch_qemu "$arch")")
    [[ $1 == */* ]] || set -- "/usr/bin/$1" "${@:2}"  # qemu takes a path, not a name to look up
  fi
  local mounts='mount -t proc proc "$R/proc"'
  local b host target mode
  for b in "${binds[@]}"; do
    IFS=: read -r host target mode <<<"$b"
    mkdir -p "$root/$target"
    mounts+=" && mount --bind '$host' \"\$R/$target\" && mount -o remount,bind,$mode \"\$R/$target\""
  done
  env -i PATH=/usr/local/bin:/usr/bin:/bin HOME=/root LANG=C.UTF-8 HYPOTHESIS_PROFILE=ci \
    PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1 PIP_ROOT_USER_ACTION=ignore \
    PIP_CERT=/etc/ssl/certs/ca-certificates.crt "${envs[@]}" R="$root" \
    unshare --mount --propagation private sh -c "$mounts && exec /usr/sbin/chroot \"\$R\" \"\$@\"" sh "${emu[@]}" "$@"
}

# Bytecode for an emulated root's Python files, compiled natively by the amd64 root of the same release (the
# same Python, so the same bytecode; Debian compiles it when a package is configured, which unpacking skips):
# else the first run of each program compiles it under qemu, minutes per root.
precompile() {  # SUITE DEB PYTHON(python3.X)
  local dir
  for dir in "/usr/lib/$3" /usr/lib/python3/dist-packages; do
    # Files some packages ship that no Python 3 compiles are left as they are (compileall reports them).
    in_root "$ROOTS/$1-amd64" amd64 --bind-rw "$ROOTS/$1-$2$dir:/emulated" -- \
      "$3" -m compileall -q -j 2 -d "$dir" /emulated >/dev/null || true
  done
}

# The package's own tests that a bare root can run (the reference implementation is not there: tests of it
# skip): everywhere; with torch (and PyPI's ml_dtypes); with ml_dtypes. Left out by name: tests that import torch
# where it is not installed, and under qemu tests that start a Python process (user-mode qemu without binfmt
# cannot start an emulated program from an emulated program).
TESTS_BASE=(api/test_api.py engine/test_engine_binding.py format/test_malicious.py slicing/test_slicing.py
            format/test_sharded.py format/test_error_text_keeps_nul_bytes.py)
TESTS_TORCH=(frameworks/test_torch.py prefetch/test_prefetch.py frameworks/test_framework_functions.py
             api/test_binding_export.py prefetch/test_prefetch_takes_f64_not_as_f6.py cli)
TESTS_ML_DTYPES=(frameworks/test_numpy.py)
NEEDS_TORCH='test_matches_numpy_on_every_framework_and_backend or test_errors_match_the_reference or
  test_no_leaks_reported_when_everything_is_released or test_framework_modules_offer_the_names_the_references_import'
NEEDS_EXEC='test_bounded_memory_and_time or test_million_tiny_entries_near_the_cap'
LIBS_ALLOWED='linux-vdso|libc\.so\.6|libm\.so\.6|libpthread\.so\.0|libdl\.so\.2|librt\.so\.1|ld-linux|ld64\.so'

summary=()
# check_wheel SUITE ARCH PYTHON TAG [--pyenv PREFIX] [--torch] [--check PYTHON_CODE] [--wheels DIR]: one wheel in
# one root, which pip chooses from DIR (default: every wheel built).
check_wheel() {
  local suite=$1 arch=$2 python=$3 tag=$4 pyenv="" torch=0 check="" wheels=$DIST
  shift 4
  while (($#)); do
    case $1 in
      --pyenv) pyenv=$2; shift 2 ;; --torch) torch=1; shift ;; --check) check=$2; shift 2 ;; --wheels) wheels=$2; shift 2 ;;
    esac
  done
  local root="$ROOTS/$suite-$arch" t0=$SECONDS binds=(--bind "$wheels:/wheels" --bind "$ROOT/tests:/src/tests")
  printf '\n\033[1m--- %s on %s %s (%s)\033[0m\n' "$tag" "$suite" "$arch" "$python"
  local py=("$python") pip_args=(--break-system-packages)
  if [ -n "$pyenv" ]; then
    # A venv of an interpreter built on this machine (pyenv's, scripts/python-ft.sh's), whose base stays
    # read-only: pip installs into the venv. Made without pip, which venv would install by starting the
    # interpreter again (qemu-user cannot start an emulated program from one): pip's wheel bundled with the
    # interpreter installs itself.
    binds+=(--bind "$pyenv:$pyenv")
    rm -rf "$root/opt/venv-$python"
    in_root "$root" "$arch" "${binds[@]}" -- "$pyenv/bin/$python" -m venv --without-pip "/opt/venv-$python"
    local bundled
    bundled=$(ls "$pyenv"/lib/python3*/ensurepip/_bundled/pip-*.whl | head -n 1)
    in_root "$root" "$arch" "${binds[@]}" --env "PYTHONPATH=$bundled" -- "/opt/venv-$python/bin/python" -m pip \
      install -q --no-index "$bundled"
    py=("/opt/venv-$python/bin/python")
    pip_args=()
  fi
  # (Not a directory at the root: the tests run from /, where it would import as a namespace package `torch`.)
  [ $torch = 1 ] && binds+=(--bind "$(dirname "$TORCH_WHEEL"):/mnt/torch-wheel")
  run() { in_root "$root" "$arch" "${binds[@]}" -- "$@"; }
  rm -rf "$root/work"
  mkdir -p "$root/work"
  # --force-reinstall: a root checks more than one wheel (forky: cp314, then abi3), and pip must take each.
  run "${py[@]}" -m pip install -q "${pip_args[@]}" --force-reinstall --no-index --find-links /wheels safetensors
  cp constraints.txt "$root/work/constraints.txt"
  # Those Pythons have no distribution numpy: PyPI's, and pytest and hypothesis where the versions pinned here
  # have wheels for them (not on 3.10, too old for them; not on 3.13t, for which hypothesis has no wheel).
  local extra=()
  case $python in python3.10 | python3.13t) ;; *) extra=(pytest hypothesis) ;; esac
  [ -n "$pyenv" ] && run "${py[@]}" -m pip install -q --only-binary=:all: -c /work/constraints.txt numpy "${extra[@]}"
  if [ $torch = 1 ]; then
    # With PyPI's numpy and ml_dtypes, as the development venv has them (the torch tests use bfloat16 arrays).
    run "${py[@]}" -m pip install -q "${pip_args[@]}" -c /work/constraints.txt \
      "/mnt/torch-wheel/$(basename "$TORCH_WHEEL")" numpy ml_dtypes
  fi
  run "${py[@]}" /src/tests/wheel/check_wheel.py /work/out "$tag"
  [ -z "$check" ] || run "${py[@]}" -c "$check"

  # The `safetensors` command pip installed: its script run by that Python (under qemu it cannot exec it).
  local cli
  cli=$(run "${py[@]}" -c 'import sys, sysconfig; print(sysconfig.get_path("scripts"))')/safetensors
  run "${py[@]}" "$cli" inspect /work/out/numpy.safetensors
  run "${py[@]}" "$cli" verify --scan /work/out/numpy.safetensors
  [ "$arch" = amd64 ] && run "$cli" verify -q /work/out/numpy.safetensors

  # What the module needs, as this system's dynamic loader resolves it: glibc's libraries only.
  local module loader
  module=$(run "${py[@]}" -c 'import safetensors._safetensors_cpp as m; print(m.__file__)')
  loader=$(arch_loader "$arch")
  local needed
  needed=$(run "$loader" --list "$module")
  echo "$needed"
  # (Under qemu the vDSO is listed without a name.)
  if awk '{print $1}' <<<"$needed" | grep '\.so' | grep -vE "$LIBS_ALLOWED" | grep -q .; then
    echo "FAILED: $module needs a library outside glibc"
    exit 1
  fi

  if [ -n "$pyenv" ] && ((${#extra[@]} == 0)); then
    summary+=("$(printf '%-55s %-14s %3ds  %s' "$tag" "$suite-$arch" $((SECONDS - t0)) \
      "(venv of $python: check_wheel.py only)")")
    return
  fi
  local tests=("${TESTS_BASE[@]}") leave_out=()
  [ $torch = 1 ] && tests+=("${TESTS_TORCH[@]}") || leave_out+=("$NEEDS_TORCH")
  [ "$arch" != amd64 ] && leave_out+=("$NEEDS_EXEC")
  run "${py[@]}" -c 'import ml_dtypes' 2>/dev/null && tests+=("${TESTS_ML_DTYPES[@]}")
  # The tests import the installed package: the root has no source tree.
  local select=()
  if ((${#leave_out[@]})); then
    local expr
    expr=$(printf ' or %s' "${leave_out[@]}")
    select=(-k "not ($(tr -s ' \n' ' ' <<<"${expr# or }"))")
  fi
  run "${py[@]}" -m pytest -q -p no:cacheprovider "${select[@]}" "${tests[@]/#//src/tests/python/}"
  summary+=("$(printf '%-55s %-14s %3ds  %s' "$tag" "$suite-$arch" $((SECONDS - t0)) "${tests[*]}")")
}

pyenv_prefix() { ls -d "${PYENV_ROOT:-$HOME/.pyenv}/versions/$1".* 2>/dev/null | sort -V | tail -n 1; }
wheel_tag() {  # ARCH(x86_64, aarch64...) ABI(cp311, cp314t, abi3) -> the built wheel's tag, or nothing
  local w pair
  pair=$(bash scripts/wheel.sh --tag "$2")
  w=$(ls "$DIST"/safetensors-*-"$pair"-*_"$1".whl 2>/dev/null | head -n 1) || true
  [ -n "$w" ] && basename "$w" .whl | cut -d- -f3-
}

for deb in "${EMULATED[@]}"; do
  for suite in $(emulated_suites "$deb"); do
    precompile "$suite" "$deb" \
      "$(case $suite in bookworm) echo python3.11 ;; trixie) echo python3.13 ;; forky) echo python3.14 ;; esac)"
  done
done
for deb in amd64 "${EMULATED[@]}"; do
  arch=$(arch_of "$deb")
  tag=$(wheel_tag "$arch" cp311) && check_wheel bookworm "$deb" python3 "$tag"
  if [ "$arch" = x86_64 ] && [ -n "$TORCH_WHEEL" ]; then
    tag=$(wheel_tag "$arch" cp311) && check_wheel bookworm-pypi "$deb" python3 "$tag" --torch
  fi
  tag=$(wheel_tag "$arch" cp313) && check_wheel trixie "$deb" python3 "$tag"
  tag=$(wheel_tag "$arch" cp314) && check_wheel forky "$deb" python3.14 "$tag"
done
for version in 3.10 3.12; do
  prefix=$(pyenv_prefix "$version")
  if tag=$(wheel_tag x86_64 "cp${version/./}") && [ -n "$prefix" ]; then
    check_wheel bookworm-pypi amd64 "python$version" "$tag" --pyenv "$prefix"
  fi
done
# The stable-ABI wheel (cp312-abi3), alone in a wheelhouse of its own so that pip cannot prefer a per-version
# one, on the newest Python here (3.14, Debian testing): what a Python newer than the per-version wheels gets.
for arch in x86_64 aarch64; do
  if tag=$(wheel_tag "$arch" abi3); then
    deb=$(arch_debian "$arch")
    rm -rf "$T/abi3-$arch" && mkdir -p "$T/abi3-$arch"
    cp "$DIST"/safetensors-*-"$tag".whl "$T/abi3-$arch/"
    check_wheel forky "$deb" python3.14 "$tag" --wheels "$T/abi3-$arch" \
      --check 'import safetensors._safetensors_cpp as m; assert m.__file__.endswith(".abi3.so"), m.__file__'
  fi
done
# The free-threaded wheels, each with the free-threaded CPython it was built for (scripts/python-ft.sh,
# read-only; aarch64's cross-built against Debian 12's arm64 libraries), in Debian 12 with the libstdc++ PyPI's
# numpy needs: pip takes cp313t / cp314t, and the GIL stays off after importing the package and its numpy module.
for arch in x86_64 aarch64; do
  for minor in 3.13 3.14; do
    if tag=$(wheel_tag "$arch" "cp${minor/./}t"); then
      prefix=$(bash scripts/python-ft.sh --version "$minor" --arch "$arch" --prefix | tail -n 1)
      check_wheel bookworm-pypi "$(arch_debian "$arch")" "python${minor}t" "$tag" --pyenv "$prefix" \
        --check 'import sys, safetensors.numpy; assert not sys._is_gil_enabled(), "the GIL came back on"'
    fi
  done
done

if [ "$MATRIX" = ci ]; then
  summary+=("(SAFETENSORS_WHEEL_MATRIX=ci: the other wheels of aarch64, s390x, ppc64le and the sdist build left out)")
else
# The sdist, built by pip in a root that holds only what README lists for it (a C++ compiler, Python's headers,
# simdjson's development files); pip fetches the build tools from PyPI (pinned by constraints.txt).
printf '\n\033[1m--- the sdist, built by pip on bookworm amd64\033[0m\n'
t0=$SECONDS
root=$ROOTS/sdist-amd64
rm -rf "$root/work"
mkdir -p "$root/work"
cp constraints.txt "$root/work/constraints.txt"
in_root "$root" amd64 --bind "$DIST:/wheels" --bind "$ROOT/tests:/src/tests" --env PIP_CONSTRAINT=/work/constraints.txt \
  --env CMAKE_BUILD_PARALLEL_LEVEL="$JOBS" -- \
  python3 -m pip install -q --break-system-packages "/wheels/$(basename "$(ls "$DIST"/safetensors-*.tar.gz)")"
in_root "$root" amd64 --bind "$ROOT/tests:/src/tests" -- python3 /src/tests/wheel/check_wheel.py /work/out \
  cp311-cp311-linux_x86_64
summary+=("$(printf '%-55s %-14s %3ds  %s' "sdist (pip install, built here)" "sdist-amd64" $((SECONDS - t0)) \
  "check_wheel.py")")
fi

printf '\n\033[1m=== wheels: %s\033[0m\n' "$DIST"
ls -l "$DIST"
printf '  %s\n' "${summary[@]}"
