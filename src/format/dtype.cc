#include "safetensors/dtype.h"

#include <algorithm>
#include <array>
#include <cassert>
#include <cstring>
#include <limits>
#include <string>

namespace safetensors {

namespace {

// Codes bucketed by length and last character, built from the table at compile time: a lookup compares at
// most a couple of candidates (it runs once per tensor of every header).
constexpr std::size_t kMaxCodeLength = 12;
struct CodeIndex {
  std::array<std::array<std::int8_t, 4>, (kMaxCodeLength + 1) * 16> buckets{};
  constexpr CodeIndex() {
    for (auto& b : buckets) b.fill(-1);
    for (std::size_t i = 0; i < kDtypeTable.size(); ++i) {
      const std::string_view c = kDtypeTable[i].code;
      auto& b = buckets[slot(c)];
      std::size_t k = 0;
      while (b[k] != -1) ++k;  // a full bucket fails constant evaluation (index out of range)
      b[k] = static_cast<std::int8_t>(i);
    }
  }
  static constexpr std::size_t slot(std::string_view c) {
    return c.size() * 16 + (static_cast<unsigned char>(c.back()) & 15);
  }
};
constexpr CodeIndex kCodeIndex;

// One unit of W bytes, reversed. memcpy in and out: the units need not be aligned.
template <unsigned W>
void reverse_unit(const std::byte* in, std::byte* out) {
  if constexpr (W == 2) {
    std::uint16_t v;
    std::memcpy(&v, in, 2);
    v = __builtin_bswap16(v);
    std::memcpy(out, &v, 2);
  } else if constexpr (W == 4) {
    std::uint32_t v;
    std::memcpy(&v, in, 4);
    v = __builtin_bswap32(v);
    std::memcpy(out, &v, 4);
  } else {
    static_assert(W == 8);
    std::uint64_t v;
    std::memcpy(&v, in, 8);
    v = __builtin_bswap64(v);
    std::memcpy(out, &v, 8);
  }
}

template <unsigned W>
void reverse_units(const std::byte* in, std::byte* out, std::size_t n) {
  for (std::size_t i = 0; i + W <= n; i += W) reverse_unit<W>(in + i, out + i);
}

void reverse(const std::byte* in, std::byte* out, std::size_t n, unsigned width) {
  assert((width == 0 || n % width == 0) && "byte swap of a partial unit");
  switch (width) {
    case 2: return reverse_units<2>(in, out, n);
    case 4: return reverse_units<4>(in, out, n);
    case 8: return reverse_units<8>(in, out, n);
    default:
      assert(width <= 1 && "byte swap width must be 0, 1, 2, 4 or 8");
      if (in != out && n != 0) std::memcpy(out, in, n);
  }
}

}  // namespace

void byteswap_units(std::span<std::byte> bytes, unsigned width) {
  reverse(bytes.data(), bytes.data(), bytes.size(), width);
}

void byteswap_copy(std::span<const std::byte> src, std::span<std::byte> dst, unsigned width) {
  assert(src.size() == dst.size());
  reverse(src.data(), dst.data(), std::min(src.size(), dst.size()), width);
}

std::optional<Dtype> dtype_from_code(std::string_view code) {
  if (code.empty() || code.size() > kMaxCodeLength) return std::nullopt;
  for (std::int8_t i : kCodeIndex.buckets[CodeIndex::slot(code)]) {
    if (i < 0) break;
    if (kDtypeTable[static_cast<std::size_t>(i)].code == code) return kDtypeTable[static_cast<std::size_t>(i)].dtype;
  }
  return std::nullopt;
}

std::optional<Dtype> dtype_from_torch_name(std::string_view name) {
  if (name.empty()) return std::nullopt;
  for (const DtypeInfo& row : kDtypeTable) {
    if (row.torch_name == name) return row.dtype;
  }
  return std::nullopt;
}

namespace {

std::string shape_text(std::span<const std::uint64_t> shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

}  // namespace

Result<std::vector<std::uint64_t>> torch_shape(Dtype d, std::span<const std::uint64_t> shape) {
  const DtypeInfo& row = dtype_info(d);
  std::vector<std::uint64_t> out(shape.begin(), shape.end());
  if (row.torch_pack == 1) return out;
  if (out.empty() || out.back() % row.torch_pack != 0) {
    return Error::invalid_argument(
        "", "cannot represent an " + std::string(row.code) + " tensor of shape " + shape_text(shape) + " as torch." +
                std::string(row.torch_name) + ", which packs " + std::to_string(row.torch_pack) +
                " values per element of the last dimension (it must be " +
                (row.torch_pack == 2 ? std::string("even)") : "a multiple of " + std::to_string(row.torch_pack) + ")"));
  }
  out.back() /= row.torch_pack;
  return out;
}

Result<std::vector<std::uint64_t>> header_shape(Dtype d, std::span<const std::uint64_t> shape) {
  const DtypeInfo& row = dtype_info(d);
  std::vector<std::uint64_t> out(shape.begin(), shape.end());
  if (row.torch_pack == 1) return out;
  if (out.empty()) {
    return Error::invalid_argument(
        "", "a torch." + std::string(row.torch_name) + " scalar packs " + std::to_string(row.torch_pack) +
                " values, which the format can only store with a shape (reshape it to (1,))");
  }
  if (out.back() > std::numeric_limits<std::uint64_t>::max() / row.torch_pack) {
    return Error::invalid_argument("", "a torch." + std::string(row.torch_name) + " last dimension of " +
                                           std::to_string(out.back()) + " is too large to unpack");
  }
  out.back() *= row.torch_pack;
  return out;
}

}  // namespace safetensors
