// Hostile files, one test per class: each is refused with an Error of the expected kind whose message says
// what is wrong, on a memory source and through a real file on both backends, without allocating in
// proportion to any size the file merely declares (this binary counts every operator new).
#include <malloc.h>
#include <sys/resource.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <ctime>
#include <new>
#include <string>
#include <vector>

#include "safetensors/file.h"
#include "test_util.h"

// ---------------------------------------------------------------------------------------------------------
// Allocation accounting: bytes live through operator new, and the peak since the last reset. Sizes are
// malloc_usable_size() on both sides, so allocation and release always balance.

namespace {

std::atomic<std::int64_t> g_live{0};
std::atomic<std::int64_t> g_peak{0};

void note_alloc(void* p) {
  if (p == nullptr) return;
  const std::int64_t now = g_live.fetch_add(static_cast<std::int64_t>(malloc_usable_size(p))) +
                           static_cast<std::int64_t>(malloc_usable_size(p));
  std::int64_t peak = g_peak.load();
  while (now > peak && !g_peak.compare_exchange_weak(peak, now)) {
  }
}

void note_free(void* p) {
  if (p != nullptr) g_live.fetch_sub(static_cast<std::int64_t>(malloc_usable_size(p)));
}

void* counted_alloc(std::size_t n, std::size_t align, bool nothrow) {
  void* p = align <= alignof(std::max_align_t)
                ? std::malloc(n ? n : 1)
                : std::aligned_alloc(align, (std::max<std::size_t>(n, 1) + align - 1) / align * align);
  if (p == nullptr && !nothrow) throw std::bad_alloc();
  note_alloc(p);
  return p;
}

void counted_free(void* p) {
  note_free(p);
  std::free(p);
}

}  // namespace

void* operator new(std::size_t n) { return counted_alloc(n, 0, false); }
void* operator new[](std::size_t n) { return counted_alloc(n, 0, false); }
void* operator new(std::size_t n, const std::nothrow_t&) noexcept { return counted_alloc(n, 0, true); }
void* operator new[](std::size_t n, const std::nothrow_t&) noexcept { return counted_alloc(n, 0, true); }
void* operator new(std::size_t n, std::align_val_t a) { return counted_alloc(n, static_cast<std::size_t>(a), false); }
void* operator new[](std::size_t n, std::align_val_t a) { return counted_alloc(n, static_cast<std::size_t>(a), false); }
void* operator new(std::size_t n, std::align_val_t a, const std::nothrow_t&) noexcept {
  return counted_alloc(n, static_cast<std::size_t>(a), true);
}
void* operator new[](std::size_t n, std::align_val_t a, const std::nothrow_t&) noexcept {
  return counted_alloc(n, static_cast<std::size_t>(a), true);
}
void operator delete(void* p) noexcept { counted_free(p); }
void operator delete[](void* p) noexcept { counted_free(p); }
void operator delete(void* p, std::size_t) noexcept { counted_free(p); }
void operator delete[](void* p, std::size_t) noexcept { counted_free(p); }
void operator delete(void* p, const std::nothrow_t&) noexcept { counted_free(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { counted_free(p); }
void operator delete(void* p, std::align_val_t) noexcept { counted_free(p); }
void operator delete[](void* p, std::align_val_t) noexcept { counted_free(p); }
void operator delete(void* p, std::size_t, std::align_val_t) noexcept { counted_free(p); }
void operator delete[](void* p, std::size_t, std::align_val_t) noexcept { counted_free(p); }
void operator delete(void* p, std::align_val_t, const std::nothrow_t&) noexcept { counted_free(p); }
void operator delete[](void* p, std::align_val_t, const std::nothrow_t&) noexcept { counted_free(p); }

namespace safetensors {
namespace {

using test::raw_file;
using test::TempDir;
using Kind = Error::Kind;

// Peak bytes allocated (above what was live before) while `fn` runs.
template <typename Fn>
std::int64_t peak_allocation(Fn&& fn) {
  const std::int64_t before = g_live.load();
  g_peak.store(before);
  fn();
  return g_peak.load() - before;
}

std::string entry(std::string_view dtype, std::string_view shape, std::uint64_t begin, std::uint64_t end) {
  return "{\"dtype\":\"" + std::string(dtype) + "\",\"shape\":" + std::string(shape) + ",\"data_offsets\":[" +
         std::to_string(begin) + "," + std::to_string(end) + "]}";
}

struct Expect {
  Kind kind;
  // Text the message must contain: the reason, in words.
  std::string says;
};

// simdjson's DOM parser reserves, per byte of JSON, 8 bytes of tape, 4 of structural index and 5/3 of
// string buffer, whatever the JSON holds; the File keeps the header bytes and a name arena of the same size.
// Most of it is never touched, but it is allocated: 16 bytes per byte present is the honest bound, and an
// allocation sized from a length the file merely declares exceeds it by orders of magnitude.
constexpr std::int64_t kBytesPerFileByte = 16;

// Opens `bytes` from memory and (with `via_files`) from a file on both backends: every path refuses it with
// `want`, and no path allocates more than `budget` bytes (default: kBytesPerFileByte per byte of the file)
// above a small constant.
void expect_refused(const std::string& bytes, const Expect& want, std::int64_t budget = -1, bool via_files = true) {
  if (budget < 0) budget = kBytesPerFileByte * static_cast<std::int64_t>(bytes.size());
  constexpr std::int64_t kSlack = 64 << 10;  // the parser's depth tables, error strings, the File shell
  std::optional<Result<File>> mem;
  const std::int64_t peak = peak_allocation([&] {
    auto owner = std::make_shared<std::string>(bytes);  // counted too: it is the file
    mem.emplace(File::open(memory_source(test::as_bytes(*owner), owner)));
  });
  ASSERT_FALSE(mem->ok()) << "accepted: expected " << want.says;
  const Error& e = mem->error();
  EXPECT_EQ(e.kind(), want.kind) << e.to_string();
  EXPECT_NE(e.to_string().find(want.says), std::string::npos) << e.to_string();
  EXPECT_NE(e.to_string().find(std::string(e.token())), std::string::npos) << e.to_string();
  EXPECT_LE(peak, static_cast<std::int64_t>(bytes.size()) + budget + kSlack)
      << "allocated " << peak << " bytes for a " << bytes.size() << "-byte file";

  if (!via_files) return;
  TempDir dir;
  const std::string path = dir.file("hostile.safetensors");
  test::write_bytes(path, bytes);
  for (Backend b : {Backend::kMmap, Backend::kPread}) {
    std::optional<Result<File>> f;
    const std::int64_t file_peak = peak_allocation([&] { f.emplace(File::open(path, {b, kDefaultMaxHeaderBytes})); });
    ASSERT_FALSE(f->ok());
    EXPECT_EQ(f->error().kind(), want.kind) << f->error().to_string();
    EXPECT_EQ(f->error().message(), e.message()) << "the backends disagree";
    EXPECT_NE(f->error().to_string().find(path), std::string::npos) << "the error does not name the file";
    EXPECT_LE(file_peak, budget + kSlack)
        << "allocated " << file_peak << " bytes opening a " << bytes.size() << "-byte file";
  }
}

TEST(MaliciousTest, HeaderLengthPastEndOfFile) {
  expect_refused(raw_file("{}", "", 1000), {Kind::kInvalidHeaderLength, "declared length 1000 runs past the end"});
  // Just below the cap: nothing near 100 MB may be allocated for an 18-byte file.
  expect_refused(raw_file("{}", "", kDefaultMaxHeaderBytes),
                 {Kind::kInvalidHeaderLength, "declared length 100000000 runs past the end of the 10-byte file"});
  expect_refused(raw_file("{}", "", UINT64_MAX - 1), {Kind::kHeaderTooLarge, "exceeds the limit"});
}

TEST(MaliciousTest, MillionTinyEntriesNearTheCap) {
  // 1,000,000 one-byte tensors, listed in reverse offset order (so the sort runs), padded with whitespace
  // to just under the cap; the data buffer lacks its last byte, so every check runs before the refusal.
  constexpr std::uint64_t kEntries = 1'000'000;
  std::string header = "{";
  header.reserve(kDefaultMaxHeaderBytes);
  for (std::uint64_t i = kEntries; i-- > 0;) {
    if (header.size() > 1) header += ',';
    header += "\"t" + std::to_string(i) + "\":" + entry("U8", "[1]", i, i + 1);
  }
  header += '}';
  ASSERT_LT(header.size(), kDefaultMaxHeaderBytes);
  header.append(kDefaultMaxHeaderBytes - 8 - header.size(), ' ');
  const std::string bytes = raw_file(header, std::string(kEntries - 1, '\x01'));
  header = std::string();
  // CPU time of this process, not wall time: other processes on a busy machine cannot push it past the bound.
  const std::clock_t t0 = std::clock();
  // The parser's reservations plus about 70 bytes per tensor (its entry, shape and index slot). From memory
  // only: the file backends differ in nothing but the source (test_malicious.py opens this file from disk).
  expect_refused(bytes, {Kind::kMetadataIncompleteBuffer, "the tensors cover 1000000 bytes of a 999999-byte"},
                 kBytesPerFileByte * static_cast<std::int64_t>(bytes.size()) + 100 * kEntries, /*via_files=*/false);
  const double cpu_seconds = static_cast<double>(std::clock() - t0) / CLOCKS_PER_SEC;
  EXPECT_LT(cpu_seconds, 120.0) << "one open of a 100 MB header (about 1 s of CPU; 10 s in sanitizer builds)";
}

TEST(MaliciousTest, OverlappingTensors) {
  const std::string h = "{\"a\":" + entry("U8", "[4]", 0, 4) + ",\"b\":" + entry("U8", "[4]", 2, 6) + "}";
  expect_refused(raw_file(h, std::string(6, '\0')), {Kind::kInvalidOffset, "invalid offset for tensor `b`"});
  // One tensor inside another.
  const std::string inside = "{\"a\":" + entry("U8", "[8]", 0, 8) + ",\"b\":" + entry("U8", "[2]", 3, 5) + "}";
  expect_refused(raw_file(inside, std::string(8, '\0')), {Kind::kInvalidOffset, "invalid offset for tensor `b`"});
}

TEST(MaliciousTest, ManyTensorsAtOneOffset) {
  std::string h = "{";
  for (int i = 0; i < 100; ++i) h += (i ? ",\"t" : "\"t") + std::to_string(i) + "\":" + entry("F32", "[4]", 0, 16);
  h += "}";
  expect_refused(raw_file(h, std::string(16, '\0')), {Kind::kInvalidOffset, "invalid offset for tensor `t1`"});
}

TEST(MaliciousTest, GapBetweenTensors) {
  const std::string h = "{\"a\":" + entry("U8", "[2]", 0, 2) + ",\"b\":" + entry("U8", "[2]", 6, 8) + "}";
  expect_refused(raw_file(h, std::string(8, '\0')), {Kind::kInvalidOffset, "invalid offset for tensor `b`"});
  // A gap before the first tensor.
  const std::string first = "{\"a\":" + entry("U8", "[2]", 2, 4) + "}";
  expect_refused(raw_file(first, std::string(4, '\0')), {Kind::kInvalidOffset, "invalid offset for tensor `a`"});
}

TEST(MaliciousTest, TrailingBytesPolyglot) {
  // A valid file with a ZIP archive (or an HTML page) appended after the last tensor.
  const std::string h = "{\"a\":" + entry("U8", "[4]", 0, 4) + "}";
  expect_refused(raw_file(h, std::string("abcd") + "PK\x03\x04" + std::string(26, '\0')),
                 {Kind::kMetadataIncompleteBuffer, "the tensors cover 4 bytes of a 34-byte data buffer"});
  expect_refused(raw_file(h, "abcd<html><script>alert(1)</script></html>"),
                 {Kind::kMetadataIncompleteBuffer, "incomplete metadata, file not fully covered"});
}

TEST(MaliciousTest, OffsetsPastEndOfFile) {
  const std::string h = "{\"a\":" + entry("U8", "[16]", 0, 16) + "}";
  expect_refused(raw_file(h, "xy"), {Kind::kMetadataIncompleteBuffer, "the tensors cover 16 bytes of a 2-byte"});
  // A tensor claiming (almost) the whole 64-bit range: refused without reading or allocating it.
  const std::string huge = "{\"a\":" + entry("U8", "[1152921504606846976]", 0, 1ull << 60) + "}";
  expect_refused(raw_file(huge, "xy"), {Kind::kMetadataIncompleteBuffer, "incomplete metadata"});
  const std::string far = "{\"a\":" + entry("U8", "[4]", 1ull << 62, (1ull << 62) + 4) + "}";
  expect_refused(raw_file(far, "abcd"), {Kind::kInvalidOffset, "invalid offset for tensor `a`"});
}

TEST(MaliciousTest, ShapeProductOverflows64Bits) {
  const std::string h = "{\"a\":" + entry("U8", "[4294967296,4294967296]", 0, 4) + "}";
  expect_refused(raw_file(h, "abcd"), {Kind::kValidationOverflow, "overflow computing buffer size"});
  // A zero dimension after the overflow does not rescue it: the product is computed left to right.
  const std::string zero = "{\"a\":" + entry("U8", "[4294967296,4294967296,0]", 0, 0) + "}";
  expect_refused(raw_file(zero), {Kind::kValidationOverflow, "for tensor `a`"});
}

TEST(MaliciousTest, ByteCountOverflows64Bits) {
  // 2^61 elements fit; 2^61 * 64 bits do not.
  const std::string h = "{\"a\":" + entry("F64", "[2305843009213693952]", 0, 8) + "}";
  expect_refused(raw_file(h, std::string(8, '\0')), {Kind::kValidationOverflow, "overflow computing buffer size"});
  const std::string c64 = "{\"a\":" + entry("C64", "[65536,65536,65536,65536]", 0, 8) + "}";
  expect_refused(raw_file(c64, std::string(8, '\0')), {Kind::kValidationOverflow, "for tensor `a`"});
}

TEST(MaliciousTest, NotUtf8) {
  const Expect want{Kind::kInvalidHeaderUtf8, "invalid UTF-8 in header"};
  expect_refused(raw_file("{\"a\xff\":" + entry("U8", "[1]", 0, 1) + "}", "x"), want);
  expect_refused(raw_file("{\"__metadata__\":{\"k\":\"\xc3\"}}"), want);  // truncated sequence
  expect_refused(raw_file("{\"\xc0\xaf\":1}"), want);                     // overlong '/'
  expect_refused(raw_file("{\"\xed\xa0\x80\":1}"), want);                 // UTF-16 surrogate
  expect_refused(raw_file("{\"\xf4\x90\x80\x80\":1}"), want);             // above U+10FFFF
  expect_refused(raw_file(std::string("{}") + "\xfe\xff"), want);         // in trailing "whitespace"
}

TEST(MaliciousTest, DuplicateTensorKeys) {
  const std::string e = entry("U8", "[1]", 0, 1);
  expect_refused(raw_file("{\"a\":" + e + ",\"a\":" + e + "}", "x"),
                 {Kind::kInvalidHeaderJson, "duplicate tensor name `a`"});
  // The same name spelled with an escape is the same key.
  expect_refused(raw_file("{\"a\":" + e + ",\"\\u0061\":" + e + "}", "x"),
                 {Kind::kInvalidHeaderJson, "duplicate tensor name `a`"});
  expect_refused(raw_file("{\"a\":{\"dtype\":\"U8\",\"dtype\":\"I8\",\"shape\":[1],\"data_offsets\":[0,1]}}", "x"),
                 {Kind::kInvalidHeaderJson, "duplicate field `dtype` for tensor `a`"});
}

TEST(MaliciousTest, DuplicateMetadata) {
  expect_refused(raw_file("{\"__metadata__\":{\"a\":\"1\"},\"__metadata__\":{\"a\":\"2\"}}"),
                 {Kind::kInvalidHeaderJson, "duplicate key `__metadata__`"});
  expect_refused(raw_file("{\"__metadata__\":{\"a\":\"1\",\"a\":\"2\"}}"),
                 {Kind::kInvalidHeaderJson, "duplicate key `a` in `__metadata__`"});
}

TEST(MaliciousTest, NonStringMetadataValues) {
  for (const char* value : {"1", "1.5", "true", "null", "[\"x\"]", "{\"x\":\"y\"}"}) {
    SCOPED_TRACE(value);
    expect_refused(raw_file(std::string("{\"__metadata__\":{\"k\":") + value + "}}"),
                   {Kind::kInvalidHeaderJson, "`__metadata__` value for key `k` must be a string"});
  }
  expect_refused(raw_file("{\"__metadata__\":[\"k\",\"v\"]}"),
                 {Kind::kInvalidHeaderJson, "`__metadata__` must be an object of strings, found an array"});
  expect_refused(raw_file("{\"__metadata__\":\"k=v\"}"),
                 {Kind::kInvalidHeaderJson, "`__metadata__` must be an object of strings, found a string"});
}

TEST(MaliciousTest, DeepNesting) {
  const Expect too_deep{Kind::kInvalidHeaderJson, "too deep"};
  expect_refused(raw_file(std::string(100'000, '[') + std::string(100'000, ']')), too_deep);
  std::string objects;
  for (int i = 0; i < 50'000; ++i) objects += "{\"a\":";
  objects += "1" + std::string(50'000, '}');
  expect_refused(raw_file(objects), too_deep);
  // Deep inside a field the schema ignores: still parsed, still refused.
  expect_refused(raw_file("{\"a\":{\"x\":" + std::string(5000, '[') + std::string(5000, ']') +
                          ",\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[0,0]}}"),
                 too_deep);
  // Unbalanced: opened and never closed.
  expect_refused(raw_file(std::string(1'000'000, '[')), {Kind::kInvalidHeaderJson, "invalid JSON in header"});
}

TEST(MaliciousTest, HugeNegativeAndFractionalNumbers) {
  const Expect bad_number{Kind::kInvalidHeaderJson, "invalid JSON in header"};
  for (const char* shape : {"[18446744073709551616]", "[99999999999999999999999999999]", "[1e400]"}) {
    SCOPED_TRACE(shape);
    expect_refused(raw_file("{\"a\":" + entry("U8", shape, 0, 1) + "}", "x"), bad_number);
  }
  expect_refused(raw_file("{\"a\":" + entry("U8", "[-1]", 0, 1) + "}", "x"),
                 {Kind::kInvalidHeaderJson, "found an integer that is negative"});
  for (const char* shape : {"[1.5]", "[1.0]", "[1e0]", "[-0.0]"}) {
    SCOPED_TRACE(shape);
    expect_refused(raw_file("{\"a\":" + entry("U8", shape, 0, 1) + "}", "x"),
                   {Kind::kInvalidHeaderJson, "found a floating-point number"});
  }
  expect_refused(raw_file("{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1.0]}}", "x"),
                 {Kind::kInvalidHeaderJson, "`data_offsets` of tensor `a` must be two non-negative integers"});
  expect_refused(raw_file("{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[-1,0]}}", "x"),
                 {Kind::kInvalidHeaderJson, "`data_offsets` of tensor `a` must be two non-negative integers"});
}

TEST(MaliciousTest, UnknownDtypes) {
  for (const char* dtype : {"F128", "f32", "float32", "", "F32 ", "U8\\u0000"}) {
    SCOPED_TRACE(dtype);
    expect_refused(raw_file("{\"a\":" + entry(dtype, "[1]", 0, 4) + "}", "abcd"),
                   {Kind::kInvalidHeaderJson, "unknown dtype"});
  }
  expect_refused(raw_file("{\"a\":{\"dtype\":32,\"shape\":[1],\"data_offsets\":[0,4]}}", "abcd"),
                 {Kind::kInvalidHeaderJson, "`dtype` of tensor `a` must be a string, found an integer"});
}

TEST(MaliciousTest, NulBytes) {
  const std::string e = entry("U8", "[1]", 0, 1);
  // NUL padding after the object (writers must pad with spaces).
  expect_refused(raw_file("{\"a\":" + e + "}" + std::string(6, '\0'), "x"), {Kind::kInvalidHeaderJson, "invalid JSON"});
  // A raw NUL inside a key, and before the object.
  expect_refused(raw_file(std::string("{\"a\0b\":", 7) + e + "}", "x"), {Kind::kInvalidHeaderJson, "invalid JSON"});
  expect_refused(raw_file(std::string("\0{}", 3)), {Kind::kInvalidHeaderJson, "invalid JSON"});
  // An all-zero file: a zero header length.
  expect_refused(std::string(64, '\0'), {Kind::kInvalidHeaderJson, "the header is empty"});
}

TEST(MaliciousTest, NotSafetensorsAtAll) {
  const Expect too_large{Kind::kHeaderTooLarge, "header too large"};
  // A legacy torch pickle (protocol 2), a ZIP archive (torch.save's default), a git-lfs pointer, HTML.
  expect_refused(std::string("\x80\x02\x8a\x0a\x6c\xfc\x9c\x46\xf9\x20\x6a\xa8\x50\x19.", 15), too_large);
  expect_refused(std::string("PK\x03\x04\x00\x00\x08\x08\x00\x00", 10) + std::string(60, '\0'), too_large);
  expect_refused(
      "version https://git-lfs.github.com/spec/v1\n"
      "oid sha256:4d7a214614ab2935c943f9e0ff69d22eadbb8f32b1258daaa5e2ca24d17e2393\n"
      "size 12345\n",
      too_large);
  expect_refused("<!DOCTYPE html>\n<html><head><title>404</title></head><body>Not Found</body></html>\n", too_large);
  expect_refused("hello", {Kind::kHeaderTooSmall, "header too small"});
}

}  // namespace
}  // namespace safetensors
