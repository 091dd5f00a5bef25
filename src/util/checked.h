// Overflow-checked arithmetic on sizes and offsets that come from files or callers.
#ifndef SAFETENSORS_SRC_UTIL_CHECKED_H_
#define SAFETENSORS_SRC_UTIL_CHECKED_H_

#include <cstdint>
#include <optional>
#include <span>

namespace safetensors::internal {

inline std::optional<std::uint64_t> checked_add(std::uint64_t a, std::uint64_t b) {
  std::uint64_t r;
  if (__builtin_add_overflow(a, b, &r)) return std::nullopt;
  return r;
}

inline std::optional<std::uint64_t> checked_mul(std::uint64_t a, std::uint64_t b) {
  std::uint64_t r;
  if (__builtin_mul_overflow(a, b, &r)) return std::nullopt;
  return r;
}

// Product of `dims` (1 for none), or nullopt on overflow.
inline std::optional<std::uint64_t> checked_product(std::span<const std::uint64_t> dims) {
  std::uint64_t r = 1;
  for (std::uint64_t d : dims) {
    if (__builtin_mul_overflow(r, d, &r)) return std::nullopt;
  }
  return r;
}

// Bytes needed for `numel` elements of `bits` bits each: nullopt on overflow; sets *aligned to whether the
// bit count is a whole number of bytes.
inline std::optional<std::uint64_t> checked_nbytes(std::uint64_t numel, std::uint32_t bits, bool* aligned) {
  auto total_bits = checked_mul(numel, bits);
  if (!total_bits) return std::nullopt;
  *aligned = (*total_bits % 8) == 0;
  return *total_bits / 8;
}

}  // namespace safetensors::internal

#endif  // SAFETENSORS_SRC_UTIL_CHECKED_H_
