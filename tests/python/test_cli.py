"""The `safetensors` command-line tool: inspect, verify, convert, diff, and their error paths.

Most tests call `main(argv)` in-process (fast, and the captured output is exact); a few run the tool as a
subprocess, through `python -m safetensors._cli` and through the installed console script.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, NamedTuple

import numpy as np
import pytest
import torch

import safetensors.numpy as stnp
import safetensors.torch as stt
from safetensors import _cli
from safetensors._cli import main
from safetensors import safe_open
from safetensors._safetensors_cpp import plan_shards
from safetensors._sharding import Checkpoint, Shard, parse_size, resolve


def shard_file_names(stem: str, count: int) -> List[str]:
    """The names transformers gives shards (the C++ plan makes them)."""
    return [f"{stem}-{i:05d}-of-{count:05d}.safetensors" for i in range(1, count + 1)]


class Result(NamedTuple):
    rc: int
    out: str
    err: str


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str]):
    def run(*argv: object) -> Result:
        capsys.readouterr()
        rc = main([str(a) for a in argv])
        captured = capsys.readouterr()
        return Result(rc, captured.out, captured.err)

    return run


def assert_input_error(result: Result, *fragments: str) -> None:
    """Exit status 2 and one line on stderr, naming what went wrong, with no traceback."""
    assert result.rc == 2, result
    assert result.out == ""
    lines = result.err.splitlines()
    assert len(lines) == 1, result.err
    assert "Traceback" not in result.err
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])


def small_file(path: Path, metadata: Dict[str, str] | None = None) -> Path:
    """b: I64 [4] (0..3) and a: F32 [2, 3] (zeros)."""
    stnp.save_file(
        {"a": np.zeros((2, 3), np.float32), "b": np.arange(4, dtype=np.int64)},
        str(path),
        metadata={"k": "v"} if metadata is None else metadata,
    )
    return path


def write_index(path: Path, weight_map: Dict[str, str], metadata: Dict[str, object] | None = None) -> Path:
    """An index as transformers writes it (two-space indent, sorted keys, final newline)."""
    document = {"metadata": metadata if metadata is not None else {"total_size": 0}, "weight_map": weight_map}
    path.write_text(json.dumps(document, indent=2, sort_keys=True) + "\n")
    return path


@pytest.fixture
def sharded(tmp_path: Path) -> Path:
    """A hand-written transformers-style checkpoint: two shards and an index. Shard 2 also holds a stale
    tensor, `stale`, that the index does not assign to it."""
    d = tmp_path / "ckpt"
    d.mkdir()
    stnp.save_file(
        {"embed.weight": np.ones((4, 2), np.float32), "layer.0.weight": np.full((2, 2), 2, np.float16)},
        str(d / "model-00001-of-00002.safetensors"),
        metadata={"format": "pt"},
    )
    stnp.save_file(
        {"lm_head.weight": np.arange(8, dtype=np.float32).reshape(2, 4), "stale": np.zeros(3, np.int8)},
        str(d / "model-00002-of-00002.safetensors"),
        metadata={"format": "pt"},
    )
    write_index(
        d / "model.safetensors.index.json",
        {
            "embed.weight": "model-00001-of-00002.safetensors",
            "layer.0.weight": "model-00001-of-00002.safetensors",
            "lm_head.weight": "model-00002-of-00002.safetensors",
        },
        {"total_parameters": 20, "total_size": 72},
    )
    return d


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


def test_version(cli):
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


# -- inspect -----------------------------------------------------------------------------------------------

def test_inspect_file_text(cli, tmp_path):
    f = small_file(tmp_path / "x.safetensors")
    r = cli("inspect", f)
    assert r.rc == 0 and r.err == ""
    assert r.out == (
        f"{f}: 2 tensors, 56 B of data, 208 bytes (header 144 bytes)\n"
        "  name  dtype  shape   size  offsets\n"
        "  b     I64    [4]     32 B  [0, 32)\n"
        "  a     F32    [2, 3]  24 B  [32, 56)\n"
        "  metadata:\n"
        "    k: v\n"
        "\n"
        "parameters by dtype:\n"
        "  F32     6\n"
        "  I64     4\n"
        "  total  10\n"
        "total bytes: 56 (56 B) of tensor data in 1 file\n"
    )


def test_inspect_file_json(cli, tmp_path):
    f = small_file(tmp_path / "x.safetensors")
    r = cli("inspect", "--json", f)
    assert r.rc == 0
    assert json.loads(r.out) == {
        "path": str(f),
        "kind": "file",
        "index": None,
        "files": [
            {
                "path": str(f),
                "file_size": 208,
                "header_size": 144,
                "metadata": {"k": "v"},
                "tensors": [
                    {"name": "b", "dtype": "I64", "shape": [4], "parameters": 4, "nbytes": 32, "data_offsets": [0, 32]},
                    {"name": "a", "dtype": "F32", "shape": [2, 3], "parameters": 6, "nbytes": 24, "data_offsets": [32, 56]},
                ],
            }
        ],
        "parameters": {"F32": 6, "I64": 4},
        "total_parameters": 10,
        "total_bytes": 56,
    }


def test_inspect_scalars_empty_tensors_no_metadata_and_long_values(cli, tmp_path):
    f = tmp_path / "odd.safetensors"
    stnp.save_file({"scalar": np.array(3.0, np.float64), "empty": np.zeros((0, 5), np.float32)}, str(f))
    doc = json.loads(cli("inspect", "--json", f).out)
    assert doc["files"][0]["metadata"] is None
    assert [(t["name"], t["shape"], t["parameters"], t["nbytes"]) for t in doc["files"][0]["tensors"]] == [
        ("scalar", [], 1, 8),
        ("empty", [0, 5], 0, 0),
    ]
    assert doc["parameters"] == {"F64": 1, "F32": 0}
    text = cli("inspect", f).out
    assert "  scalar  F64    []       8 B  [0, 8)\n  empty   F32    [0, 5]   0 B  [8, 8)\n" in text
    assert "  metadata:\n    (none)\n" in text

    g = tmp_path / "long.safetensors"
    stnp.save_file({"x": np.zeros(1, np.uint8)}, str(g), metadata={"config": "a\nb" + "z" * 300})
    text = cli("inspect", g).out
    assert "    config: a\\nb" + "z" * 196 + "... (303 characters)\n" in text
    assert json.loads(cli("inspect", "--json", g).out)["files"][0]["metadata"] == {"config": "a\nb" + "z" * 300}


def test_inspect_hand_written_transformers_index(cli, sharded):
    index = sharded / "model.safetensors.index.json"
    doc = json.loads(cli("inspect", "--json", index).out)
    assert doc["kind"] == "index"
    assert doc["index"] == {"path": str(index), "metadata": {"total_parameters": 20, "total_size": 72}}
    assert [f["path"] for f in doc["files"]] == [
        str(sharded / "model-00001-of-00002.safetensors"),
        str(sharded / "model-00002-of-00002.safetensors"),
    ]
    # Only the names the index assigns: `stale` in shard 2 is not shown or counted.
    assert [[t["name"] for t in f["tensors"]] for f in doc["files"]] == [
        ["embed.weight", "layer.0.weight"],
        ["lm_head.weight"],
    ]
    assert doc["parameters"] == {"F32": 16, "F16": 4}
    assert (doc["total_parameters"], doc["total_bytes"]) == (20, 72)

    # A directory with an index means that index; the text lists the index metadata and shared metadata once.
    r = cli("inspect", sharded)
    assert r.rc == 0
    assert json.loads(cli("inspect", "--json", sharded).out)["files"] == doc["files"]
    assert r.out.startswith(
        f"index {index}: 3 tensors in 2 files\n  metadata:\n    total_parameters: 20\n    total_size: 72\n\n"
    )
    assert "stale" not in r.out
    assert "\nmetadata (the same in all 2 files):\n  format: pt\n" in r.out
    assert r.out.endswith("total bytes: 72 (72 B) of tensor data in 2 files\n")


def test_inspect_directory_without_index_lists_every_safetensors_file(cli, tmp_path):
    small_file(tmp_path / "b.safetensors", metadata={"k": "1"})
    small_file(tmp_path / "a.safetensors", metadata={"k": "2"})
    (tmp_path / "notes.txt").write_text("not a checkpoint")
    (tmp_path / "sub").mkdir()
    small_file(tmp_path / "sub" / "c.safetensors")
    doc = json.loads(cli("inspect", "--json", tmp_path).out)
    assert doc["kind"] == "directory" and doc["index"] is None
    assert [f["path"] for f in doc["files"]] == [str(tmp_path / "a.safetensors"), str(tmp_path / "b.safetensors")]
    assert (doc["total_parameters"], doc["total_bytes"]) == (20, 112)
    text = cli("inspect", tmp_path).out
    assert text.count("  metadata:\n") == 2  # the files' metadata differ, so each file shows its own


def test_inspect_input_errors(cli, tmp_path, sharded):
    assert_input_error(cli("inspect", tmp_path / "nope.safetensors"), "nope.safetensors: no such file or directory")
    text = tmp_path / "text.safetensors"
    text.write_bytes(b"this is not a safetensors file")
    assert_input_error(cli("inspect", text), "text.safetensors", "HeaderTooLarge")
    empty = tmp_path / "empty"
    empty.mkdir()
    assert_input_error(cli("inspect", empty), f"{empty}: no *.safetensors files in this directory")

    (sharded / "extra.safetensors.index.json").write_text("{}")
    assert_input_error(cli("inspect", sharded), "several index files (extra.safetensors.index.json, model.safetensors.index.json)")


@pytest.mark.parametrize(
    "content, message",
    [
        ("{not json", "invalid index: The JSON document has an improper structure"),
        ('{"metadata": {}}', "invalid index: missing `weight_map`"),
        ('{"weight_map": {"a": "x.safetensors", "a": "y.safetensors"}}', "duplicate key `a` in `weight_map`"),
        ('{"weight_map": {"a": "../x.safetensors"}}', "not a relative path inside the index's directory"),
        ('{"weight_map": {"a": "/etc/x.safetensors"}}', "not a relative path inside the index's directory"),
        ('{"weight_map": {"a": 3}}', "value for tensor `a` must be a string"),
        ('{"metadata": [], "weight_map": {}}', "`metadata` must be an object"),
    ],
)
def test_inspect_invalid_index(cli, tmp_path, content, message):
    index = tmp_path / "model.safetensors.index.json"
    index.write_text(content)
    assert_input_error(cli("inspect", index), str(index), message)


def test_inspect_index_naming_missing_shard_or_tensor(cli, sharded):
    index = sharded / "model.safetensors.index.json"
    weight_map = json.loads(index.read_text())["weight_map"]
    write_index(index, {**weight_map, "ghost": "model-00002-of-00002.safetensors"})
    assert_input_error(
        cli("inspect", index),
        'File does not contain tensor ghost (TensorNotFound) in "',
        'model-00002-of-00002.safetensors", which the index',
    )
    write_index(index, {**weight_map, "x": "model-00003-of-00003.safetensors"})
    assert_input_error(cli("inspect", sharded), "model-00003-of-00003.safetensors: no such file, but the index")


# -- verify ------------------------------------------------------------------------------------------------

def test_verify_ok(cli, tmp_path):
    f = small_file(tmp_path / "x.safetensors")
    r = cli("verify", f)
    assert r == Result(0, f"OK    {f}: 2 tensors, 56 B read\nverify OK: 1 file, 2 tensors, 56 B read\n", "")
    r = cli("verify", "--quiet", f)
    assert r == Result(0, "verify OK: 1 file, 2 tensors, 56 B read\n", "")


def _corrupt(data: bytes, how: str) -> bytes:
    b = bytearray(data)
    if how == "length byte":
        b[0] ^= 0x01
    elif how == "first JSON byte":
        b[8] ^= 0x80
    elif how == "offset digit":
        i = data.index(b"[0,32]")
        b[i + 3] = ord("4")
    elif how == "dtype letter":
        i = data.index(b'"I64"')
        b[i + 3] = ord("8")
    elif how == "truncated by one byte":
        del b[-1]
    elif how == "truncated header":
        del b[4:]
    elif how == "trailing byte":
        b += b"\0"
    return bytes(b)


@pytest.mark.parametrize(
    "how, token",
    [
        ("length byte", "InvalidHeaderDeserialization"),
        ("first JSON byte", "invalid UTF-8 in header"),
        ("offset digit", "invalid shape, data type, or offset for tensor `b`"),
        ("dtype letter", "unknown dtype `I68`"),
        ("truncated by one byte", "MetadataIncompleteBuffer"),
        ("truncated header", "HeaderTooSmall"),
        ("trailing byte", "MetadataIncompleteBuffer"),
    ],
)
def test_verify_corrupt_file(cli, tmp_path, how, token):
    good = small_file(tmp_path / "good.safetensors")
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(_corrupt(good.read_bytes(), how))
    r = cli("verify", bad)
    assert r.rc == 1 and r.err == ""
    lines = r.out.splitlines()
    assert lines[0].startswith(f"FAIL  {bad}: Error while deserializing header: ")
    assert token in lines[0]
    assert lines[1] == "verify FAILED: 1 file, 0 tensors, 0 B read, 1 failed"
    # The other commands treat the same file as an input error.
    assert_input_error(cli("inspect", bad), "bad.safetensors", token)
    assert_input_error(cli("diff", good, bad), "bad.safetensors", token)


def test_verify_directory_reports_every_file(cli, tmp_path):
    small_file(tmp_path / "a.safetensors")
    (tmp_path / "b.safetensors").write_bytes(b"\x08\0\0\0\0\0\0\0{}      ")  # valid, empty
    (tmp_path / "c.safetensors").write_bytes(b"junk")
    r = cli("verify", tmp_path)
    assert r.rc == 1
    assert r.out.splitlines() == [
        f"OK    {tmp_path / 'a.safetensors'}: 2 tensors, 56 B read",
        f"OK    {tmp_path / 'b.safetensors'}: 0 tensors, 0 B read",
        f"FAIL  {tmp_path / 'c.safetensors'}: Error while deserializing header: header too small (HeaderTooSmall) "
        f'in "{tmp_path / "c.safetensors"}"',
        "verify FAILED: 3 files, 2 tensors, 56 B read, 1 failed",
    ]


def test_verify_index(cli, sharded):
    r = cli("verify", sharded)
    assert r.rc == 0
    assert r.out.splitlines() == [
        f"OK    {sharded / 'model-00001-of-00002.safetensors'}: 2 tensors, 40 B read",
        f"OK    {sharded / 'model-00002-of-00002.safetensors'}: 2 tensors, 35 B read",
        "      note: holds tensor 'stale' that the index does not list",
        "verify OK: 2 files, 4 tensors, 75 B read",
    ]


def test_verify_index_with_missing_shard_and_missing_tensor(cli, sharded):
    index = sharded / "model.safetensors.index.json"
    weight_map = json.loads(index.read_text())["weight_map"]
    write_index(
        index,
        {**weight_map, "ghost": "model-00002-of-00002.safetensors", "gone": "model-00003-of-00003.safetensors"},
    )
    r = cli("verify", index)
    assert r.rc == 1
    assert r.out.splitlines() == [
        f"OK    {sharded / 'model-00001-of-00002.safetensors'}: 2 tensors, 40 B read",
        f"FAIL  {sharded / 'model-00002-of-00002.safetensors'}: File does not contain tensor ghost (TensorNotFound) "
        f'in "{sharded / "model-00002-of-00002.safetensors"}", which the index {index} assigns to it',
        "      note: holds tensor 'stale' that the index does not list",
        f"FAIL  {sharded / 'model-00003-of-00003.safetensors'}: no such file, but the index {index} names it",
        "verify FAILED: 3 files, 4 tensors, 75 B read, 2 failed",
    ]


def test_verify_invalid_index_is_a_verification_failure(cli, tmp_path):
    index = tmp_path / "model.safetensors.index.json"
    index.write_text('{"weight_map": []}')
    r = cli("verify", index)
    assert r.rc == 1
    assert r.out == f'FAIL  invalid argument: invalid index: `weight_map` must be an object (InvalidArgument) in "{index}"\n'


def test_verify_input_errors(cli, tmp_path):
    assert_input_error(cli("verify", tmp_path / "nope"), "nope: no such file or directory")
    assert_input_error(cli("verify", tmp_path), "no *.safetensors files")


def _nan_file(path: Path) -> Path:
    f32 = np.arange(12, dtype=np.float32).reshape(3, 4)
    f32[1, 2] = np.nan
    f32[2, 0] = np.inf
    f32[2, 1] = -np.inf
    bf16 = torch.tensor([1.0, float("nan"), float("nan"), 2.0], dtype=torch.bfloat16)
    f16 = torch.tensor([float("inf"), 0.0], dtype=torch.float16)
    f8 = torch.tensor([float("nan"), 1.0, 2.0], dtype=torch.float32).to(torch.float8_e5m2)
    stt.save_file(
        {
            "f32": torch.from_numpy(f32),
            "bf16": bf16,
            "f16": f16,
            "f8": f8,
            "clean": torch.ones(5),
            "ints": torch.tensor([-1, 0x7FC00000], dtype=torch.int32),  # NaN's bit pattern, as an int
        },
        str(path),
    )
    return path


def test_verify_scan_finds_nan_and_inf(cli, tmp_path):
    f = _nan_file(tmp_path / "nan.safetensors")
    r = cli("verify", "--scan", f)
    assert r.rc == 1 and r.err == ""
    assert r.out.splitlines() == [
        f"NaN   {f}: 6 tensors, 91 B read, 5 float tensors scanned, 4 with NaN/Inf",
        "      tensor 'f32' (F32 [3, 4]): 1 NaN, 2 Inf in 12 values",
        "      tensor 'bf16' (BF16 [4]): 2 NaN, 0 Inf in 4 values",
        "      tensor 'f16' (F16 [2]): 0 NaN, 1 Inf in 2 values",
        "      tensor 'f8' (F8_E5M2 [3]): 1 NaN, 0 Inf in 3 values",
        "verify FAILED: 1 file, 6 tensors, 91 B read, 4 tensors with NaN/Inf",
    ]
    # Findings are reported under --quiet too; without --scan the same file verifies.
    assert cli("verify", "--scan", "-q", f).out.splitlines()[1:] == r.out.splitlines()[1:]
    assert cli("verify", f).rc == 0


def test_verify_scan_clean(cli, tmp_path):
    f = small_file(tmp_path / "x.safetensors")
    r = cli("verify", "--scan", f)
    assert r == Result(
        0,
        f"OK    {f}: 2 tensors, 56 B read, 1 float tensor scanned\n"
        "verify OK: 1 file, 2 tensors, 56 B read, 0 tensors with NaN/Inf\n",
        "",
    )


def test_verify_reads_large_tensors_in_pieces(cli, tmp_path, monkeypatch):
    monkeypatch.setattr(_cli.common, "CHUNK_BYTES", 64)
    values = np.zeros((100, 5), np.float32)
    values[97, 3] = np.nan  # in the last piece
    values[0, 0] = np.inf  # in the first
    f = tmp_path / "big.safetensors"
    stnp.save_file({"w": values, "row": np.ones(100, np.float64)}, str(f))
    reads: List[object] = []
    original = _cli._cpp.File.read_slice
    monkeypatch.setattr(_cli._cpp.File, "read_slice", lambda self, *a: (reads.append(a[1].shape), original(self, *a))[1])
    r = cli("verify", "--scan", f)
    assert r.rc == 1
    assert "      tensor 'w' (F32 [100, 5]): 1 NaN, 1 Inf in 500 values" in r.out.splitlines()
    assert r.out.endswith("verify FAILED: 1 file, 2 tensors, 2.7 KiB read, 1 tensor with NaN/Inf\n")
    # 64-byte pieces: w in 3-row slices (60 bytes), row in 8-element slices.
    assert sorted(set(reads)) == [(1, 5), (3, 5), (4,), (8,)]
    assert (reads.count((3, 5)), reads.count((1, 5)), reads.count((8,)), reads.count((4,))) == (33, 1, 12, 1)


def test_progress_bar_only_on_a_terminal(cli, tmp_path, monkeypatch):
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    f = small_file(tmp_path / "x.safetensors")
    assert cli("verify", f).err == ""  # captured stderr is not a terminal
    terminal = Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    assert main(["verify", str(f)]) == 0
    assert terminal.getvalue().startswith("\rverifying [")
    assert terminal.getvalue().endswith("] 100% 56 B/56 B\n")
    quiet = Terminal()
    monkeypatch.setattr(sys, "stderr", quiet)
    assert main(["verify", "-q", str(f)]) == 0
    assert quiet.getvalue() == ""


# -- convert -----------------------------------------------------------------------------------------------

def _state_dict() -> Dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {
        "embed.weight": torch.randn(10, 4, generator=g),
        "layer.weight": torch.randn(4, 4, generator=g, dtype=torch.float64),
        "layer.bias": torch.zeros(4, dtype=torch.bfloat16),
        "steps": torch.tensor(7, dtype=torch.int64),
        "mask": torch.tensor([True, False]),
    }


def _assert_equal_dicts(a: Dict[str, torch.Tensor], b: Dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for name in a:
        assert a[name].dtype == b[name].dtype and a[name].shape == b[name].shape, name
        assert torch.equal(a[name], b[name]), name


def test_convert_state_dict_round_trip_and_bytes(cli, tmp_path):
    sd = _state_dict()
    src = tmp_path / "pytorch_model.bin"
    torch.save(sd, src)
    out = tmp_path / "model.safetensors"
    r = cli("convert", src, out)
    assert r.rc == 0 and r.err == ""
    assert r.out == f"converted {src}: 5 tensors, 306 B\n  wrote {out}: 5 tensors\n"
    _assert_equal_dicts(stt.load_file(out), torch.load(src, weights_only=True))
    # The very bytes save_file writes, with the metadata transformers looks for.
    expected = tmp_path / "expected.safetensors"
    stt.save_file(sd, expected, metadata={"format": "pt"})
    assert out.read_bytes() == expected.read_bytes()
    assert cli("verify", out).rc == 0


@pytest.mark.parametrize("entry", ["state_dict", "model"])
def test_convert_finds_the_state_dict_entry(cli, tmp_path, entry):
    sd = _state_dict()
    src = tmp_path / "checkpoint.pt"
    torch.save({entry: sd, "epoch": 3, "optimizer": {"lr": 0.1}}, src)
    r = cli("convert", src, tmp_path / "out.safetensors")
    assert r.rc == 0
    assert r.out.startswith(f'converted {src} ("{entry}" entry): 5 tensors')
    _assert_equal_dicts(stt.load_file(tmp_path / "out.safetensors"), sd)


def test_convert_legacy_format_and_pth(cli, tmp_path):
    sd = _state_dict()
    src = tmp_path / "legacy.pth"
    torch.save(sd, src, _use_new_zipfile_serialization=False)  # cannot be memory-mapped
    assert cli("convert", "-q", src, tmp_path / "out.safetensors") == Result(0, "", "")
    _assert_equal_dicts(stt.load_file(tmp_path / "out.safetensors"), sd)


def test_convert_tied_weights_like_save_model(cli, tmp_path):
    class Tied(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = torch.nn.Embedding(10, 4)
            self.lm_head = torch.nn.Linear(4, 10, bias=False)
            self.lm_head.weight = self.embed.weight

    torch.manual_seed(0)
    model = Tied()
    src = tmp_path / "tied.bin"
    torch.save(model.state_dict(), src)
    out = tmp_path / "tied.safetensors"
    r = cli("convert", src, out)
    assert r.rc == 0
    assert r.out.splitlines()[-1] == (
        "  shared tensor lm_head.weight is stored once, as embed.weight (recorded in the metadata)"
    )
    with safe_open(out, "pt") as f:
        assert f.keys() == ["embed.weight"]
        assert f.metadata() == {"format": "pt", "lm_head.weight": "embed.weight"}
    expected = tmp_path / "expected.safetensors"
    stt.save_model(model, expected, metadata={"format": "pt"})
    assert out.read_bytes() == expected.read_bytes()
    fresh = Tied()
    assert stt.load_model(fresh, out) == (set(), [])
    assert torch.equal(fresh.lm_head.weight, model.embed.weight)


def test_convert_overlapping_views_and_non_contiguous_tensors(cli, tmp_path):
    base = torch.arange(24, dtype=torch.float32).reshape(6, 4)
    sd = {"base": base, "rows": base[2:4], "transposed": torch.randn(3, 5, generator=torch.Generator().manual_seed(0)).t(), "strided": torch.arange(10)[::3]}
    src = tmp_path / "views.pt"
    torch.save(sd, src)
    out = tmp_path / "views.safetensors"
    r = cli("convert", src, out)
    assert r.rc == 0
    assert "  overlapping tensors written as separate copies: rows\n" in r.out
    _assert_equal_dicts(stt.load_file(out), torch.load(src, weights_only=True))
    assert safe_open(out, "pt").metadata() == {"format": "pt"}


def test_convert_sharded_matches_transformers_layout(cli, tmp_path):
    sd = {f"layer.{i}.weight": torch.full((i + 1, 100), float(i)) for i in range(6)}  # 400, 800, ... 2400 bytes
    sd["big"] = torch.zeros(2000)  # 8000 bytes, over the limit: a shard of its own
    sd["tail"] = torch.ones(10, dtype=torch.float16)
    src = tmp_path / "big.bin"
    torch.save(sd, src)
    out_dir = tmp_path / "out"
    r = cli("convert", "--max-shard-size", "3KB", "--metadata", "source=test", src, out_dir / "model.safetensors")
    assert r.rc == 0, r.err
    names = shard_file_names("model", 5)
    assert sorted(os.listdir(out_dir)) == names + ["model.safetensors.index.json"]
    assert r.out.splitlines()[-1] == f"  wrote {out_dir / 'model.safetensors.index.json'}"

    index_text = (out_dir / "model.safetensors.index.json").read_text()
    index = json.loads(index_text)
    assert index_text == json.dumps(index, indent=2, sort_keys=True) + "\n"
    total = sum(t.nelement() * t.element_size() for t in sd.values())
    assert index["metadata"] == {"total_size": total}
    assert index["weight_map"] == {
        "layer.0.weight": names[0], "layer.1.weight": names[0], "layer.2.weight": names[0],
        "layer.3.weight": names[1], "layer.4.weight": names[2], "big": names[3],
        "layer.5.weight": names[4], "tail": names[4],
    }
    hub = pytest.importorskip("huggingface_hub")
    split = hub.split_torch_state_dict_into_shards(sd, max_shard_size=3000)
    assert split.tensor_to_filename == index["weight_map"]

    loaded: Dict[str, torch.Tensor] = {}
    for name in names:
        with safe_open(out_dir / name, "pt") as f:
            assert f.metadata() == {"format": "pt", "source": "test"}
        loaded.update(stt.load_file(out_dir / name))
    _assert_equal_dicts(loaded, sd)
    # The tool reads its own output as a checkpoint.
    assert json.loads(cli("inspect", "--json", out_dir).out)["total_bytes"] == total
    assert cli("verify", out_dir).rc == 0
    single = tmp_path / "single.safetensors"
    assert cli("convert", "-q", "--metadata", "source=test", src, single).rc == 0
    assert cli("diff", single, out_dir).rc == 0


def test_convert_below_the_shard_limit_writes_one_file(cli, tmp_path):
    src = tmp_path / "m.bin"
    torch.save(_state_dict(), src)
    assert cli("convert", "--max-shard-size", "5GB", src, tmp_path).rc == 0
    assert sorted(os.listdir(tmp_path)) == ["m.bin", "model.safetensors"]


def test_convert_refuses_to_overwrite_without_force_and_cleans_stale_shards(cli, tmp_path):
    src = tmp_path / "m.bin"
    torch.save(_state_dict(), src)
    out = tmp_path / "out" / "model.safetensors"
    assert cli("convert", "-q", "--max-shard-size", "100B", src, out).rc == 0
    shards = sorted(os.listdir(out.parent))
    assert shards == shard_file_names("model", 3) + ["model.safetensors.index.json"]
    before = {name: (out.parent / name).read_bytes() for name in shards}

    r = cli("convert", src, out)
    assert_input_error(r, f"{out.parent / 'model-00001-of-00003.safetensors'}: already exists; pass --force")
    assert {name: (out.parent / name).read_bytes() for name in os.listdir(out.parent)} == before

    r = cli("convert", "--force", src, out)
    assert r.rc == 0
    assert sorted(os.listdir(out.parent)) == ["model.safetensors"]
    assert r.out.splitlines()[-4:] == [f"  removed stale {out.parent / name}" for name in shards]
    _assert_equal_dicts(stt.load_file(out), _state_dict())
    assert_input_error(cli("convert", src, out), "model.safetensors: already exists")
    # Other stems in the same directory are not this output.
    assert cli("convert", "-q", src, out.parent / "other.safetensors").rc == 0


def test_convert_counts_as_its_outputs_the_shard_names_the_library_gives(tmp_path):
    """convert's stale-output rule is the C++ shard naming rule (is_shard_file_name), not a second pattern."""
    from safetensors._cli.convert import _existing_outputs

    ours = ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors",
            "model-100000-of-100000.safetensors", "model.safetensors", "model.safetensors.index.json"]
    not_ours = ["model-00003-of-00002.safetensors", "model-00000-of-00002.safetensors",
                "model-0001-of-00002.safetensors", "model-00001-of-00002.safetensors.tmp",
                "other-00001-of-00002.safetensors", "model.bin"]
    for name in ours + not_ours:
        (tmp_path / name).write_bytes(b"")
    assert _existing_outputs(str(tmp_path), "model") == sorted(str(tmp_path / n) for n in ours)
    assert _existing_outputs(str(tmp_path / "absent"), "model") == []


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--max-shard-size", "5XB"], "--max-shard-size: invalid size '5XB'"),
        (["--max-shard-size", "0KB"], "must be at least one byte"),
        (["--metadata", "novalue"], "--metadata 'novalue': expected KEY=VALUE"),
        (["--metadata", "=v"], "--metadata '=v': expected KEY=VALUE"),
        (["--metadata", "k=1", "--metadata", "k=2"], "--metadata: key 'k' given twice"),
    ],
)
def test_convert_option_errors(cli, tmp_path, argv, message):
    src = tmp_path / "m.bin"
    torch.save(_state_dict(), src)
    assert_input_error(cli("convert", src, tmp_path / "o.safetensors", *argv), message)
    assert not (tmp_path / "o.safetensors").exists()


def test_convert_metadata_options(cli, tmp_path):
    src = tmp_path / "m.bin"
    torch.save(_state_dict(), src)
    out = tmp_path / "o.safetensors"
    assert cli("convert", src, out, "--metadata", "format=mlx", "--metadata", "note=a=b", "--metadata", "empty=").rc == 0
    assert safe_open(out, "pt").metadata() == {"format": "mlx", "note": "a=b", "empty": ""}


class _NotAllowed:
    pass


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda p: torch.save({"w": torch.ones(2), "obj": _NotAllowed()}, p),
         "cannot load with torch.load(weights_only=True): Unsupported global: GLOBAL"),
        (lambda p: p.write_bytes(b"not a checkpoint"), "cannot load with torch.load(weights_only=True)"),
        (lambda p: torch.save([torch.ones(2)], p), "holds a list, not a state dict"),
        (lambda p: torch.save({"w": torch.ones(2), "epoch": 3}, p),
         "the state dict has entries that are not named tensors: 'epoch' (int)"),
        (lambda p: torch.save({"model": {"w": torch.ones(2), "n": "x"}}, p),
         "the state dict (in its \"model\" entry) has entries that are not named tensors: 'n' (str)"),
        (lambda p: torch.save({"c": torch.ones(2, dtype=torch.complex128)}, p),
         "tensor 'c' has dtype torch.complex128, which safetensors cannot store"),
        (lambda p: torch.save({"s": torch.eye(2).to_sparse()}, p), "tensor 's' is sparse"),
    ],
)
def test_convert_input_errors(cli, tmp_path, make, message):
    src = tmp_path / "in.pt"
    make(src)
    assert_input_error(cli("convert", src, tmp_path / "o.safetensors"), str(src), message)
    assert not (tmp_path / "o.safetensors").exists()


def test_convert_path_errors(cli, tmp_path):
    src = tmp_path / "m.bin"
    torch.save(_state_dict(), src)
    assert_input_error(cli("convert", tmp_path / "nope.bin", tmp_path / "o.safetensors"), "nope.bin: no such file")
    assert_input_error(cli("convert", tmp_path, tmp_path / "o.safetensors"), "is a directory")
    assert_input_error(cli("convert", src, tmp_path / "o.st"), "o.st: the output must be a .safetensors file name")
    # A directory that does not exist yet is created.
    assert cli("convert", "-q", src, tmp_path / "new" / "deeper" / "m.safetensors").rc == 0
    assert (tmp_path / "new" / "deeper" / "m.safetensors").is_file()


def test_convert_progress_bar(cli, tmp_path, monkeypatch):
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    src = tmp_path / "m.bin"
    torch.save(_state_dict(), src)
    terminal = Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    assert main(["convert", str(src), str(tmp_path / "a.safetensors")]) == 0
    assert terminal.getvalue().startswith("\rconverting [")
    assert terminal.getvalue().endswith("[##############################] 100% 306 B/306 B\n")
    quiet = Terminal()
    monkeypatch.setattr(sys, "stderr", quiet)
    assert main(["convert", "--quiet", str(src), str(tmp_path / "b.safetensors")]) == 0
    assert quiet.getvalue() == ""


def test_convert_output_loads_in_transformers(cli, tmp_path):
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=50, n_positions=16)
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(config)
    src = tmp_path / "pytorch_model.bin"
    torch.save(model.state_dict(), src)  # lm_head.weight is tied to transformer.wte.weight
    out = tmp_path / "hf"
    assert cli("convert", "-q", "--max-shard-size", "10KiB", src, out / "model.safetensors").rc == 0
    assert (out / "model.safetensors.index.json").exists()
    config.save_pretrained(out)
    loaded = transformers.GPT2LMHeadModel.from_pretrained(out)
    _assert_equal_dicts(loaded.state_dict(), model.state_dict())
    # A checkpoint transformers itself writes is read by the tool.
    model.save_pretrained(tmp_path / "saved", max_shard_size="10KB")
    assert cli("verify", "--scan", tmp_path / "saved").rc == 0
    doc = json.loads(cli("inspect", "--json", tmp_path / "saved").out)
    assert doc["total_parameters"] == sum(p.numel() for p in model.parameters())


# -- diff --------------------------------------------------------------------------------------------------

def test_diff_identical(cli, tmp_path):
    a = small_file(tmp_path / "a.safetensors")
    b = small_file(tmp_path / "b.safetensors")
    r = cli("diff", a, b)
    assert r == Result(0, f"A: {a}\nB: {b}\nidentical: 2 tensors, 56 bytes of tensor data, 1 metadata entry\n", "")


def test_diff_reports_every_kind_of_difference(cli, tmp_path):
    a, b = tmp_path / "a.safetensors", tmp_path / "b.safetensors"
    stnp.save_file(
        {
            "same": np.arange(4, dtype=np.int32),
            "gone": np.zeros(2, np.float32),
            "reshaped": np.zeros((2, 3), np.float32),
            "retyped": np.zeros(3, np.float32),
            "values": np.array([1.0, 2.0, 3.0, 4.0], np.float32),
            "ints": np.array([1, 2, 3], np.int64),
        },
        str(a),
        metadata={"format": "pt", "only_a": "1", "changed": "old"},
    )
    stnp.save_file(
        {
            "same": np.arange(4, dtype=np.int32),
            "new": np.zeros(1, np.uint8),
            "reshaped": np.zeros((3, 2), np.float32),
            "retyped": np.zeros(3, np.float16),
            "values": np.array([1.0, 2.5, 3.0, 3.0], np.float32),
            "ints": np.array([1, 2, 4], np.int64),
        },
        str(b),
        metadata={"format": "pt", "only_b": "2", "changed": "new"},
    )
    r = cli("diff", a, b)
    assert r.rc == 1 and r.err == ""
    assert r.out.splitlines() == [
        f"A: {a}",
        f"B: {b}",
        "only in A: gone  F32 [2]",
        "values differ: ints  I64 [3]: 1 of 3 elements differ",
        "only in B: new  U8 [1]",
        "dtype/shape differ: reshaped  F32 [2, 3] -> F32 [3, 2]",
        "dtype/shape differ: retyped  F32 [3] -> F16 [3]",
        "values differ: values  F32 [4]: 2 of 4 elements differ, max abs diff 1",
        "metadata differs: changed: 'old' -> 'new'",
        "metadata only in A: only_a = '1'",
        "metadata only in B: only_b = '2'",
        "9 differences (3 tensors compared)",
    ]


def test_diff_float_details(cli, tmp_path):
    a, b = tmp_path / "a.safetensors", tmp_path / "b.safetensors"
    nan = float("nan")
    stt.save_file(
        {
            "bf16": torch.tensor([1.0, 2.0, 3.0], dtype=torch.bfloat16),
            "signed_zero": torch.tensor([0.0, 1.0]),
            "nan": torch.tensor([nan, 1.0, 2.0]),
            "inf": torch.tensor([float("inf"), 1.0]),
        },
        str(a),
    )
    stt.save_file(
        {
            "bf16": torch.tensor([1.0, 2.0, 3.25], dtype=torch.bfloat16),
            "signed_zero": torch.tensor([-0.0, 1.0]),
            "nan": torch.tensor([nan, nan, 2.5]),
            "inf": torch.tensor([float("inf"), 1.0]),
        },
        str(b),
    )
    r = cli("diff", a, b)
    assert r.rc == 1
    assert r.out.splitlines()[2:] == [
        "values differ: bf16  BF16 [3]: 1 of 3 elements differ, max abs diff 0.25",
        "values differ: nan  F32 [3]: 2 of 3 elements differ, max abs diff 0.5, 1 NaN on one side only",
        "values differ: signed_zero  F32 [2]: 1 of 2 elements differ, max abs diff 0",
        "3 differences (4 tensors compared)",
    ]


def test_diff_compares_large_tensors_in_pieces(cli, tmp_path, monkeypatch):
    monkeypatch.setattr(_cli.common, "CHUNK_BYTES", 100)
    x = np.zeros((50, 10), np.float64)
    y = x.copy()
    y[0, 0], y[25, 5], y[49, 9] = 0.5, -2.0, 1e-3
    stnp.save_file({"x": x}, str(tmp_path / "a.safetensors"))
    stnp.save_file({"x": y}, str(tmp_path / "b.safetensors"))
    r = cli("diff", tmp_path / "a.safetensors", tmp_path / "b.safetensors")
    assert r.out.splitlines()[2] == "values differ: x  F64 [50, 10]: 3 of 500 elements differ, max abs diff 2"


def test_diff_sharded_against_single_file(cli, tmp_path, sharded):
    single = tmp_path / "single.safetensors"
    tensors = {}
    for name in sorted(os.listdir(sharded)):
        if name.endswith(".safetensors"):
            tensors.update(stnp.load_file(str(sharded / name)))
    del tensors["stale"]  # the index does not assign it, so it is not part of the checkpoint
    stnp.save_file(tensors, str(single), metadata={"format": "pt"})
    assert cli("diff", single, sharded).rc == 0
    assert cli("diff", sharded / "model.safetensors.index.json", single).rc == 0
    stnp.save_file(tensors, str(single), metadata={"format": "np"})
    r = cli("diff", sharded, single)
    assert r.rc == 1 and r.out.splitlines()[2:] == [
        "metadata differs: format: 'pt' -> 'np'",
        "1 difference (3 tensors compared)",
    ]


def test_diff_input_errors(cli, tmp_path):
    a = small_file(tmp_path / "a.safetensors")
    assert_input_error(cli("diff", a, tmp_path / "missing.safetensors"), "missing.safetensors: no such file")
    assert_input_error(cli("diff", tmp_path / "missing.safetensors", a), "missing.safetensors: no such file")
    both = tmp_path / "dir"
    both.mkdir()
    small_file(both / "one.safetensors")
    small_file(both / "two.safetensors")
    assert_input_error(cli("diff", a, both), "tensor `b` is also in", "one.safetensors", "two.safetensors")


# -- helpers of _sharding ----------------------------------------------------------------------------------

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


def test_resolve(tmp_path, sharded):
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
