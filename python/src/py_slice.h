// PySafeSlice, safe_open.get_slice's handle on a tensor not read yet: a CPython type of its own (not a
// nanobind class) so that its methods are ordinary method descriptors whose text signatures inspect.signature
// reads, as the reference's PyO3 methods are; get_shape/get_dtype/len answer from the header in one C call.
#ifndef SAFETENSORS_PYTHON_PY_SLICE_H_
#define SAFETENSORS_PYTHON_PY_SLICE_H_

#include <nanobind/nanobind.h>

#include "safetensors/file.h"

namespace safetensors::python {

// Creates the type as `m.PySafeSlice`.
void bind_py_slice(nanobind::module_& m);

// A new handle on `tensor` of the File `file` (kept alive by the handle, and with it `tensor`); its [index]
// calls reader.slice_item(name, index).
nanobind::object make_py_slice(nanobind::handle file, nanobind::handle reader, const TensorInfo* tensor);

}  // namespace safetensors::python

#endif  // SAFETENSORS_PYTHON_PY_SLICE_H_
