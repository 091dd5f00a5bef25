#include "safetensors/slice.h"

#include <algorithm>
#include <string>

#include "util/checked.h"

namespace safetensors {
namespace {

__extension__ typedef __int128 i128;

// One axis of the index expression after normalization.
struct AxisSpec {
  std::uint64_t start;  // first position taken
  std::uint64_t count;  // positions taken
  std::int64_t step;    // distance between positions (any sign, never 0)
  bool keep;            // false for integer indices: the axis is dropped from the result
};

std::string to_str(i128 v) {
  if (v >= INT64_MIN && v <= INT64_MAX) return std::to_string(static_cast<std::int64_t>(v));
  return std::to_string(static_cast<std::uint64_t>(v));
}

// Python's slice.indices(length) followed by the slice's length, computed without overflow.
AxisSpec normalize_range(const SliceIndex& s, std::uint64_t length) {
  const i128 len = length;
  const i128 step = s.step.value_or(1);
  i128 start, stop;
  if (step > 0) {
    start = s.start ? i128(*s.start) : 0;
    stop = s.stop ? i128(*s.stop) : len;
    if (start < 0) start = std::max<i128>(start + len, 0);
    if (stop < 0) stop = std::max<i128>(stop + len, 0);
    start = std::min(start, len);
    stop = std::min(stop, len);
  } else {
    start = s.start ? i128(*s.start) : len - 1;
    stop = s.stop ? i128(*s.stop) : -1;
    if (s.start && start < 0) start = std::max<i128>(start + len, -1);
    if (s.stop && stop < 0) stop = std::max<i128>(stop + len, -1);
    start = std::min(start, len - 1);
    stop = std::min(stop, len - 1);
  }
  i128 count = 0;
  if (step > 0 && stop > start) count = (stop - start + step - 1) / step;
  if (step < 0 && start > stop) count = (start - stop + (-step) - 1) / (-step);
  AxisSpec a;
  a.start = count > 0 ? static_cast<std::uint64_t>(start) : 0;
  a.count = static_cast<std::uint64_t>(count);
  // With at most one position the step is never taken: 1 lets the axis join a contiguous run (a sub-byte
  // tensor's x[:, ::-1, :] over a length-1 axis is the whole tensor, not a misaligned slice).
  a.step = count > 1 ? static_cast<std::int64_t>(step) : 1;
  a.keep = true;
  return a;
}

}  // namespace

Result<SlicePlan> SlicePlan::make(Dtype dtype, std::span<const std::uint64_t> shape,
                                  std::span<const SliceIndex> indices, std::string_view context,
                                  std::string_view tensor) {
  auto slice_error = [&](std::string detail) { return Error::invalid_slice(context, tensor, detail); };
  const std::size_t ndim = shape.size();

  std::size_t ellipses = 0;
  for (const SliceIndex& ix : indices) ellipses += ix.kind == SliceIndex::Kind::kEllipsis;
  if (ellipses > 1) return slice_error("an index can only have a single ellipsis ('...')");
  const std::size_t explicit_axes = indices.size() - ellipses;
  if (explicit_axes > ndim) {
    return slice_error("too many indices for tensor: tensor is " + std::to_string(ndim) + "-dimensional, but " +
                       std::to_string(explicit_axes) + " were indexed");
  }

  auto numel = internal::checked_product(shape);
  const std::uint32_t bits = dtype_bits(dtype);
  if (!numel || !internal::checked_mul(*numel, bits)) return Error::validation_overflow(context, tensor);

  // Expand the Ellipsis (or the missing trailing indices) into full ranges and normalize every axis.
  std::vector<AxisSpec> axes;
  axes.reserve(ndim);
  auto push_full = [&](std::size_t n) {
    for (std::size_t i = 0; i < n; ++i) axes.push_back({0, shape[axes.size()], 1, true});
  };
  for (const SliceIndex& ix : indices) {
    switch (ix.kind) {
      case SliceIndex::Kind::kEllipsis: push_full(ndim - explicit_axes); break;
      case SliceIndex::Kind::kIndex: {
        const std::size_t d = axes.size();
        const i128 len = shape[d];
        i128 i = ix.index;
        if (i < 0) i += len;
        if (i < 0 || i >= len) {
          return slice_error("index " + std::to_string(ix.index) + " is out of bounds for axis " + std::to_string(d) +
                             " with size " + to_str(len));
        }
        axes.push_back({static_cast<std::uint64_t>(i), 1, 1, false});
        break;
      }
      case SliceIndex::Kind::kRange:
        if (ix.step && *ix.step == 0) return slice_error("slice step cannot be zero");
        axes.push_back(normalize_range(ix, shape[axes.size()]));
        break;
    }
  }
  push_full(ndim - axes.size());

  // Element strides (row-major). Bounded by numel, which fits.
  std::vector<std::uint64_t> stride(ndim, 1);
  for (std::size_t d = ndim; d-- > 1;) stride[d - 1] = stride[d] * shape[d];

  SlicePlan plan;
  plan.dtype_ = dtype;
  std::uint64_t out_numel = 1;
  i128 first = 0;
  // A tensor with no elements has no element to start at: its strides are products that may have wrapped
  // (a 0 in front of huge axes), and an index into a huge axis times one of them overflows even 128 bits.
  const bool no_elements = *numel == 0;
  for (std::size_t d = 0; d < ndim; ++d) {
    const AxisSpec& a = axes[d];
    // a.start < shape[d] where count > 0: the sum stays below numel.
    if (!no_elements) first += i128(a.start) * stride[d];
    if (a.keep) {
      plan.shape_.push_back(a.count);
      // |step| < shape[d] where count > 1 (else 1), so |step * stride| <= numel.
      const i128 view_stride = no_elements ? 0 : i128(a.step) * stride[d];
      if (view_stride > INT64_MAX || view_stride < INT64_MIN) return slice_error("step too large");
      plan.strides_.push_back(static_cast<std::int64_t>(view_stride));
    }
    out_numel *= a.count;  // <= numel: cannot overflow
  }
  plan.first_element_ = static_cast<std::uint64_t>(first);
  if (out_numel == 0) return plan;

  // The run: trailing axes taken whole form a contiguous block; the next axis inward-out extends the run when
  // it has step 1, and is walked otherwise.
  std::size_t k = ndim;  // axes [k, ndim) are taken whole
  std::uint64_t block = 1;
  while (k > 0 && axes[k - 1].start == 0 && axes[k - 1].step == 1 && axes[k - 1].count == shape[k - 1]) {
    --k;
    block *= shape[k];
  }
  std::uint64_t run_elems = block;
  std::size_t walked = k;  // axes [0, walked) are iterated
  if (k > 0 && axes[k - 1].step == 1) {
    run_elems = axes[k - 1].count * block;
    walked = k - 1;
  }

  i128 base_elem = 0;
  for (std::size_t d = 0; d < ndim && d < k; ++d) base_elem += i128(axes[d].start) * stride[d];
  const i128 bits128 = bits;
  bool aligned = (base_elem * bits128) % 8 == 0 && (i128(run_elems) * bits128) % 8 == 0;

  plan.run_bytes_ = static_cast<std::uint64_t>(i128(run_elems) * bits128 / 8);
  plan.base_ = static_cast<std::uint64_t>(base_elem * bits128 / 8);
  plan.run_count_ = 1;
  i128 lowest = plan.base_, highest = plan.base_;
  for (std::size_t d = 0; d < walked; ++d) {
    const AxisSpec& a = axes[d];
    if (a.count <= 1) continue;
    const i128 step_bits = i128(a.step) * stride[d] * bits128;
    if (step_bits % 8 != 0) aligned = false;
    const i128 step_bytes = step_bits / 8;
    if (step_bytes > INT64_MAX || step_bytes < INT64_MIN) return slice_error("step too large");
    plan.axes_.push_back({a.count, static_cast<std::int64_t>(step_bytes)});
    plan.run_count_ *= a.count;
    (step_bytes < 0 ? lowest : highest) += step_bytes * i128(a.count - 1);
  }
  if (!aligned) return Error::misaligned_slice(context, tensor);
  plan.source_begin_ = static_cast<std::uint64_t>(lowest);
  plan.source_end_ = static_cast<std::uint64_t>(highest) + plan.run_bytes_;
  plan.nbytes_ = plan.run_bytes_ * plan.run_count_;
  plan.whole_ = plan.run_count_ == 1 && plan.base_ == 0 && out_numel == *numel;
  return plan;
}

}  // namespace safetensors
