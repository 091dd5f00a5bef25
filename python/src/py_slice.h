// PySafeSlice, safe_open.get_slice's handle on a tensor not read yet: a CPython type of its own (not a
// nanobind class) so that its methods are ordinary method descriptors whose text signatures inspect.signature
// reads, as the reference's PyO3 methods are; get_shape/get_dtype/len answer from the header in one C call.
// SliceGetter, get_slice itself: one vectorcall from a name to a handle (20k names: the cost of open + keys
// + every shape is mostly these calls).
#ifndef SAFETENSORS_PYTHON_PY_SLICE_H_
#define SAFETENSORS_PYTHON_PY_SLICE_H_

#include <nanobind/nanobind.h>

#include "safetensors/file.h"

namespace safetensors::python {

// Creates the types as `m.PySafeSlice` and `m.SliceGetter`.
void bind_py_slice(nanobind::module_& m);

// safe_open.get_slice for the File `file`: a callable whose call getter(name) returns a new PySafeSlice on
// tensor `name` (keeping `file` alive, and with it the tensor's header entry), whose [index] calls
// reader.slice_item(name, index). getter.close() makes later calls raise "File is closed".
nanobind::object make_slice_getter(nanobind::handle file, nanobind::handle reader);

}  // namespace safetensors::python

#endif  // SAFETENSORS_PYTHON_PY_SLICE_H_
