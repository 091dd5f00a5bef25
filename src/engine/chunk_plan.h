// How a Prefetcher's plan of pieces becomes positional reads (engine.h: "Pieces are read in chunks"): the
// byte-range planning, a pure function of the plan, separate from the threads that run it.
#ifndef SAFETENSORS_SRC_ENGINE_CHUNK_PLAN_H_
#define SAFETENSORS_SRC_ENGINE_CHUNK_PLAN_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "safetensors/engine.h"

namespace safetensors::internal {

// One positional read: [lo, hi) of the data buffer into a slab (dst == nullptr) or to dst. Its segments are
// ChunkPlan::segments[first_segment, first_segment + segments).
struct Chunk {
  std::uint64_t lo = 0;
  std::uint64_t hi = 0;
  std::byte* dst = nullptr;
  std::size_t first_segment = 0;
  std::size_t segments = 0;
};

// The part of one piece that one chunk holds: bytes [piece_offset, piece_offset + length) of plan[piece], at
// chunk_offset in the chunk.
struct Segment {
  std::size_t piece = 0;
  std::uint64_t piece_offset = 0;
  std::uint64_t chunk_offset = 0;
  std::uint64_t length = 0;
};

struct ChunkPlan {
  // In file order, so reads sweep the file forward; every chunk holds at least one segment.
  std::vector<Chunk> chunks;
  // Each chunk's segments in piece order (by begin).
  std::vector<Segment> segments;
};

// The reads of `plan` (zero-size pieces need none). Staged pieces merge into one run when they overlap,
// touch, or lie at most merge_gap bytes apart; direct pieces when they touch in the file and their
// destinations touch in memory (one read can fill both). A run is cut into chunks of at most staged_max
// (direct_max) bytes, cut at page boundaries of the file and at whole swap units of the piece a cut falls in
// (Piece::swap_bytes). REQUIRES: every piece lies in the data buffer, which starts at data_offset in the
// file; staged_max, direct_max > 0.
ChunkPlan plan_chunks(const std::vector<Piece>& plan, std::uint64_t staged_max, std::uint64_t direct_max,
                      std::uint64_t merge_gap, std::uint64_t data_offset);

// On a big-endian host: turns the file's bytes of `chunk`'s segments, read to `base` (the chunk's first byte),
// into native values (a no-op elsewhere). Segments of overlapping pieces share bytes, which are swapped once:
// segments come in piece order (by begin), so each swaps only what lies past the previous ones, from a unit
// boundary.
void swap_segments(const std::vector<Piece>& plan, const std::vector<Segment>& segments, const Chunk& chunk,
                   std::byte* base);

}  // namespace safetensors::internal

#endif  // SAFETENSORS_SRC_ENGINE_CHUNK_PLAN_H_
