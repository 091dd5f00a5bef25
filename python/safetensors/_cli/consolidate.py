"""``safetensors consolidate SHARDED_DIR OUT_DIR``: the full files from DCP shard files (see
``safetensors.dcp.consolidate``)."""

from __future__ import annotations

import argparse
import json
import os
from typing import IO

from .common import EXIT_OK, CliError

__all__ = ["cmd_consolidate"]


def cmd_consolidate(args: argparse.Namespace, stdout: IO[str], stderr: IO[str]) -> int:
    if not os.path.isdir(args.sharded_dir):
        raise CliError(f"{args.sharded_dir}: no such directory")
    mapping = None
    if args.mapping is not None:
        try:
            with open(args.mapping) as f:
                mapping = json.load(f)
        except (OSError, ValueError) as e:
            raise CliError(f"{args.mapping}: {e}") from None
    try:
        from ..dcp import consolidate
    except ImportError as e:
        raise CliError(f"consolidate needs PyTorch with torch.distributed: {e}") from None
    from .._core import SafetensorError

    try:
        written = consolidate(args.sharded_dir, args.out_dir, mapping, buffer_bytes=args.buffer_mib << 20)
    except SafetensorError as e:
        raise CliError(str(e)) from None
    if not args.quiet:
        for name in written:
            stdout.write(f"{os.path.join(args.out_dir, name)}\n")
    return EXIT_OK
