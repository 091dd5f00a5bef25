// The C API (include/safetensors/c.h): handles that wrap the C++ objects, and one place where Errors and
// exceptions become codes and error objects. No C++ exception crosses this boundary.
#include "safetensors/c.h"

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "safetensors/dtype.h"
#include "safetensors/engine.h"
#include "safetensors/error.h"
#include "safetensors/file.h"
#include "safetensors/sharded.h"
#include "safetensors/slice.h"
#include "safetensors/source.h"
#include "safetensors/writer.h"

#include "quote.h"

using safetensors::Dtype;
using safetensors::Error;
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
                  SAFETENSORS_BACKEND_MEMORY == static_cast<int>(safetensors::Backend::kMemory),
              "c.h backends are the C++ backends");

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

struct safetensors_slice_plan_t {
  safetensors::SlicePlan plan;
  // What the plan was made for, so a plan given with another file or tensor is refused.
  const safetensors::Source* source;
  std::size_t tensor;
};

struct safetensors_prefetcher_t {
  std::unique_ptr<safetensors::Prefetcher> prefetcher;
};

struct safetensors_sharded_t : safetensors::internal::TensorSetHandle<safetensors::ShardedFile> {};

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

// Reports `e` through `error` (convention 3) and returns its code.
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

// -------------------------------------------------------------------------------------------------------
// What both handles share (H: safetensors_file_t or safetensors_sharded_t); the C functions over these are
// defined once for both, by SAFETENSORS_SET_ACCESSORS_ below.

// How errors about a handle name it: the file, or "<shards>" for a sharded handle.
const std::string& context_of(const safetensors_file_t* h) { return h->set.path(); }
std::string context_of(const safetensors_sharded_t*) { return "<shards>"; }

const std::optional<safetensors::Metadata>& metadata_of(const safetensors_file_t* h) { return h->set.metadata(); }
const std::optional<safetensors::Metadata>& metadata_of(const safetensors_sharded_t* h) {
  return h->set.index_metadata();
}

// A new handle over the opened set, or the open's error.
template <typename H, typename Set>
safetensors_code_t make_handle(safetensors::Result<Set> opened, H** out, safetensors_error_t** error) {
  if (!opened.ok()) return fail(error, opened.error());
  std::vector<std::string> names = copy_names(opened->tensors());
  *out = new H{{std::move(opened).value(), std::move(names)}};
  return SAFETENSORS_OK;
}

template <typename H>
const safetensors::TensorInfo* tensor_at(const H* h, size_t i) {
  return i < h->set.tensors().size() ? &h->set.tensors()[i] : nullptr;
}

// Tensor i, or the out-of-range Error.
template <typename H>
safetensors::Result<const safetensors::TensorInfo*> checked_tensor_at(const H* h, size_t i) {
  const auto* t = tensor_at(h, i);
  if (t == nullptr) return out_of_range(context_of(h), i, h->set.tensors().size());
  return t;
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

// The options an open with C backend `b` uses, or the Error for an unknown backend (naming `context`).
safetensors::Result<safetensors::OpenOptions> open_options(int b, std::string_view context) {
  switch (b) {
    case SAFETENSORS_BACKEND_MMAP: return safetensors::OpenOptions{.backend = safetensors::Backend::kMmap};
    case SAFETENSORS_BACKEND_PREAD: return safetensors::OpenOptions{.backend = safetensors::Backend::kPread};
    case SAFETENSORS_BACKEND_MEMORY: return safetensors::OpenOptions{.backend = safetensors::Backend::kMemory};
  }
  return Error::invalid_argument(context, "unknown backend " + std::to_string(b));
}

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
    d.dtype = static_cast<Dtype>(t.dtype);
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

void to_c_piece(const safetensors::Piece& p, size_t i, safetensors_piece_t* out) {
  *out = safetensors_piece_t{p.begin, p.end, i, SAFETENSORS_DELIVERY_STAGED, nullptr, 0};
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
  *file = nullptr;
  return guarded(error, [&] {
    auto options = open_options(backend, path);
    if (!options.ok()) return fail(error, options.error());
    auto opened = safetensors::File::open(path, *options);
    return make_handle(std::move(opened), file, error);
  });
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

// -------------------------------------------------------------------------------------------------------
// Sharded checkpoints

safetensors_code_t safetensors_sharded_open_index(const char* index_path, int backend, safetensors_sharded_t** sharded,
                                                  safetensors_error_t** error) {
  *sharded = nullptr;
  return guarded(error, [&] {
    auto options = open_options(backend, index_path);
    if (!options.ok()) return fail(error, options.error());
    auto opened = safetensors::ShardedFile::open_index(index_path, *options);
    return make_handle(std::move(opened), sharded, error);
  });
}

safetensors_code_t safetensors_sharded_open_files(const char* const* paths, size_t count, int backend,
                                                  safetensors_sharded_t** sharded, safetensors_error_t** error) {
  *sharded = nullptr;
  return guarded(error, [&] {
    auto options = open_options(backend, "<shards>");
    if (!options.ok()) return fail(error, options.error());
    if (paths == nullptr && count != 0) return fail(error, Error::invalid_argument("<shards>", "paths is NULL"));
    std::vector<std::string> list;
    list.reserve(count);
    for (size_t k = 0; k < count; ++k) {
      if (paths[k] == nullptr) {
        return fail(error, Error::invalid_argument("<shards>", "path " + std::to_string(k) + " is NULL"));
      }
      list.emplace_back(paths[k]);
    }
    auto opened = safetensors::ShardedFile::open_files(list, *options);
    return make_handle(std::move(opened), sharded, error);
  });
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
      auto t = checked_tensor_at(sharded, requests[k].tensor);
      if (!t.ok()) return fail(error, t.error());
      reqs.push_back({*t, std::span<std::byte>(static_cast<std::byte*>(requests[k].dst), requests[k].dst_len)});
    }
    auto st = sharded->set.read_many(reqs, threads);
    return st.ok() ? SAFETENSORS_OK : fail(error, st.error());
  });
}

// -------------------------------------------------------------------------------------------------------
// Prefetch

safetensors_code_t safetensors_tensor_piece(const safetensors_file_t* file, size_t i, safetensors_piece_t* piece,
                                            safetensors_error_t** error) {
  return guarded(error, [&] {
    auto found = checked_tensor_at(file, i);
    if (!found.ok()) return fail(error, found.error());
    const auto* t = *found;
    auto p = safetensors::tensor_piece(file->set, *t);
    if (!p.ok()) return fail(error, p.error());
    to_c_piece(*p, i, piece);
    return SAFETENSORS_OK;
  });
}

safetensors_code_t safetensors_row_piece(const safetensors_file_t* file, size_t i, uint64_t r0, uint64_t r1,
                                         safetensors_piece_t* piece, safetensors_error_t** error) {
  return guarded(error, [&] {
    auto found = checked_tensor_at(file, i);
    if (!found.ok()) return fail(error, found.error());
    const auto* t = *found;
    auto p = safetensors::row_piece(file->set, *t, r0, r1);
    if (!p.ok()) return fail(error, p.error());
    to_c_piece(*p, i, piece);
    return SAFETENSORS_OK;
  });
}

safetensors_code_t safetensors_prefetch_start(const safetensors_file_t* file, const safetensors_piece_t* pieces,
                                              size_t count, const safetensors_prefetch_options_t* options,
                                              safetensors_prefetcher_t** prefetcher, safetensors_error_t** error) {
  *prefetcher = nullptr;
  return guarded(error, [&] {
    const std::string& path = file->set.path();
    if (pieces == nullptr && count != 0) return fail(error, Error::invalid_argument(path, "pieces is NULL"));
    std::vector<safetensors::Piece> plan;
    plan.reserve(count);
    for (size_t k = 0; k < count; ++k) {
      const safetensors_piece_t& c = pieces[k];
      auto found = checked_tensor_at(file, c.tensor);
      if (!found.ok()) return fail(error, found.error());
      const auto* t = *found;
      if (c.delivery != SAFETENSORS_DELIVERY_STAGED && c.delivery != SAFETENSORS_DELIVERY_DIRECT) {
        return fail(error, Error::invalid_argument(path, "piece " + std::to_string(k) + " has unknown delivery " +
                                                             std::to_string(c.delivery)));
      }
      if (c.dst == nullptr && c.dst_len != 0) {
        return fail(error, Error::invalid_argument(path, "piece " + std::to_string(k) + " has a NULL dst"));
      }
      safetensors::Piece p;
      p.begin = c.begin;
      p.end = c.end;
      p.tensor = t->name;
      p.swap_bytes = safetensors::dtype_swap_bytes(t->dtype);  // native values in events (convention 8)
      if (c.delivery == SAFETENSORS_DELIVERY_DIRECT) {
        p.delivery = safetensors::Delivery::kDirect;
        p.dst = std::span<std::byte>(static_cast<std::byte*>(c.dst), c.dst_len);
      }
      plan.push_back(p);
    }
    safetensors::PrefetchOptions o;
    if (options != nullptr) {
      if (options->threads != 0) o.threads = options->threads;
      if (options->chunk_bytes != 0) o.chunk_bytes = options->chunk_bytes;
      o.merge_gap = options->merge_gap;
      o.max_slabs = options->max_slabs;
    }
    auto started = safetensors::Prefetcher::start(file->set, std::move(plan), o);
    if (!started.ok()) return fail(error, started.error());
    *prefetcher = new safetensors_prefetcher_t{std::move(started).value()};
    return SAFETENSORS_OK;
  });
}

void safetensors_prefetch_free(safetensors_prefetcher_t* prefetcher) { delete prefetcher; }

safetensors_code_t safetensors_prefetch_next(safetensors_prefetcher_t* prefetcher, int64_t timeout_ms,
                                             safetensors_prefetch_event_t* event, safetensors_error_t** error) {
  return guarded(error, [&] {
    auto ev = timeout_ms < 0 ? prefetcher->prefetcher->next()
                             : prefetcher->prefetcher->next_for(std::chrono::milliseconds(timeout_ms));
    if (!ev.ok()) return fail(error, ev.error());
    using Kind = safetensors::PrefetchEvent::Kind;
    const int32_t kind = ev->kind == Kind::kStaged   ? SAFETENSORS_EVENT_STAGED
                         : ev->kind == Kind::kDirect ? SAFETENSORS_EVENT_DIRECT
                         : ev->kind == Kind::kEnd    ? SAFETENSORS_EVENT_END
                                                     : SAFETENSORS_EVENT_TIMEOUT;
    *event = safetensors_prefetch_event_t{kind,       ev->piece_done ? 1 : 0, ev->piece,
                                          ev->offset, ev->bytes.data(),       ev->bytes.size(),
                                          ev->slab,   ev->slab_data};
    return SAFETENSORS_OK;
  });
}

safetensors_code_t safetensors_prefetch_release(safetensors_prefetcher_t* prefetcher, uint64_t slab,
                                                safetensors_error_t** error) {
  return guarded(error, [&] {
    auto st = prefetcher->prefetcher->release(slab);
    return st.ok() ? SAFETENSORS_OK : fail(error, st.error());
  });
}

safetensors_code_t safetensors_prefetch_wait_piece(safetensors_prefetcher_t* prefetcher, size_t i,
                                                   safetensors_error_t** error) {
  return guarded(error, [&] {
    auto st = prefetcher->prefetcher->wait_piece(i);
    return st.ok() ? SAFETENSORS_OK : fail(error, st.error());
  });
}

void safetensors_prefetch_cancel(safetensors_prefetcher_t* prefetcher) { prefetcher->prefetcher->cancel(); }

void safetensors_prefetch_stats(const safetensors_prefetcher_t* prefetcher, safetensors_prefetch_stats_t* stats) {
  const safetensors::PrefetchStats s = prefetcher->prefetcher->stats();
  *stats = safetensors_prefetch_stats_t{s.bytes_read, s.reads,        s.bytes_staged, s.bytes_direct,
                                        s.chunks,     s.slab_wait_ns, s.events_lent};
}

safetensors_code_t safetensors_slab_pool_set_capacity(uint64_t bytes, safetensors_error_t** error) {
  return guarded(error, [&] {
    auto st = safetensors::SlabPool::global().set_capacity(bytes);
    return st.ok() ? SAFETENSORS_OK : fail(error, st.error());
  });
}

safetensors_code_t safetensors_slab_pool_set_slab_bytes(uint64_t bytes, safetensors_error_t** error) {
  return guarded(error, [&] {
    auto st = safetensors::SlabPool::global().set_slab_bytes(bytes);
    return st.ok() ? SAFETENSORS_OK : fail(error, st.error());
  });
}

safetensors_code_t safetensors_slab_pool_set_allocator(void* (*alloc)(size_t size, void* user),
                                                       void (*free_fn)(void* p, size_t size, void* user), void* user,
                                                       safetensors_error_t** error) {
  return guarded(error, [&] {
    safetensors::SlabAllocator a;
    if (alloc != nullptr) a.alloc = [alloc, user](std::size_t n) { return alloc(n, user); };
    if (free_fn != nullptr) a.free = [free_fn, user](void* p, std::size_t n) { free_fn(p, n, user); };
    auto st = safetensors::SlabPool::global().set_allocator(std::move(a));
    return st.ok() ? SAFETENSORS_OK : fail(error, st.error());
  });
}

void safetensors_slab_pool_trim(void) { safetensors::SlabPool::global().trim(); }

void safetensors_slab_pool_stats(safetensors_slab_pool_stats_t* stats) {
  const safetensors::SlabPoolStats s = safetensors::SlabPool::global().stats();
  *stats = safetensors_slab_pool_stats_t{s.capacity,   s.slab_bytes,   s.allocated_bytes,
                                         s.peak_bytes, s.slabs_in_use, s.slabs_free};
}

}  // extern "C"
