"""Shared fixtures: temporary files, the reference implementation (in its own directory, run in a subprocess)."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REFERENCE_PATH = os.environ.get("SAFETENSORS_REFERENCE_PATH", str(Path(__file__).resolve().parents[2] / ".ref"))


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
        proc = subprocess.run([sys.executable, "-c", script], input=pickle.dumps(inputs), capture_output=True, env=env)
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
