// Parsing and validating the header (COMPAT.md sections 1 and 2). Internal: File is the public face.
#ifndef SAFETENSORS_SRC_FORMAT_HEADER_H_
#define SAFETENSORS_SRC_FORMAT_HEADER_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string_view>
#include <vector>

#include "format/name_index.h"
#include "safetensors/error.h"
#include "safetensors/file.h"
#include "safetensors/source.h"

namespace safetensors::internal {

// A validated header. Names and shapes live in two arenas (no allocation per tensor); the TensorInfo views
// point into them, and stay valid when a ParsedHeader is moved.
struct ParsedHeader {
  std::uint64_t header_length = 0;  // N
  std::unique_ptr<char[]> names;    // every tensor name, back to back
  std::vector<std::uint64_t> dims;  // every shape, back to back
  std::vector<TensorInfo> tensors;  // file order: by (begin, end), ties in header order
  NameIndex index;                  // name -> position in `tensors`
  std::optional<Metadata> metadata;
};

// Validation steps 4-10 over the N header bytes `json`, for a file whose data buffer (everything after the
// header) is `data_length` bytes. `json` must be followed by at least kJsonPadding readable bytes, whose
// values do not matter.
Result<ParsedHeader> parse_header_json(std::string_view json, std::uint64_t data_length, std::string_view context);

// Steps 1-10: reads the length prefix and the header from `source` and validates them.
Result<ParsedHeader> read_header(const Source& source, std::uint64_t max_header_bytes);

// Bytes that must be readable after the end of the JSON text given to parse_header_json.
inline constexpr std::size_t kJsonPadding = 64;

}  // namespace safetensors::internal

#endif  // SAFETENSORS_SRC_FORMAT_HEADER_H_
