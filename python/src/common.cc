// The argument conversions every part of _safetensors_cpp takes (common.h).
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "common.h"
#include "safetensors/dtype.h"
#include "safetensors/slice.h"

namespace nb = nanobind;

namespace safetensors::python {
namespace {

// A Python int (or anything with __index__) as the slicer's 64-bit position. A bound beyond 64 bits is
// equivalent to the limit (Python clamps slices), and an integer index beyond them is out of bounds either way.
std::int64_t clamped_index(nb::handle value) {
  nb::object index = nb::steal(PyNumber_Index(value.ptr()));
  if (!index.is_valid()) throw nb::python_error();
  int overflow = 0;
  const long long i = PyLong_AsLongLongAndOverflow(index.ptr(), &overflow);
  if (overflow != 0) return overflow > 0 ? INT64_MAX : INT64_MIN;
  if (i == -1 && PyErr_Occurred()) throw nb::python_error();
  return i;
}

std::optional<std::int64_t> slice_bound(nb::handle value) {
  if (value.is_none()) return std::nullopt;
  if (!PyIndex_Check(value.ptr())) {
    raise_message(Error::Kind::kInvalidSlice,
                  "slice indices must be integers or None or have an __index__ method (got " +
                      std::string(nb::type_name(value.type()).c_str()) + ")");
  }
  return clamped_index(value);
}

}  // namespace

// An index expression of Python objects: integers, slices and Ellipsis, numpy's basic indexing. (The layers
// numpy adds on top -- None, one integer list -- are resolved in python/safetensors/_slicing.py.)
std::vector<SliceIndex> to_indices(nb::handle spec) {
  std::vector<SliceIndex> out;
  for (nb::handle item : spec) {
    if (item.is(Py_Ellipsis)) {
      out.push_back(SliceIndex::ellipsis());
    } else if (PySlice_Check(item.ptr())) {
      out.push_back(SliceIndex::range(slice_bound(item.attr("start")), slice_bound(item.attr("stop")),
                                      slice_bound(item.attr("step"))));
    } else if (PyIndex_Check(item.ptr()) && !PyBool_Check(item.ptr())) {
      out.push_back(SliceIndex::at(clamped_index(item)));
    } else {
      raise_message(Error::Kind::kInvalidSlice,
                    "only integers, slices (`:`) and ellipsis (`...`) are valid indices here (got " +
                        std::string(nb::type_name(item.type()).c_str()) + ")");
    }
  }
  return out;
}

nb::tuple shape_tuple(std::span<const std::uint64_t> shape) {
  nb::object t = nb::steal(PyTuple_New(static_cast<Py_ssize_t>(shape.size())));
  for (std::size_t i = 0; i < shape.size(); ++i) {
    tuple_set(t.ptr(), static_cast<Py_ssize_t>(i), PyLong_FromUnsignedLongLong(shape[i]));
  }
  return nb::borrow<nb::tuple>(t);
}

Backend parse_backend(const std::string& name) {
  if (name == "mmap") return Backend::kMmap;
  if (name == "pread") return Backend::kPread;
  if (name == "direct") return Backend::kDirect;
  if (name == "auto") return Backend::kAuto;
  raise_message(Error::Kind::kInvalidArgument,
                "backend \"" + name + "\" is invalid (expected one of: \"mmap\", \"pread\", \"direct\", \"auto\")");
}

OpenOptions open_options(const std::string& backend, std::uint64_t max_header_bytes, const RemotePairs& remote) {
  OpenOptions options;
  options.backend = parse_backend(backend);
  options.max_header_bytes = max_header_bytes;
  for (const auto& [key, value] : remote) check(options.remote.set(key, value));
  return options;
}

nb::tuple info_tuple(const TensorInfo& t) {
  return nb::make_tuple(nb::str(dtype_code(t.dtype).data(), dtype_code(t.dtype).size()), shape_tuple(t.shape), t.begin,
                        t.end);
}

std::vector<TensorData> to_tensor_data(const std::vector<PyTensorSpec>& specs) {
  std::vector<TensorData> out;
  out.reserve(specs.size());
  for (const auto& [name, code, shape, ptr, len] : specs) {
    auto dt = dtype_from_code(code);
    if (!dt) raise_error(Error::invalid_argument("", "unknown dtype code \"" + code + "\""));
    out.push_back({name, *dt, shape, std::span<const std::byte>(reinterpret_cast<const std::byte*>(ptr), len)});
  }
  return out;
}

std::optional<Metadata> to_metadata(const PyMetadata& md) {
  if (!md) return std::nullopt;
  return Metadata(md->begin(), md->end());
}

}  // namespace safetensors::python
