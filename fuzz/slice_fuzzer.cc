// Slicing: an arbitrary dtype, shape and index expression decoded from the fuzz bytes, planned with
// File::plan_slice and read with File::read_slice (from a mapping and with positional reads), checked against
// a plain element-by-element evaluation of numpy's indexing rules.
//
// Input layout (ByteReader): mode, dtype, ndim, the dims, the index count, then per index a tag and its
// values. In the small mode (mode < 0x80) dims are 0..6 and the tensor is written to a real file and read
// back; in the huge mode dims may be any 64-bit value and only SlicePlan::make runs, to exercise the
// overflow paths of the arithmetic.
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "fuzz_util.h"
#include "safetensors/file.h"
#include "safetensors/slice.h"
#include "safetensors/source.h"
#include "safetensors/testing.h"
#include "safetensors/writer.h"

namespace safetensors::fuzz {
namespace {

__extension__ typedef __int128 i128;

struct Case {
  Dtype dtype = Dtype::kU8;
  std::vector<std::uint64_t> shape;
  std::vector<SliceIndex> indices;
};

Case decode(ByteReader& r, bool huge) {
  Case c;
  c.dtype = kDtypeTable[r.u8() % kDtypeTable.size()].dtype;
  const unsigned ndim = r.u8() % 5;
  for (unsigned d = 0; d < ndim; ++d) {
    if (!huge) {
      c.shape.push_back(r.u8() % 7);
    } else {
      const std::uint8_t tag = r.u8();
      c.shape.push_back(tag < 0x80 ? tag % 9 : tag < 0xc0 ? r.u64() >> (tag % 64) : r.u64());
    }
  }
  const unsigned count = r.u8() % (ndim + 3);
  for (unsigned i = 0; i < count; ++i) {
    const std::uint8_t tag = r.u8() % 8;
    if (tag < 3) {
      c.indices.push_back(SliceIndex::at(r.i64()));
    } else if (tag < 7) {
      const std::uint8_t present = r.u8();
      std::optional<std::int64_t> start, stop, step;
      if (present & 1) start = r.i64();
      if (present & 2) stop = r.i64();
      if (present & 4) step = r.i64();
      c.indices.push_back(SliceIndex::range(start, stop, step));
    } else {
      c.indices.push_back(SliceIndex::ellipsis());
    }
  }
  return c;
}

// One axis of the expected result: positions start, start + step, ... (count of them).
struct Axis {
  i128 start = 0;
  i128 count = 0;
  i128 step = 1;
  bool keep = true;
};

enum class Outcome { kOk, kInvalidSlice, kOverflow };

struct Expected {
  Outcome outcome = Outcome::kOk;
  std::vector<Axis> axes;
  std::vector<std::uint64_t> shape;  // kept axes' counts
  i128 numel = 1;                    // elements in the result
};

// Python's slice.indices(length) for one axis (the algorithm the Python data model documents), then the
// number of positions it visits.
Axis python_range(const SliceIndex& s, std::uint64_t length) {
  const i128 len = length;
  const i128 step = s.step.value_or(1);
  const i128 lower = step < 0 ? -1 : 0;
  const i128 upper = step < 0 ? len - 1 : len;
  auto adjust = [&](std::optional<std::int64_t> v, i128 dflt) -> i128 {
    if (!v) return dflt;
    i128 x = *v;
    if (x < 0) {
      x += len;
      if (x < lower) x = lower;
    } else if (x > upper) {
      x = upper;
    }
    return x;
  };
  const i128 start = adjust(s.start, step < 0 ? upper : lower);
  const i128 stop = adjust(s.stop, step < 0 ? lower : upper);
  Axis a;
  a.start = start;
  a.step = step;
  if (step > 0 && stop > start) a.count = (stop - start - 1) / step + 1;
  if (step < 0 && start > stop) a.count = (start - stop - 1) / (-step) + 1;
  return a;
}

Expected evaluate(const Case& c) {
  Expected e;
  const std::size_t ndim = c.shape.size();
  std::size_t ellipses = 0;
  for (const SliceIndex& ix : c.indices) ellipses += ix.kind == SliceIndex::Kind::kEllipsis;
  const std::size_t explicit_axes = c.indices.size() - ellipses;
  if (ellipses > 1 || explicit_axes > ndim) {
    e.outcome = Outcome::kInvalidSlice;
    return e;
  }
  // As the format defines it: the running product of the dims, then times the bit size, each within 64 bits.
  u128 numel = 1;
  bool overflow = false;
  for (std::uint64_t d : c.shape) {
    numel *= d;
    overflow |= numel > UINT64_MAX;
    if (overflow) break;
  }
  if (overflow || numel * dtype_bits(c.dtype) > UINT64_MAX) {
    e.outcome = Outcome::kOverflow;
    return e;
  }
  for (const SliceIndex& ix : c.indices) {
    if (ix.kind == SliceIndex::Kind::kEllipsis) {
      for (std::size_t k = 0; k < ndim - explicit_axes; ++k) {
        e.axes.push_back({0, c.shape[e.axes.size()], 1, true});
      }
    } else if (ix.kind == SliceIndex::Kind::kIndex) {
      const i128 len = c.shape[e.axes.size()];
      const i128 i = ix.index < 0 ? ix.index + len : ix.index;
      if (i < 0 || i >= len) {
        e.outcome = Outcome::kInvalidSlice;
        return e;
      }
      e.axes.push_back({i, 1, 1, false});
    } else {
      if (ix.step && *ix.step == 0) {
        e.outcome = Outcome::kInvalidSlice;
        return e;
      }
      e.axes.push_back(python_range(ix, c.shape[e.axes.size()]));
    }
  }
  while (e.axes.size() < ndim) e.axes.push_back({0, c.shape[e.axes.size()], 1, true});
  for (const Axis& a : e.axes) {
    if (a.keep) e.shape.push_back(static_cast<std::uint64_t>(a.count));
    e.numel *= a.count;
  }
  return e;
}

// Source element index of every result element, in result (row-major) order.
std::vector<std::uint64_t> source_elements(const Case& c, const Expected& e) {
  const std::size_t ndim = c.shape.size();
  std::vector<std::uint64_t> stride(ndim, 1);
  for (std::size_t d = ndim; d-- > 1;) stride[d - 1] = stride[d] * c.shape[d];
  std::vector<std::uint64_t> out;
  if (e.numel == 0) return out;
  std::vector<i128> pos(ndim, 0);
  for (;;) {
    i128 elem = 0;
    for (std::size_t d = 0; d < ndim; ++d) elem += (e.axes[d].start + pos[d] * e.axes[d].step) * i128(stride[d]);
    out.push_back(static_cast<std::uint64_t>(elem));
    std::size_t d = ndim;
    while (d > 0 && ++pos[d - 1] == e.axes[d - 1].count) pos[--d] = 0;
    if (d == 0) break;
  }
  return out;
}

// True when every maximal run of consecutive source elements (in result order) starts and ends on a byte
// boundary: exactly then the result can be copied as whole bytes.
bool byte_aligned(const std::vector<std::uint64_t>& elems, std::uint32_t bits) {
  if (bits % 8 == 0) return true;
  std::size_t i = 0;
  while (i < elems.size()) {
    std::size_t j = i + 1;
    while (j < elems.size() && elems[j] == elems[j - 1] + 1) ++j;
    if ((elems[i] * bits) % 8 != 0 || ((j - i) * bits) % 8 != 0) return false;
    i = j;
  }
  return true;
}

// Element `k` of a packed bit stream (least significant bit first within each byte).
void copy_bits(std::span<const std::byte> src, std::uint64_t src_elem, std::span<std::byte> dst, std::uint64_t dst_elem,
               std::uint32_t bits) {
  for (std::uint32_t b = 0; b < bits; ++b) {
    const std::uint64_t s = src_elem * bits + b, d = dst_elem * bits + b;
    const bool bit = (std::to_integer<unsigned>(src[s / 8]) >> (s % 8)) & 1u;
    if (bit) dst[d / 8] |= std::byte(1u << (d % 8));
  }
}

std::uint64_t splitmix(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

std::string describe(const Case& c) {
  std::string s = std::string(dtype_code(c.dtype)) + " [";
  for (std::uint64_t d : c.shape) s += std::to_string(d) + ",";
  s += "] [";
  auto opt = [](const std::optional<std::int64_t>& v) { return v ? std::to_string(*v) : std::string(); };
  for (const SliceIndex& ix : c.indices) {
    if (ix.kind == SliceIndex::Kind::kIndex) s += std::to_string(ix.index);
    if (ix.kind == SliceIndex::Kind::kRange) s += opt(ix.start) + ":" + opt(ix.stop) + ":" + opt(ix.step);
    if (ix.kind == SliceIndex::Kind::kEllipsis) s += "...";
    s += ", ";
  }
  return s + "]";
}

// Invariants of any successful plan: sizes are consistent and every run lies inside the tensor's bytes.
void check_plan_shape(const SlicePlan& p, const Case& c, const Expected& e) {
  const std::string what = describe(c);
  FUZZ_CHECK(p.shape() == e.shape, "result shape of " + what);
  const i128 bits = e.numel * dtype_bits(c.dtype);
  FUZZ_CHECK(bits % 8 == 0 && i128(p.nbytes()) == bits / 8, "nbytes of " + what);
  FUZZ_CHECK(i128(p.run_count()) * p.run_length() == i128(p.nbytes()), "runs do not add up for " + what);
  i128 tensor_bits = dtype_bits(c.dtype);
  for (std::uint64_t d : c.shape) tensor_bits *= d;
  FUZZ_CHECK(i128(p.source_end()) * 8 <= tensor_bits + 7, "plan reads past the tensor for " + what);
  FUZZ_CHECK(p.nbytes() == 0 || p.source_begin() < p.source_end(), "empty source range for " + what);
  if (p.run_count() > 4096) return;
  std::uint64_t next_dst = 0;
  p.for_each_run([&](const SliceRun& r) {
    FUZZ_CHECK(r.dest_offset == next_dst && r.length == p.run_length(), "run layout of " + what);
    FUZZ_CHECK(r.source_offset >= p.source_begin() && r.source_offset + r.length <= p.source_end(),
               "run outside [source_begin, source_end) for " + what);
    next_dst += r.length;
    return true;
  });
  FUZZ_CHECK(next_dst == p.nbytes(), "runs do not fill the result of " + what);
}

// Huge shapes: only the plan is checked, without reading or enumerating elements.
void check_huge(const Case& c, const Expected& e) {
  auto plan = SlicePlan::make(c.dtype, c.shape, c.indices, "<fuzz>", "t");
  const std::string what = describe(c);
  if (e.outcome == Outcome::kInvalidSlice) {
    FUZZ_CHECK(!plan.ok() && plan.error().kind() == Error::Kind::kInvalidSlice, "expected kInvalidSlice: " + what);
    return;
  }
  if (e.outcome == Outcome::kOverflow) {
    FUZZ_CHECK(!plan.ok() && plan.error().kind() == Error::Kind::kValidationOverflow, "expected overflow: " + what);
    return;
  }
  if (!plan.ok()) {
    const auto k = plan.error().kind();
    // Sub-byte alignment is only judged by enumeration (small mode); a byte stride above 2^63 is refused.
    FUZZ_CHECK((k == Error::Kind::kMisalignedSlice && dtype_bits(c.dtype) % 8 != 0) || k == Error::Kind::kInvalidSlice,
               plan.error().to_string() + " for " + what);
    return;
  }
  check_plan_shape(*plan, c, e);
}

void check_small(const Case& c, const Expected& e) {
  const std::string what = describe(c);
  const std::uint32_t bits = dtype_bits(c.dtype);
  std::uint64_t numel = 1;
  for (std::uint64_t d : c.shape) numel *= d;
  if (numel * bits % 8 != 0) {
    // Not a whole number of bytes: no file can hold it; the planner must still not misbehave.
    auto plan = SlicePlan::make(c.dtype, c.shape, c.indices, "<fuzz>", "t");
    if (plan.ok()) FUZZ_CHECK(e.outcome == Outcome::kOk, "plan accepted an invalid slice: " + what);
    return;
  }
  auto data = std::make_shared<std::vector<std::byte>>(numel * bits / 8);
  for (std::size_t i = 0; i < data->size(); ++i) (*data)[i] = static_cast<std::byte>(splitmix(i) & 0xff);
  TensorData td{"t", c.dtype, c.shape, *data};
  auto bytes = serialize(std::span<const TensorData>(&td, 1));
  FUZZ_CHECK(bytes.ok(), bytes.error().to_string());
  auto owner = std::make_shared<std::vector<std::byte>>(std::move(bytes).value());
  auto mem = memory_source(*owner, owner, "<fuzz>");
  auto hidden = std::make_shared<testing::FaultySource>(mem);
  hidden->hide_mapping = true;
  for (const auto& source : {mem, std::shared_ptr<const Source>(hidden)}) {
    auto file = File::open(source);
    FUZZ_CHECK(file.ok(), file.error().to_string());
    const TensorInfo& t = file->tensors().at(0);
    auto plan = file->plan_slice(t, c.indices);
    if (e.outcome == Outcome::kInvalidSlice) {
      FUZZ_CHECK(!plan.ok() && plan.error().kind() == Error::Kind::kInvalidSlice, "expected kInvalidSlice: " + what);
      check_error_text(plan.error());
      continue;
    }
    FUZZ_CHECK(e.outcome == Outcome::kOk, "overflow in a small tensor");
    const auto elems = source_elements(c, e);
    if (!byte_aligned(elems, bits)) {
      FUZZ_CHECK(!plan.ok() && plan.error().kind() == Error::Kind::kMisalignedSlice,
                 "expected kMisalignedSlice: " + what);
      continue;
    }
    FUZZ_CHECK(plan.ok(), plan.error().to_string() + " for " + what);
    check_plan_shape(*plan, c, e);
    std::vector<std::byte> want(plan->nbytes());
    for (std::size_t k = 0; k < elems.size(); ++k) copy_bits(*data, elems[k], want, k, bits);
    std::vector<std::byte> got(plan->nbytes(), std::byte{0xee});
    auto st = file->read_slice(t, *plan, got);
    FUZZ_CHECK(st.ok(), st.error().to_string());
    FUZZ_CHECK(same_bytes(got, want), "slice bytes differ for " + what);
  }
}

}  // namespace
}  // namespace safetensors::fuzz

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace safetensors::fuzz;
  ByteReader r(data, size);
  const bool huge = r.u8() >= 0x80;
  const Case c = decode(r, huge);
  const Expected e = evaluate(c);
  if (huge) {
    check_huge(c, e);
  } else {
    check_small(c, e);
  }
  return 0;
}
