// A flat open-addressing index from tensor name to position, built once per File. No per-entry allocation:
// 20k names cost one array of 64K uint64 slots.
#ifndef SAFETENSORS_SRC_FORMAT_NAME_INDEX_H_
#define SAFETENSORS_SRC_FORMAT_NAME_INDEX_H_

#include <bit>
#include <cstdint>
#include <cstring>
#include <string_view>
#include <vector>

namespace safetensors::internal {

// 64-bit hash of a short string: 8 bytes at a time, then a final avalanche.
inline std::uint64_t hash_name(std::string_view s) {
  std::uint64_t h = 0x9E3779B97F4A7C15ull ^ (s.size() * 0xff51afd7ed558ccdull);
  const char* p = s.data();
  std::size_t n = s.size();
  while (n >= 8) {
    std::uint64_t w;
    std::memcpy(&w, p, 8);
    h = (h ^ (w * 0x87c37b91114253d5ull)) * 0x4cf5ad432745937full;
    h = std::rotl(h, 31);
    p += 8;
    n -= 8;
  }
  std::uint64_t tail = 0;
  std::memcpy(&tail, p, n);
  h ^= tail * 0x87c37b91114253d5ull;
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdull;
  h ^= h >> 33;
  h *= 0xc4ceb9fe1a85ec53ull;
  h ^= h >> 33;
  return h;
}

class NameIndex {
 public:
  // Indexes names(0..n-1). Returns the position of the first name that repeats an earlier one, or n.
  template <typename NameAt>
  std::size_t build(std::size_t n, NameAt&& name_at) {
    std::size_t cap = 16;
    while (cap < 2 * n) cap <<= 1;
    slots_.assign(cap, 0);
    mask_ = cap - 1;
    for (std::size_t i = 0; i < n; ++i) {
      const std::string_view name = name_at(i);
      const std::uint64_t h = hash_name(name);
      const std::uint64_t tag = h & kTagMask;
      for (std::size_t s = h & mask_;; s = (s + 1) & mask_) {
        const std::uint64_t v = slots_[s];
        if (v == 0) {
          slots_[s] = tag | (i + 1);
          break;
        }
        if ((v & kTagMask) == tag && name_at((v & kPositionMask) - 1) == name) return i;
      }
    }
    return n;
  }

  // Position of `name`, or -1.
  template <typename NameAt>
  std::int64_t find(std::string_view name, NameAt&& name_at) const {
    if (slots_.empty()) return -1;
    const std::uint64_t h = hash_name(name);
    const std::uint64_t tag = h & kTagMask;
    for (std::size_t s = h & mask_;; s = (s + 1) & mask_) {
      const std::uint64_t v = slots_[s];
      if (v == 0) return -1;
      if ((v & kTagMask) == tag) {
        const std::size_t i = (v & kPositionMask) - 1;
        if (name_at(i) == name) return static_cast<std::int64_t>(i);
      }
    }
  }

 private:
  // A slot holds the high 32 bits of the name's hash (its tag: a probe compares names only when tags match)
  // and position + 1 in the low 32; 0 = empty. The low bits of the hash choose the slot.
  static constexpr std::uint64_t kTagMask = 0xFFFFFFFF00000000ull;
  static constexpr std::uint64_t kPositionMask = 0xFFFFFFFFull;
  std::vector<std::uint64_t> slots_;
  std::size_t mask_ = 0;
};

}  // namespace safetensors::internal

#endif  // SAFETENSORS_SRC_FORMAT_NAME_INDEX_H_
