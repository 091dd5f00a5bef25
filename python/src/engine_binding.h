// The engine's part of _safetensors_cpp (engine_binding.cc), registered by module.cc.
#ifndef SAFETENSORS_PYTHON_ENGINE_BINDING_H_
#define SAFETENSORS_PYTHON_ENGINE_BINDING_H_

#include <nanobind/nanobind.h>

#include "safetensors/error.h"

namespace safetensors::python {

// Adds Prefetcher, PrefetchEvent, CopyQueue and the slab-pool functions to `m` (the `engine` submodule).
// Errors go through common.h's raise_error.
void bind_engine(nanobind::module_& m);

}  // namespace safetensors::python

#endif  // SAFETENSORS_PYTHON_ENGINE_BINDING_H_
