// The dtype table (dtype.h) in _safetensors_cpp: its rows, torch's packing rule and the byte swap, so that the
// Python package states none of them again.
#include "dtype_binding.h"

#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/string_view.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "common.h"
#include "safetensors/dtype.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace safetensors::python {
namespace {

Dtype dtype_of(std::string_view code) {
  const auto d = dtype_from_code(code);
  if (!d) check(Status(Error::invalid_argument("<dtype>", "unknown dtype code " + std::string(code))));
  return *d;
}

}  // namespace

void bind_dtypes(nb::module_& m) {
  m.def(
      "dtype_table",
      []() {
        nb::list out;
        for (const DtypeInfo& row : kDtypeTable) {
          static constexpr const char* kKinds[] = {"bool", "signed", "unsigned", "float", "complex"};
          out.append(nb::make_tuple(
              nb::str(row.code.data(), row.code.size()), row.bits, kKinds[static_cast<int>(row.kind)], row.swap_bytes,
              row.dlpack_code == kNoDlpack ? nb::object(nb::none()) : nb::object(nb::int_(row.dlpack_code)),
              row.torch_pack, nb::str(row.torch_name.data(), row.torch_name.size()),
              nb::str(row.numpy_name.data(), row.numpy_name.size())));
        }
        return out;
      },
      nb::sig("def dtype_table() -> list[tuple[str, int, str, int, int | None, int, str, str]]"),
      "[(code, bits, kind, swap bytes, DLPack code or None, torch pack, torch name, numpy name)] in rank "
      "order: the one dtype table (include/safetensors/dtype.h). kind is bool/signed/unsigned/float/complex.");
  m.def(
      "torch_shape",
      [](std::string_view code, const std::vector<std::uint64_t>& shape) {
        return check(torch_shape(dtype_of(code), shape));
      },
      "code"_a, "shape"_a,
      "torch's shape for a header shape (a packed type's last dimension divided by its pack); SafetensorError "
      "where torch cannot hold it.");
  m.def(
      "header_shape",
      [](std::string_view code, const std::vector<std::uint64_t>& shape) {
        Result<std::vector<std::uint64_t>> out = header_shape(dtype_of(code), shape);
        // A tensor that cannot be saved as it is: Python's ValueError, as for the other refusals of a save.
        if (!out.ok()) throw nb::value_error(out.error().detail().c_str());
        return std::move(out).value();
      },
      "code"_a, "shape"_a,
      "The header shape for torch's shape (a packed type's last dimension multiplied by its pack); ValueError "
      "for a packed scalar.");
  m.def(
      "byteswap",
      [](nb::ndarray<std::uint8_t, nb::ndim<1>, nb::c_contig, nb::device::cpu> data, unsigned width) {
        if (width != 0 && width != 1 && width != 2 && width != 4 && width != 8) {
          check(Status(Error::invalid_argument("<byteswap>", "unit width " + std::to_string(width))));
        }
        if (width > 1 && data.shape(0) % width != 0) {
          check(Status(Error::invalid_argument("<byteswap>", "not a whole number of units")));
        }
        byteswap_units(std::span(reinterpret_cast<std::byte*>(data.data()), data.shape(0)), width);
      },
      "data"_a, "width"_a, nb::sig("def byteswap(data: typing.Any, width: int) -> None"),
      "Reverses each `width`-byte unit of a writable, contiguous 1-d uint8 CPU buffer in place (a bytearray, "
      "a numpy array, a torch tensor), on any host.");
}

}  // namespace safetensors::python
