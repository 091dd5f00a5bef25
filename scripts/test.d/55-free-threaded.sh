# Free-threaded Python (README "Threads"): CPython 3.14t built from Debian's source package with its venv of
# free-threaded wheels (scripts/python-ft.sh, cached outside the tree: a warm run builds nothing), the package
# built and installed into it, then on that interpreter: importing safetensors, safetensors.numpy and (where
# torch installs) safetensors.torch leaves the GIL off; the whole Python suite with PYTHON_GIL=0 (frameworks
# without a free-threaded build skip, each naming why; the reference runs on the development venv's 3.11);
# and the thread stress test (tests/python/threads/test_threads.py) for SAFETENSORS_STRESS_ROUNDS rounds (default 10).
# The whole suite takes about 5 minutes on a 2-core machine; SAFETENSORS_FT_SUITE=0 leaves it out.
set -euo pipefail
cd "$ROOT"
VENV=$(bash scripts/python-ft.sh | tail -n 1)
PY=$VENV/bin/python
"$PY" -c 'import sys; print(sys.version)'
[ -s "$VENV/missing" ] && echo "not in the free-threaded venv (no cp314t wheel installs): $(tr '\n' ' ' <"$VENV/missing")"

# The package, built with the venv's pinned nanobind and scikit-build-core (cmake and ninja: the development
# venv's, on PATH); the build tree build/py-<tag> is kept between runs.
"$PY" -m pip install -q --disable-pip-version-check --no-build-isolation --no-deps . 2>&1 \
  | { grep -v "^WARNING: Location" || true; }
"$PY" - <<'PY'
import sys, sysconfig
import safetensors._safetensors_cpp as cpp
assert sysconfig.get_config_var("Py_GIL_DISABLED"), "not a free-threaded Python"
assert "site-packages" in cpp.__file__, cpp.__file__  # the installed build, not the source tree's module
print("free-threaded module:", cpp.__file__)
PY

export SAFETENSORS_REFERENCE_PATH="$ROOT/.ref" SAFETENSORS_REFERENCE_PYTHON="$ROOT/.venv/bin/python"
# The GIL check runs without PYTHON_GIL (which would keep the GIL off whatever a module declares).
env -u PYTHON_GIL "$PY" -m pytest -q -p no:cacheprovider tests/python/threads/test_free_threaded.py
if [ "${SAFETENSORS_FT_SUITE:-1}" = 1 ]; then
  PYTHON_GIL=0 "$PY" -m pytest -q -p no:cacheprovider -rs tests/python --ignore=tests/python/threads/test_threads.py
fi
PYTHON_GIL=0 SAFETENSORS_STRESS_ROUNDS=${SAFETENSORS_STRESS_ROUNDS:-10} \
  "$PY" -m pytest -q -p no:cacheprovider tests/python/threads/test_threads.py
