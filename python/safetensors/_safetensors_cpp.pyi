"""Native core of the safetensors package (C++ library binding)."""

from collections.abc import Sequence

from safetensors import (
    SafetensorError as SafetensorError,
    SafetensorIOError as SafetensorIOError,
    SafetensorSliceError as SafetensorSliceError
)


class Buffer:
    """
    Buffer-protocol view of file or memory bytes; keeps them alive while referenced.
    """

    @property
    def nbytes(self) -> int: ...

    @property
    def writable(self) -> bool: ...

class SlicePlan:
    """A planned index expression over one tensor."""

    @property
    def shape(self) -> tuple[int, ...]: ...

    @property
    def nbytes(self) -> int: ...

    @property
    def is_whole(self) -> bool: ...

class File:
    """An open, validated safetensors file (or in-memory bytes)."""

    def __init__(self, path: str, backend: str = 'mmap', max_header_bytes: int = 100000000) -> None: ...

    @staticmethod
    def from_buffer(data: bytes | bytearray | memoryview, max_header_bytes: int = 100000000) -> File:
        """
        Validates a bytes-like object in place; the object is kept alive by the File and its views.
        """

    @property
    def path(self) -> str: ...

    @property
    def backend(self) -> str: ...

    @property
    def data_offset(self) -> int: ...

    @property
    def header_length(self) -> int: ...

    @property
    def size(self) -> int: ...

    def __len__(self) -> int: ...

    def __contains__(self, arg: str, /) -> bool: ...

    def keys(self) -> list[str]:
        """Tensor names sorted."""

    def offset_keys(self) -> list[str]:
        """Tensor names in file (offset) order."""

    def metadata(self) -> dict[str, str] | None:
        """`__metadata__` as a dict, or None."""

    def info(self, name: str) -> tuple[str, tuple[int, ...], int, int]:
        """
        (dtype code, shape, begin, end) of one tensor; begin/end are relative to the data buffer.
        """

    def shape(self, name: str) -> list[int]:
        """A tensor's shape, as a new list."""

    def dtype(self, name: str) -> str:
        """A tensor's dtype code, e.g. "F32"."""

    def infos(self) -> list[tuple[str, tuple[str, tuple[int, ...], int, int]]]:
        """[(name, (dtype code, shape, begin, end))] in file order."""

    def buffer(self) -> Buffer | None:
        """
        The data buffer (everything after the header) as a Buffer, or None on the pread backend.
        """

    def dlpack(self, name: str) -> object | None:
        """
        A DLPack capsule viewing a tensor in the writable mapping (zero-copy, keeps it alive), or None (pread backend, read-only mapping, or a dtype DLPack cannot describe).
        """

    def dlpack_all(self) -> list[tuple[str, object | None]]:
        """
        [(name, DLPack capsule or None)] for every tensor, in file order (see dlpack).
        """

    def read_owned_all(self, threads: int = 0) -> list[tuple[str, object | None]]:
        """
        [(name, DLPack capsule or None)] for every tensor in file order: each read into new memory the capsule owns (None for dtypes DLPack cannot describe). Reads in parallel with the GIL released.
        """

    def read_owned(self, name: str) -> object | None:
        """
        A tensor read into new memory of its own, as a DLPack capsule that frees it, or None (a dtype DLPack cannot describe). Releases the GIL while reading.
        """

    def read_bytes(self, name: str) -> bytearray:
        """
        A tensor's bytes, read into a new bytearray. Releases the GIL while reading.
        """

    def read_into(self, name: str, ptr: int, nbytes: int, fresh: bool = False) -> None:
        """
        Reads a tensor's bytes to the address ptr (nbytes must equal its size). fresh=True: the destination is a new allocation the caller owns, filled faster with huge pages. Releases the GIL.
        """

    def read_many(self, items: Sequence[tuple[str, int, int]], threads: int = 0, fresh: bool = False) -> None:
        """
        Reads [(name, ptr, nbytes)] with a pool of threads (fresh: as in read_into). Releases the GIL.
        """

    def read_range(self, offset: int, ptr: int, nbytes: int, threads: int = 0) -> None:
        """
        Reads data-buffer bytes [offset, offset + nbytes) to the address ptr, with a pool of threads. Releases the GIL.
        """

    def plan_slice(self, name: str, spec: Sequence[tuple[int, int | None, int | None, int | None]]) -> SlicePlan: ...

    def read_slice(self, name: str, plan: SlicePlan, ptr: int) -> None:
        """
        Reads the planned slice to the address ptr (plan.nbytes bytes). Releases the GIL.
        """

def serialize(tensors: Sequence[tuple[str, str, Sequence[int], int, int]], metadata: Sequence[tuple[str, str]] | None = None) -> bytes:
    """
    Serializes [(name, dtype code, shape, data_ptr, data_len)] to bytes. Releases the GIL while copying.
    """

def serialize_file(tensors: Sequence[tuple[str, str, Sequence[int], int, int]], path: str, metadata: Sequence[tuple[str, str]] | None = None, fsync: bool = False) -> None:
    """
    Writes [(name, dtype code, shape, data_ptr, data_len)] to path atomically. Releases the GIL.
    """

def dtype_table() -> list[tuple[str, int, str, str]]:
    """
    [(code, bits, torch name, numpy name)] in rank order: the one dtype table.
    """

def live_mappings() -> int:
    """Number of file mappings alive in this process (for tests)."""

DEFAULT_MAX_HEADER_BYTES: int = 100000000
