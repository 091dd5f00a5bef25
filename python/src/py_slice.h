// PySafeSlice, safe_open.get_slice's handle on a tensor not read yet: a CPython type of its own (not a
// nanobind class) so that its methods are ordinary method descriptors whose text signatures inspect.signature
// reads, as the reference's PyO3 methods are; get_shape/get_dtype/len answer from the header in one C call.
// SafeOpenBase, the native base class of safe_open, owns get_slice: one method lookup and one C call from a
// name to a handle.
#ifndef SAFETENSORS_PYTHON_PY_SLICE_H_
#define SAFETENSORS_PYTHON_PY_SLICE_H_

#include <nanobind/nanobind.h>

namespace safetensors::python {

// Creates the types as `m.PySafeSlice` and `m.SafeOpenBase` (safe_open's native base: its get_slice, fed by
// _attach(file, reader), asked by _open() and stopped by _detach(): the one record of whether it is open).
void bind_py_slice(nanobind::module_& m);

}  // namespace safetensors::python

#endif  // SAFETENSORS_PYTHON_PY_SLICE_H_
