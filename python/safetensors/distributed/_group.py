"""The process group a distributed load runs on (torch.distributed): ranks, the backend that moves each device
type's tensors, the one collective of plans and statuses, and how a failed collective is reported."""

from __future__ import annotations

import pickle
import time
from typing import Any, Iterable, List, Optional

import torch
import torch.distributed as dist

from .._core import SafetensorError

__all__ = ["CPU_BACKENDS", "Group", "collective_failed", "error_text", "failures_text", "held", "released"]

# Backends that move CPU tensors; every other backend is taken to serve its accelerator's device type.
CPU_BACKENDS = ("gloo", "mpi", "ucc")

#: The longest released() waits, in seconds; past it the call goes on (it never hangs on a backend's thread).
RELEASE_WAIT = 5.0


_use_count = getattr(torch.Tensor, "_use_count", None)  # a torch without it: nothing is seen as held


def held(tensor: torch.Tensor) -> bool:
    """Whether something besides its Python object holds ``tensor`` (a collective's work, a backend's thread)."""
    return _use_count is not None and _use_count(tensor) > 1


def released(tensors: Iterable[torch.Tensor], timeout: float = RELEASE_WAIT) -> bool:
    """Waits until no thread of the process group's backend holds any of ``tensors`` (see :func:`held`); False
    when ``timeout`` passed first.

    gloo runs a collective on its own worker thread, which drops its references to the collective's tensors
    after ``wait()`` has returned on this thread, and that drop takes the GIL. A process that ends in between
    aborts in interpreter shutdown ("terminate called without an active exception": the worker thread meets a
    finalizing interpreter). So a distributed call returns only after its CPU tensors are let go of (an
    accelerator backend's tensors are its watchdog's to drop, on its own schedule: not waited for)."""
    pending = [t for t in tensors if held(t)]
    deadline = time.monotonic() + timeout
    while pending:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.0002)  # lets go of the GIL, which the worker thread needs to drop its references
        pending = [t for t in pending if held(t)]
    return True


class Group:
    """One rank's view of the process group: its rank, the world size, the backend name, the global ranks."""

    def __init__(self, group: Optional[dist.ProcessGroup]) -> None:
        if not dist.is_available() or not dist.is_initialized():
            raise SafetensorError(
                "safetensors.distributed needs an initialized process group: call "
                "torch.distributed.init_process_group(...) on every rank first"
            )
        self.group = group if group is not None else dist.group.WORLD
        self.rank = dist.get_rank(self.group)
        if self.rank < 0:
            raise SafetensorError("safetensors.distributed: this process is not a member of the given process group")
        self.world = dist.get_world_size(self.group)
        self.backend = str(dist.get_backend(self.group)).lower()
        self._global = [dist.get_global_rank(self.group, r) if self.group is not dist.group.WORLD else r
                        for r in range(self.world)]

    def global_rank(self, rank: int) -> int:
        return self._global[rank]

    def backend_for(self, device_type: str) -> Optional[str]:
        """The backend that moves tensors of ``device_type`` ("cpu:gloo,cuda:nccl" names one per type)."""
        if ":" in self.backend:
            pairs = dict(item.split(":", 1) for item in self.backend.split(",") if ":" in item)
            return pairs.get(device_type)
        if self.backend in CPU_BACKENDS:
            return self.backend if device_type == "cpu" else None
        return self.backend if device_type != "cpu" else None

    def comm_device(self, target: torch.device) -> torch.device:
        """Where the bytes travel: the destination device when the group has a backend for it that is not a
        CPU backend (NCCL, HCCL, ...), else CPU tensors (gloo), copied to the destination at the end."""
        if target.type == "meta":
            return target
        backend = self.backend_for(target.type)
        if target.type != "cpu" and backend is not None and backend not in CPU_BACKENDS:
            return target
        if self.backend_for("cpu") is None:
            raise SafetensorError(
                f"process group backend {self.backend} cannot move tensors for device {target}: load to a device "
                "it serves, or use a group with a CPU backend (gloo)"
            )
        return torch.device("cpu")

    def gather(self, obj: Any, what: str, *, action: str = "load") -> List[Any]:
        """Every rank's ``obj`` (picklable), by rank. On a group with a CPU backend the pickles travel as CPU
        tensors this call lets go of before it returns (see :func:`released`); otherwise as
        ``all_gather_object`` sends them."""
        try:
            if self.backend_for("cpu") is None:
                out: List[Any] = [None] * self.world
                dist.all_gather_object(out, obj, group=self.group)
                return out
            payload = bytearray(pickle.dumps(obj))
            size = torch.tensor([len(payload)], dtype=torch.int64)
            sizes = [torch.zeros(1, dtype=torch.int64) for _ in range(self.world)]
            dist.all_gather(sizes, size, group=self.group)
            lengths = [int(s.item()) for s in sizes]
            longest = max(lengths)
            mine = torch.zeros(longest, dtype=torch.uint8)
            mine[: len(payload)] = torch.frombuffer(payload, dtype=torch.uint8)
            received = [torch.empty(longest, dtype=torch.uint8) for _ in range(self.world)]
            dist.all_gather(received, mine, group=self.group)
        except RuntimeError as e:
            raise collective_failed(self, what, e, action=action) from e
        released([size, mine, *sizes, *received])
        return [pickle.loads(t[:n].numpy().tobytes()) for t, n in zip(received, lengths)]


def collective_failed(grp: Group, what: str, e: BaseException, *, action: str = "load") -> SafetensorError:
    """``action`` ("load", "save") names the distributed operation in the text."""
    return SafetensorError(
        f"distributed {action}: a collective failed on rank {grp.rank} of {grp.world} while {what} (another rank "
        f"died, failed outside the {action}, or timed out; the process group cannot be used any more): "
        f"{str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__}"
    )


def failures_text(statuses: List[Optional[str]], world: int, what: str, *, action: str = "load") -> Optional[str]:
    failed = [(r, text) for r, text in enumerate(statuses) if text is not None]
    if not failed:
        return None
    if len(failed) == 1:
        r, text = failed[0]
        return f"distributed {action} failed on rank {r} of {world} ({what}): {text}"
    listed = "; ".join(f"rank {r}: {text}" for r, text in failed)
    return f"distributed {action} failed on {len(failed)} of {world} ranks ({what}): {listed}"


def error_text(e: BaseException) -> str:
    """How a rank reports its failure to the others: a SafetensorError's text, or the exception's type and text."""
    return str(e) if isinstance(e, SafetensorError) else f"{type(e).__name__}: {e}"
