// The C API's sharded checkpoints (include/safetensors/c.h); their tensor accessors are c_api.cc's, shared
// with files.
#include "safetensors/c.h"

#include <span>
#include <string>
#include <vector>

#include "c_api/c_api_internal.h"
#include "safetensors/error.h"
#include "safetensors/file.h"
#include "safetensors/sharded.h"

using safetensors::Error;
using safetensors::c_api::fail;
using safetensors::c_api::guarded;
using safetensors::c_api::open_handle;
using safetensors::c_api::tensor_at;

extern "C" {

// -------------------------------------------------------------------------------------------------------
// Sharded checkpoints

safetensors_code_t safetensors_sharded_open_index(const char* index_path, int backend, safetensors_sharded_t** sharded,
                                                  safetensors_error_t** error) {
  return open_handle(
      backend, index_path,
      [&](const safetensors::OpenOptions& options) {
        return safetensors::ShardedFile::open_index(index_path, options);
      },
      sharded, error);
}

safetensors_code_t safetensors_sharded_open_files(const char* const* paths, size_t count, int backend,
                                                  safetensors_sharded_t** sharded, safetensors_error_t** error) {
  const auto open = [&](const safetensors::OpenOptions& options) -> safetensors::Result<safetensors::ShardedFile> {
    if (paths == nullptr && count != 0) return Error::invalid_argument("<shards>", "paths is NULL");
    std::vector<std::string> list;
    list.reserve(count);
    for (size_t k = 0; k < count; ++k) {
      if (paths[k] == nullptr) return Error::invalid_argument("<shards>", "path " + std::to_string(k) + " is NULL");
      list.emplace_back(paths[k]);
    }
    return safetensors::ShardedFile::open_files(list, options);
  };
  return open_handle(backend, "<shards>", open, sharded, error);
}

void safetensors_sharded_free(safetensors_sharded_t* sharded) { delete sharded; }

size_t safetensors_sharded_shard_count(const safetensors_sharded_t* sharded) { return sharded->set.shards().size(); }
const char* safetensors_sharded_shard_path(const safetensors_sharded_t* sharded, size_t shard) {
  const auto& shards = sharded->set.shards();
  return shard < shards.size() ? shards[shard].path().c_str() : nullptr;
}

size_t safetensors_sharded_tensor_shard(const safetensors_sharded_t* sharded, size_t i) {
  const auto* t = tensor_at(sharded, i);
  return t ? sharded->set.shard_of(*t) : sharded->set.shards().size();
}

safetensors_code_t safetensors_sharded_read_many(const safetensors_sharded_t* sharded,
                                                 const safetensors_read_request_t* requests, size_t count,
                                                 unsigned threads, safetensors_error_t** error) {
  return guarded(error, [&] {
    if (requests == nullptr && count != 0) return fail(error, Error::invalid_argument("<shards>", "requests is NULL"));
    std::vector<safetensors::ReadRequest> reqs;
    reqs.reserve(count);
    for (size_t k = 0; k < count; ++k) {
      auto t = safetensors::c_api::checked_tensor_at(sharded, requests[k].tensor);
      if (!t.ok()) return fail(error, t.error());
      reqs.push_back({*t, std::span<std::byte>(static_cast<std::byte*>(requests[k].dst), requests[k].dst_len)});
    }
    auto st = sharded->set.read_many(reqs, threads);
    return st.ok() ? SAFETENSORS_OK : fail(error, st.error());
  });
}

}  // extern "C"
