// Header parsing: File::open over a memory source, and internal::parse_header_json on the header bytes with
// exactly the padding it requires.
//
// The input is a whole file. When its length prefix fits, the parser run directly on the header must agree
// with File::open (same error text, or the same tensors and metadata), whatever bytes fill the padding.
// When it does not fit, the whole input is parsed as a bare JSON header, so the fuzzer can also explore the
// JSON grammar without keeping a length prefix consistent.
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>

#include "format/header.h"
#include "fuzz_util.h"
#include "safetensors/file.h"
#include "safetensors/source.h"

namespace safetensors::fuzz {
namespace {

// parse_header_json over a copy of `json` followed by exactly kJsonPadding bytes of `fill`: ASan reports a
// read past the padding, and the result must not depend on what the padding holds.
Result<internal::ParsedHeader> parse_padded(std::span<const std::byte> json, std::uint64_t data_length, char fill) {
  auto buf = std::make_unique<char[]>(json.size() + internal::kJsonPadding);
  if (!json.empty()) std::memcpy(buf.get(), json.data(), json.size());
  std::memset(buf.get() + json.size(), fill, internal::kJsonPadding);
  return internal::parse_header_json(std::string_view(buf.get(), json.size()), data_length, "<fuzz>");
}

void check_same_tensors(const std::vector<TensorInfo>& a, const std::vector<TensorInfo>& b) {
  FUZZ_CHECK(a.size() == b.size(), "tensor counts differ");
  for (std::size_t i = 0; i < a.size(); ++i) {
    FUZZ_CHECK(a[i].name == b[i].name, "names differ at " + std::to_string(i));
    FUZZ_CHECK(a[i].dtype == b[i].dtype && a[i].begin == b[i].begin && a[i].end == b[i].end,
               "entry `" + std::string(a[i].name) + "` differs");
    FUZZ_CHECK(std::equal(a[i].shape.begin(), a[i].shape.end(), b[i].shape.begin(), b[i].shape.end()),
               "shape of `" + std::string(a[i].name) + "` differs");
  }
}

// Two outcomes of parsing the same header must be identical.
void check_same(const Result<internal::ParsedHeader>& a, const Result<internal::ParsedHeader>& b) {
  FUZZ_CHECK(a.ok() == b.ok(), std::string("one parse failed: ") + (a.ok() ? b : a).error().to_string());
  if (!a.ok()) {
    FUZZ_CHECK(a.error().to_string() == b.error().to_string(), a.error().to_string() + " vs " + b.error().to_string());
    return;
  }
  FUZZ_CHECK(a->header_length == b->header_length, "header_length differs");
  FUZZ_CHECK(a->metadata == b->metadata, "metadata differs");
  check_same_tensors(a->tensors, b->tensors);
}

// A successful bare parse: tensors tile [0, data_length) and every name is found through the index.
void check_parsed(const internal::ParsedHeader& h, std::uint64_t json_size, std::uint64_t data_length) {
  FUZZ_CHECK(h.header_length == json_size, "header_length");
  std::uint64_t expected = 0;
  for (std::size_t i = 0; i < h.tensors.size(); ++i) {
    const TensorInfo& t = h.tensors[i];
    FUZZ_CHECK(t.begin == expected && t.end >= t.begin, "tensors do not tile the buffer");
    const std::int64_t found = h.index.find(t.name, [&](std::size_t k) { return h.tensors[k].name; });
    FUZZ_CHECK(found == static_cast<std::int64_t>(i), "index lookup of `" + std::string(t.name) + "`");
    expected = t.end;
  }
  FUZZ_CHECK(expected == data_length, "tensors do not cover the data buffer");
}

}  // namespace
}  // namespace safetensors::fuzz

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace safetensors;
  using namespace safetensors::fuzz;
  const auto bytes = as_bytes(data, size);

  auto file = File::open(memory_source(bytes, nullptr, "<fuzz>"));
  if (file.ok()) {
    check_file_invariants(*file, size);
  } else {
    FUZZ_CHECK(is_format_error(file.error().kind()), "unexpected kind: " + file.error().to_string());
    check_error_text(file.error());
  }

  std::uint64_t n = 0;
  for (std::size_t i = 0; i < 8 && i < size; ++i) n |= static_cast<std::uint64_t>(data[i]) << (8 * i);
  if (size >= 8 && n <= size - 8 && n <= kDefaultMaxHeaderBytes) {
    const auto json = bytes.subspan(8, n);
    const std::uint64_t data_length = size - 8 - n;
    // The cap applies to the declared length exactly: one byte below it refuses, at it changes nothing.
    OpenOptions capped;
    capped.max_header_bytes = n;
    auto at_cap = File::open(memory_source(bytes, nullptr, "<fuzz>"), capped);
    FUZZ_CHECK(at_cap.ok() == file.ok(), "a cap equal to the header length changed the outcome");
    if (n > 0) {
      capped.max_header_bytes = n - 1;
      auto below = File::open(memory_source(bytes, nullptr, "<fuzz>"), capped);
      FUZZ_CHECK(!below.ok() && below.error().kind() == Error::Kind::kHeaderTooLarge, "cap below the header length");
    }
    auto zero_padded = parse_padded(json, data_length, '\0');
    check_same(zero_padded, parse_padded(json, data_length, '"'));
    check_same(zero_padded, parse_padded(json, data_length, '}'));
    FUZZ_CHECK(zero_padded.ok() == file.ok(), "parse_header_json and File::open disagree");
    if (file.ok()) {
      FUZZ_CHECK(zero_padded->header_length == file->header_length(), "header_length");
      FUZZ_CHECK(zero_padded->metadata == file->metadata(), "metadata");
      check_same_tensors(zero_padded->tensors, file->tensors());
    } else {
      FUZZ_CHECK(zero_padded.error().to_string() == file.error().to_string(),
                 zero_padded.error().to_string() + " vs " + file.error().to_string());
    }
  } else {
    auto bare = parse_padded(bytes, 0, '"');
    check_same(bare, parse_padded(bytes, 0, '\0'));
    if (bare.ok()) {
      check_parsed(*bare, size, 0);
    } else {
      FUZZ_CHECK(is_format_error(bare.error().kind()), "unexpected kind: " + bare.error().to_string());
      check_error_text(bare.error());
    }
  }
  return 0;
}
