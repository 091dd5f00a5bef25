"""`safetensors diff`: every kind of difference between two checkpoints, sharded against single files."""

from __future__ import annotations

import os

import numpy as np
import torch

import safetensors.numpy as stnp
import safetensors.torch as stt
from safetensors import _cli
from cli.helpers import Result, assert_input_error, small_file


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
