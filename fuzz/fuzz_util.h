// Shared pieces of the fuzz harnesses: a checked-abort macro, a reader that decodes structured values from
// the fuzz bytes, and the independent recomputations the harnesses compare the library against.
//
// A harness aborts (so libFuzzer and the replay driver report a crash) on anything that is not an expected
// Error value: a wrong error kind, a mismatch between two paths that must agree, or bytes that differ from
// what the input says they are.
#ifndef SAFETENSORS_FUZZ_FUZZ_UTIL_H_
#define SAFETENSORS_FUZZ_FUZZ_UTIL_H_

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "safetensors/dtype.h"
#include "safetensors/error.h"
#include "safetensors/file.h"

namespace safetensors::fuzz {

[[noreturn]] inline void fail(const char* file, int line, const char* cond, const std::string& what) {
  std::fprintf(stderr, "%s:%d: FUZZ_CHECK(%s) failed: %s\n", file, line, cond, what.c_str());
  std::abort();
}

// FUZZ_CHECK(cond, what): aborts with `what` (a std::string expression, evaluated only on failure).
#define FUZZ_CHECK(cond, what)                                                 \
  do {                                                                         \
    if (!(cond)) ::safetensors::fuzz::fail(__FILE__, __LINE__, #cond, (what)); \
  } while (0)

inline std::span<const std::byte> as_bytes(const std::uint8_t* data, std::size_t size) {
  return {reinterpret_cast<const std::byte*>(data), size};
}

inline bool same_bytes(std::span<const std::byte> a, std::span<const std::byte> b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size()) == 0);
}

// Whole `dtype` elements in the file's byte order as this host's values, as reads into caller memory give them.
inline std::vector<std::byte> native_copy(std::span<const std::byte> file_bytes, Dtype dtype) {
  std::vector<std::byte> out(file_bytes.begin(), file_bytes.end());
  swap_to_native(dtype, out);
  return out;
}

// The kinds File::open may return for bytes held in memory: the format's own failures (COMPAT.md section 2).
// A memory source never fails a read, so kIo, kInvalidArgument and the rest are bugs there.
inline bool is_format_error(Error::Kind k) {
  switch (k) {
    case Error::Kind::kHeaderTooSmall:
    case Error::Kind::kHeaderTooLarge:
    case Error::Kind::kInvalidHeaderLength:
    case Error::Kind::kInvalidHeaderUtf8:
    case Error::Kind::kInvalidHeaderJson:
    case Error::Kind::kInvalidOffset:
    case Error::Kind::kValidationOverflow:
    case Error::Kind::kMisalignedSlice:
    case Error::Kind::kTensorInvalidInfo:
    case Error::Kind::kMetadataIncompleteBuffer: return true;
    default: return false;
  }
}

// Every error's text must be non-empty and carry its variant token.
inline void check_error_text(const Error& e) {
  const std::string text = e.to_string();
  FUZZ_CHECK(!e.message().empty(), text);
  FUZZ_CHECK(text.find(std::string("(") + std::string(e.token()) + ")") != std::string::npos, text);
}

__extension__ typedef unsigned __int128 u128;

// The invariants of a File that open() accepted, recomputed here without the library's helpers:
// tensors tile the data buffer in file order, each spans exactly numel * bits / 8 bytes, names are unique
// and found by find(), keys() is sorted, and metadata keys are unique.
inline void check_file_invariants(const File& f, std::uint64_t input_size) {
  FUZZ_CHECK(f.size() == input_size, "size");
  FUZZ_CHECK(f.data_offset() == 8 + f.header_length(), "data_offset");
  FUZZ_CHECK(f.data_offset() <= f.size(), "data_offset past the end");
  std::uint64_t expected = 0;
  std::set<std::string_view> names;
  for (const TensorInfo& t : f.tensors()) {
    FUZZ_CHECK(t.begin == expected, "tensor `" + std::string(t.name) + "` does not start where the last ended");
    FUZZ_CHECK(t.end >= t.begin, "end < begin");
    u128 numel = 1;
    for (std::uint64_t d : t.shape) {
      numel *= d;
      FUZZ_CHECK(numel <= UINT64_MAX, "numel overflows but open() accepted the file");
    }
    FUZZ_CHECK(t.numel() == static_cast<std::uint64_t>(numel), "numel");
    const u128 bits = numel * dtype_bits(t.dtype);
    FUZZ_CHECK(bits % 8 == 0, "sub-byte tensor accepted without whole bytes");
    FUZZ_CHECK(bits / 8 == t.nbytes(), "nbytes of `" + std::string(t.name) + "`");
    FUZZ_CHECK(names.insert(t.name).second, "duplicate name `" + std::string(t.name) + "` accepted");
    FUZZ_CHECK(f.find(t.name) == &t, "find(`" + std::string(t.name) + "`)");
    expected = t.end;
  }
  FUZZ_CHECK(f.data_offset() + expected == f.size(), "tensors do not cover the data buffer");
  const auto keys = f.keys();
  FUZZ_CHECK(keys.size() == f.tensors().size(), "keys().size()");
  FUZZ_CHECK(std::equal(keys.begin(), keys.end(), names.begin(), names.end()), "keys() not sorted");
  // A name that cannot occur: it is not valid UTF-8, and headers must be.
  FUZZ_CHECK(f.find("\xff") == nullptr, "find of an impossible name");
  FUZZ_CHECK(!f.info("\xff").ok() && f.info("\xff").error().kind() == Error::Kind::kTensorNotFound,
             "info of a missing name");
  if (f.metadata()) {
    std::set<std::string_view> keys_seen;
    for (const auto& kv : *f.metadata()) {
      FUZZ_CHECK(keys_seen.insert(kv.first).second, "duplicate metadata key `" + kv.first + "` accepted");
    }
  }
}

// Decodes structured values from the fuzz bytes; reads past the end give zeros, so every input decodes.
class ByteReader {
 public:
  ByteReader(const std::uint8_t* data, std::size_t size) : data_(data), size_(size) {}

  bool empty() const { return pos_ >= size_; }
  std::size_t remaining() const { return pos_ < size_ ? size_ - pos_ : 0; }
  std::uint8_t u8() { return pos_ < size_ ? data_[pos_++] : 0; }
  std::uint64_t u64() {
    std::uint64_t v = 0;
    for (int i = 0; i < 8; ++i) v |= static_cast<std::uint64_t>(u8()) << (8 * i);
    return v;
  }
  // Mostly small values around zero, sometimes the extremes or raw 64-bit values: the interesting inputs
  // for index arithmetic.
  std::int64_t i64() {
    const std::uint8_t tag = u8();
    if (tag < 0xe0) return static_cast<std::int64_t>(tag % 25) - 12;
    switch (tag & 7) {
      case 0: return INT64_MIN;
      case 1: return INT64_MAX;
      case 2: return INT64_MIN + 1;
      case 3: return INT64_MAX - 1;
      case 4: return static_cast<std::int64_t>(u8()) * 37 - 4000;
      default: return static_cast<std::int64_t>(u64());
    }
  }

 private:
  const std::uint8_t* data_;
  std::size_t size_;
  std::size_t pos_ = 0;
};

}  // namespace safetensors::fuzz

#endif  // SAFETENSORS_FUZZ_FUZZ_UTIL_H_
