"""`safetensors inspect`: text and JSON listings of files, directories and indexes, and its input errors."""

from __future__ import annotations

import json

import numpy as np
import pytest

import safetensors.numpy as stnp
from cli.helpers import assert_input_error, small_file, write_index


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
