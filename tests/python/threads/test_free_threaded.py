"""On a free-threaded Python (3.13t, 3.14t), importing the package keeps the GIL off: the native module
declares that it does not need it (nanobind's FREE_THREADED). A module that did not would turn the GIL back on
for the whole process, with a RuntimeWarning. Checked in a fresh interpreter without PYTHON_GIL (which would
force the GIL off whatever the modules declare). README "Threads"."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig

import pytest

FREE_THREADED = bool(sysconfig.get_config_var("Py_GIL_DISABLED"))
pytestmark = pytest.mark.skipif(not FREE_THREADED, reason="this Python has a GIL (not a free-threaded build)")

CHECK = """
import importlib, sys, warnings
warnings.simplefilter("error")  # "The global interpreter lock (GIL) has been enabled to load module ..."
for name in sys.argv[1:]:
    importlib.import_module(name)
    assert not sys._is_gil_enabled(), f"importing {name} enabled the GIL"
print("gil off")
"""


def have(module: str) -> bool:
    probe = subprocess.run([sys.executable, "-c", f"import {module}"], capture_output=True,
                           env={k: v for k, v in os.environ.items() if k != "PYTHON_GIL"})
    return probe.returncode == 0


@pytest.mark.parametrize("modules", [
    ["safetensors"],
    ["safetensors", "safetensors.numpy"],
    pytest.param(["safetensors", "safetensors.torch"], marks=pytest.mark.skipif(
        FREE_THREADED and not have("torch"), reason="torch is not installed for this free-threaded Python")),
])
def test_importing_keeps_the_gil_off(modules):
    env = {k: v for k, v in os.environ.items() if k != "PYTHON_GIL"}
    proc = subprocess.run([sys.executable, "-c", CHECK, *modules], capture_output=True, text=True, env=env)
    assert proc.returncode == 0 and proc.stdout.strip() == "gil off", proc.stderr

