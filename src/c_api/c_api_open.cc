// The C API's open options and opens of locations, local or remote (include/safetensors/c.h).
#include <cstdint>
#include <new>
#include <string>
#include <string_view>

#include "c_api/c_api_internal.h"
#include "safetensors/c.h"
#include "safetensors/error.h"
#include "safetensors/file.h"
#include "safetensors/sharded.h"

using safetensors::Error;
using safetensors::c_api::fail;
using safetensors::c_api::guarded;
using safetensors::c_api::make_handle;

struct safetensors_open_options_t {
  safetensors::OpenOptions options;
};

namespace {

const safetensors::OpenOptions& options_or_default(const safetensors_open_options_t* options) {
  static const safetensors::OpenOptions kDefaults;
  return options == nullptr ? kDefaults : options->options;
}

}  // namespace

extern "C" {

safetensors_open_options_t* safetensors_open_options_new(void) {
  return new (std::nothrow) safetensors_open_options_t{};
}

void safetensors_open_options_free(safetensors_open_options_t* options) { delete options; }

safetensors_code_t safetensors_open_options_set_backend(safetensors_open_options_t* options, int backend,
                                                        safetensors_error_t** error) {
  return guarded(error, [&] {
    auto parsed = safetensors::c_api::open_options(backend, "<open options>");
    if (!parsed.ok()) return fail(error, parsed.error());
    options->options.backend = parsed->backend;
    return SAFETENSORS_OK;
  });
}

safetensors_code_t safetensors_open_options_set_remote(safetensors_open_options_t* options, const char* key,
                                                       const char* value, safetensors_error_t** error) {
  return guarded(error, [&] {
    const safetensors::Status st = options->options.remote.set(key, value);
    return st.ok() ? SAFETENSORS_OK : fail(error, st.error());
  });
}

safetensors_code_t safetensors_open_with(const char* location, const safetensors_open_options_t* options,
                                         safetensors_file_t** file, safetensors_error_t** error) {
  *file = nullptr;
  return guarded(
      error, [&] { return make_handle(safetensors::File::open(location, options_or_default(options)), file, error); });
}

safetensors_code_t safetensors_sharded_open_index_with(const char* index_location,
                                                       const safetensors_open_options_t* options,
                                                       safetensors_sharded_t** sharded, safetensors_error_t** error) {
  *sharded = nullptr;
  return guarded(error, [&] {
    return make_handle(safetensors::ShardedFile::open_index(index_location, options_or_default(options)), sharded,
                       error);
  });
}

const char* safetensors_file_source_kind(const safetensors_file_t* file) {
  // Every kind() is a literal: its data is NUL-terminated and lives as long as the program.
  return file->set.source()->kind().data();
}

void safetensors_file_source_stats(const safetensors_file_t* file, uint64_t* requests, uint64_t* bytes_fetched,
                                   uint64_t* retries) {
  const safetensors::SourceStats s = file->set.source()->stats();
  if (requests != nullptr) *requests = s.requests;
  if (bytes_fetched != nullptr) *bytes_fetched = s.bytes_fetched;
  if (retries != nullptr) *retries = s.retries;
}

void safetensors_file_direct_stats(const safetensors_file_t* file, uint64_t* direct_bytes, uint64_t* bounced_bytes,
                                   uint64_t* cached_bytes, int* direct_refused, uint64_t* resident_bytes) {
  const safetensors::SourceStats s = file->set.source()->stats();
  if (direct_bytes != nullptr) *direct_bytes = s.direct_bytes;
  if (bounced_bytes != nullptr) *bounced_bytes = s.bounced_bytes;
  if (cached_bytes != nullptr) *cached_bytes = s.cached_bytes;
  if (direct_refused != nullptr) *direct_refused = s.direct_refused != 0 ? 1 : 0;
  if (resident_bytes != nullptr) *resident_bytes = s.resident_bytes;
}

int safetensors_file_source_counter(const safetensors_file_t* file, const char* name, size_t name_len,
                                    uint64_t* value) {
  const std::string_view wanted(name, name_len);
  for (const safetensors::SourceCounter& c : safetensors::kSourceCounters) {
    if (wanted == c.name) {
      *value = file->set.source()->stats().*c.field;
      return 1;
    }
  }
  return 0;
}

}  // extern "C"
