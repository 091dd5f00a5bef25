// src/format/json_writer.h (the one JSON string writer, in its two modes) and src/util/quote.h.
#include "format/json_writer.h"

#include <gtest/gtest.h>

#include <string>
#include <string_view>

#include "util/quote.h"

namespace safetensors::internal {
namespace {

std::string json(std::string_view s, JsonEscape mode) {
  std::string out = "x";  // appends, never replaces
  append_json_string(&out, s, mode);
  return out.substr(1);
}

TEST(JsonWriterTest, BothModesEscapeQuotesBackslashesAndControls) {
  for (JsonEscape mode : {JsonEscape::kRawUtf8, JsonEscape::kAscii}) {
    EXPECT_EQ(json("", mode), R"("")");
    EXPECT_EQ(json("plain.name_0", mode), R"("plain.name_0")");
    EXPECT_EQ(json("a\"b\\c", mode), R"("a\"b\\c")");
    EXPECT_EQ(json("\n\r\t\b\f", mode), R"("\n\r\t\b\f")");
    EXPECT_EQ(json(std::string_view("\x00\x01\x1f", 3), mode), R"("\u0000\u0001\u001f")");
    EXPECT_EQ(json(" ~/", mode), R"(" ~/")");
  }
}

TEST(JsonWriterTest, RawUtf8WritesNonAsciiAndDelAsTheyAre) {
  // The reference's header writer (serde_json).
  EXPECT_EQ(json("caf\xc3\xa9", JsonEscape::kRawUtf8), "\"caf\xc3\xa9\"");
  EXPECT_EQ(json("\xf0\x9f\x98\x80", JsonEscape::kRawUtf8), "\"\xf0\x9f\x98\x80\"");
  EXPECT_EQ(json("\x7f", JsonEscape::kRawUtf8), "\"\x7f\"");
}

TEST(JsonWriterTest, AsciiWritesWhatPythonJsonDumpsWrites) {
  // json.dumps("café") == '"caf\\u00e9"'; json.dumps("\x7f") == '"\\u007f"'; json.dumps("€") == '"\\u20ac"';
  // json.dumps("😀") == '"\\ud83d\\ude00"' (a surrogate pair, lowercase hex).
  EXPECT_EQ(json("caf\xc3\xa9", JsonEscape::kAscii), R"("caf\u00e9")");
  EXPECT_EQ(json("\x7f", JsonEscape::kAscii), R"("\u007f")");
  EXPECT_EQ(json("\xe2\x82\xac", JsonEscape::kAscii), R"("\u20ac")");
  EXPECT_EQ(json("\xf0\x9f\x98\x80", JsonEscape::kAscii), R"("\ud83d\ude00")");
  EXPECT_EQ(json("a\xc3\xa9\"\xe2\x82\xac", JsonEscape::kAscii), R"("a\u00e9\"\u20ac")");
}

TEST(QuoteTest, BackquotesAsMessagesNameThings) {
  EXPECT_EQ(quote("lm_head.weight"), "`lm_head.weight`");
  EXPECT_EQ(quote(""), "``");
  EXPECT_EQ(quote(std::string_view("a\0b", 3)), std::string("`a\0b`", 5));
}

}  // namespace
}  // namespace safetensors::internal
