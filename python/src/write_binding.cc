// serialize and serialize_file (write_binding.h): a WritePlan over the caller's tensor memory, written with the
// GIL released.
#include "write_binding.h"

#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "common.h"
#include "safetensors/writer.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace safetensors::python {

void bind_write(nb::module_& m) {
  m.def(
      "serialize",
      [](const std::vector<PyTensorSpec>& specs,
         const std::optional<std::vector<std::pair<std::string, std::string>>>& metadata) {
        std::vector<TensorData> tensors = to_tensor_data(specs);
        WritePlan plan = check(WritePlan::make(tensors, to_metadata(metadata)), Op::kSerialize);
        nb::object out = nb::steal(PyBytes_FromStringAndSize(nullptr, static_cast<Py_ssize_t>(plan.total_size())));
        if (!out.is_valid()) throw nb::python_error();
        std::span<std::byte> dst(reinterpret_cast<std::byte*>(PyBytes_AsString(out.ptr())),
                                 static_cast<std::size_t>(plan.total_size()));
        check(without_gil([&] { return serialize_into(plan, tensors, dst); }), Op::kSerialize);
        return nb::borrow<nb::bytes>(out);
      },
      "tensors"_a, "metadata"_a = nb::none(),
      "Serializes [(name, dtype code, shape, data_ptr, data_len)] to bytes. Releases the GIL while copying.");

  m.def(
      "serialize_file",
      [](const std::vector<PyTensorSpec>& specs, const std::string& path,
         const std::optional<std::vector<std::pair<std::string, std::string>>>& metadata, bool fsync) {
        std::vector<TensorData> tensors = to_tensor_data(specs);
        std::optional<Metadata> md = to_metadata(metadata);
        check(without_gil([&] { return save_file(path, tensors, md, WriteOptions{.fsync = fsync}); }), Op::kSerialize);
      },
      "tensors"_a, "path"_a, "metadata"_a = nb::none(), "fsync"_a = false,
      "Writes [(name, dtype code, shape, data_ptr, data_len)] to path atomically. Releases the GIL.");
}

}  // namespace safetensors::python
