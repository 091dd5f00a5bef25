"""Native core of the safetensors package (C++ library binding)."""

from collections.abc import Callable, Sequence
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

DEFAULT_READER_THREADS: int = 8

DEFAULT_CHUNK_BYTES: int = 8388608

DEFAULT_STAGING_BYTES: int = 268435456

DEFAULT_SLAB_BYTES: int = 8388608

PREFETCH_MAX_THREADS: int = 64

def tensor_piece(file: File, name: str) -> tuple[int, int]:
    """The data-buffer range [begin, end) of a whole tensor."""

def row_piece(file: File, name: str, r0: int, r1: int) -> tuple[int, int]:
    """
    The data-buffer range [begin, end) of rows [r0, r1) of a tensor's first dimension (checked: 0-d, range, sub-byte alignment).
    """

class PrefetchEvent:
    """What Prefetcher.next() returns."""

    @property
    def kind(self) -> str:
        """
        'staged' (bytes in a slab), 'direct' (a piece complete), 'end' or 'timeout'.
        """

    @property
    def piece(self) -> int:
        """The piece's position in the plan."""

    @property
    def offset(self) -> int:
        """staged: where the bytes lie in the piece."""

    @property
    def address(self) -> int:
        """staged: the bytes' address in the slab (valid until release(slab))."""

    @property
    def size(self) -> int: ...

    @property
    def slab(self) -> int:
        """staged: the handle to release (0: none)."""

    @property
    def slab_address(self) -> int:
        """
        staged: the slab allocation's start (what the pool's alloc returned); address - slab_address is the bytes' offset in it.
        """

    @property
    def piece_done(self) -> bool:
        """The piece's last chunk (always true for direct)."""

class Prefetcher:
    """
    A plan of data-buffer ranges read in the background (the C++ engine). Each plan item is (tensor name, begin, end, dst): dst an address of end - begin writable bytes (direct) or None (staged: bytes come through slabs of the process-wide pool). May be shared by threads: close() from one makes the others' calls raise.
    """

    def __init__(self, file: File, plan: list[tuple[str, int, int, int | None]], threads: int = 8, chunk_bytes: int = 8388608, merge_gap: int = 0, max_slabs: int = 0) -> None: ...

    def next(self, timeout: float | None = None) -> PrefetchEvent:
        """
        Waits (the GIL released) for the next event; raises the readers' error (naming file and tensor).
        """

    def release(self, slab: int) -> None:
        """
        Returns a staged event's slab to the pool, once nothing reads it any more.
        """

    def wait_piece(self, piece: int) -> None:
        """Waits (the GIL released) until direct piece `piece` is complete."""

    def piece_done(self, piece: int) -> bool: ...

    def cancel(self) -> None:
        """
        Stops the readers and wakes every waiter; lent slabs stay valid until released or close().
        """

    def close(self) -> None:
        """
        Cancels, joins the readers and returns every slab. Then every method but close() raises.
        """

    def __enter__(self) -> Prefetcher: ...

    def __exit__(self, arg0: object | None, arg1: object | None, arg2: object | None, /) -> None: ...

    def __len__(self) -> int: ...

    def stats(self) -> dict[str, int]:
        """
        Counters: bytes read, bytes staged/direct, reads, chunks, nanoseconds readers waited for slabs, ...
        """

class CopyQueue:
    """
    The engine's slab rule for copies that complete later than they are issued: each staged event's slab goes back to the Prefetcher once the copy out of it completed. One thread at a time (external synchronization).
    """

    def __init__(self, prefetcher: Prefetcher, done: Callable[[Any], bool], wait: Callable[[Any], None]) -> None:
        """
        done(event) polls a copy's event, wait(event) waits for it; both run on the thread calling next() or finish().
        """

    def add(self, event: Any | None, slab: int, piece: int = -1) -> None:
        """
        Records a copy out of `slab` issued after every earlier one; event None: complete already. `piece`: the piece it completes (the event's piece where piece_done), else -1.
        """

    def next(self) -> tuple[PrefetchEvent, list[int]]:
        """
        Retires completed copies, then waits (the GIL released) for the next event: (event, pieces whose last copy completed). With copies pending it waits briefly, then for the oldest copy ('timeout').
        """

    def finish(self) -> list[int]:
        """Waits for every pending copy: the pieces they completed."""

    def close(self) -> None:
        """
        Waits for every pending copy (errors ignored) and releases its slab. Then every method but close() raises.
        """

def slab_pool_set_capacity(bytes: int) -> None:
    """
    The most bytes the process-wide slab pool allocates at once (default DEFAULT_STAGING_BYTES).
    """

def slab_pool_set_slab_bytes(bytes: int) -> None:
    """
    The size of each slab (a multiple of 4096; default DEFAULT_SLAB_BYTES).
    """

def slab_pool_set_allocator(alloc: Callable[[int], int] | None = None, free: Callable[[int, int], None] | None = None) -> None:
    """
    Slab memory from alloc(size) -> address (0 on failure), returned by free(address, size); both None: the default. They run on reader threads (taking the GIL).
    """

def slab_pool_trim() -> None:
    """Frees every idle slab now."""

def slab_pool_reset_peak() -> None:
    """Restarts the pool's peak_bytes counter from the bytes allocated now."""

def slab_pool_stats() -> dict[str, int]:
    """
    Counters of the process-wide slab pool (bytes allocated now and at peak, slabs in use, ...).
    """

class ShardIndex:
    """
    A parsed, validated index file (model.safetensors.index.json): which shard holds each tensor. Every index rule lives here (and in ShardedFile.open_index, built on it). Immutable: may be shared by threads.
    """

    @staticmethod
    def read(path: str, max_bytes: int = 100000000, remote: Sequence[tuple[str, str]] = []) -> ShardIndex:
        """
        Reads and validates the index at path (a local path or a URL). Releases the GIL.
        """

    @staticmethod
    def parse(path: str, text: str) -> ShardIndex:
        """Validates index text; path names it in errors and locates the shards."""

    @property
    def path(self) -> str: ...

    @property
    def metadata(self) -> dict[str, str] | None:
        """
        The index's metadata (non-string values as compact JSON text), or None.
        """

    @property
    def total_size(self) -> int | None: ...

    @property
    def metadata_json(self) -> str | None:
        """The metadata object as compact JSON text, or None."""

    @property
    def shard_names(self) -> list[str]:
        """Distinct shard names, sorted."""

    @property
    def weight_map(self) -> dict[str, str]:
        """{tensor: shard name}, in index order."""

    def shard_path(self, s: int) -> str:
        """Shard s's path, relative to the index's directory."""

    def assigned(self, s: int) -> list[str]:
        """The tensor names the index assigns to shard s, sorted."""

    def select(self, shard: File, s: int) -> list[str]:
        """
        Names of the tensors of shard (the opened file of shard s) the index assigns to it, in file order. Raises SafetensorError (TensorNotFound, naming the shard) when it lacks one: the one check that a shard holds what the index assigns.
        """

class ShardedFile:
    """
    Several safetensors files seen as one set of tensors: an index's shards (only the tensors it assigns to each) or a list of files. Safe for concurrent use by multiple threads, as File is.
    """

    @staticmethod
    def open_index(path: str, backend: str = 'mmap', max_header_bytes: int = 100000000, remote: Sequence[tuple[str, str]] = []) -> ShardedFile:
        """
        Opens an index and validates it and every shard it names. Releases the GIL.
        """

    @staticmethod
    def open_files(paths: Sequence[str], backend: str = 'mmap', max_header_bytes: int = 100000000, remote: Sequence[tuple[str, str]] = []) -> ShardedFile:
        """
        Opens every file; a tensor name in two files is an error. Releases the GIL.
        """

    @property
    def index_path(self) -> str:
        """The index path, or '' for open_files()."""

    @property
    def index_metadata(self) -> dict[str, str] | None: ...

    @property
    def total_size(self) -> int | None: ...

    @property
    def shards(self) -> list[File]:
        """The shard files: an index's sorted by name, else in the order given."""

    def __len__(self) -> int: ...

    def __contains__(self, arg: str, /) -> bool: ...

    def keys(self) -> list[str]:
        """Visible tensor names, sorted."""

    def infos(self) -> list[tuple[str, tuple[str, tuple[int, ...], int, int]]]:
        """
        [(name, (dtype code, shape, begin, end))], shard by shard, in file order within a shard.
        """

    def info(self, name: str) -> tuple[str, tuple[int, ...], int, int]: ...

    def shard_of(self, name: str) -> int:
        """Position in shards of the file holding the tensor."""

    def read_into(self, name: str, ptr: int, nbytes: int) -> None:
        """
        Reads a tensor's bytes to the address ptr (nbytes must equal its size). Releases the GIL.
        """

    def read_many(self, items: Sequence[tuple[str, int, int]], threads: int = 0) -> None:
        """
        Reads [(name, ptr, nbytes)] from any shards with a pool of threads. Releases the GIL.
        """

class ShardPlan:
    """
    Where each tensor goes: shard file names, members, the index text. Immutable: may be shared by threads.
    """

    @property
    def shards(self) -> list[tuple[str, list[int], int]]:
        """
        [(file name, indices of the input tensors, data bytes)] in shard order.
        """

    @property
    def index_file_name(self) -> str: ...

    @property
    def total_size(self) -> int: ...

    @property
    def index_json(self) -> str:
        """The index text, as transformers writes it."""

def plan_shards(sizes: Sequence[tuple[str, int]], max_shard_bytes: int, prefix: str = 'model') -> ShardPlan:
    """
    Splits [(name, nbytes)] as huggingface_hub does; names the shards and writes the index text (nothing is written to disk). No tensors give no shards.
    """

def shard_file_name(prefix: str, i: int, n: int) -> str:
    """
    The file name of shard i (1-based) of n: '<prefix>-00001-of-00003.safetensors', as plan_shards names them.
    """

def is_shard_file_name(prefix: str, name: str) -> bool:
    """Whether name is shard_file_name(prefix, i, n) for some 1 <= i <= n."""

def write_index(directory: str, plan: ShardPlan, fsync: bool = False) -> None:
    """
    Writes plan.index_json to directory/plan.index_file_name atomically, keeping an existing index's mode bits; fsync=True syncs the file and the directory. Releases the GIL.
    """

def save_sharded(directory: str, tensors: Sequence[tuple[str, str, Sequence[int], int, int]], max_shard_bytes: int, prefix: str = 'model', metadata: Sequence[tuple[str, str]] | None = None, fsync: bool = False) -> ShardPlan:
    """
    Plans, writes every shard atomically, then the index: [(name, dtype code, shape, data_ptr, data_len)]. Returns the plan. Releases the GIL.
    """
