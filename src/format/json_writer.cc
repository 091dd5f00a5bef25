#include "format/json_writer.h"

#include <cstdint>

namespace safetensors::internal {
namespace {

void append_u16(std::string* out, std::uint32_t unit) {
  static constexpr char kHex[] = "0123456789abcdef";
  out->append("\\u");
  for (int shift = 12; shift >= 0; shift -= 4) out->push_back(kHex[(unit >> shift) & 0xf]);
}

// The UTF-8 sequence starting at s[*i] as a code point; advances *i past it. REQUIRES: s is valid UTF-8.
std::uint32_t next_code_point(std::string_view s, std::size_t* i) {
  const auto c = static_cast<unsigned char>(s[*i]);
  const int len = c >= 0xf0 ? 4 : c >= 0xe0 ? 3 : 2;
  std::uint32_t cp = c & (len == 4 ? 0x07 : len == 3 ? 0x0f : 0x1f);
  for (int k = 1; k < len; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[*i + k]) & 0x3f);
  *i += static_cast<std::size_t>(len);
  return cp;
}

}  // namespace

void append_json_string(std::string* out, std::string_view s, JsonEscape mode) {
  const bool ascii = mode == JsonEscape::kAscii;
  out->push_back('"');
  for (std::size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c >= 0x80 && ascii) {
      std::uint32_t cp = next_code_point(s, &i);
      if (cp >= 0x10000) {
        cp -= 0x10000;
        append_u16(out, 0xd800 + (cp >> 10));
        append_u16(out, 0xdc00 + (cp & 0x3ff));
      } else {
        append_u16(out, cp);
      }
      continue;
    }
    ++i;
    switch (c) {
      case '"': out->append("\\\""); break;
      case '\\': out->append("\\\\"); break;
      case '\n': out->append("\\n"); break;
      case '\r': out->append("\\r"); break;
      case '\t': out->append("\\t"); break;
      case '\b': out->append("\\b"); break;
      case '\f': out->append("\\f"); break;
      default:
        if (c < 0x20 || (c == 0x7f && ascii)) {
          append_u16(out, c);
        } else {
          out->push_back(static_cast<char>(c));
        }
    }
  }
  out->push_back('"');
}

}  // namespace safetensors::internal
