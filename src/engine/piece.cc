// The plan's pieces (engine.h): a whole tensor, or rows of its first dimension, as data-buffer ranges. The one
// place rows become bytes.
#include <optional>
#include <string>

#include "safetensors/engine.h"
#include "util/checked.h"
#include "util/quote.h"

namespace safetensors {

Result<Piece> tensor_piece(const File& file, const TensorInfo& tensor) {
  if (tensor.end < tensor.begin || tensor.end > file.size() - file.data_offset()) {
    return Error::invalid_argument(file.path(), "tensor " + internal::quote(tensor.name) + " is not in this file");
  }
  Piece p;
  p.begin = tensor.begin;
  p.end = tensor.end;
  p.tensor = tensor.name;
  p.swap_bytes = dtype_swap_bytes(tensor.dtype);
  return p;
}

Result<Piece> row_piece(const File& file, const TensorInfo& tensor, std::uint64_t r0, std::uint64_t r1) {
  SAFETENSORS_ASSIGN_OR_RETURN(Piece p, tensor_piece(file, tensor));
  if (tensor.shape.empty()) {
    return Error::invalid_slice(file.path(), tensor.name, "cannot take rows of a 0-d tensor");
  }
  const std::uint64_t rows = tensor.shape[0];
  if (r0 > r1 || r1 > rows) {
    return Error::invalid_slice(file.path(), tensor.name,
                                "rows [" + std::to_string(r0) + ", " + std::to_string(r1) +
                                    ") are out of range for a first dimension of " + std::to_string(rows));
  }
  const auto row_elems = internal::checked_product(tensor.shape.subspan(1));
  const auto row_bits = row_elems ? internal::checked_mul(*row_elems, dtype_bits(tensor.dtype)) : std::nullopt;
  const auto bit0 = row_bits ? internal::checked_mul(r0, *row_bits) : std::nullopt;
  const auto bit1 = row_bits ? internal::checked_mul(r1, *row_bits) : std::nullopt;
  if (!bit0 || !bit1) return Error::validation_overflow(file.path(), tensor.name);
  if (*bit0 % 8 != 0 || *bit1 % 8 != 0) return Error::misaligned_slice(file.path(), tensor.name);
  // bit1 / 8 <= nbytes(), which File::open() checked against the tensor's extent, so the sums cannot overflow.
  p.begin = tensor.begin + *bit0 / 8;
  p.end = tensor.begin + *bit1 / 8;
  if (p.end > tensor.end) return Error::validation_overflow(file.path(), tensor.name);
  return p;
}

}  // namespace safetensors
