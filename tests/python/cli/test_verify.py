"""`safetensors verify`: whole-file checks, indexes, `--scan` for NaN and Inf, reads in bounded pieces."""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path
from typing import List

import numpy as np
import pytest
import torch

import safetensors.numpy as stnp
import safetensors.torch as stt
from safetensors import _cli
from safetensors._cli import main
from cli.helpers import Result, assert_input_error, small_file, write_index


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
