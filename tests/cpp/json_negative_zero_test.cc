// Found by tests/python/test_mutations_differential.py: simdjson reads the JSON literal -0 as the
// integer 0, so a shape or offset spelled -0 was accepted; the reference reads it as the float -0.0 and
// refuses it wherever an integer is required (and ignores it where the schema ignores the value).
// Regression input: fuzz/regressions/header/negative_zero_*.
#include <string>

#include "format/header.h"
#include "test_util.h"

namespace safetensors {
namespace {

using test::open_bytes;
using test::raw_file;

TEST(JsonNegativeZero, IsAFloatWhereAnIntegerIsRequired) {
  auto shape = open_bytes(raw_file(R"({"a":{"dtype":"U8","shape":[-0],"data_offsets":[0,0]}})"));
  EXPECT_ST_ERROR(shape, kInvalidHeaderJson);
  EXPECT_EQ(shape.error().detail(),
            "`shape` of tensor `a` must hold non-negative integers below 2^64, found a "
            "floating-point number");
  EXPECT_ST_ERROR(open_bytes(raw_file(R"({"a":{"dtype":"U8","shape":[0],"data_offsets":[-0,0]}})")),
                  kInvalidHeaderJson);
  EXPECT_ST_ERROR(open_bytes(raw_file(R"({"a":{"dtype":"U8","shape":[0],"data_offsets":[0, -0 ]}})")),
                  kInvalidHeaderJson);
  EXPECT_ST_ERROR(open_bytes(raw_file(R"({"__metadata__":{"k":-0}})")), kInvalidHeaderJson);
}

TEST(JsonNegativeZero, IsIgnoredWhereTheSchemaIgnoresTheValue) {
  auto f = open_bytes(raw_file(R"({"a":{"x":[-0,-0.0,{"y":-0}],"dtype":"U8","shape":[0],"data_offsets":[0,0]}})"));
  ASSERT_ST_OK(f);
  // The header length is the file's, not that of the text the parser was given.
  EXPECT_EQ(f->header_length(),
            std::string(R"({"a":{"x":[-0,-0.0,{"y":-0}],"dtype":"U8","shape":[0],"data_offsets":[0,0]}})").size());
}

TEST(JsonNegativeZero, OtherSpellingsAreUnchanged) {
  // Inside strings -0 is text; -01 stays invalid JSON; -0.0 and -0e0 were floats already.
  auto named = open_bytes(
      raw_file(R"({"layer-0":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"__metadata__":{"v":"-0"}})", "x"));
  ASSERT_ST_OK(named);
  EXPECT_EQ(named->tensors()[0].name, "layer-0");
  EXPECT_EQ(named->metadata()->front().second, "-0");
  EXPECT_ST_ERROR(open_bytes(raw_file(R"({"a":{"dtype":"U8","shape":[-01],"data_offsets":[0,0]}})")),
                  kInvalidHeaderJson);
  EXPECT_ST_ERROR(open_bytes(raw_file(R"({"a":{"dtype":"U8","shape":[-0e0],"data_offsets":[0,0]}})")),
                  kInvalidHeaderJson);
  auto escaped = open_bytes(raw_file(R"({"a\"-0":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}})", "x"));
  ASSERT_ST_OK(escaped);
  EXPECT_EQ(escaped->tensors()[0].name, "a\"-0");
}

}  // namespace
}  // namespace safetensors
