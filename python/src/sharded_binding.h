// Sharded checkpoints (sharded.h) in _safetensors_cpp (sharded_binding.cc), registered by module.cc.
#ifndef SAFETENSORS_PYTHON_SHARDED_BINDING_H_
#define SAFETENSORS_PYTHON_SHARDED_BINDING_H_

#include <nanobind/nanobind.h>

#include "safetensors/error.h"

namespace safetensors::python {

// Adds ShardIndex, ShardedFile, ShardPlan, plan_shards, write_index and save_sharded to `m` (the `sharded`
// submodule). REQUIRES: File is already bound in the parent module (ShardedFile.shards and ShardIndex.select take
// and return File objects). Errors go through common.h's raise_error.
void bind_sharded(nanobind::module_& m);

}  // namespace safetensors::python

#endif  // SAFETENSORS_PYTHON_SHARDED_BINDING_H_
