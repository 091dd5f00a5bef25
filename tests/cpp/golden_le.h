// A golden file for byte order: one tensor of every multi-byte dtype (and a few single-byte ones), each with
// its values as this host holds them and, spelled out by hand, the little-endian bytes the format stores.
// Shared by big_endian_test (both directions on one host) and cross_host_file (a file written on one
// host and checked on the other, e.g. x86-64 and s390x under qemu: scripts/test.d/60-big-endian.sh).
#ifndef SAFETENSORS_TESTS_GOLDEN_LE_H_
#define SAFETENSORS_TESTS_GOLDEN_LE_H_

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "safetensors/dtype.h"
#include "safetensors/writer.h"

namespace safetensors::test {

struct GoldenTensor {
  std::string name;
  Dtype dtype;
  std::vector<std::uint64_t> shape;
  std::vector<std::byte> native;  // the values in this host's byte order
  std::string file_bytes;         // the same values as the file holds them (little-endian)
};

template <typename T>
std::vector<std::byte> native_bytes(std::initializer_list<T> values) {
  std::vector<std::byte> out(values.size() * sizeof(T));
  std::size_t at = 0;
  for (const T& v : values) {
    std::memcpy(out.data() + at, &v, sizeof(T));
    at += sizeof(T);
  }
  return out;
}

inline std::vector<GoldenTensor> golden_tensors() {
  using std::string_literals::operator""s;
  return {
      {"u64", Dtype::kU64, {1}, native_bytes<std::uint64_t>({0x0102030405060708}), "\x08\x07\x06\x05\x04\x03\x02\x01"s},
      {"i64",
       Dtype::kI64,
       {2},
       native_bytes<std::int64_t>({-2, 0x1122334455667788}),
       "\xfe\xff\xff\xff\xff\xff\xff\xff\x88\x77\x66\x55\x44\x33\x22\x11"s},
      {"f64", Dtype::kF64, {1}, native_bytes<double>({-1.5}), "\x00\x00\x00\x00\x00\x00\xf8\xbf"s},
      // C64: two F32 halves (real, imaginary), each little-endian on its own.
      {"c64", Dtype::kC64, {1}, native_bytes<float>({1.0f, -2.0f}), "\x00\x00\x80\x3f\x00\x00\x00\xc0"s},
      {"f32", Dtype::kF32, {2}, native_bytes<float>({0.5f, 3.0f}), "\x00\x00\x00\x3f\x00\x00\x40\x40"s},
      {"u32", Dtype::kU32, {1}, native_bytes<std::uint32_t>({0xA1B2C3D4}), "\xd4\xc3\xb2\xa1"s},
      {"i32",
       Dtype::kI32,
       {3, 1},
       native_bytes<std::int32_t>({1, -1, 0x01020304}),
       "\x01\x00\x00\x00\xff\xff\xff\xff\x04\x03\x02\x01"s},
      // BF16 1.0 and -3.0, F16 1.0: their bit patterns as 16-bit integers.
      {"bf16", Dtype::kBF16, {2}, native_bytes<std::uint16_t>({0x3F80, 0xC040}), "\x80\x3f\x40\xc0"s},
      {"f16", Dtype::kF16, {1}, native_bytes<std::uint16_t>({0x3C00}), "\x00\x3c"s},
      {"u16", Dtype::kU16, {1}, native_bytes<std::uint16_t>({0xBEEF}), "\xef\xbe"s},
      {"i16", Dtype::kI16, {2}, native_bytes<std::int16_t>({-2, 0x0102}), "\xfe\xff\x02\x01"s},
      {"u8", Dtype::kU8, {3}, native_bytes<std::uint8_t>({1, 2, 3}), "\x01\x02\x03"s},
      {"f4", Dtype::kF4, {2}, native_bytes<std::uint8_t>({0x21}), "\x21"s},
      {"bool", Dtype::kBool, {2}, native_bytes<std::uint8_t>({1, 0}), "\x01\x00"s},
  };
}

inline std::vector<TensorData> golden_data(const std::vector<GoldenTensor>& golden) {
  std::vector<TensorData> out;
  for (const GoldenTensor& g : golden) out.push_back({g.name, g.dtype, g.shape, g.native});
  return out;
}

}  // namespace safetensors::test

#endif  // SAFETENSORS_TESTS_GOLDEN_LE_H_
