// Slicing: an index expression with numpy semantics, turned into contiguous byte runs.
//
// A SlicePlan is computed from a tensor's dtype and shape and a list of SliceIndex values, exactly as numpy
// interprets `array[i0, i1, ...]`: an integer picks one position and drops the axis (negative values count
// from the end); a range start:stop:step keeps the axis, with Python's clamping of out-of-range bounds and
// negative steps walking backwards; one Ellipsis stands for as many full ranges as needed; axes not indexed
// are taken whole. The plan describes the result as runs of contiguous source bytes, in result order, so a
// reader touches only the bytes the result contains.
//
// Sub-byte dtypes (F4, F6_*) can be sliced when every run starts and ends on a byte boundary; otherwise
// planning fails with kMisalignedSlice.
//
// Thread safety: SlicePlan is immutable after make(); const methods are safe from any thread.
#ifndef SAFETENSORS_SLICE_H_
#define SAFETENSORS_SLICE_H_

#include <cstdint>
#include <optional>
#include <span>
#include <string_view>
#include <utility>
#include <vector>

#include "safetensors/dtype.h"
#include "safetensors/error.h"
#include "safetensors/export.h"

namespace safetensors {

// One component of an index expression.
struct SliceIndex {
  enum class Kind { kIndex, kRange, kEllipsis };

  static SliceIndex at(std::int64_t i) { return {Kind::kIndex, i, std::nullopt, std::nullopt, std::nullopt}; }
  static SliceIndex range(std::optional<std::int64_t> start = std::nullopt,
                          std::optional<std::int64_t> stop = std::nullopt,
                          std::optional<std::int64_t> step = std::nullopt) {
    return {Kind::kRange, 0, start, stop, step};
  }
  static SliceIndex all() { return range(); }
  static SliceIndex ellipsis() { return {Kind::kEllipsis, 0, std::nullopt, std::nullopt, std::nullopt}; }

  Kind kind;
  std::int64_t index;                 // kIndex only
  std::optional<std::int64_t> start;  // kRange only; nullopt = numpy's default for the step's sign
  std::optional<std::int64_t> stop;
  std::optional<std::int64_t> step;  // nullopt = 1; 0 is an error
};

// One contiguous run: `length` bytes at `source_offset` (relative to the tensor's first byte) go to
// `dest_offset` of the result.
struct SliceRun {
  std::uint64_t source_offset;
  std::uint64_t dest_offset;
  std::uint64_t length;
};

class SAFETENSORS_EXPORT SlicePlan {
 public:
  // Plans `indices` over a tensor of `dtype` and `shape`. `context` and `tensor` only name the file and the
  // tensor in errors. Errors: kInvalidSlice (index out of bounds, step 0, more than one Ellipsis, too many
  // indices), kMisalignedSlice (a sub-byte run off a byte boundary).
  static Result<SlicePlan> make(Dtype dtype, std::span<const std::uint64_t> shape, std::span<const SliceIndex> indices,
                                std::string_view context = {}, std::string_view tensor = {});

  Dtype dtype() const { return dtype_; }
  // The result's shape: integer-indexed axes removed, ranges replaced by their lengths.
  const std::vector<std::uint64_t>& shape() const { return shape_; }
  // Bytes in the result (0 when any result axis is empty).
  std::uint64_t nbytes() const { return nbytes_; }
  // Number of runs for_each_run() visits.
  std::uint64_t run_count() const { return run_count_; }
  // Bytes per run (every run has the same length).
  std::uint64_t run_length() const { return run_bytes_; }
  // The lowest and one past the highest source byte any run touches; [0, 0) when empty.
  std::uint64_t source_begin() const { return source_begin_; }
  std::uint64_t source_end() const { return source_end_; }
  // True when the result is one run that is the whole tensor.
  bool is_whole() const { return whole_; }
  // The result as a strided view of the tensor's elements, as numpy would make it: the index (in row-major
  // order) of the result's first element, and per result axis the distance in elements between neighbours
  // (negative where a range walks backwards; an axis of length 0 or 1 has its row-major stride). For a view of
  // sub-byte elements, mind that an element may not start on a byte.
  std::uint64_t first_element() const { return first_element_; }
  const std::vector<std::int64_t>& strides() const { return strides_; }

  // Calls fn(const SliceRun&) for every run in result order; stops early and returns false when fn returns
  // false.
  template <typename Fn>
  bool for_each_run(Fn&& fn) const {
    return for_each_run(0, run_count_, std::forward<Fn>(fn));
  }
  // The same for runs [first, first + count) only (so disjoint ranges can be walked by different threads).
  // REQUIRES: first + count <= run_count().
  template <typename Fn>
  bool for_each_run(std::uint64_t first, std::uint64_t count, Fn&& fn) const;

 private:
  // One iterated axis of the run walk: `count` positions, `step_bytes` apart (negative for reversed axes).
  struct Axis {
    std::uint64_t count;
    std::int64_t step_bytes;
  };

  // The result.
  Dtype dtype_ = Dtype::kU8;
  std::vector<std::uint64_t> shape_;
  std::uint64_t nbytes_ = 0;
  bool whole_ = false;
  // The runs: the odometer walk over axes_ (outermost first) from base_, the source byte offset of the first
  // run, and the span of the source they touch.
  std::vector<Axis> axes_;
  std::uint64_t base_ = 0;
  std::uint64_t run_bytes_ = 0;
  std::uint64_t run_count_ = 0;
  std::uint64_t source_begin_ = 0;
  std::uint64_t source_end_ = 0;
  // The result as a strided view: one stride per result axis, in elements, from first_element_.
  std::vector<std::int64_t> strides_;
  std::uint64_t first_element_ = 0;
};

template <typename Fn>
bool SlicePlan::for_each_run(std::uint64_t first, std::uint64_t count, Fn&& fn) const {
  if (count == 0) return true;
  const std::size_t n = axes_.size();
  // The run index is a mixed-radix number over the walked axes (the last axis varies fastest).
  std::vector<std::uint64_t> pos(n, 0);
  // The source offset is kept as a wrapping unsigned sum; every value it takes at a visited run is a valid
  // offset inside the tensor (make() checked the extremes), so intermediate wrap-around is harmless.
  std::uint64_t src = base_;
  std::uint64_t index = first;
  for (std::size_t a = n; a-- > 0;) {
    pos[a] = index % axes_[a].count;
    index /= axes_[a].count;
    src += static_cast<std::uint64_t>(axes_[a].step_bytes) * pos[a];
  }
  std::uint64_t dst = first * run_bytes_;
  for (std::uint64_t r = 0; r < count; ++r) {
    if (!fn(SliceRun{src, dst, run_bytes_})) return false;
    dst += run_bytes_;
    for (std::size_t a = n; a-- > 0;) {
      if (++pos[a] < axes_[a].count) {
        src += static_cast<std::uint64_t>(axes_[a].step_bytes);
        break;
      }
      src -= static_cast<std::uint64_t>(axes_[a].step_bytes) * (axes_[a].count - 1);
      pos[a] = 0;
    }
  }
  return true;
}

}  // namespace safetensors

#endif  // SAFETENSORS_SLICE_H_
