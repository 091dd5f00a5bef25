"""``safetensors convert``: a PyTorch checkpoint to one safetensors file, or with ``--max-shard-size`` to shards
and an index planned, written and published by the C++ library (``save_sharded``)."""

from __future__ import annotations

import argparse
import os
import re
import zipfile
from typing import IO, Any, Dict, List, Sequence, Tuple

from .. import _safetensors_cpp as _cpp
from .._safetensors_cpp import SafetensorError
from .._checkpoint_paths import INDEX_SUFFIX, SAFETENSORS_SUFFIX, checkpoint_files, format_size, parse_size
from .common import EXIT_OK, CliError, describe_error, count_of, Progress, WriteWatcher

def _output_layout(output: str) -> Tuple[str, str]:
    """(directory, stem) of the files ``convert`` writes: ``OUT/model.safetensors`` -> (``OUT``, ``model``);
    an existing directory, or a path ending in a separator, gets ``model.safetensors`` inside it."""
    if os.path.isdir(output) or output.endswith(("/", os.sep)):
        return output, "model"
    directory, base = os.path.split(output)
    if not base.endswith(SAFETENSORS_SUFFIX) or base == SAFETENSORS_SUFFIX:
        raise CliError(f"{output}: the output must be a .safetensors file name or a directory")
    return directory, base[: -len(SAFETENSORS_SUFFIX)]


def _parse_metadata(items: Sequence[str]) -> Dict[str, str]:
    out: Dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise CliError(f"--metadata {item!r}: expected KEY=VALUE")
        if key in out:
            raise CliError(f"--metadata: key {key!r} given twice")
        out[key] = value
    return out


def _torch_load_reason(error: BaseException) -> str:
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(error))
    marker = "WeightsUnpickler error:"
    if marker in text:
        text = text.split(marker, 1)[1]
        text = re.split(r"\.\s|\n\n", text.strip(), maxsplit=1)[0]
    return " ".join(text.split()) or type(error).__name__


def _load_state_dict(path: str) -> Tuple[Dict[str, Any], str]:
    """The state dict in a PyTorch checkpoint, and where it was found (``""``, ``"state_dict"``, ``"model"``).
    Memory-maps zip-format checkpoints, so tensors are read from disk as they are written out."""
    import torch

    try:
        loaded = torch.load(path, map_location="cpu", weights_only=True, mmap=zipfile.is_zipfile(path))
    except Exception as e:  # torch raises many types here: pickle, zip, runtime and OS errors
        raise CliError(f"{path}: cannot load with torch.load(weights_only=True): {_torch_load_reason(e)}") from None
    if not isinstance(loaded, dict):
        raise CliError(f"{path}: holds a {type(loaded).__name__}, not a state dict (a dict of tensors)")
    where = ""
    for key in ("state_dict", "model"):
        if isinstance(loaded.get(key), dict):
            loaded, where = loaded[key], key
            break
    bad = [k for k, v in loaded.items() if not isinstance(k, str) or not isinstance(v, torch.Tensor)]
    if bad:
        found = f' (in its "{where}" entry)' if where else ""
        details = ", ".join(f"{k!r} ({type(loaded[k]).__name__})" for k in bad[:5])
        more = f" and {len(bad) - 5} more" if len(bad) > 5 else ""
        raise CliError(
            f"{path}: the state dict{found} has entries that are not named tensors: {details}{more}; "
            'expected a state dict, or a dict with a "state_dict" or "model" entry holding one'
        )
    return dict(loaded), where


def _same_view(a: Any, b: Any) -> bool:
    return a.data_ptr() == b.data_ptr() and a.dtype == b.dtype and a.shape == b.shape and a.stride() == b.stride()


def _untie(state_dict: Dict[str, Any]) -> Tuple[Dict[str, Any], Dict[str, str], List[str]]:
    """Drops aliases of shared tensors the way ``save_model`` does. Returns the tensors to write, the
    ``{dropped: kept}`` records, and the names of tensors copied to stand alone.

    Only exact aliases (the same elements as the kept tensor) are dropped: a loader restores them from the
    record. Other tensors overlapping a kept one (a slice of it, say), or a group none of whose members
    covers its whole storage, are written as independent copies, so no data is lost."""
    from ..torch import _find_shared_tensors, _remove_duplicate_names

    kept: Dict[str, Any] = dict(state_dict)
    ties: Dict[str, str] = {}
    copied: List[str] = []
    for group in _find_shared_tensors(state_dict):
        if len(group) < 2:
            continue
        members = {name: state_dict[name] for name in sorted(group)}
        try:
            removals = _remove_duplicate_names(members)
        except RuntimeError:  # no member covers the whole storage
            removals = {}
        anchor = next(iter(removals), None)
        for keep, dropped in removals.items():
            for name in dropped:
                if _same_view(members[name], members[keep]):
                    ties[name] = keep
                    del kept[name]
        remaining = [name for name in members if name not in ties]
        if anchor is None:
            anchor = remaining[0]
        for name in remaining:
            if name != anchor:
                kept[name] = members[name].clone()
                copied.append(name)
    return kept, ties, copied


def cmd_convert(args: argparse.Namespace, stdout: IO[str], stderr: IO[str]) -> int:
    if not os.path.exists(args.input):
        raise CliError(f"{args.input}: no such file")
    if os.path.isdir(args.input):
        raise CliError(f"{args.input}: is a directory; convert takes one PyTorch checkpoint file")
    directory, stem = _output_layout(args.output)
    max_shard = None
    if args.max_shard_size is not None:
        try:
            max_shard = parse_size(args.max_shard_size)
        except ValueError as e:
            raise CliError(f"--max-shard-size: {e}") from None
    user_metadata = _parse_metadata(args.metadata or [])
    existing = checkpoint_files(directory, stem)
    if existing and not args.force:
        raise CliError(f"{existing[0]}: already exists; pass --force to overwrite")
    try:
        import torch
    except ImportError:
        raise CliError("convert needs PyTorch: pip install torch") from None
    from .._torch_types import CODES
    from ..torch import _flatten_as_ptr, save_file

    state_dict, where = _load_state_dict(args.input)
    for name, tensor in state_dict.items():
        if tensor.layout != torch.strided:
            raise CliError(f"{args.input}: tensor {name!r} is sparse ({tensor.layout}); safetensors stores dense tensors")
        if tensor.dtype not in CODES:
            raise CliError(f"{args.input}: tensor {name!r} has dtype {tensor.dtype}, which safetensors cannot store")
    tensors, ties, copied = _untie(state_dict)
    tensors = {name: tensor.contiguous() for name, tensor in tensors.items()}

    # transformers 4.x refuses a file whose metadata lacks "format"; tie records follow save_model
    # (an explicit --metadata value wins over a record of the same key).
    metadata = {"format": "pt", **user_metadata}
    for dropped, keep in ties.items():
        metadata.setdefault(dropped, keep)

    keep_alive: List[Any] = []  # CPU copies the specs' addresses point into
    specs = [(name, spec.dtype, spec.shape, spec.data_ptr, spec.data_len)
             for name, spec in _flatten_as_ptr(tensors, keep_alive).items()]
    total = sum(spec[4] for spec in specs)
    # The C++ plan (huggingface_hub's split and names). No tensors, or one shard, is written as one file, as
    # save_pretrained does when its split is not sharded.
    plan = _cpp.sharded.plan_shards([(spec[0], spec[4]) for spec in specs], max_shard) if max_shard is not None else None
    sharded = plan is not None and len(plan.shards) > 1
    if sharded:
        targets = [os.path.join(directory, file_name) for file_name, _, _ in plan.shards]
        groups = [[specs[i][0] for i in inputs] for _, inputs, _ in plan.shards]
        index_path = os.path.join(directory, plan.index_file_name)
    else:
        targets = [os.path.join(directory, stem + SAFETENSORS_SUFFIX)]
        groups = [[spec[0] for spec in specs]]
        index_path = None

    if directory:
        os.makedirs(directory, exist_ok=True)
    progress = Progress("converting", total, stderr, enabled=not args.quiet and stderr.isatty())
    try:
        with WriteWatcher(progress, 0, total):
            if sharded:
                # Every shard atomically, then the index (atomic, an existing index's mode bits kept).
                _cpp.sharded.save_sharded(directory or ".", specs, max_shard, stem, list(metadata.items()))
            else:
                save_file(tensors, targets[0], metadata=metadata)
    except (SafetensorError, OSError) as e:
        raise CliError(describe_error(e)) from None
    finally:
        progress.close()

    written = set(targets) | ({index_path} if index_path else set())
    stale = [p for p in existing if p not in written]
    # The old index goes first, so no reader meets an index naming shards that are being removed.
    for path in sorted(stale, key=lambda p: not p.endswith(INDEX_SUFFIX)):
        os.unlink(path)

    if not args.quiet:
        source = f' ("{where}" entry)' if where else ""
        stdout.write(f"converted {args.input}{source}: {count_of(len(tensors), 'tensor')}, {format_size(total)}\n")
        for target, names in zip(targets, groups):
            stdout.write(f"  wrote {target}: {count_of(len(names), 'tensor')}\n")
        if index_path is not None:
            stdout.write(f"  wrote {index_path}\n")
        for dropped, keep in sorted(ties.items()):
            stdout.write(f"  shared tensor {dropped} is stored once, as {keep} (recorded in the metadata)\n")
        if copied:
            stdout.write(f"  overlapping tensors written as separate copies: {', '.join(sorted(copied))}\n")
        for path in stale:
            stdout.write(f"  removed stale {path}\n")
    return EXIT_OK
