// Reads split into chunks a thread pool shares (cut by parallel.h's for_each_chunk), behind File::read_many,
// File::read_range, File::read_slice's long runs and ShardedFile::read_many.
#ifndef SAFETENSORS_SRC_FILE_READ_CHUNKS_H_
#define SAFETENSORS_SRC_FILE_READ_CHUNKS_H_

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "safetensors/error.h"
#include "safetensors/source.h"

namespace safetensors::internal {

// Reads are split into chunks of at most this many bytes: large enough that a syscall's cost is noise, small
// enough that a few threads share one large tensor.
constexpr std::uint64_t kReadChunk = 8u << 20;

// A contiguous range of `source` to copy to dst, part of the bytes of `tensor` (empty: of a data range).
struct ReadChunk {
  const Source* source;
  std::uint64_t source_offset;
  std::byte* dst;
  std::uint64_t length;
  std::string_view tensor;
  // host_swap_bytes() of the tensor's dtype (0: a data range, or no swap on this host): the chunk is swapped
  // to native values once it landed. Chunks start at multiples of kReadChunk into their tensor or run, or at
  // aligned file offsets a whole number of units into it (split_read), so they hold whole units.
  std::uint8_t swap = 0;
};
static_assert(kReadChunk % 8 == 0, "read chunks must hold whole swap units");

// How a read names itself in errors: the file is the error's context, this adds the tensor.
std::string read_of(std::string_view tensor);

// Appends [source_offset, source_offset + dst.size()) of `source` as chunks of at most kReadChunk bytes, each
// swapped with width `swap` once read (see ReadChunk::swap). Where the source has a ReadHints::alignment, the
// chunks after the first start at multiples of it in the file.
void split_read(const Source& source, std::uint64_t source_offset, std::span<std::byte> dst, std::string_view tensor,
                std::uint8_t swap, std::vector<ReadChunk>* chunks);

// Reads every chunk with up to `threads` threads (0 = the source's ReadHints::parallelism, else by `total`, the
// chunks' bytes, and the hardware); the first error wins. Where the source's ReadHints::merge_gap is set,
// consecutive chunks smaller than it that lie within it of each other are read as one (a remote source's
// request costs a round trip); chunks of one call must then be in file order for merging to apply. Chunks are
// handed out in order, so chunks of different requests -- or files -- appended in turn are read side by side,
// and the readers hint their chunks' Sources ahead (hint_ahead,
// Source::prefetch). Every read is a positional read (read_exact), so a file that shrank or fails
// underneath gives kIo, even on the mmap backend; the chunks keep a warm read as fast as copying out of the
// mapping.
Status read_chunks(std::span<const ReadChunk> chunks, std::uint64_t total, unsigned threads);

}  // namespace safetensors::internal

#endif  // SAFETENSORS_SRC_FILE_READ_CHUNKS_H_
