// The dtype table's part of _safetensors_cpp (dtype_binding.cc), registered by module.cc.
#ifndef SAFETENSORS_PYTHON_DTYPE_BINDING_H_
#define SAFETENSORS_PYTHON_DTYPE_BINDING_H_

#include <nanobind/nanobind.h>

namespace safetensors::python {

// Adds dtype_table, torch_shape, header_shape and byteswap to `m`. Errors go through common.h's raise_error.
void bind_dtypes(nanobind::module_& m);

}  // namespace safetensors::python

#endif  // SAFETENSORS_PYTHON_DTYPE_BINDING_H_
