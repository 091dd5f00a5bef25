// What the C API's sources share (include/safetensors/c.h is the contract): the handles behind its opaque
// types, and the one place where Errors and exceptions become codes and error objects, so that no C++
// exception crosses into C. The API is one source per concern: c_api.cc (codes, errors, dtypes, files, views,
// slices), c_api_open.cc (open options, locations), c_api_write.cc, c_api_sharded.cc and c_api_engine.cc.
#ifndef SAFETENSORS_SRC_C_API_C_API_INTERNAL_H_
#define SAFETENSORS_SRC_C_API_C_API_INTERNAL_H_

#include <cstddef>
#include <exception>
#include <new>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "safetensors/c.h"
#include "safetensors/error.h"
#include "safetensors/file.h"
#include "safetensors/sharded.h"

struct safetensors_error_t {
  safetensors_code_t code;
  std::string message;
  std::string context;
  std::string tensor;
};

namespace safetensors::internal {

// What a file handle and a sharded handle share: the C++ object (a File or a ShardedFile, which answer the
// same queries) and its tensor names, copied so that they can be handed out NUL-terminated (a File's arena
// holds them back to back). Every accessor the two handles share is written once, over this template.
template <typename Set>
struct TensorSetHandle {
  Set set;
  std::vector<std::string> names;
};

}  // namespace safetensors::internal

struct safetensors_file_t : safetensors::internal::TensorSetHandle<safetensors::File> {};

struct safetensors_view_t {
  safetensors::TensorView view;
};

struct safetensors_sharded_t : safetensors::internal::TensorSetHandle<safetensors::ShardedFile> {};

namespace safetensors::c_api {

// Reports `e` through `error` (convention 3) and returns its code.
safetensors_code_t fail(safetensors_error_t** error, const Error& e);
// Reports an error that is no Error (out of memory, an exception) and returns `code`.
safetensors_code_t fail_internal(safetensors_error_t** error, safetensors_code_t code, const char* what);

// Runs `body` (which returns a code and reports its own Errors with fail()) and turns any exception into a
// code, so none escapes into C.
template <typename Body>
safetensors_code_t guarded(safetensors_error_t** error, Body&& body) noexcept {
  try {
    return body();
  } catch (const std::bad_alloc&) {
    return fail_internal(error, SAFETENSORS_OUT_OF_MEMORY, "");
  } catch (const std::exception& e) {
    return fail_internal(error, SAFETENSORS_INTERNAL, e.what());
  } catch (...) {
    return fail_internal(error, SAFETENSORS_INTERNAL, "unknown exception");
  }
}

// `s` as the C API hands strings out: NUL-terminated, its length in *len (where len is not NULL).
const char* out_string(const std::string& s, size_t* len);

Error out_of_range(const std::string& context, std::size_t i, std::size_t count);
std::vector<std::string> copy_names(const std::vector<TensorInfo>& tensors);

// How errors about a handle name it: the file, or "<shards>" for a sharded handle.
inline const std::string& context_of(const safetensors_file_t* h) { return h->set.path(); }
inline std::string context_of(const safetensors_sharded_t*) { return "<shards>"; }

// A new handle over the opened set, or the open's error.
template <typename H, typename Set>
safetensors_code_t make_handle(Result<Set> opened, H** out, safetensors_error_t** error) {
  if (!opened.ok()) return fail(error, opened.error());
  std::vector<std::string> names = copy_names(opened->tensors());
  *out = new H{{std::move(opened).value(), std::move(names)}};
  return SAFETENSORS_OK;
}

template <typename H>
const TensorInfo* tensor_at(const H* h, size_t i) {
  return i < h->set.tensors().size() ? &h->set.tensors()[i] : nullptr;
}

// Tensor i, or the out-of-range Error.
template <typename H>
Result<const TensorInfo*> checked_tensor_at(const H* h, size_t i) {
  const auto* t = tensor_at(h, i);
  if (t == nullptr) return out_of_range(context_of(h), i, h->set.tensors().size());
  return t;
}

// The options an open with C backend `b` uses, or the Error (naming `context`) for an unknown backend or for
// MEMORY, a read path no open asks for: the one place a request for it is refused.
Result<OpenOptions> open_options(int b, std::string_view context);

// The C API's opens by backend: *out is NULL, then a new handle over open(options for `backend`), or the
// Error of the backend (naming `context`) or of the open.
template <typename H, typename Open>
safetensors_code_t open_handle(int backend, std::string_view context, Open&& open, H** out,
                               safetensors_error_t** error) {
  *out = nullptr;
  return guarded(error, [&] {
    auto options = open_options(backend, context);
    if (!options.ok()) return fail(error, options.error());
    return make_handle(open(*options), out, error);
  });
}

}  // namespace safetensors::c_api

#endif  // SAFETENSORS_SRC_C_API_C_API_INTERNAL_H_
