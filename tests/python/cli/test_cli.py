"""The `safetensors` command-line tool itself: help, version, usage errors, `python -m` and the console
script, closed pipes; and the checkpoint-path helpers (sizes, shard plans, what a path names).

Most tests call `main(argv)` in-process (fast, and the captured output is exact); a few run the tool as a
subprocess, through `python -m safetensors._cli` and through the installed console script.
"""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import safetensors.numpy as stnp
from safetensors._cli import main
from safetensors._safetensors_cpp.sharded import plan_shards
from safetensors._checkpoint_paths import Checkpoint, Shard, parse_size, resolve
from cli.helpers import shard_file_names, small_file


# -- the tool itself ---------------------------------------------------------------------------------------

def test_help_for_the_tool_and_every_command(cli):
    r = cli("--help")
    assert r.rc == 0 and r.out.startswith("usage: safetensors ")
    for command in ("inspect", "verify", "convert", "diff"):
        assert command in r.out
    for command in ("inspect", "verify", "convert", "diff"):
        r = cli(command, "--help")
        assert r.rc == 0, command
        assert r.out.startswith(f"usage: safetensors {command} "), r.out
    assert "--max-shard-size" in cli("convert", "--help").out
    assert "--scan" in cli("verify", "--help").out
    assert "--json" in cli("inspect", "--help").out


def test_version_flag_prints_the_package_version(cli):
    import safetensors

    r = cli("--version")
    assert (r.rc, r.out) == (0, f"safetensors {safetensors.__version__}\n")


@pytest.mark.parametrize(
    "argv, message",
    [
        ([], "required: COMMAND"),
        (["frob"], "invalid choice: 'frob'"),
        (["inspect"], "required: FILE|DIR|INDEX"),
        (["diff", "a"], "required: B"),
        (["inspect", "x", "--nope"], "unrecognized arguments: --nope"),
    ],
)
def test_usage_errors_exit_2(cli, argv, message):
    r = cli(*argv)
    assert r.rc == 2
    assert message in r.err
    assert "Traceback" not in r.err


def test_python_dash_m(tmp_path):
    f = small_file(tmp_path / "x.safetensors")
    proc = subprocess.run(
        [sys.executable, "-m", "safetensors._cli", "verify", str(f)], capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.endswith("verify OK: 1 file, 2 tensors, 56 B read\n")
    proc = subprocess.run([sys.executable, "-m", "safetensors._cli", "inspect", str(tmp_path / "nope")],
                          capture_output=True, text=True)
    assert proc.returncode == 2
    assert proc.stderr == f"safetensors inspect: error: {tmp_path / 'nope'}: no such file or directory\n"


def test_installed_console_script(tmp_path):
    script = Path(sys.executable).parent / "safetensors"
    if not script.exists():
        pytest.skip(f"{script} is not installed (reinstall the package to generate console scripts)")
    f = small_file(tmp_path / "x.safetensors")
    proc = subprocess.run([str(script), "inspect", "--json", str(f)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["total_parameters"] == 10
    proc = subprocess.run([str(script), "verify", str(tmp_path / "missing.safetensors")], capture_output=True, text=True)
    assert proc.returncode == 2 and "missing.safetensors" in proc.stderr and "Traceback" not in proc.stderr


# -- helpers of _checkpoint_paths ----------------------------------------------------------------------------------

@pytest.mark.parametrize(
    "text, value",
    [
        ("1000", 1000),
        ("5GB", 5 * 10**9),
        ("5gb", 5 * 10**9),
        ("500MB", 500 * 10**6),
        ("1.5 GB", 1_500_000_000),
        ("10KB", 10_000),
        ("2GiB", 2 * 2**30),
        ("64KiB", 65536),
        ("3MiB", 3 * 2**20),
        ("1TB", 10**12),
        ("1TiB", 2**40),
        ("12B", 12),
    ],
)
def test_parse_size(text, value):
    assert parse_size(text) == value


@pytest.mark.parametrize("text", ["", "GB", "5XB", "-1GB", "5 G B", "0", "0.1B", "1e3"])
def test_parse_size_rejects(text):
    with pytest.raises(ValueError, match="invalid size"):
        parse_size(text)


def test_plan_shards():
    def groups(sizes):
        return [[sizes[i][0] for i in inputs] for _, inputs, _ in plan_shards(sizes, 10).shards]

    assert groups([("a", 6), ("b", 6), ("c", 2), ("d", 6), ("e", 2), ("f", 2)]) == [["a"], ["b", "c"], ["d", "e", "f"]]
    assert groups([("x", 1), ("huge", 50), ("y", 1)]) == [["huge"], ["x", "y"]]
    assert groups([]) == []  # huggingface_hub's split of an empty state dict has no files either
    assert [name for name, _, _ in plan_shards([("a", 6), ("b", 6)], 10).shards] == shard_file_names("model", 2)


def test_a_path_resolves_to_its_checkpoint_kind_and_shards(tmp_path, sharded):
    f = small_file(tmp_path / "x.safetensors")
    assert resolve(str(f)) == Checkpoint(str(f), "file", [Shard(str(f))])
    c = resolve(str(sharded))
    assert (c.kind, c.index_path) == ("directory", str(sharded / "model.safetensors.index.json"))
    assert [(s.path, s.names) for s in c.shards] == [
        (str(sharded / "model-00001-of-00002.safetensors"), ["embed.weight", "layer.0.weight"]),
        (str(sharded / "model-00002-of-00002.safetensors"), ["lm_head.weight"]),
    ]


def test_sub_byte_floats(cli, tmp_path):
    ml_dtypes = pytest.importorskip("ml_dtypes")
    a = np.array([0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -1.0], dtype=ml_dtypes.float4_e2m1fn)
    b = a.copy()
    b[3], b[6] = 3.0, -6.0
    stnp.save_file({"q": a}, str(tmp_path / "a.safetensors"))
    stnp.save_file({"q": b}, str(tmp_path / "b.safetensors"))
    assert json.loads(cli("inspect", "--json", tmp_path / "a.safetensors").out)["files"][0]["tensors"] == [
        {"name": "q", "dtype": "F4", "shape": [8], "parameters": 8, "nbytes": 4, "data_offsets": [0, 4]}
    ]
    assert cli("verify", "--scan", tmp_path / "a.safetensors").rc == 0
    r = cli("diff", tmp_path / "a.safetensors", tmp_path / "b.safetensors")
    assert r.out.splitlines()[2] == "values differ: q  F4 [8]: 2 of 8 elements differ, max abs diff 12"


def test_closed_pipe_ends_quietly(tmp_path, monkeypatch):
    class ClosedPipe(io.StringIO):
        def write(self, text: str) -> int:
            raise BrokenPipeError(32, "Broken pipe")

    f = small_file(tmp_path / "x.safetensors")
    monkeypatch.setattr(sys, "stdout", ClosedPipe())
    assert main(["inspect", str(f)]) == 141
