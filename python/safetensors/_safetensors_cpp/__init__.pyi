"""Native core of the safetensors package (C++ library binding)."""

from collections.abc import Sequence
import types
from typing import Any

from safetensors import (
    SafetensorBlockingIOError as SafetensorBlockingIOError,
    SafetensorBrokenPipeError as SafetensorBrokenPipeError,
    SafetensorChildProcessError as SafetensorChildProcessError,
    SafetensorConnectionAbortedError as SafetensorConnectionAbortedError,
    SafetensorConnectionRefusedError as SafetensorConnectionRefusedError,
    SafetensorConnectionResetError as SafetensorConnectionResetError,
    SafetensorError as SafetensorError,
    SafetensorFileExistsError as SafetensorFileExistsError,
    SafetensorFileNotFoundError as SafetensorFileNotFoundError,
    SafetensorIOError as SafetensorIOError,
    SafetensorInterruptedError as SafetensorInterruptedError,
    SafetensorIsADirectoryError as SafetensorIsADirectoryError,
    SafetensorNotADirectoryError as SafetensorNotADirectoryError,
    SafetensorPermissionError as SafetensorPermissionError,
    SafetensorProcessLookupError as SafetensorProcessLookupError,
    SafetensorSliceError as SafetensorSliceError,
    SafetensorTimeoutError as SafetensorTimeoutError
)
from safetensors._safetensors_cpp import (
    engine as engine,
    sharded as sharded
)


class SlicePlan:
    """
    A planned index expression over one tensor. Immutable: may be shared by threads.
    """

    @property
    def shape(self) -> tuple[int, ...]: ...

    @property
    def nbytes(self) -> int: ...

    @property
    def is_whole(self) -> bool: ...

    @property
    def run_count(self) -> int:
        """
        How many contiguous runs of the tensor's bytes the result is made of (0 when it is empty).
        """

    @property
    def source_begin(self) -> int:
        """
        The lowest byte any run reads, from the tensor's first byte; 0 when empty.
        """

    @property
    def source_end(self) -> int:
        """
        One past the highest byte any run reads, from the tensor's first byte; 0 when empty.
        """

    @property
    def first_element(self) -> int:
        """
        The result as a strided view of the tensor: the row-major index of its first element.
        """

    @property
    def strides(self) -> tuple[int, ...]:
        """
        The result as a strided view of the tensor: per axis, the distance in elements between neighbours (negative where a range walks backwards).
        """

class PySafeSlice:
    """
    A tensor not read yet: get_shape(), get_dtype(), len() and [index] with numpy semantics (read through safe_open's reader). Immutable: may be shared by threads.
    """

    def __len__(self) -> int: ...

    def __getitem__(self, index: object, /) -> object: ...

    def get_shape(self) -> list[int]:
        """The tensor's shape, as a new list."""

    def get_dtype(self) -> str:
        """The tensor's dtype code, e.g. "F32"."""

class SafeOpenBase:
    """
    The native part of safe_open: the open file that get_slice serves. Safe for concurrent use by multiple threads, _detach included.
    """

    def get_slice(self, name: str) -> PySafeSlice:
        """A lazy handle on tensor ``name`` that reads only what an index expression selects."""

    def _attach(self, file: File, reader: object, /) -> None:
        """The File and the _Reader that get_slice serves."""

    def _open(self) -> object:
        """The _Reader, while the file is open; SafetensorError "File is closed" otherwise."""

    def _detach(self) -> None:
        """Lets go of the file: get_slice and _open raise "File is closed" from now on."""

class File:
    """
    An open, validated safetensors file (or in-memory bytes). Safe for concurrent use by multiple threads (every method).
    """

    def __init__(self, path: str, backend: str = 'mmap', max_header_bytes: int = 100000000, remote: list[tuple[str, str]] = []) -> None:
        """
        Opens a local path or an http(s):// or s3:// URL; remote: (option, value) pairs (RemoteOptions).
        """

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
    def source_kind(self) -> str:
        """
        What the bytes come from: "mmap", "pread", "direct", "memory", "http" or "s3".
        """

    def source_stats(self) -> dict[str, int | str]:
        """
        What the source did so far (source.h, SourceStats): a remote source's requests, body bytes fetched and retries; a direct source's bytes read with O_DIRECT, bounced, read through the cache, whether O_DIRECT was refused (1), and for backend auto the bytes cached when it chose and the probe that told (residency_probe). Zeros elsewhere.
        """

    def with_backend(self, backend: str) -> File:
        """
        This file read through another backend: the same open file (not the path again), the same header. The file itself where its source has no other way (memory, remote).
        """

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

    def dtypes(self) -> list[str]:
        """The dtype codes the file's tensors use, each once, in rank order."""

    def infos(self) -> list[tuple[str, tuple[str, tuple[int, ...], int, int]]]:
        """[(name, (dtype code, shape, begin, end))] in file order."""

    def buffer(self) -> memoryview | None:
        """
        The data buffer (everything after the header) as a memoryview that keeps the mapping alive, or None on the pread backend. Writable where the mapping is (a private copy-on-write mapping).
        """

    def view(self, name: str) -> object | None:
        """
        A tensor in the file's writable mapping, zero-copy, as a DLPack capsule that keeps the mapping alive (typed as the tensor where DLPack has its dtype, else its bytes as uint8), or None (pread backend, read-only mapping).
        """

    def view_all(self) -> list[tuple[str, object | None]]:
        """[(name, view(name))] for every tensor, in file order."""

    def read(self, name: str, dlpack: bool = True) -> object:
        """
        A tensor read into new memory of its own (GIL released): a bytearray, or where the source reads directly memory placed congruent with the file; exported as a DLPack capsule (typed as in view), or with dlpack=False as a buffer (the bytearray itself, else a memoryview).
        """

    def destination(self, begin: int, nbytes: int) -> object:
        """
        New memory for the data-buffer bytes [begin, begin + nbytes) to be read into (a DLPack capsule of uint8): where the source reads directly, placed so that its reads land in it without a bounce.
        """

    def read_all(self, names: list[str] | None = None, threads: int = 0, dlpack: bool = True) -> list[tuple[str, object]]:
        """
        [(name, read(name, dlpack))] for the tensors named (every tensor in file order when None), read in parallel with the GIL released.
        """

    def read_into(self, name: str, ptr: int, nbytes: int, fresh: bool = False) -> None:
        """
        Reads a tensor's bytes to the address ptr (nbytes must equal its size). fresh=True: the destination is a new allocation the caller owns (advise_fresh_destination: kept on 4 KiB pages). Releases the GIL.
        """

    def read_many(self, items: Sequence[tuple[str, int, int]], threads: int = 0, fresh: bool = False) -> None:
        """
        Reads [(name, ptr, nbytes)] with a pool of threads (fresh: as in read_into). Releases the GIL.
        """

    def read_range(self, offset: int, ptr: int, nbytes: int, threads: int = 0) -> None:
        """
        Reads data-buffer bytes [offset, offset + nbytes) to the address ptr, with a pool of threads. Releases the GIL.
        """

    def plan_slice(self, name: str, spec: Sequence[int | slice | types.EllipsisType]) -> SlicePlan:
        """
        Plans a basic index expression (ints, slices, Ellipsis, one per axis at most) over a tensor.
        """

    def read_slice(self, name: str, plan: SlicePlan, ptr: int) -> None:
        """
        Reads the planned slice to the address ptr (plan.nbytes bytes). Releases the GIL.
        """

def is_remote_location(location: str) -> bool:
    """
    True for the http://, https:// and s3:// URLs the library opens as remote sources.
    """

def serialize(tensors: Sequence[tuple[str, str, Sequence[int], int, int]], metadata: Sequence[tuple[str, str]] | None = None) -> bytes:
    """
    Serializes [(name, dtype code, shape, data_ptr, data_len)] to bytes. Releases the GIL while copying.
    """

def serialize_file(tensors: Sequence[tuple[str, str, Sequence[int], int, int]], path: str, metadata: Sequence[tuple[str, str]] | None = None, fsync: bool = False) -> None:
    """
    Writes [(name, dtype code, shape, data_ptr, data_len)] to path atomically. Releases the GIL.
    """

def plan_file(tensors: Sequence[tuple[str, str, Sequence[int]]], metadata: Sequence[tuple[str, str]] | None = None) -> tuple[bytes, list[tuple[str, int, int]]]:
    """
    The layout serialize would give [(name, dtype code, shape)]: (the file's first bytes -- length, header, padding --, [(name, begin, end)] in file order, offsets relative to the data buffer).
    """

def pwrite_box(fd: int, offset: int, shape: Sequence[int], box: Sequence[tuple[int, int]], item: int, ptr: int, nbytes: int, what: str) -> None:
    """
    Writes the box [(start, stop)] of a C-contiguous tensor of shape (in elements of item bytes) whose bytes start at offset of fd, from nbytes at ptr (the box, C-contiguous): one positional write per run the box makes in the file (one for a box of whole rows). Bytes as they are (no byte swapping). Raises SafetensorIOError naming what. Releases the GIL.
    """

def dtype_table() -> list[tuple[str, int, str, int, int | None, int, str, str]]:
    """
    [(code, bits, kind, swap bytes, DLPack code or None, torch pack, torch name, numpy name)] in rank order: the one dtype table (include/safetensors/dtype.h). kind is bool/signed/unsigned/float/complex.
    """

def torch_shape(code: str, shape: Sequence[int]) -> list[int]:
    """
    torch's shape for a header shape (a packed type's last dimension divided by its pack); SafetensorError where torch cannot hold it.
    """

def header_shape(code: str, shape: Sequence[int]) -> list[int]:
    """
    The header shape for torch's shape (a packed type's last dimension multiplied by its pack); ValueError for a packed scalar.
    """

def byteswap(data: Any, width: int) -> None:
    """
    Reverses each `width`-byte unit of a writable, contiguous 1-d uint8 CPU buffer in place (a bytearray, a numpy array, a torch tensor), on any host.
    """

def live_mappings() -> int:
    """Number of file mappings alive in this process (for tests)."""

def set_direct_bounce(always: bool | None) -> None:
    """
    For tests: direct sources opened from now on read everything through bounce memory (True), straight into aligned destinations where they can (False), or as the device under the file suggests (None).
    """

DEFAULT_MAX_HEADER_BYTES: int = 100000000
