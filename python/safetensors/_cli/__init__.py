"""The ``safetensors`` command-line tool: inspect, verify, convert, diff and consolidate checkpoints.

One module per command (inspect, verify, convert, diff, consolidate) over ``common``; also runs as ``python -m
safetensors._cli``. Exit codes: 0 success; 1 a verification failure, NaN/Inf found
by ``verify --scan``, or ``diff`` found differences; 2 a usage or input error (a missing file, a file that is
not a safetensors file, an existing output), reported as one line naming the file.

``inspect`` and ``verify`` need nothing beyond this package; ``verify --scan`` and ``diff`` need numpy
(ml_dtypes for bfloat16/float8 values); ``convert`` needs torch.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import IO, Any, Callable, Optional, Sequence

from .. import _safetensors_cpp as _cpp  # noqa: F401 - tests patch the binding through here
from .common import EXIT_USAGE, PROG, CliError
from .consolidate import cmd_consolidate
from .convert import cmd_convert
from .diff import cmd_diff
from .inspect import cmd_inspect
from .verify import cmd_verify

__all__ = ["build_parser", "main"]

_EPILOG = """\
exit status: 0 success; 1 verification failure, NaN/Inf found, or differences found;
2 usage or input error (missing file, not a safetensors file, existing output).
A checkpoint is a .safetensors file, a directory (its *.safetensors.index.json when it has
one, else every *.safetensors file in it), or an index file such as model.safetensors.index.json."""


def _command(commands: Any, name: str, run: Callable[[argparse.Namespace, IO[str], IO[str]], int], summary: str,
             description: str) -> argparse.ArgumentParser:
    """Adds the subcommand ``name``, which :func:`main` runs as ``run(args, stdout, stderr)``."""
    p = commands.add_parser(name, help=summary, description=description)
    p.set_defaults(run=run)
    return p


def _checkpoint(p: argparse.ArgumentParser, name: str = "path", metavar: str = "FILE|DIR|INDEX") -> None:
    """Adds a positional argument naming a checkpoint (what one may be: see the epilog)."""
    p.add_argument(name, metavar=metavar, help="a .safetensors file, a directory or an index file")


def _flag(p: argparse.ArgumentParser, *names: str, help: str) -> None:
    p.add_argument(*names, action="store_true", help=help)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Inspect, verify, convert and compare safetensors checkpoints.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    from .. import __version__

    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    commands.required = True

    p = _command(commands, "inspect", cmd_inspect, "list tensors, parameter counts and metadata",
                 "Show each tensor (name, dtype, shape, size, data offsets), parameter counts by dtype, the total "
                 "size of tensor data, and the metadata. For an index, each shard shows only the tensors the index "
                 "assigns to it.")
    _checkpoint(p)
    _flag(p, "--json", help="print a JSON document instead of tables")

    p = _command(commands, "verify", cmd_verify, "validate headers and read every tensor",
                 "Validate every file (the header, then every tensor's bytes, read from disk) and, for an index, that "
                 "each shard it names exists and holds the tensors assigned to it. Exit status 1 on any failure.")
    _checkpoint(p)
    _flag(p, "--scan", help="also count NaN and Inf values in float tensors (exit 1 if any)")
    _flag(p, "-q", "--quiet", help="print only failures, findings and the summary")

    p = _command(commands, "convert", cmd_convert, "convert a PyTorch checkpoint (.bin/.pt/.pth) to safetensors",
                 "Convert a PyTorch checkpoint (a state dict, or a dict with a 'state_dict' or 'model' entry holding "
                 "one) loaded with torch.load(weights_only=True). Shared (tied) tensors are stored once and recorded "
                 "in the metadata as save_model does; the metadata also gets format=pt, which transformers 4.x "
                 "requires. With --max-shard-size, a checkpoint above the limit is written as "
                 "STEM-0000i-of-0000N.safetensors shards plus STEM.safetensors.index.json.")
    p.add_argument("input", metavar="INPUT", help="the PyTorch checkpoint file")
    p.add_argument(
        "output",
        metavar="OUTPUT",
        help="the .safetensors file to write (its name without .safetensors is the shard stem), or a directory "
        "(model.safetensors in it)",
    )
    p.add_argument(
        "--max-shard-size",
        metavar="SIZE",
        help="largest amount of tensor data per file, e.g. 5GB, 500MB, 2GiB (KB/MB/GB are powers of 1000, "
        "KiB/MiB/GiB powers of 1024); default: one file",
    )
    p.add_argument(
        "--metadata", metavar="KEY=VALUE", action="append", help="a metadata entry to store (repeatable)"
    )
    _flag(p, "-f", "--force", help="overwrite existing output, removing stale shards of the same stem")
    _flag(p, "-q", "--quiet", help="no progress bar and no summary")

    p = _command(commands, "diff", cmd_diff, "compare two checkpoints",
                 "Compare two checkpoints: tensors only in one, different dtype or shape, different values (bytes; "
                 "for floats also the largest absolute difference), and metadata (merged over each checkpoint's "
                 "files). Exit status 0 when identical, 1 when different.")
    _checkpoint(p, "a", "A")
    _checkpoint(p, "b", "B")

    p = _command(commands, "consolidate", cmd_consolidate, "write the full files of a torch DCP sharded checkpoint",
                 "Write the full safetensors files of a directory of DCP shard files (torch's "
                 "HuggingFaceStorageWriter with save_distributed=True): model-00001-of-0000N.safetensors (one file "
                 "unless --mapping says otherwise), each as save_file writes the full tensors with format=pt, and "
                 "model.safetensors.index.json. Streams: memory is one read buffer, whatever the tensors' sizes.")
    p.add_argument("sharded_dir", metavar="SHARDED_DIR", help="the directory of shard files")
    p.add_argument("out_dir", metavar="OUT_DIR", help="where the full files go (created if missing)")
    p.add_argument("--mapping", metavar="JSON", help="a JSON file {tensor name: output file index 1..N}")
    p.add_argument("--buffer-mib", type=int, default=64, metavar="MIB", help="read buffer size (default 64)")
    _flag(p, "-q", "--quiet", help="do not list the files written")
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Runs the tool on ``argv`` (default: the process arguments) and returns the exit status."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # --help, --version and usage errors
        return e.code if isinstance(e.code, int) else EXIT_USAGE
    stdout, stderr = sys.stdout, sys.stderr
    try:
        return args.run(args, stdout, stderr)
    except CliError as e:
        stderr.write(f"{PROG} {args.command}: error: {e}\n")
        return EXIT_USAGE
    except KeyboardInterrupt:
        stderr.write(f"{PROG} {args.command}: interrupted\n")
        return 130
    except BrokenPipeError:
        # The reader went away (`safetensors inspect ... | head`): stop quietly, as a killed pipe writer would.
        try:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit
        except (OSError, ValueError):
            pass
        return 141

