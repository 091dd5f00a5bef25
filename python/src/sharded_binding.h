// Sharded checkpoints (sharded.h) in _safetensors_cpp (sharded_binding.cc), registered by module.cc.
#ifndef SAFETENSORS_PYTHON_SHARDED_BINDING_H_
#define SAFETENSORS_PYTHON_SHARDED_BINDING_H_

#include <nanobind/nanobind.h>

#include "safetensors/error.h"

namespace safetensors::python {

// Adds ShardIndex, ShardedFile, ShardPlan, plan_shards, write_index and save_sharded to `m`. REQUIRES: File is
// already bound in `m` (ShardedFile.shards and ShardIndex.select take and return File objects). `raise` throws
// the module's translated error for an Error (module.cc's one translation path); it never returns.
void bind_sharded(nanobind::module_& m, void (*raise)(Error));

}  // namespace safetensors::python

#endif  // SAFETENSORS_PYTHON_SHARDED_BINDING_H_
