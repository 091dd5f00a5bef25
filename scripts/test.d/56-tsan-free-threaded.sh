# ThreadSanitizer on free-threaded Python (README "Threads"): the library and the binding built with clang's
# -fsanitize=thread (SAFETENSORS_SANITIZE=thread) for CPython 3.14t built under TSan itself (scripts/python-ft.sh
# --tsan: cached outside the tree, numpy only), then the thread stress test (tests/python/threads/test_threads.py:
# 8 threads behind a barrier on shared and private handles, saves and loads; its numpy paths) with the GIL off,
# for SAFETENSORS_TSAN_ROUNDS rounds (default 10). Any race TSan sees in our code fails the stage at once
# (halt_on_error); CPython's own suppressions (Tools/tsan/suppressions_free_threading.txt) are the only ones.
set -euo pipefail
cd "$ROOT"
VENV=$(bash scripts/python-ft.sh --tsan | tail -n 1)
PREFIX=$(bash scripts/python-ft.sh --tsan --prefix | tail -n 1)
PY=$VENV/bin/python

# The package, into the TSan venv, from a build tree of its own (build/py-tsan), with debug information so that a
# report names our functions and lines. pip itself is not under test.
TSAN_OPTIONS="report_bugs=0 exitcode=0" CC=clang CXX=clang++ "$PY" -m pip install -q --disable-pip-version-check \
  --no-build-isolation --no-deps --config-settings=build-dir=build/py-tsan \
  --config-settings=cmake.define.SAFETENSORS_SANITIZE=thread --config-settings=cmake.build-type=RelWithDebInfo . \
  2>&1 | { grep -v "^WARNING: Location" || true; }

export TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 suppressions=$PREFIX/tsan-suppressions.txt"
PYTHON_GIL=0 "$PY" - <<'PY'
import sys, sysconfig
import safetensors._safetensors_cpp as cpp
assert sysconfig.get_config_var("Py_GIL_DISABLED"), "not a free-threaded Python"
assert "-fsanitize=thread" in (sysconfig.get_config_var("CONFIG_ARGS") + sysconfig.get_config_var("PY_CFLAGS")), \
    "the interpreter is not built under TSan"
assert "site-packages" in cpp.__file__, cpp.__file__
print("TSan build of the module on", sys.version.split()[0], "(free-threaded):", cpp.__file__)
PY
# --capture=sys: a report goes to file descriptor 2 as TSan writes it (pytest's default capture would hold it in a
# test's buffer, and halt_on_error exits before pytest prints that).
PYTHON_GIL=0 SAFETENSORS_STRESS_ROUNDS=${SAFETENSORS_TSAN_ROUNDS:-10} \
  "$PY" -m pytest -q -p no:cacheprovider --capture=sys -rs tests/python/threads/test_threads.py
