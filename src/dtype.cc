#include "safetensors/dtype.h"

#include <array>

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

}  // namespace

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

}  // namespace safetensors
