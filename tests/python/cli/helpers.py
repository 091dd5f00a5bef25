"""What the command-line tests share: the result of one run, the input-error check and small checkpoints."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Dict, List, NamedTuple

import numpy as np

import safetensors.numpy as stnp


def shard_file_names(stem: str, count: int) -> List[str]:
    """The names transformers gives shards (the C++ plan makes them)."""
    return [f"{stem}-{i:05d}-of-{count:05d}.safetensors" for i in range(1, count + 1)]


class Result(NamedTuple):
    rc: int
    out: str
    err: str


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
