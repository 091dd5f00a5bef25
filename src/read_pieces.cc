#include "read_pieces.h"

#include <algorithm>

#include "parallel.h"
#include "quote.h"
#include "safetensors/dtype.h"

namespace safetensors::internal {

std::string read_of(std::string_view tensor) { return "read of tensor " + quote(tensor); }

void split_read(const Source& source, std::uint64_t source_offset, std::span<std::byte> dst, std::string_view tensor,
                std::uint8_t swap, std::vector<ReadPiece>* pieces) {
  for_each_piece(dst.size(), kReadChunk, [&](std::uint64_t off, std::uint64_t len) {
    pieces->push_back({&source, source_offset + off, dst.data() + off, len, tensor, swap});
  });
}

Status read_pieces(std::span<const ReadPiece> pieces, std::uint64_t total, unsigned threads) {
  if (pieces.empty()) return ok_status();
  if (threads == 0) threads = default_threads(total, kReadChunk);
  return run_parallel(pieces.size(), threads, [&](std::size_t i) -> Status {
    hint_ahead(i, pieces.size(),
               [&](std::size_t k) { pieces[k].source->prefetch(pieces[k].source_offset, pieces[k].length); });
    const ReadPiece& p = pieces[i];
    const std::string what = p.tensor.empty() ? std::string("read of the data buffer") : read_of(p.tensor);
    const std::span<std::byte> dst(p.dst, p.length);
    SAFETENSORS_RETURN_IF_ERROR(read_exact(*p.source, p.source_offset, dst, what));
    byteswap_units(dst, p.swap);
    return ok_status();
  });
}

}  // namespace safetensors::internal
