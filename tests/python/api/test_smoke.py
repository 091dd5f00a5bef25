"""The installed package is this project's, and it is what `import safetensors` finds."""

import importlib.metadata

import safetensors
from safetensors import _safetensors_cpp


def test_installed_distribution_is_ours():
    assert importlib.metadata.version("safetensors") == safetensors.__version__
    assert "+cpp" in safetensors.__version__
    assert _safetensors_cpp.__name__ == "safetensors._safetensors_cpp"


def test_the_demo_runs_end_to_end(tmp_path):
    # The README's first command runs examples/python/demo.py: it saves a GPT-2-sized model, inspects it,
    # loads it back on every available device (asserting equal tensors) and prints the speed table.
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[3]
    env = dict(os.environ, SAFETENSORS_DEMO_OUT=str(tmp_path), SAFETENSORS_DEMO_REPEAT="1")  # every row, timed once
    run = subprocess.run([sys.executable, str(root / "examples" / "python" / "demo.py")], env=env,
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-4000:]
    out = run.stdout
    assert "148 tensors, 124.4M parameters, 475 MiB (float32)" in out
    assert "identical to the saved ones: True" in out
    assert "slice wte.weight[1000:1002, ::256] -> shape (2, 3)" in out
    for row in ("save", "load, lazy (mmap)", "load + touch every page (mmap)", "load, materialized (pread)"):
        assert f"   {row} " in out, row
    assert (tmp_path / "gpt2.safetensors").stat().st_size > 124_439_808 * 4  # the float32 data and a header
