// Shared helpers for the C++ tests: Status matchers, temporary directories and raw file builders.
#ifndef SAFETENSORS_TESTS_TEST_UTIL_H_
#define SAFETENSORS_TESTS_TEST_UTIL_H_

#include <gtest/gtest.h>

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include "safetensors/error.h"
#include "safetensors/file.h"
#include "safetensors/source.h"
#include "safetensors/testing.h"
#include "safetensors/writer.h"

namespace safetensors::test {

// ASSERT_ST_OK(status_or_result): fails with the error's full text.
#define ASSERT_ST_OK(expr)                                  \
  do {                                                      \
    const auto& st_ok_ = (expr);                            \
    ASSERT_TRUE(st_ok_.ok()) << st_ok_.error().to_string(); \
  } while (0)
#define EXPECT_ST_OK(expr)                                  \
  do {                                                      \
    const auto& st_ok_ = (expr);                            \
    EXPECT_TRUE(st_ok_.ok()) << st_ok_.error().to_string(); \
  } while (0)
// EXPECT_ST_ERROR(expr, kind): the expression failed with exactly this Error::Kind.
#define EXPECT_ST_ERROR(expr, expected_kind)                                                                     \
  do {                                                                                                           \
    const auto& st_err_ = (expr);                                                                                \
    ASSERT_FALSE(st_err_.ok()) << "expected " #expected_kind;                                                    \
    EXPECT_EQ(st_err_.error().kind(), ::safetensors::Error::Kind::expected_kind) << st_err_.error().to_string(); \
  } while (0)

inline std::span<const std::byte> as_bytes(std::string_view s) {
  return {reinterpret_cast<const std::byte*>(s.data()), s.size()};
}
inline std::string to_string(std::span<const std::byte> b) {
  return std::string(reinterpret_cast<const char*>(b.data()), b.size());
}

// 8-byte little-endian length + header + data.
inline std::string raw_file(std::string_view header, std::string_view data = {}, std::uint64_t declared = UINT64_MAX) {
  const std::uint64_t n = declared == UINT64_MAX ? header.size() : declared;
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  out.append(header);
  out.append(data);
  return out;
}

// Whole `dtype` elements in the file's (little-endian) byte order as this host's values, as every read into
// caller memory delivers them: a swapped copy on a big-endian host.
inline std::vector<std::byte> native_copy(std::span<const std::byte> file_bytes, Dtype dtype) {
  std::vector<std::byte> out(file_bytes.begin(), file_bytes.end());
  swap_to_native(dtype, out);
  return out;
}

// A directory removed (recursively) when the object dies.
class TempDir {
 public:
  // mkdtemp creates the directory atomically under a name no other directory has: no two tests (ctest -j,
  // gtest shards) can ever share one, which a random name plus create_directories could not promise.
  TempDir() {
    std::string name = (std::filesystem::temp_directory_path() / "st_test_XXXXXX").string();
    if (::mkdtemp(name.data()) == nullptr) {
      throw std::system_error(errno, std::generic_category(), "mkdtemp(" + name + ")");
    }
    path_ = name;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  std::string file(std::string_view name) const { return (path_ / name).string(); }
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

inline void write_bytes(const std::string& path, std::string_view bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}
inline std::string read_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

// Opens in-memory bytes (kept alive by the Source).
inline Result<File> open_bytes(std::string bytes, const OpenOptions& options = {}) {
  auto owner = std::make_shared<std::string>(std::move(bytes));
  return File::open(memory_source(as_bytes(*owner), owner), options);
}

// What File::backend() reports for a file opened with `b` where nothing falls back. REQUIRES: b is not kAuto.
inline ReadPath read_path_of(Backend b) {
  switch (b) {
    case Backend::kMmap: return ReadPath::kMmap;
    case Backend::kPread: return ReadPath::kPread;
    case Backend::kDirect: return ReadPath::kDirect;
    case Backend::kAuto: break;
  }
  ADD_FAILURE() << "kAuto has no read path of its own";
  return ReadPath::kPread;
}

inline std::vector<std::uint64_t> shape_of(const TensorInfo& t) { return {t.shape.begin(), t.shape.end()}; }

// `tensors` serialized into memory, as a Source that owns the bytes and maps them (the mmap path).
inline Result<std::shared_ptr<const Source>> serialized_source(std::span<const TensorData> tensors) {
  SAFETENSORS_ASSIGN_OR_RETURN(auto bytes, serialize(tensors));
  auto owner = std::make_shared<std::vector<std::byte>>(std::move(bytes));
  return memory_source(*owner, owner);
}

// `source` without its mapping: every read goes through Source::read, as on the pread path.
inline std::shared_ptr<testing::FaultySource> without_mapping(std::shared_ptr<const Source> source) {
  auto faulty = std::make_shared<testing::FaultySource>(std::move(source));
  faulty->hide_mapping = true;
  return faulty;
}

// Deterministic pseudo-random bytes.
inline std::vector<std::byte> random_bytes(std::size_t n, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<std::byte> out(n);
  for (auto& b : out) b = static_cast<std::byte>(rng() & 0xff);
  return out;
}

}  // namespace safetensors::test

#endif  // SAFETENSORS_TESTS_TEST_UTIL_H_
