#include "read_chunks.h"

#include <algorithm>

#include "parallel.h"
#include "quote.h"
#include "safetensors/dtype.h"

namespace safetensors::internal {

std::string read_of(std::string_view tensor) { return "read of tensor " + quote(tensor); }

void split_read(const Source& source, std::uint64_t source_offset, std::span<std::byte> dst, std::string_view tensor,
                std::uint8_t swap, std::vector<ReadChunk>* chunks) {
  for_each_chunk(dst.size(), kReadChunk, [&](std::uint64_t off, std::uint64_t len) {
    chunks->push_back({&source, source_offset + off, dst.data() + off, len, tensor, swap});
  });
}

Status read_chunks(std::span<const ReadChunk> chunks, std::uint64_t total, unsigned threads) {
  if (chunks.empty()) return ok_status();
  if (threads == 0) threads = default_threads(total, kReadChunk);
  return run_parallel(chunks.size(), threads, [&](std::size_t i) -> Status {
    hint_ahead(i, chunks.size(),
               [&](std::size_t k) { chunks[k].source->prefetch(chunks[k].source_offset, chunks[k].length); });
    const ReadChunk& p = chunks[i];
    const std::string what = p.tensor.empty() ? std::string("read of the data buffer") : read_of(p.tensor);
    const std::span<std::byte> dst(p.dst, p.length);
    SAFETENSORS_RETURN_IF_ERROR(read_exact(*p.source, p.source_offset, dst, what));
    byteswap_units(dst, p.swap);
    return ok_status();
  });
}

}  // namespace safetensors::internal
