// Saving from Python: serialize and serialize_file of _safetensors_cpp (write_binding.cc), registered by
// module.cc.
#ifndef SAFETENSORS_PYTHON_WRITE_BINDING_H_
#define SAFETENSORS_PYTHON_WRITE_BINDING_H_

#include <nanobind/nanobind.h>

namespace safetensors::python {

// Adds serialize (to bytes) and serialize_file (atomically to a path) to `m`; both release the GIL while
// copying tensor bytes.
void bind_write(nanobind::module_& m);

}  // namespace safetensors::python

#endif  // SAFETENSORS_PYTHON_WRITE_BINDING_H_
