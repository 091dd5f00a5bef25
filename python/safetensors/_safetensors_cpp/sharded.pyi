"""
Sharded checkpoints (src/sharded/): the index, a set of shard files read as one, and the shard plan of a save.
"""

from collections.abc import Sequence

import safetensors._safetensors_cpp


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

    def select(self, shard: safetensors._safetensors_cpp.File, s: int) -> list[str]:
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
    def shards(self) -> list[safetensors._safetensors_cpp.File]:
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
