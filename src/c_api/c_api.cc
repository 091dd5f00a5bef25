// The C API (include/safetensors/c.h): codes and errors, dtypes, files and sharded files' shared accessors,
// views and slices. c_api_internal.h lists the other parts.
#include "safetensors/c.h"

#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "c_api/c_api_internal.h"
#include "safetensors/dtype.h"
#include "safetensors/error.h"
#include "safetensors/file.h"
#include "safetensors/sharded.h"
#include "safetensors/slice.h"
#include "safetensors/source.h"
#include "util/quote.h"

using safetensors::Dtype;
using safetensors::Error;
using safetensors::c_api::checked_tensor_at;
using safetensors::c_api::fail;
using safetensors::c_api::guarded;
using safetensors::c_api::make_handle;
using safetensors::c_api::open_handle;
using safetensors::c_api::out_string;
using safetensors::c_api::tensor_at;
using safetensors::internal::quote;

// The enums of c.h are the C++ enums by value.
#define SAFETENSORS_SAME_DTYPE_(c, cpp) static_assert(c == static_cast<int>(Dtype::cpp), #c)
SAFETENSORS_SAME_DTYPE_(SAFETENSORS_BOOL, kBool);
SAFETENSORS_SAME_DTYPE_(SAFETENSORS_F4, kF4);
SAFETENSORS_SAME_DTYPE_(SAFETENSORS_F6_E2M3, kF6_E2M3);
SAFETENSORS_SAME_DTYPE_(SAFETENSORS_F6_E3M2, kF6_E3M2);
SAFETENSORS_SAME_DTYPE_(SAFETENSORS_U8, kU8);
SAFETENSORS_SAME_DTYPE_(SAFETENSORS_I8, kI8);
SAFETENSORS_SAME_DTYPE_(SAFETENSORS_F8_E5M2, kF8_E5M2);
SAFETENSORS_SAME_DTYPE_(SAFETENSORS_F8_E4M3, kF8_E4M3);
SAFETENSORS_SAME_DTYPE_(SAFETENSORS_F8_E8M0, kF8_E8M0);
SAFETENSORS_SAME_DTYPE_(SAFETENSORS_F8_E4M3FNUZ, kF8_E4M3FNUZ);
SAFETENSORS_SAME_DTYPE_(SAFETENSORS_F8_E5M2FNUZ, kF8_E5M2FNUZ);
SAFETENSORS_SAME_DTYPE_(SAFETENSORS_I16, kI16);
SAFETENSORS_SAME_DTYPE_(SAFETENSORS_U16, kU16);
SAFETENSORS_SAME_DTYPE_(SAFETENSORS_F16, kF16);
SAFETENSORS_SAME_DTYPE_(SAFETENSORS_BF16, kBF16);
SAFETENSORS_SAME_DTYPE_(SAFETENSORS_I32, kI32);
SAFETENSORS_SAME_DTYPE_(SAFETENSORS_U32, kU32);
SAFETENSORS_SAME_DTYPE_(SAFETENSORS_F32, kF32);
SAFETENSORS_SAME_DTYPE_(SAFETENSORS_C64, kC64);
SAFETENSORS_SAME_DTYPE_(SAFETENSORS_F64, kF64);
SAFETENSORS_SAME_DTYPE_(SAFETENSORS_I64, kI64);
SAFETENSORS_SAME_DTYPE_(SAFETENSORS_U64, kU64);
#undef SAFETENSORS_SAME_DTYPE_
static_assert(safetensors::kDtypeTable.size() == SAFETENSORS_U64 + 1, "c.h lists every dtype");
static_assert(SAFETENSORS_BACKEND_MMAP == static_cast<int>(safetensors::Backend::kMmap) &&
                  SAFETENSORS_BACKEND_PREAD == static_cast<int>(safetensors::Backend::kPread) &&
                  SAFETENSORS_BACKEND_DIRECT == static_cast<int>(safetensors::Backend::kDirect) &&
                  SAFETENSORS_BACKEND_AUTO == static_cast<int>(safetensors::Backend::kAuto),
              "c.h backends are the C++ backend requests");
static_assert(SAFETENSORS_BACKEND_MMAP == static_cast<int>(safetensors::ReadPath::kMmap) &&
                  SAFETENSORS_BACKEND_PREAD == static_cast<int>(safetensors::ReadPath::kPread) &&
                  SAFETENSORS_BACKEND_MEMORY == static_cast<int>(safetensors::ReadPath::kMemory) &&
                  SAFETENSORS_BACKEND_DIRECT == static_cast<int>(safetensors::ReadPath::kDirect),
              "c.h backends are the C++ read paths");

struct safetensors_slice_plan_t {
  safetensors::SlicePlan plan;
  // What the plan was made for, so a plan given with another file or tensor is refused.
  const safetensors::Source* source;
  std::size_t tensor;
};

namespace {

// Handed out when even an error object cannot be allocated; safetensors_error_free() leaves it alone.
safetensors_error_t g_out_of_memory{SAFETENSORS_OUT_OF_MEMORY, "out of memory (OutOfMemory)", "", ""};

const std::uint64_t kNoDims[1] = {0};

safetensors_code_t code_of(Error::Kind kind) {
  switch (kind) {
    case Error::Kind::kHeaderTooSmall: return SAFETENSORS_HEADER_TOO_SMALL;
    case Error::Kind::kHeaderTooLarge: return SAFETENSORS_HEADER_TOO_LARGE;
    case Error::Kind::kInvalidHeaderLength: return SAFETENSORS_INVALID_HEADER_LENGTH;
    case Error::Kind::kInvalidHeaderUtf8: return SAFETENSORS_INVALID_HEADER_UTF8;
    case Error::Kind::kInvalidHeaderJson: return SAFETENSORS_INVALID_HEADER_JSON;
    case Error::Kind::kInvalidOffset: return SAFETENSORS_INVALID_OFFSET;
    case Error::Kind::kValidationOverflow: return SAFETENSORS_VALIDATION_OVERFLOW;
    case Error::Kind::kMisalignedSlice: return SAFETENSORS_MISALIGNED_SLICE;
    case Error::Kind::kTensorInvalidInfo: return SAFETENSORS_TENSOR_INVALID_INFO;
    case Error::Kind::kMetadataIncompleteBuffer: return SAFETENSORS_METADATA_INCOMPLETE_BUFFER;
    case Error::Kind::kTensorNotFound: return SAFETENSORS_TENSOR_NOT_FOUND;
    case Error::Kind::kInvalidSlice: return SAFETENSORS_INVALID_SLICE;
    case Error::Kind::kNotFound: return SAFETENSORS_NOT_FOUND;
    case Error::Kind::kIo: return SAFETENSORS_IO;
    case Error::Kind::kInvalidArgument: return SAFETENSORS_INVALID_ARGUMENT;
  }
  return SAFETENSORS_INTERNAL;
}

void set_error(safetensors_error_t** error, safetensors_error_t* value) {
  if (error == nullptr) return;
  safetensors_error_free(*error);
  *error = value;
}

}  // namespace

namespace safetensors::c_api {

safetensors_code_t fail(safetensors_error_t** error, const Error& e) {
  const safetensors_code_t code = code_of(e.kind());
  if (error != nullptr) {
    try {
      set_error(error, new safetensors_error_t{code, e.to_string(), e.context(), e.tensor()});
    } catch (const std::bad_alloc&) {
      set_error(error, &g_out_of_memory);
    }
  }
  return code;
}

safetensors_code_t fail_internal(safetensors_error_t** error, safetensors_code_t code, const char* what) {
  if (code == SAFETENSORS_OUT_OF_MEMORY) {
    set_error(error, &g_out_of_memory);
    return code;
  }
  if (error != nullptr) {
    try {
      set_error(error, new safetensors_error_t{code, std::string("internal error: ") + what + " (Internal)", "", ""});
    } catch (const std::bad_alloc&) {
      set_error(error, &g_out_of_memory);
    }
  }
  return code;
}

const char* out_string(const std::string& s, size_t* len) {
  if (len != nullptr) *len = s.size();
  return s.c_str();
}

std::vector<std::string> copy_names(const std::vector<safetensors::TensorInfo>& tensors) {
  std::vector<std::string> names;
  names.reserve(tensors.size());
  for (const auto& t : tensors) names.emplace_back(t.name);
  return names;
}

Error out_of_range(const std::string& context, std::size_t i, std::size_t count) {
  return Error::invalid_argument(
      context, "tensor position " + std::to_string(i) + " is out of range (" + std::to_string(count) + " tensors)");
}

Result<OpenOptions> open_options(int b, std::string_view context) {
  switch (b) {
    case SAFETENSORS_BACKEND_MMAP: return safetensors::OpenOptions{.backend = safetensors::Backend::kMmap};
    case SAFETENSORS_BACKEND_PREAD: return safetensors::OpenOptions{.backend = safetensors::Backend::kPread};
    case SAFETENSORS_BACKEND_MEMORY:
      // A read path only: no location is read into memory by asking.
      return Error::invalid_argument(context, "the memory backend has no file; use safetensors_open_memory()");
    case SAFETENSORS_BACKEND_DIRECT: return safetensors::OpenOptions{.backend = safetensors::Backend::kDirect};
    case SAFETENSORS_BACKEND_AUTO: return safetensors::OpenOptions{.backend = safetensors::Backend::kAuto};
  }
  return Error::invalid_argument(context, "unknown backend " + std::to_string(b));
}

}  // namespace safetensors::c_api

namespace {

// What both handles share (H: safetensors_file_t or safetensors_sharded_t); the C functions over these are
// defined once for both, by SAFETENSORS_SET_ACCESSORS_ below.

const std::optional<safetensors::Metadata>& metadata_of(const safetensors_file_t* h) { return h->set.metadata(); }
const std::optional<safetensors::Metadata>& metadata_of(const safetensors_sharded_t* h) {
  return h->set.index_metadata();
}

template <typename H>
safetensors_code_t find_tensor(const H* h, const char* name, size_t name_len, size_t* index,
                               safetensors_error_t** error) {
  return guarded(error, [&] {
    const std::string_view n = name_len ? std::string_view(name, name_len) : std::string_view();
    auto info = h->set.info(n);
    if (!info.ok()) return fail(error, info.error());
    *index = static_cast<size_t>(*info - h->set.tensors().data());
    return SAFETENSORS_OK;
  });
}

template <typename H>
safetensors_code_t read_tensor_into(const H* h, size_t i, void* dst, size_t dst_len, safetensors_error_t** error) {
  return guarded(error, [&] {
    auto t = checked_tensor_at(h, i);
    if (!t.ok()) return fail(error, t.error());
    auto st = h->set.read_into(**t, std::span<std::byte>(static_cast<std::byte*>(dst), dst_len));
    return st.ok() ? SAFETENSORS_OK : fail(error, st.error());
  });
}

template <typename H>
safetensors_code_t view_tensor(const H* h, size_t i, safetensors_view_t** view, safetensors_error_t** error) {
  *view = nullptr;
  return guarded(error, [&] {
    auto t = checked_tensor_at(h, i);
    if (!t.ok()) return fail(error, t.error());
    auto v = h->set.view(**t);
    if (!v.ok()) return fail(error, v.error());
    *view = new safetensors_view_t{std::move(v).value()};
    return SAFETENSORS_OK;
  });
}

}  // namespace

extern "C" {

// -------------------------------------------------------------------------------------------------------
// Codes and errors

safetensors_code_t safetensors_error_code(const safetensors_error_t* error) { return error->code; }
const char* safetensors_error_message(const safetensors_error_t* error) { return error->message.c_str(); }
const char* safetensors_error_context(const safetensors_error_t* error, size_t* len) {
  return out_string(error->context, len);
}
const char* safetensors_error_tensor(const safetensors_error_t* error, size_t* len) {
  return out_string(error->tensor, len);
}
void safetensors_error_free(safetensors_error_t* error) {
  if (error != &g_out_of_memory) delete error;
}

const char* safetensors_code_name(int code) {
  switch (code) {
    case SAFETENSORS_OK: return "SAFETENSORS_OK";
    case SAFETENSORS_HEADER_TOO_SMALL: return "SAFETENSORS_HEADER_TOO_SMALL";
    case SAFETENSORS_HEADER_TOO_LARGE: return "SAFETENSORS_HEADER_TOO_LARGE";
    case SAFETENSORS_INVALID_HEADER_LENGTH: return "SAFETENSORS_INVALID_HEADER_LENGTH";
    case SAFETENSORS_INVALID_HEADER_UTF8: return "SAFETENSORS_INVALID_HEADER_UTF8";
    case SAFETENSORS_INVALID_HEADER_JSON: return "SAFETENSORS_INVALID_HEADER_JSON";
    case SAFETENSORS_INVALID_OFFSET: return "SAFETENSORS_INVALID_OFFSET";
    case SAFETENSORS_VALIDATION_OVERFLOW: return "SAFETENSORS_VALIDATION_OVERFLOW";
    case SAFETENSORS_MISALIGNED_SLICE: return "SAFETENSORS_MISALIGNED_SLICE";
    case SAFETENSORS_TENSOR_INVALID_INFO: return "SAFETENSORS_TENSOR_INVALID_INFO";
    case SAFETENSORS_METADATA_INCOMPLETE_BUFFER: return "SAFETENSORS_METADATA_INCOMPLETE_BUFFER";
    case SAFETENSORS_TENSOR_NOT_FOUND: return "SAFETENSORS_TENSOR_NOT_FOUND";
    case SAFETENSORS_INVALID_SLICE: return "SAFETENSORS_INVALID_SLICE";
    case SAFETENSORS_NOT_FOUND: return "SAFETENSORS_NOT_FOUND";
    case SAFETENSORS_IO: return "SAFETENSORS_IO";
    case SAFETENSORS_INVALID_ARGUMENT: return "SAFETENSORS_INVALID_ARGUMENT";
    case SAFETENSORS_OUT_OF_MEMORY: return "SAFETENSORS_OUT_OF_MEMORY";
    case SAFETENSORS_INTERNAL: return "SAFETENSORS_INTERNAL";
  }
  return "SAFETENSORS_UNKNOWN";
}

const char* safetensors_version(void) { return SAFETENSORS_VERSION_STRING; }

// -------------------------------------------------------------------------------------------------------
// Dtypes

const char* safetensors_dtype_code(int dtype) {
  const auto i = static_cast<std::size_t>(dtype);
  return dtype >= 0 && i < safetensors::kDtypeTable.size() ? safetensors::kDtypeTable[i].code.data() : nullptr;
}

uint32_t safetensors_dtype_bits(int dtype) {
  const auto i = static_cast<std::size_t>(dtype);
  return dtype >= 0 && i < safetensors::kDtypeTable.size() ? safetensors::kDtypeTable[i].bits : 0;
}

uint32_t safetensors_dtype_swap_bytes(int dtype) {
  const auto i = static_cast<std::size_t>(dtype);
  return dtype >= 0 && i < safetensors::kDtypeTable.size() ? safetensors::kDtypeTable[i].swap_bytes : 0;
}

int safetensors_host_must_swap(int dtype) {
  const auto i = static_cast<std::size_t>(dtype);
  return dtype >= 0 && i < safetensors::kDtypeTable.size() &&
         safetensors::host_must_swap(safetensors::kDtypeTable[i].dtype);
}

void safetensors_swap_to_native(int dtype, void* data, size_t len) {
  const auto i = static_cast<std::size_t>(dtype);
  if (dtype < 0 || i >= safetensors::kDtypeTable.size() || len == 0) return;
  safetensors::swap_to_native(safetensors::kDtypeTable[i].dtype, std::span(static_cast<std::byte*>(data), len));
}

safetensors_code_t safetensors_dtype_from_code(const char* code, size_t len, safetensors_dtype_t* dtype,
                                               safetensors_error_t** error) {
  return guarded(error, [&] {
    const std::string_view text = len ? std::string_view(code, len) : std::string_view();
    const auto d = safetensors::dtype_from_code(text);
    if (!d) return fail(error, Error::invalid_argument("<dtype>", "unknown dtype code " + quote(text)));
    *dtype = static_cast<safetensors_dtype_t>(*d);
    return SAFETENSORS_OK;
  });
}

// -------------------------------------------------------------------------------------------------------
// What files and sharded files share, defined once for both handles: PREFIX_tensor_count, PREFIX_find,
// PREFIX_tensor_name, PREFIX_tensor_dtype, PREFIX_tensor_rank, PREFIX_tensor_shape, PREFIX_tensor_nbytes,
// PREFIX_metadata_count, PREFIX_metadata_key, PREFIX_metadata_value, PREFIX_read_into and PREFIX_view, for
// PREFIX safetensors_file and safetensors_sharded.

#define SAFETENSORS_SET_ACCESSORS_(PREFIX, H)                                                                      \
  size_t PREFIX##_tensor_count(const H* h) { return h->set.tensors().size(); }                                     \
  safetensors_code_t PREFIX##_find(const H* h, const char* name, size_t name_len, size_t* index,                   \
                                   safetensors_error_t** error) {                                                  \
    return find_tensor(h, name, name_len, index, error);                                                           \
  }                                                                                                                \
  const char* PREFIX##_tensor_name(const H* h, size_t i, size_t* len) {                                            \
    if (len != nullptr) *len = 0;                                                                                  \
    return i < h->names.size() ? out_string(h->names[i], len) : nullptr;                                           \
  }                                                                                                                \
  safetensors_dtype_t PREFIX##_tensor_dtype(const H* h, size_t i) {                                                \
    const auto* t = tensor_at(h, i);                                                                               \
    return static_cast<safetensors_dtype_t>(t ? t->dtype : Dtype::kBool);                                          \
  }                                                                                                                \
  size_t PREFIX##_tensor_rank(const H* h, size_t i) {                                                              \
    const auto* t = tensor_at(h, i);                                                                               \
    return t ? t->shape.size() : 0;                                                                                \
  }                                                                                                                \
  const uint64_t* PREFIX##_tensor_shape(const H* h, size_t i) {                                                    \
    const auto* t = tensor_at(h, i);                                                                               \
    return t == nullptr ? nullptr : t->shape.empty() ? kNoDims : t->shape.data();                                  \
  }                                                                                                                \
  uint64_t PREFIX##_tensor_nbytes(const H* h, size_t i) {                                                          \
    const auto* t = tensor_at(h, i);                                                                               \
    return t ? t->nbytes() : 0;                                                                                    \
  }                                                                                                                \
  size_t PREFIX##_metadata_count(const H* h) { return metadata_of(h) ? metadata_of(h)->size() : 0; }               \
  const char* PREFIX##_metadata_key(const H* h, size_t i, size_t* len) {                                           \
    return i < PREFIX##_metadata_count(h) ? out_string((*metadata_of(h))[i].first, len) : nullptr;                 \
  }                                                                                                                \
  const char* PREFIX##_metadata_value(const H* h, size_t i, size_t* len) {                                         \
    return i < PREFIX##_metadata_count(h) ? out_string((*metadata_of(h))[i].second, len) : nullptr;                \
  }                                                                                                                \
  safetensors_code_t PREFIX##_read_into(const H* h, size_t i, void* dst, size_t dst_len,                           \
                                        safetensors_error_t** error) {                                             \
    return read_tensor_into(h, i, dst, dst_len, error);                                                            \
  }                                                                                                                \
  safetensors_code_t PREFIX##_view(const H* h, size_t i, safetensors_view_t** view, safetensors_error_t** error) { \
    return view_tensor(h, i, view, error);                                                                         \
  }

SAFETENSORS_SET_ACCESSORS_(safetensors_file, safetensors_file_t)
SAFETENSORS_SET_ACCESSORS_(safetensors_sharded, safetensors_sharded_t)
#undef SAFETENSORS_SET_ACCESSORS_

// -------------------------------------------------------------------------------------------------------
// Files

safetensors_code_t safetensors_open(const char* path, int backend, safetensors_file_t** file,
                                    safetensors_error_t** error) {
  return open_handle(
      backend, path, [&](const safetensors::OpenOptions& options) { return safetensors::File::open(path, options); },
      file, error);
}

safetensors_code_t safetensors_open_memory(const void* data, size_t size, safetensors_file_t** file,
                                           safetensors_error_t** error) {
  *file = nullptr;
  return guarded(error, [&] {
    if (data == nullptr && size != 0) return fail(error, Error::invalid_argument("<memory>", "data is NULL"));
    // No owner: the caller guarantees the bytes' lifetime (c.h).
    auto source =
        safetensors::memory_source(std::span<const std::byte>(static_cast<const std::byte*>(data), size), nullptr);
    auto opened = safetensors::File::open(std::move(source));
    return make_handle(std::move(opened), file, error);
  });
}

void safetensors_file_free(safetensors_file_t* file) { delete file; }

const char* safetensors_file_path(const safetensors_file_t* file) { return file->set.path().c_str(); }
safetensors_backend_t safetensors_file_backend(const safetensors_file_t* file) {
  return static_cast<safetensors_backend_t>(file->set.backend());
}
uint64_t safetensors_file_data_offset(const safetensors_file_t* file) { return file->set.data_offset(); }

void safetensors_file_tensor_offsets(const safetensors_file_t* file, size_t i, uint64_t* begin, uint64_t* end) {
  const auto* t = tensor_at(file, i);
  *begin = t ? t->begin : 0;
  *end = t ? t->end : 0;
}

int safetensors_file_has_metadata(const safetensors_file_t* file) { return file->set.metadata().has_value(); }
const char* safetensors_file_metadata_get(const safetensors_file_t* file, const char* key, size_t key_len,
                                          size_t* len) {
  if (!file->set.metadata()) return nullptr;
  const std::string_view k = key_len ? std::string_view(key, key_len) : std::string_view();
  for (const auto& [mk, mv] : *file->set.metadata()) {
    if (mk == k) return out_string(mv, len);
  }
  return nullptr;
}

// -------------------------------------------------------------------------------------------------------
// Views

const void* safetensors_view_data(const safetensors_view_t* view) { return view->view.bytes.data(); }
size_t safetensors_view_size(const safetensors_view_t* view) { return view->view.bytes.size(); }
int safetensors_view_writable(const safetensors_view_t* view) { return view->view.writable ? 1 : 0; }
void safetensors_view_free(safetensors_view_t* view) { delete view; }

// -------------------------------------------------------------------------------------------------------
// Slices

safetensors_code_t safetensors_file_plan_slice(const safetensors_file_t* file, size_t i,
                                               const safetensors_slice_t* indices, size_t count,
                                               safetensors_slice_plan_t** plan, safetensors_error_t** error) {
  *plan = nullptr;
  return guarded(error, [&] {
    auto found = checked_tensor_at(file, i);
    if (!found.ok()) return fail(error, found.error());
    const auto* t = *found;
    if (indices == nullptr && count != 0) {
      return fail(error, Error::invalid_argument(file->set.path(), "indices is NULL"));
    }
    std::vector<safetensors::SliceIndex> spec;
    spec.reserve(count);
    for (size_t k = 0; k < count; ++k) {
      const safetensors_slice_t& s = indices[k];
      switch (s.kind) {
        case SAFETENSORS_SLICE_INDEX: spec.push_back(safetensors::SliceIndex::at(s.index)); break;
        case SAFETENSORS_SLICE_RANGE: {
          auto opt = [&](uint32_t flag, int64_t v) {
            return (s.flags & flag) ? std::optional<std::int64_t>(v) : std::nullopt;
          };
          spec.push_back(safetensors::SliceIndex::range(opt(SAFETENSORS_SLICE_HAS_START, s.start),
                                                        opt(SAFETENSORS_SLICE_HAS_STOP, s.stop),
                                                        opt(SAFETENSORS_SLICE_HAS_STEP, s.step)));
          break;
        }
        case SAFETENSORS_SLICE_ELLIPSIS: spec.push_back(safetensors::SliceIndex::ellipsis()); break;
        default:
          return fail(error,
                      Error::invalid_argument(file->set.path(), "slice component " + std::to_string(k) +
                                                                    " has unknown kind " + std::to_string(s.kind)));
      }
    }
    auto made = file->set.plan_slice(*t, spec);
    if (!made.ok()) return fail(error, made.error());
    *plan = new safetensors_slice_plan_t{std::move(made).value(), file->set.source().get(), i};
    return SAFETENSORS_OK;
  });
}

size_t safetensors_slice_plan_rank(const safetensors_slice_plan_t* plan) { return plan->plan.shape().size(); }
const uint64_t* safetensors_slice_plan_shape(const safetensors_slice_plan_t* plan) {
  return plan->plan.shape().empty() ? kNoDims : plan->plan.shape().data();
}
uint64_t safetensors_slice_plan_nbytes(const safetensors_slice_plan_t* plan) { return plan->plan.nbytes(); }
void safetensors_slice_plan_free(safetensors_slice_plan_t* plan) { delete plan; }

safetensors_code_t safetensors_file_read_slice(const safetensors_file_t* file, size_t i,
                                               const safetensors_slice_plan_t* plan, void* dst, size_t dst_len,
                                               safetensors_error_t** error) {
  return guarded(error, [&] {
    auto found = checked_tensor_at(file, i);
    if (!found.ok()) return fail(error, found.error());
    const auto* t = *found;
    if (plan->source != file->set.source().get() || plan->tensor != i) {
      return fail(error, Error::invalid_argument(file->set.path(), "the slice plan was made for another tensor"));
    }
    auto st = file->set.read_slice(*t, plan->plan, std::span<std::byte>(static_cast<std::byte*>(dst), dst_len));
    return st.ok() ? SAFETENSORS_OK : fail(error, st.error());
  });
}

}  // extern "C"
