"""The command-line tests' fixtures: ``cli`` runs ``main(argv)`` in-process and captures its output; ``sharded``
is a hand-written transformers-style checkpoint."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import safetensors.numpy as stnp
from safetensors._cli import main

from cli.helpers import Result, write_index


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str]):
    def run(*argv: object) -> Result:
        capsys.readouterr()
        rc = main([str(a) for a in argv])
        captured = capsys.readouterr()
        return Result(rc, captured.out, captured.err)

    return run


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
