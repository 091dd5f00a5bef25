"""``safetensors inspect``: each tensor (name, dtype, shape, size, offsets), parameter counts by dtype, the total
size of tensor data, and the metadata; for an index, only the tensors it assigns to each shard."""

from __future__ import annotations

import argparse
import json
from typing import IO, Any, Dict, List, Optional, Sequence, Set

from .._checkpoint_paths import Checkpoint, format_size
from .common import EXIT_OK, count_of, numel, one_line, open_shard, OpenShard, resolve_checkpoint, shape_text

def _inspect_document(checkpoint: Checkpoint, opened: List[OpenShard]) -> Dict[str, Any]:
    parameters: Dict[str, int] = {}
    total_bytes = 0
    files = []
    for item in opened:
        tensors = []
        for name, (code, shape, begin, end, _) in item.tensors:
            count = numel(shape)
            parameters[code] = parameters.get(code, 0) + count
            total_bytes += end - begin
            tensors.append(
                {
                    "name": name,
                    "dtype": code,
                    "shape": list(shape),
                    "parameters": count,
                    "nbytes": end - begin,
                    "data_offsets": [begin, end],
                }
            )
        files.append(
            {
                "path": item.shard.path,
                "file_size": item.file.size,
                "header_size": item.file.header_length,
                "metadata": item.file.metadata(),
                "tensors": tensors,
            }
        )
    ordered = dict(sorted(parameters.items(), key=lambda kv: (-kv[1], kv[0])))
    index = None
    if checkpoint.index_path is not None:
        index = {"path": checkpoint.index_path, "metadata": checkpoint.index_metadata}
    return {
        "path": checkpoint.path,
        "kind": checkpoint.kind,
        "index": index,
        "files": files,
        "parameters": ordered,
        "total_parameters": sum(parameters.values()),
        "total_bytes": total_bytes,
    }


def _table(rows: List[Sequence[str]], right: Set[int], indent: str = "  ") -> List[str]:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = []
    for row in rows:
        cells = [cell.rjust(w) if i in right else cell.ljust(w) for i, (cell, w) in enumerate(zip(row, widths))]
        lines.append((indent + "  ".join(cells)).rstrip())
    return lines


def _metadata_lines(metadata: Optional[Dict[str, Any]], indent: str) -> List[str]:
    if metadata is None:
        return [f"{indent}(none)"]
    if not metadata:
        return [f"{indent}(empty)"]
    return [f"{indent}{one_line(str(k))}: {one_line(str(v))}" for k, v in metadata.items()]


def _inspect_text(doc: Dict[str, Any]) -> str:
    out: List[str] = []
    files = doc["files"]
    if doc["index"] is not None:
        count = sum(len(f["tensors"]) for f in files)
        out.append(f"index {doc['index']['path']}: {count_of(count, 'tensor')} in {count_of(len(files), 'file')}")
        out.append("  metadata:")
        out.extend(_metadata_lines(doc["index"]["metadata"], "    "))
    same_metadata = len(files) > 1 and all(f["metadata"] == files[0]["metadata"] for f in files)
    for f in files:
        tensors = f["tensors"]
        data = sum(t["nbytes"] for t in tensors)
        if out:
            out.append("")
        out.append(
            f"{f['path']}: {count_of(len(tensors), 'tensor')}, {format_size(data)} of data, "
            f"{f['file_size']:,} bytes (header {f['header_size']:,} bytes)"
        )
        if tensors:
            rows: List[Sequence[str]] = [("name", "dtype", "shape", "size", "offsets")]
            for t in tensors:
                begin, end = t["data_offsets"]
                rows.append((t["name"], t["dtype"], shape_text(t["shape"]), format_size(t["nbytes"]), f"[{begin}, {end})"))
            out.extend(_table(rows, right={3}))
        if not same_metadata:
            out.append("  metadata:")
            out.extend(_metadata_lines(f["metadata"], "    "))
    if same_metadata:
        out.append("")
        out.append(f"metadata (the same in all {len(files)} files):")
        out.extend(_metadata_lines(files[0]["metadata"], "  "))
    out.append("")
    out.append("parameters by dtype:")
    rows = [(code, f"{count:,}") for code, count in doc["parameters"].items()]
    rows.append(("total", f"{doc['total_parameters']:,}"))
    out.extend(_table(rows, right={1}))
    total = doc["total_bytes"]
    out.append(f"total bytes: {total:,} ({format_size(total)}) of tensor data in {count_of(len(files), 'file')}")
    return "\n".join(out) + "\n"


def cmd_inspect(args: argparse.Namespace, stdout: IO[str], stderr: IO[str]) -> int:
    checkpoint = resolve_checkpoint(args.path)
    opened = [open_shard(checkpoint, shard) for shard in checkpoint.shards]
    doc = _inspect_document(checkpoint, opened)
    if args.json:
        stdout.write(json.dumps(doc, indent=2, ensure_ascii=False) + "\n")
    else:
        stdout.write(_inspect_text(doc))
    return EXIT_OK
