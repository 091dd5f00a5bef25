// The reader's validation, one hostile test per error kind (COMPAT.md section 2), in the order the checks run.
#include <string>
#include <string_view>
#include <vector>

#include "format/header.h"
#include "format/name_index.h"
#include "test_util.h"

namespace safetensors {
namespace {

using test::open_bytes;
using test::raw_file;

constexpr char kOneF32[] = R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})";

TEST(HeaderTest, AcceptsMinimalFiles) {
  auto f = open_bytes(raw_file("{}"));
  ASSERT_ST_OK(f);
  EXPECT_TRUE(f->tensors().empty());
  EXPECT_FALSE(f->metadata().has_value());
  EXPECT_EQ(f->data_offset(), 10u);

  auto g = open_bytes(raw_file(kOneF32, std::string(4, '\0')));
  ASSERT_ST_OK(g);
  ASSERT_EQ(g->tensors().size(), 1u);
  EXPECT_EQ(g->tensors()[0].name, "a");
  EXPECT_EQ(g->tensors()[0].dtype, Dtype::kF32);
  EXPECT_EQ(test::shape_of(g->tensors()[0]), std::vector<std::uint64_t>{1});
}

TEST(HeaderTest, AcceptsAnyLengthAndWhitespaceAroundTheObject) {
  // N = 9 is not a multiple of 8; spaces, tabs and newlines around the object are JSON whitespace.
  ASSERT_ST_OK(open_bytes(raw_file(" \t\n{}\r\n  ")));
  ASSERT_ST_OK(open_bytes(raw_file("{}       ")));
}

TEST(HeaderTest, Step1HeaderTooSmall) {
  EXPECT_ST_ERROR(open_bytes(""), kHeaderTooSmall);
  EXPECT_ST_ERROR(open_bytes("\x01\x02"), kHeaderTooSmall);
  EXPECT_ST_ERROR(open_bytes(std::string(7, '\0')), kHeaderTooSmall);
}

TEST(HeaderTest, Step2HeaderTooLarge) {
  EXPECT_ST_ERROR(open_bytes(raw_file("{}", "", 100'000'001)), kHeaderTooLarge);
  EXPECT_ST_ERROR(open_bytes(raw_file("{}", "", UINT64_MAX - 1)), kHeaderTooLarge);
  // The cap is the caller's to set, in both directions.
  OpenOptions small;
  small.max_header_bytes = 4;
  EXPECT_ST_ERROR(open_bytes(raw_file("{}     "), small), kHeaderTooLarge);
  // Checked before the file length: a declared length above the cap is "too large" even when it also runs
  // past the end of the file.
  EXPECT_ST_ERROR(open_bytes(raw_file("{}", "", 200'000'000)), kHeaderTooLarge);
}

TEST(HeaderTest, Step3InvalidHeaderLength) {
  EXPECT_ST_ERROR(open_bytes(raw_file("{}", "", 50)), kInvalidHeaderLength);
  EXPECT_ST_ERROR(open_bytes(raw_file("{}", "", 3)), kInvalidHeaderLength);
  EXPECT_ST_ERROR(open_bytes(raw_file("{}", "", 99'999'999)), kInvalidHeaderLength);
  // Without a cap, a length that cannot be addressed at all is "too large", never an allocation attempt.
  OpenOptions uncapped;
  uncapped.max_header_bytes = UINT64_MAX;
  EXPECT_ST_ERROR(open_bytes(raw_file("{}", "", UINT64_MAX - 2), uncapped), kHeaderTooLarge);
  EXPECT_ST_ERROR(open_bytes(raw_file("{}", "", 1ull << 40), uncapped), kInvalidHeaderLength);
}

TEST(HeaderTest, Step4InvalidUtf8) {
  EXPECT_ST_ERROR(open_bytes(raw_file("{\"\xff\":1}")), kInvalidHeaderUtf8);
  // An overlong encoding and a lone surrogate are not UTF-8 either.
  EXPECT_ST_ERROR(open_bytes(raw_file("{\"\xc0\xaf\":1}")), kInvalidHeaderUtf8);
  EXPECT_ST_ERROR(open_bytes(raw_file("{\"\xed\xa0\x80\":1}")), kInvalidHeaderUtf8);
}

TEST(HeaderTest, Step5InvalidJson) {
  const char* bad[] = {
      "",                                                           // N == 0
      "{\"a\":",                                                    // truncated
      "[]",                                                         // not an object
      "{}\0\0\0\0\0\0",                                             // (NUL padding, see below)
      R"({"a":{"dtype":"F32","shape":[1]}})",                       // missing data_offsets
      R"({"a":{"shape":[1],"data_offsets":[0,4]}})",                // missing dtype
      R"({"a":{"dtype":"F32","data_offsets":[0,4]}})",              // missing shape
      R"({"a":{"dtype":"F33","shape":[1],"data_offsets":[0,4]}})",  // unknown dtype
      R"({"a":{"dtype":"f32","shape":[1],"data_offsets":[0,4]}})",  // codes are case-sensitive
      R"({"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})",
      R"({"a":{"dtype":"F32","shape":[1.0],"data_offsets":[0,4]}})",
      R"({"a":{"dtype":"F32","shape":[1e0],"data_offsets":[0,4]}})",
      R"({"a":{"dtype":"F32","shape":[18446744073709551616],"data_offsets":[0,4]}})",
      R"({"a":{"dtype":"F32","shape":1,"data_offsets":[0,4]}})",
      R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4,8]}})",
      R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0]}})",
      R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,"4"]}})",
      R"({"a":{"dtype":32,"shape":[1],"data_offsets":[0,4]}})",
      R"({"a":[1,2]})",
      R"({"a":{"dtype":"F32","dtype":"F32","shape":[1],"data_offsets":[0,4]}})",
      R"({"__metadata__":{"k":1}})",
      R"({"__metadata__":{"k":null}})",
      R"({"__metadata__":["k"]})",
      R"({"__metadata__":{"k":"v","k":"w"}})",
      R"({"__metadata__":{},"__metadata__":{}})",
      R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})",
      "{} {}",
      "{\"a\":{}}x",
  };
  for (const char* h : bad) {
    std::string header = h;
    if (header == "{}") header.assign("{}\0\0\0\0\0\0", 8);
    SCOPED_TRACE(header);
    EXPECT_ST_ERROR(open_bytes(raw_file(header, std::string(4, '\0'))), kInvalidHeaderJson);
  }
}

TEST(HeaderTest, NullMetadataIsAbsentAndUnknownEntryFieldsAreIgnored) {
  auto f = open_bytes(
      raw_file(R"({"__metadata__":null,"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2],"x":{"y":[1]}}})", "ab"));
  ASSERT_ST_OK(f);
  EXPECT_FALSE(f->metadata().has_value());
  auto g = open_bytes(raw_file(R"({"__metadata__":{"b":"1","a":"\u00e9\n"}})"));
  ASSERT_ST_OK(g);
  ASSERT_TRUE(g->metadata().has_value());
  ASSERT_EQ(g->metadata()->size(), 2u);
  EXPECT_EQ((*g->metadata())[0], (std::pair<std::string, std::string>{"b", "1"}));
  EXPECT_EQ((*g->metadata())[1], (std::pair<std::string, std::string>{"a", "\xc3\xa9\n"}));
}

TEST(HeaderTest, Step6InvalidOffset) {
  // First tensor must begin at 0.
  EXPECT_ST_ERROR(open_bytes(raw_file(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", std::string(8, 0))),
                  kInvalidOffset);
  // End before begin.
  EXPECT_ST_ERROR(open_bytes(raw_file(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,0]}})", std::string(4, 0))),
                  kInvalidOffset);
  // A gap.
  EXPECT_ST_ERROR(
      open_bytes(raw_file(
          R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"b":{"dtype":"U8","shape":[1],"data_offsets":[2,3]}})",
          std::string(3, 0))),
      kInvalidOffset);
  // Overlap.
  auto f = open_bytes(raw_file(
      R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},"b":{"dtype":"U8","shape":[2],"data_offsets":[1,3]}})",
      std::string(3, 0)));
  EXPECT_ST_ERROR(f, kInvalidOffset);
  EXPECT_EQ(f.error().tensor(), "b");
  EXPECT_EQ(f.error().message(), "invalid offset for tensor `b`");
}

TEST(HeaderTest, ZeroSizeTensorsMayShareAnOffset) {
  auto f = open_bytes(raw_file(
      R"({"z2":{"dtype":"F32","shape":[0,3],"data_offsets":[0,0]},"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},)"
      R"("z1":{"dtype":"I64","shape":[0],"data_offsets":[0,0]},"z3":{"dtype":"BOOL","shape":[5,0],"data_offsets":[2,2]}})",
      "xy"));
  ASSERT_ST_OK(f);
  // File order: by offsets, ties in header order.
  std::vector<std::string> order;
  for (const auto& t : f->tensors()) order.emplace_back(t.name);
  EXPECT_EQ(order, (std::vector<std::string>{"z2", "z1", "a", "z3"}));
  std::vector<std::string_view> keys = f->keys();
  EXPECT_EQ(keys, (std::vector<std::string_view>{"a", "z1", "z2", "z3"}));
}

TEST(HeaderTest, Step7ValidationOverflow) {
  EXPECT_ST_ERROR(open_bytes(raw_file(
                      R"({"a":{"dtype":"F32","shape":[4611686018427387904,4611686018427387904],"data_offsets":[0,4]}})",
                      std::string(4, 0))),
                  kValidationOverflow);
  // The element count fits but the bit count does not.
  EXPECT_ST_ERROR(open_bytes(raw_file(R"({"a":{"dtype":"F64","shape":[2305843009213693952,2],"data_offsets":[0,8]}})",
                                      std::string(8, 0))),
                  kValidationOverflow);
}

TEST(HeaderTest, Step8MisalignedSubByteTensor) {
  EXPECT_ST_ERROR(open_bytes(raw_file(R"({"a":{"dtype":"F4","shape":[3],"data_offsets":[0,1]}})", std::string(1, 0))),
                  kMisalignedSlice);
  EXPECT_ST_ERROR(
      open_bytes(raw_file(R"({"a":{"dtype":"F6_E2M3","shape":[3],"data_offsets":[0,2]}})", std::string(2, 0))),
      kMisalignedSlice);
  // Whole bytes are fine: 4 x F6 = 24 bits, 2 x F4 = 8 bits.
  ASSERT_ST_OK(
      open_bytes(raw_file(R"({"a":{"dtype":"F6_E3M2","shape":[4],"data_offsets":[0,3]}})", std::string(3, 0))));
  ASSERT_ST_OK(open_bytes(raw_file(R"({"a":{"dtype":"F4","shape":[2,1],"data_offsets":[0,1]}})", std::string(1, 0))));
}

TEST(HeaderTest, Step9TensorInvalidInfo) {
  auto f = open_bytes(raw_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}})", std::string(4, 0)));
  EXPECT_ST_ERROR(f, kTensorInvalidInfo);
  EXPECT_EQ(f.error().tensor(), "a");
  EXPECT_EQ(f.error().message().rfind("invalid shape, data type, or offset for tensor `a`", 0), 0u);
}

TEST(HeaderTest, Step10MetadataIncompleteBuffer) {
  EXPECT_ST_ERROR(open_bytes(raw_file(kOneF32, std::string(5, 0))), kMetadataIncompleteBuffer);  // trailing
  EXPECT_ST_ERROR(open_bytes(raw_file(kOneF32, std::string(3, 0))), kMetadataIncompleteBuffer);  // missing
  EXPECT_ST_ERROR(open_bytes(raw_file("{}", "x")), kMetadataIncompleteBuffer);
}

TEST(HeaderTest, ChecksRunInTheDocumentedOrder) {
  // Invalid UTF-8 inside an unterminated object: step 4 wins over step 5.
  EXPECT_ST_ERROR(open_bytes(raw_file("{\"\xff")), kInvalidHeaderUtf8);
  // A duplicate key and a bad offset: step 5 wins over step 6.
  EXPECT_ST_ERROR(
      open_bytes(raw_file(
          R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[5,6]},"a":{"dtype":"U8","shape":[1],"data_offsets":[5,6]}})")),
      kInvalidHeaderJson);
  // Walking in offset order, the first offending tensor is reported: "b" (at 0) overflows before "a" (at 0,
  // after b in the walk because its end is larger) is looked at.
  auto f = open_bytes(raw_file(
      R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"b":{"dtype":"U8","shape":[4294967296,4294967296],"data_offsets":[0,0]}})",
      "x"));
  EXPECT_ST_ERROR(f, kValidationOverflow);
  EXPECT_EQ(f.error().tensor(), "b");
}

TEST(HeaderTest, ErrorsNameTheFileAndTokens) {
  auto f = open_bytes(raw_file("{}", "", 100'000'001));
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(f.error().context(), "<memory>");
  EXPECT_EQ(f.error().token(), "HeaderTooLarge");
  EXPECT_EQ(f.error().to_string().rfind("header too large", 0), 0u);
  EXPECT_EQ(f.error().to_string(),
            "header too large: declared length 100000001 exceeds the limit of 100000000 bytes (HeaderTooLarge)");
}

TEST(HeaderTest, ParseHeaderJsonDirectly) {
  std::string json = kOneF32;
  json.append(internal::kJsonPadding, '\0');
  auto parsed =
      internal::parse_header_json(std::string_view(json.data(), json.size() - internal::kJsonPadding), 4, "ctx");
  ASSERT_ST_OK(parsed);
  EXPECT_EQ(parsed->tensors.size(), 1u);
  EXPECT_EQ(parsed->tensors[0].end, 4u);
}

// Headers are read into a buffer each thread keeps for its next open (header.cc, header_buffer): a header
// read after a longer one is parsed from its own bytes alone, and one above the reuse limit (8 MiB) gets a
// buffer of its own. Less than kJsonPadding bytes follow each header, so every open here takes the read.
TEST(HeaderTest, ReusedHeaderBufferHoldsOnlyTheHeaderBeingOpened) {
  std::string json = "{";
  for (int i = 0; i < 2000; ++i) {
    json += (i ? ",\"t" : "\"t") + std::to_string(i) + R"(":{"dtype":"F32","shape":[0],"data_offsets":[0,0]})";
  }
  json += "}";
  auto whole = open_bytes(raw_file(json));
  ASSERT_ST_OK(whole);
  EXPECT_EQ(whole->tensors().size(), 2000u);
  // The same header cut inside its last entry: truncated JSON, whatever the buffer held after it before.
  auto cut = open_bytes(raw_file(json.substr(0, json.size() - 20)));
  ASSERT_FALSE(cut.ok());
  EXPECT_EQ(cut.error().kind(), Error::Kind::kInvalidHeaderJson);
  // A short header after the long one has only its own tensor.
  auto one = open_bytes(raw_file(kOneF32, std::string(4, '\0')));
  ASSERT_ST_OK(one);
  ASSERT_EQ(one->tensors().size(), 1u);
  EXPECT_EQ(one->tensors()[0].name, "a");
  // Above the reuse limit, then the long one again through the kept buffer.
  auto huge = open_bytes(raw_file("{}" + std::string((9u << 20), ' ')));
  ASSERT_ST_OK(huge);
  EXPECT_TRUE(huge->tensors().empty());
  auto again = open_bytes(raw_file(json));
  ASSERT_ST_OK(again);
  EXPECT_EQ(again->tensors().size(), 2000u);
  EXPECT_EQ(again->tensors()[1999].name, "t1999");
}

// The name index (name_index.h) of a header: every name found at its position, absent names (also ones that
// differ from a present name in one byte) not found, and the first repeat of an earlier name reported.
TEST(HeaderTest, NameIndexFindsEveryNameAndReportsTheFirstRepeat) {
  std::vector<std::string> names;
  for (int i = 0; i < 50000; ++i)
    names.push_back("model.layers." + std::to_string(i / 16) + ".w" + std::to_string(i % 16));
  auto at = [&](std::size_t i) { return std::string_view(names[i]); };
  internal::NameIndex index;
  ASSERT_EQ(index.build(names.size(), at), names.size());
  for (std::size_t i = 0; i < names.size(); ++i) ASSERT_EQ(index.find(names[i], at), static_cast<std::int64_t>(i));
  EXPECT_EQ(index.find("model.layers.0.w16", at), -1);
  EXPECT_EQ(index.find("model.layers.0.w", at), -1);
  EXPECT_EQ(index.find("", at), -1);
  names.push_back(names[31337]);
  names.push_back(names[7]);
  EXPECT_EQ(index.build(names.size(), at), 50000u);
  EXPECT_EQ(internal::NameIndex().find("a", at), -1);
}

}  // namespace
}  // namespace safetensors
