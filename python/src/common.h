// What the parts of _safetensors_cpp share (module.cc, engine_binding.cc, sharded_binding.cc): the one error
// path into Python (errors.cc), the one way the GIL is released, and the conversions of arguments every part
// takes (common.cc).
#ifndef SAFETENSORS_PYTHON_COMMON_H_
#define SAFETENSORS_PYTHON_COMMON_H_

#include <nanobind/nanobind.h>

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "safetensors/error.h"
#include "safetensors/file.h"
#include "safetensors/slice.h"
#include "safetensors/source.h"
#include "safetensors/writer.h"

namespace safetensors::python {

// What the failing call was doing; decides the reference's message prefix for format errors.
enum class Op { kOpenFile, kOpenBytes, kSerialize, kOther };

// Throws `e` to the module's one exception translator (errors.cc), which raises SafetensorError,
// SafetensorIOError, SafetensorSliceError or FileNotFoundError with the reference's text.
[[noreturn]] void raise_error(Error e, Op op = Op::kOther);

// Raises the exception `kind` maps to with exactly `text`, no prefix and no variant token: for arguments the
// binding refuses itself (a backend name, an index the slicer cannot take), whose texts the package pins.
[[noreturn]] void raise_message(Error::Kind kind, const std::string& text);

// What raise_error and raise_message raise, set as the current Python error instead of thrown: for code that
// CPython calls directly (a C slot or vectorcall), which must return NULL rather than throw.
void set_python_error(const Error& e, Op op = Op::kOther);
void set_python_message(Error::Kind kind, const std::string& text);

// Creates SafetensorError, SafetensorSliceError and SafetensorIOError in `m` and registers the translator.
void register_errors(nanobind::module_& m);

// Runs `f` with the GIL released and returns its result: the one way the binding releases the GIL. `f`
// touches no Python object; arguments are converted before and results built into Python objects after
// (constructing an array or a str needs the GIL), which a whole-function call guard could not express.
template <typename F>
decltype(auto) without_gil(F&& f) {
  nanobind::gil_scoped_release release;
  return std::forward<F>(f)();
}

// The CPython calls the binding makes that the limited API (the cp312-abi3 wheel, SAFETENSORS_STABLE_ABI) lacks:
// the unchecked macro in a per-version build, the checked function of the stable ABI in the abi3 one.
#ifdef Py_LIMITED_API
#define ST_LIMITED_OR(checked, unchecked) checked
#else
#define ST_LIMITED_OR(checked, unchecked) unchecked
#endif
inline void list_set(PyObject* list, Py_ssize_t i, PyObject* item) {  // steals `item`
  ST_LIMITED_OR(PyList_SetItem, PyList_SET_ITEM)(list, i, item);
}
inline void tuple_set(PyObject* tuple, Py_ssize_t i, PyObject* item) {  // steals `item`
  ST_LIMITED_OR(PyTuple_SetItem, PyTuple_SET_ITEM)(tuple, i, item);
}
inline PyObject* tuple_get(PyObject* tuple, Py_ssize_t i) {  // borrowed
  return ST_LIMITED_OR(PyTuple_GetItem, PyTuple_GET_ITEM)(tuple, i);
}
inline Py_ssize_t tuple_size(PyObject* tuple) { return ST_LIMITED_OR(PyTuple_Size, PyTuple_GET_SIZE)(tuple); }
#undef ST_LIMITED_OR
inline std::string type_name(PyObject* o) {  // for error texts: "int", "numpy.ndarray"
#ifdef Py_LIMITED_API
  // tp_name is out of reach: the same text from the type's __module__ and __qualname__.
  try {
    nanobind::handle type(reinterpret_cast<PyObject*>(Py_TYPE(o)));
    std::string module = nanobind::str(type.attr("__module__")).c_str();
    std::string name = nanobind::str(type.attr("__qualname__")).c_str();
    return module == "builtins" ? name : module + "." + name;
  } catch (...) {
    PyErr_Clear();
    return "?";
  }
#else
  return Py_TYPE(o)->tp_name;
#endif
}
// Whether this thread holds the GIL (on a free-threaded Python: whether it is attached). The stable ABI has no
// PyGILState_Check: there, whether this thread has a thread state, which is the same for the binding's callers
// (methods and deallocations, which CPython runs with the GIL).
inline bool holds_gil() {
#ifdef Py_LIMITED_API
  return PyGILState_GetThisThreadState() != nullptr;
#else
  return PyGILState_Check() != 0;
#endif
}
inline char* bytearray_data(PyObject* bytearray) {
#ifdef Py_LIMITED_API
  return PyByteArray_AsString(bytearray);
#else
  return PyByteArray_AS_STRING(bytearray);
#endif
}

template <typename T>
T check(Result<T> r, Op op = Op::kOther) {
  if (!r.ok()) raise_error(std::move(r).error(), op);
  return std::move(r).value();
}
inline void check(Status s, Op op = Op::kOther) {
  if (!s.ok()) raise_error(std::move(s).error(), op);
}

// "mmap", "pread", "direct" or "auto"; anything else raises SafetensorError naming the choices.
Backend parse_backend(const std::string& name);

// Remote options as (key, value) text pairs, as safetensors._core.remote_pairs() makes them from a
// storage_options dict; each goes through RemoteOptions::set (the one parser).
using RemotePairs = std::vector<std::pair<std::string, std::string>>;
// The options of an open: the backend, the header cap and the remote options. Raises SafetensorError for a
// bad backend or option.
OpenOptions open_options(const std::string& backend, std::uint64_t max_header_bytes, const RemotePairs& remote);

// An index expression, a sequence of Python ints, slices and Ellipsis (numpy's basic indexing), as the
// slicer's indices; raises SafetensorError for anything else.
std::vector<SliceIndex> to_indices(nanobind::handle spec);

// A tuple of Python ints.
nanobind::tuple shape_tuple(std::span<const std::uint64_t> shape);

// (code, shape, begin, end) -- begin/end relative to the data buffer.
nanobind::tuple info_tuple(const TensorInfo& t);

// The caller's memory at `ptr`, `nbytes` long.
inline std::span<std::byte> dest(std::uintptr_t ptr, std::uint64_t nbytes) {
  return {reinterpret_cast<std::byte*>(ptr), static_cast<std::size_t>(nbytes)};
}

// (name, dtype code, shape, data_ptr, data_len): a tensor to save, as Python describes it.
using PyTensorSpec = std::tuple<std::string, std::string, std::vector<std::uint64_t>, std::uintptr_t, std::uint64_t>;
std::vector<TensorData> to_tensor_data(const std::vector<PyTensorSpec>& specs);

using PyMetadata = std::optional<std::vector<std::pair<std::string, std::string>>>;
std::optional<Metadata> to_metadata(const PyMetadata& md);

}  // namespace safetensors::python

#endif  // SAFETENSORS_PYTHON_COMMON_H_
