#include "engine/chunk_plan.h"

#include <algorithm>
#include <span>
#include <utility>

#include "safetensors/dtype.h"

namespace safetensors::internal {
namespace {

constexpr std::uint64_t kPage = SlabPool::kPageBytes;

// Moves a chunk boundary `end` in (pos, hi) to a whole swap unit of the piece it falls inside, if any: down
// where that stays after pos, else up (never past the piece's end or hi). Pieces are sorted by begin; the
// first that contains `end` decides (overlapping pieces agree on their units, see Piece::swap_bytes).
std::uint64_t align_to_units(std::uint64_t pos, std::uint64_t end, std::uint64_t hi, const std::vector<Piece>& plan,
                             const std::vector<std::size_t>& pieces) {
  for (std::size_t i : pieces) {
    const Piece& p = plan[i];
    if (p.begin >= end) break;
    if (p.end <= end || p.swap_bytes <= 1) continue;
    const std::uint64_t into = (end - p.begin) % p.swap_bytes;
    if (into == 0) return end;
    if (end - into > pos) return end - into;
    return std::min({end - into + p.swap_bytes, p.end, hi});  // <= p.end: no overflow
  }
  return end;
}

// Cuts [lo, hi) into chunks of at most `max` bytes; every boundary inside the range is a page boundary of the
// file (where a page fits in `max`), so the reads after a range's first start page-aligned, and then a whole
// swap unit of the piece it cuts (a no-op for the aligned tensors writers produce), so each chunk's part of
// a piece can be swapped on its own.
void split(const std::vector<Piece>& plan, const std::vector<std::size_t>& pieces, std::uint64_t lo, std::uint64_t hi,
           std::uint64_t max, std::uint64_t data_offset, std::byte* dst, std::vector<Chunk>* out) {
  std::uint64_t pos = lo;
  while (pos < hi) {
    std::uint64_t end = hi;
    if (hi - pos > max) {
      end = pos + max;  // < hi: no overflow
      // data_offset + end < data_offset + hi <= the file size: no overflow.
      const std::uint64_t abs = data_offset + end;
      const std::uint64_t aligned = abs - abs % kPage;
      if (aligned > data_offset + pos) end = aligned - data_offset;
      end = align_to_units(pos, end, hi, plan, pieces);
    }
    out->push_back({pos, end, dst == nullptr ? nullptr : dst + (pos - lo), 0, 0});
    pos = end;
  }
}

// A run of pieces read as consecutive chunks.
struct Run {
  std::uint64_t lo = 0;
  std::uint64_t hi = 0;
  std::byte* dst = nullptr;
  std::vector<std::size_t> pieces;
};

// Chunks of every run, and the segments of each chunk (chunk index, segment).
void chunk_runs(const std::vector<Run>& runs, const std::vector<Piece>& plan, std::uint64_t max,
                std::uint64_t data_offset, std::vector<Chunk>* chunks,
                std::vector<std::pair<std::size_t, Segment>>* segments) {
  for (const Run& run : runs) {
    const std::size_t first = chunks->size();
    split(plan, run.pieces, run.lo, run.hi, max, data_offset, run.dst, chunks);
    const auto begin = chunks->begin() + static_cast<std::ptrdiff_t>(first);
    for (std::size_t i : run.pieces) {
      const Piece& p = plan[i];
      // The run's chunks are contiguous and ordered: the first that ends after the piece begins.
      auto c = std::partition_point(begin, chunks->end(), [&](const Chunk& ch) { return ch.hi <= p.begin; });
      for (; c != chunks->end() && c->lo < p.end; ++c) {
        const std::uint64_t from = std::max(c->lo, p.begin), to = std::min(c->hi, p.end);
        segments->push_back(
            {static_cast<std::size_t>(c - chunks->begin()), Segment{i, from - p.begin, from - c->lo, to - from}});
      }
    }
  }
}

}  // namespace

ChunkPlan plan_chunks(const std::vector<Piece>& plan, std::uint64_t staged_max, std::uint64_t direct_max,
                      std::uint64_t merge_gap, std::uint64_t data_offset) {
  ChunkPlan out;
  std::vector<std::size_t> staged, direct;
  for (std::size_t i = 0; i < plan.size(); ++i) {
    if (plan[i].size() == 0) continue;
    (plan[i].delivery == Delivery::kDirect ? direct : staged).push_back(i);
  }
  auto by_offset = [&](std::size_t a, std::size_t b) {
    return plan[a].begin != plan[b].begin ? plan[a].begin < plan[b].begin : plan[a].end < plan[b].end;
  };
  std::sort(staged.begin(), staged.end(), by_offset);
  std::sort(direct.begin(), direct.end(), by_offset);
  std::vector<Run> staged_runs, direct_runs;
  for (std::size_t i : staged) {
    const Piece& p = plan[i];
    if (!staged_runs.empty() && (p.begin <= staged_runs.back().hi || p.begin - staged_runs.back().hi <= merge_gap)) {
      Run& r = staged_runs.back();
      r.hi = std::max(r.hi, p.end);
      r.pieces.push_back(i);
    } else {
      staged_runs.push_back({p.begin, p.end, nullptr, {i}});
    }
  }
  for (std::size_t i : direct) {
    const Piece& p = plan[i];
    if (!direct_runs.empty()) {
      Run& r = direct_runs.back();
      if (p.begin == r.hi && p.dst.data() == r.dst + (r.hi - r.lo)) {
        r.hi = p.end;
        r.pieces.push_back(i);
        continue;
      }
    }
    direct_runs.push_back({p.begin, p.end, p.dst.data(), {i}});
  }
  std::vector<Chunk> chunks;
  std::vector<std::pair<std::size_t, Segment>> segs;
  chunk_runs(staged_runs, plan, staged_max, data_offset, &chunks, &segs);
  chunk_runs(direct_runs, plan, direct_max, data_offset, &chunks, &segs);

  // Chunks in file order (so reads sweep the file forward), each with its segments; chunks that hold no
  // byte of a piece (inside a merged gap) are dropped.
  std::vector<std::size_t> order(chunks.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(),
                   [&](std::size_t a, std::size_t b) { return chunks[a].lo < chunks[b].lo; });
  std::vector<std::size_t> rank(chunks.size());
  for (std::size_t k = 0; k < order.size(); ++k) rank[order[k]] = k;
  std::stable_sort(segs.begin(), segs.end(),
                   [&](const auto& a, const auto& b) { return rank[a.first] < rank[b.first]; });
  std::size_t s = 0;
  for (std::size_t k = 0; k < order.size(); ++k) {
    Chunk c = chunks[order[k]];
    c.first_segment = out.segments.size();
    while (s < segs.size() && rank[segs[s].first] == k) out.segments.push_back(segs[s++].second);
    c.segments = out.segments.size() - c.first_segment;
    if (c.segments != 0) out.chunks.push_back(c);
  }
  return out;
}

void swap_segments(const std::vector<Piece>& plan, const std::vector<Segment>& segments, const Chunk& chunk,
                   std::byte* base) {
  if constexpr (host_is_little_endian()) {
    (void)plan;
    (void)segments;
    (void)chunk;
    (void)base;
  } else {
    std::uint64_t swapped_to = 0;
    for (std::size_t k = chunk.first_segment; k < chunk.first_segment + chunk.segments; ++k) {
      const Segment& seg = segments[k];
      const unsigned w = plan[seg.piece].swap_bytes;
      const std::uint64_t end = seg.chunk_offset + seg.length;
      if (w > 1) {
        std::uint64_t from = seg.chunk_offset;
        if (swapped_to > from) from += (swapped_to - from + w - 1) / w * w;
        if (from < end) byteswap_units(std::span<std::byte>(base + from, end - from), w);
      }
      swapped_to = std::max(swapped_to, end);
    }
  }
}

}  // namespace safetensors::internal
