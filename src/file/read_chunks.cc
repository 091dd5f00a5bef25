#include "file/read_chunks.h"

#include <algorithm>
#include <cstring>

#include "io/scratch.h"
#include "safetensors/dtype.h"
#include "util/parallel.h"
#include "util/quote.h"

namespace safetensors::internal {

std::string read_of(std::string_view tensor) { return "read of tensor " + quote(tensor); }

void split_read(const Source& source, std::uint64_t source_offset, std::span<std::byte> dst, std::string_view tensor,
                std::uint8_t swap, std::vector<ReadChunk>* chunks) {
  // Where the source reads aligned ranges without a bounce, the first chunk is shortened so that every later
  // chunk starts at a multiple of the alignment in the file -- as long as the cut stays a whole number of swap
  // units into the tensor (the alignment, at most kReadChunk, is a power of two: a multiple of any unit when
  // the tensor's offset is).
  const std::uint64_t a = source.read_hints().alignment;
  std::uint64_t head = 0;
  if (a > 1 && a <= kReadChunk && (swap <= 1 || source_offset % swap == 0)) {
    head = (kReadChunk - (source_offset & (a - 1))) % kReadChunk;
  }
  if (head != 0 && head < dst.size()) {
    chunks->push_back({&source, source_offset, dst.data(), head, tensor, swap});
    source_offset += head;
    dst = dst.subspan(head);
  }
  std::byte* const base = dst.data();
  for_each_chunk(dst.size(), kReadChunk, [&](std::uint64_t off, std::uint64_t len) {
    chunks->push_back({&source, source_offset + off, base + off, len, tensor, swap});
  });
}

namespace {

// Reads `group` (chunks of one source, in file order, within its merge_gap of each other) as one read into
// scratch memory, then copies each chunk out: a remote source pays one request for many small tensors.
Status read_merged(std::span<const ReadChunk> group) {
  const ReadChunk& first = group.front();
  const std::uint64_t lo = first.source_offset;
  const std::uint64_t hi = group.back().source_offset + group.back().length;
  Scratch scratch;
  const std::span<std::byte> all = scratch.get(lo, hi - lo, first.source->read_hints().alignment);
  const std::string what =
      first.tensor.empty()
          ? std::string("read of the data buffer")
          : read_of(first.tensor) +
                (group.size() > 1 ? " and " + std::to_string(group.size() - 1) + " more" : std::string());
  SAFETENSORS_ASSIGN_OR_RETURN(auto bytes, first.source->read(lo, all, what));
  for (const ReadChunk& p : group) {
    const std::span<std::byte> dst(p.dst, p.length);
    std::memcpy(dst.data(), bytes.data() + (p.source_offset - lo), p.length);
    byteswap_units(dst, p.swap);
  }
  return ok_status();
}

}  // namespace

Status read_chunks(std::span<const ReadChunk> chunks, std::uint64_t total, unsigned threads) {
  if (chunks.empty()) return ok_status();
  const ReadHints hints = chunks.front().source->read_hints();
  if (threads == 0) {
    threads = hints.parallelism > 0 ? hints.parallelism : default_threads(total, kReadChunk);
  }
  // Groups of consecutive chunks worth one read: where the source says separate reads cost more than the
  // bytes between them (merge_gap), chunks smaller than that are merged with their neighbours in the file,
  // up to kReadChunk. Each group is [groups[g], groups[g + 1]).
  std::vector<std::size_t> groups;
  groups.reserve(chunks.size() + 1);
  for (std::size_t i = 0; i < chunks.size(); ++i) {
    if (i > 0 && hints.merge_gap > 0) {
      const ReadChunk& start = chunks[groups.back()];
      const ReadChunk& prev = chunks[i - 1];
      const ReadChunk& p = chunks[i];
      const std::uint64_t prev_end = prev.source_offset + prev.length;
      const bool small = prev.length < hints.merge_gap && p.length < hints.merge_gap;
      if (small && p.source == start.source && p.source_offset >= prev_end &&
          p.source_offset - prev_end <= hints.merge_gap &&
          p.source_offset + p.length - start.source_offset <= kReadChunk) {
        continue;
      }
    }
    groups.push_back(i);
  }
  groups.push_back(chunks.size());
  const std::size_t count = groups.size() - 1;
  return run_parallel(count, threads, [&](std::size_t g) -> Status {
    hint_ahead(g, count, [&](std::size_t k) {
      const ReadChunk& a = chunks[groups[k]];
      const ReadChunk& b = chunks[groups[k + 1] - 1];
      a.source->prefetch(a.source_offset, b.source_offset + b.length - a.source_offset);
    });
    const std::span<const ReadChunk> group = chunks.subspan(groups[g], groups[g + 1] - groups[g]);
    if (group.size() > 1) return read_merged(group);
    const ReadChunk& p = group.front();
    const std::string what = p.tensor.empty() ? std::string("read of the data buffer") : read_of(p.tensor);
    const std::span<std::byte> dst(p.dst, p.length);
    SAFETENSORS_RETURN_IF_ERROR(read_exact(*p.source, p.source_offset, dst, what));
    byteswap_units(dst, p.swap);
    return ok_status();
  });
}

}  // namespace safetensors::internal
