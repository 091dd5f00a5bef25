// The C API's saving (include/safetensors/c.h): save, serialize and save_sharded from caller memory.
#include "safetensors/c.h"

#include <cstdint>
#include <cstdlib>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "c_api/c_api_internal.h"
#include "safetensors/dtype.h"
#include "safetensors/error.h"
#include "safetensors/sharded.h"
#include "safetensors/writer.h"
#include "util/quote.h"

using safetensors::Error;
using safetensors::c_api::fail;
using safetensors::c_api::fail_internal;
using safetensors::c_api::guarded;
using safetensors::internal::quote;

namespace {

// The caller's tensors and metadata as C++ values, or the Error that makes them unusable.
struct SaveInputs {
  std::vector<safetensors::TensorData> tensors;
  std::optional<safetensors::Metadata> metadata;
};

safetensors::Result<SaveInputs> to_save_inputs(const safetensors_tensor_t* tensors, size_t count,
                                               const safetensors_metadata_entry_t* metadata, size_t metadata_count,
                                               uint32_t flags, uint32_t known_flags) {
  const std::string_view context = "<save>";
  if ((flags & ~known_flags) != 0) {
    return Error::invalid_argument(context, "unknown flags " + std::to_string(flags & ~known_flags));
  }
  if (tensors == nullptr && count != 0) return Error::invalid_argument(context, "tensors is NULL");
  if (metadata == nullptr && metadata_count != 0) return Error::invalid_argument(context, "metadata is NULL");
  SaveInputs in;
  in.tensors.reserve(count);
  for (size_t i = 0; i < count; ++i) {
    const safetensors_tensor_t& t = tensors[i];
    if ((t.name == nullptr && t.name_len != 0) || (t.shape == nullptr && t.rank != 0) ||
        (t.data == nullptr && t.size != 0)) {
      return Error::invalid_argument(context, "tensor " + std::to_string(i) + " has a NULL name, shape or data");
    }
    std::string name = t.name_len ? std::string(t.name, t.name_len) : std::string();
    if (t.dtype < 0 || static_cast<std::size_t>(t.dtype) >= safetensors::kDtypeTable.size()) {
      return Error::invalid_argument(context,
                                     "tensor " + quote(name) + " has unknown dtype " + std::to_string(t.dtype));
    }
    safetensors::TensorData d;
    d.name = std::move(name);
    d.dtype = static_cast<safetensors::Dtype>(t.dtype);
    if (t.rank) d.shape.assign(t.shape, t.shape + t.rank);
    d.data = std::span<const std::byte>(static_cast<const std::byte*>(t.data), t.size);
    in.tensors.push_back(std::move(d));
  }
  if (metadata != nullptr) {
    safetensors::Metadata md;
    md.reserve(metadata_count);
    for (size_t i = 0; i < metadata_count; ++i) {
      const auto& m = metadata[i];
      if ((m.key == nullptr && m.key_len != 0) || (m.value == nullptr && m.value_len != 0)) {
        return Error::invalid_argument(context, "metadata entry " + std::to_string(i) + " has a NULL key or value");
      }
      md.emplace_back(m.key_len ? std::string(m.key, m.key_len) : std::string(),
                      m.value_len ? std::string(m.value, m.value_len) : std::string());
    }
    in.metadata = std::move(md);
  }
  return in;
}

}  // namespace

extern "C" {

// -------------------------------------------------------------------------------------------------------
// Writing

safetensors_code_t safetensors_save(const char* path, const safetensors_tensor_t* tensors, size_t count,
                                    const safetensors_metadata_entry_t* metadata, size_t metadata_count, uint32_t flags,
                                    safetensors_error_t** error) {
  return guarded(error, [&] {
    auto in = to_save_inputs(tensors, count, metadata, metadata_count, flags, SAFETENSORS_SAVE_FSYNC);
    if (!in.ok()) return fail(error, in.error());
    auto st = safetensors::save_file(path, in->tensors, in->metadata, {.fsync = (flags & SAFETENSORS_SAVE_FSYNC) != 0});
    return st.ok() ? SAFETENSORS_OK : fail(error, st.error());
  });
}

safetensors_code_t safetensors_serialize(const safetensors_tensor_t* tensors, size_t count,
                                         const safetensors_metadata_entry_t* metadata, size_t metadata_count,
                                         void** out, size_t* out_len, safetensors_error_t** error) {
  *out = nullptr;
  return guarded(error, [&] {
    auto in = to_save_inputs(tensors, count, metadata, metadata_count, 0, 0);
    if (!in.ok()) return fail(error, in.error());
    auto plan = safetensors::WritePlan::make(in->tensors, in->metadata);
    if (!plan.ok()) return fail(error, plan.error());
    if (plan->total_size() > SIZE_MAX) {
      return fail(error, Error::validation_overflow("<memory>", ""));
    }
    const auto size = static_cast<size_t>(plan->total_size());
    void* buf = std::malloc(size ? size : 1);
    if (buf == nullptr) return fail_internal(error, SAFETENSORS_OUT_OF_MEMORY, "");
    auto st = safetensors::serialize_into(*plan, in->tensors, std::span<std::byte>(static_cast<std::byte*>(buf), size));
    if (!st.ok()) {
      std::free(buf);
      return fail(error, st.error());
    }
    *out = buf;
    *out_len = size;
    return SAFETENSORS_OK;
  });
}

void safetensors_buffer_free(void* buffer) { std::free(buffer); }

safetensors_code_t safetensors_save_sharded(const char* directory, const char* prefix, uint64_t max_shard_bytes,
                                            const safetensors_tensor_t* tensors, size_t count,
                                            const safetensors_metadata_entry_t* metadata, size_t metadata_count,
                                            uint32_t flags, size_t* shard_count, safetensors_error_t** error) {
  return guarded(error, [&] {
    auto in = to_save_inputs(tensors, count, metadata, metadata_count, flags, SAFETENSORS_SAVE_FSYNC);
    if (!in.ok()) return fail(error, in.error());
    safetensors::ShardingOptions options;
    options.max_shard_bytes = max_shard_bytes;
    if (prefix != nullptr) options.prefix = prefix;
    options.shard_metadata = std::move(in->metadata);
    options.write.fsync = (flags & SAFETENSORS_SAVE_FSYNC) != 0;
    auto plan = safetensors::save_sharded(directory, in->tensors, options);
    if (!plan.ok()) return fail(error, plan.error());
    if (shard_count != nullptr) *shard_count = plan->shards.size();
    return SAFETENSORS_OK;
  });
}

}  // extern "C"
