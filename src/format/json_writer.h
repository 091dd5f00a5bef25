// Writing JSON string literals: the one implementation of JSON escaping, for the two texts the library writes.
#ifndef SAFETENSORS_SRC_FORMAT_JSON_WRITER_H_
#define SAFETENSORS_SRC_FORMAT_JSON_WRITER_H_

#include <string>
#include <string_view>

namespace safetensors::internal {

enum class JsonEscape {
  // As the reference writes a file header (serde_json): `"` and `\` escaped, \n \t \r \b \f short, other
  // characters below 0x20 as \u00xx; everything else, DEL and non-ASCII UTF-8 included, raw.
  kRawUtf8,
  // As Python's json.dumps(ensure_ascii=True) writes an index (transformers): the same escapes, and DEL and
  // every non-ASCII character as \uxxxx, UTF-16 surrogate pairs above U+FFFF. REQUIRES: valid UTF-8.
  kAscii,
};

// Appends `s` as a quoted JSON string (lowercase hex in every \u escape).
void append_json_string(std::string* out, std::string_view s, JsonEscape mode);

}  // namespace safetensors::internal

#endif  // SAFETENSORS_SRC_FORMAT_JSON_WRITER_H_
