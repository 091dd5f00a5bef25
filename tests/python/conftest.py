"""Shared fixtures: temporary files, the reference implementation (in its own directory, run in a subprocess)."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import sysconfig
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

# Tests live in folders by area (io/, format/, distributed/, ...); the helpers they share stay here, beside this
# file: npu_sim/, remote/, faultfs.py, read_paths.py, malicious_files.py. This directory on sys.path makes them
# importable from every folder (pytest's default "prepend" import mode puts only each test file's own folder
# there, and this conftest's folder only while importing it).
sys.path.insert(0, str(Path(__file__).resolve().parent))

# Hypothesis profiles. `ci` (chosen when the environment sets CI, as CI runs scripts/test.sh) is derandomized:
# every run draws the same examples (from a seed derived from each test), keeps no example database, never
# fails on a timing deadline or a too-slow health check, and prints the reproduction blob of any failure.
# `dev` (everywhere else) keeps searching new random examples and remembers failures in .hypothesis/.
# max_examples is Hypothesis's default of 100, what every test without its own @settings uses today; tests
# that set max_examples themselves (test_differential.py, test_slicing.py) keep their own count in both.
# HYPOTHESIS_PROFILE=ci|dev picks one explicitly. Both start from Hypothesis's own defaults, not from
# whatever profile Hypothesis loaded at import (it loads a built-in `ci` when CI is in the environment).
_DEFAULTS = settings.get_profile("default")
settings.register_profile(
    "ci",
    parent=_DEFAULTS,
    derandomize=True,
    max_examples=100,
    deadline=None,
    print_blob=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile("dev", parent=_DEFAULTS, derandomize=False, max_examples=100, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE") or ("ci" if os.environ.get("CI") else "dev"))

TEST_SEED = 0

# A free-threaded Python (scripts/test.d/55-free-threaded.sh, CPython 3.14t) has no build of some frameworks
# the tests use (TensorFlow, PaddlePaddle, JAX, MLX, transformers' stack; torch where its wheel fails). There a
# test module that imports one of them at its top is skipped, naming the module, instead of failing to
# collect; on other Pythons a missing framework stays a collection error.
FREE_THREADED = bool(sysconfig.get_config_var("Py_GIL_DISABLED"))
NO_FREE_THREADED_BUILD = ("torch", "ml_dtypes", "transformers", "huggingface_hub", "mfusepy", "jax", "tensorflow",
                          "paddle", "mlx")


class _FreeThreadedModule(pytest.Module):
    def _getobj(self):
        try:
            return super()._getobj()
        except self.CollectError as e:
            cause = e.__cause__
            missing = (getattr(cause, "name", None) or "").split(".")[0]
            if not isinstance(cause, ImportError) or missing not in NO_FREE_THREADED_BUILD:
                raise
            raise pytest.skip.Exception(f"{missing} is not installed for this free-threaded Python ({cause})",
                                        allow_module_level=True) from None


if FREE_THREADED:

    def pytest_pycollect_makemodule(module_path, parent):
        if module_path.name == "conftest.py":
            return None
        return _FreeThreadedModule.from_parent(parent, path=module_path)


@pytest.fixture(autouse=True)
def _seed_global_generators() -> None:
    """Seeds the global random generators before every test, so values a test draws without its own generator
    (torch.randn, a module's random initialisation, np.random.*, random.*) are the same on every run and do not
    depend on which tests ran before. Only frameworks the test modules already imported are seeded."""
    import random

    random.seed(TEST_SEED)
    seeders = {
        "numpy": lambda m: m.random.seed(TEST_SEED),
        "torch": lambda m: m.manual_seed(TEST_SEED),
        "paddle": lambda m: m.seed(TEST_SEED),
        "tensorflow": lambda m: m.random.set_seed(TEST_SEED),
        "mlx.core": lambda m: m.random.seed(TEST_SEED),
    }
    for name, seed in seeders.items():
        module = sys.modules.get(name)
        if module is not None:
            try:
                seed(module)
            except AttributeError:  # a module that is only partly importable here (a stub, a failed import)
                pass


REFERENCE_PATH = os.environ.get("SAFETENSORS_REFERENCE_PATH", str(Path(__file__).resolve().parents[2] / ".ref"))
# The interpreter that runs the reference (its native module is built for the development venv's Python):
# this one, unless SAFETENSORS_REFERENCE_PYTHON names another (scripts/test.d/55-free-threaded.sh names the
# venv's 3.11, since the reference's abi3 module does not load on a free-threaded Python).
REFERENCE_PYTHON = os.environ.get("SAFETENSORS_REFERENCE_PYTHON", sys.executable)


def reference_available() -> bool:
    return (Path(REFERENCE_PATH) / "safetensors" / "__init__.py").exists()


class Reference:
    """Runs code against the reference `safetensors` in a subprocess (both packages are named safetensors)."""

    def run(self, code: str, **inputs: Any) -> Any:
        """Executes `code` with `inputs` bound as globals; returns the value the code assigns to `result`."""
        script = (
            "import pickle, sys\n"
            "g = pickle.loads(sys.stdin.buffer.read())\n"
            f"exec({code!r}, g)\n"
            "sys.stdout.buffer.write(pickle.dumps(g.get('result')))\n"
        )
        env = dict(os.environ, PYTHONPATH=REFERENCE_PATH)
        proc = subprocess.run([REFERENCE_PYTHON, "-c", script], input=pickle.dumps(inputs), capture_output=True,
                              env=env)
        if proc.returncode != 0:
            raise RuntimeError(f"reference subprocess failed:\n{proc.stderr.decode()}")
        return pickle.loads(proc.stdout)


@pytest.fixture(scope="session")
def reference() -> Reference:
    if not reference_available():
        if os.environ.get("CI"):
            pytest.fail(f"the reference implementation is not installed in {REFERENCE_PATH}")
        pytest.skip(f"the reference implementation is not installed in {REFERENCE_PATH} (run scripts/setup.sh)")
    return Reference()
