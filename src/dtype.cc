#include "safetensors/dtype.h"

namespace safetensors {

std::optional<Dtype> dtype_from_code(std::string_view code) {
  for (const DtypeInfo& row : kDtypeTable) {
    if (row.code == code) return row.dtype;
  }
  return std::nullopt;
}

std::optional<Dtype> dtype_from_torch_name(std::string_view name) {
  if (name.empty()) return std::nullopt;
  for (const DtypeInfo& row : kDtypeTable) {
    if (row.torch_name == name) return row.dtype;
  }
  return std::nullopt;
}

}  // namespace safetensors
