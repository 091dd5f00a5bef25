// Errors as values.
//
// Every fallible operation returns Result<T> (a T or an Error) or Status (= Result<void>). An Error has a Kind
// from a closed set -- one per failure of the format (COMPAT.md section 2) plus a few for I/O and misuse -- the
// context it happened in (a file path, or "<memory>") and, where there is one, the tensor. Callers branch on
// kind(); message() and to_string() are for people. All text lives in one switch in error.cc.
//
// Thread safety: Error and Result are values; distinct objects may be used from distinct threads freely.
#ifndef SAFETENSORS_ERROR_H_
#define SAFETENSORS_ERROR_H_

#include <cassert>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

#include "safetensors/export.h"

namespace safetensors {

class SAFETENSORS_EXPORT Error {
 public:
  enum class Kind {
    // Fewer than 8 bytes: there is no header length at all.
    kHeaderTooSmall,
    // The declared header length exceeds the cap (default 100,000,000 bytes) or does not fit in memory.
    kHeaderTooLarge,
    // 8 + header length overflows or points past the end of the file.
    kInvalidHeaderLength,
    // The header bytes are not valid UTF-8.
    kInvalidHeaderUtf8,
    // The header is not a JSON object of the safetensors schema (includes unknown dtypes, duplicate keys,
    // non-string metadata values, an empty header).
    kInvalidHeaderJson,
    // Walking tensors in data_offsets order, one does not begin where the previous ended, or ends before it
    // begins.
    kInvalidOffset,
    // The element count or the bit count of a tensor overflows 64 bits.
    kValidationOverflow,
    // A sub-byte tensor (or a slice of one) does not cover a whole number of bytes.
    kMisalignedSlice,
    // A tensor's data_offsets span differs from the size its dtype and shape require.
    kTensorInvalidInfo,
    // The data buffer is not exactly covered by the tensors: bytes are missing or trailing.
    kMetadataIncompleteBuffer,
    // A lookup by name found no such tensor.
    kTensorNotFound,
    // An index or slice is out of range or malformed for the tensor's shape.
    kInvalidSlice,
    // The file does not exist (ENOENT).
    kNotFound,
    // Any other operating-system failure (open, read, write, fsync, rename, mmap), or a file that changed
    // size after it was opened. sys_errno() holds the errno where a system call failed (0 for a file that
    // changed size under us).
    kIo,
    // The caller broke a documented precondition (wrong buffer size, unknown name in a write plan, a protocol
    // step out of order, ...).
    kInvalidArgument,
  };

  // Named factories. `context` is the file path (or "<memory>"); `tensor` a tensor name; `detail` free text
  // that is appended to the kind's fixed text.
  static Error header_too_small(std::string_view context);
  static Error header_too_large(std::string_view context, std::string_view detail = {});
  static Error invalid_header_length(std::string_view context, std::string_view detail = {});
  static Error invalid_header_utf8(std::string_view context, std::string_view detail = {});
  static Error invalid_header_json(std::string_view context, std::string_view detail);
  static Error invalid_offset(std::string_view context, std::string_view tensor);
  static Error validation_overflow(std::string_view context, std::string_view tensor);
  static Error misaligned_slice(std::string_view context, std::string_view tensor);
  static Error tensor_invalid_info(std::string_view context, std::string_view tensor, std::string_view detail = {});
  static Error metadata_incomplete_buffer(std::string_view context, std::string_view detail = {});
  static Error tensor_not_found(std::string_view context, std::string_view tensor);
  static Error invalid_slice(std::string_view context, std::string_view tensor, std::string_view detail);
  // not_found carries ENOENT as sys_errno(). For io, `detail` says what was being done ("write", "rename")
  // when `sys_errno` is set, and what went wrong otherwise.
  static Error not_found(std::string_view context);
  static Error io(std::string_view context, std::string_view detail, int sys_errno = 0);
  static Error invalid_argument(std::string_view context, std::string_view detail);

  // This error naming `tensor` as well: for failures met below the layer that knows which tensor was being
  // read (an I/O error of a prefetch read, for one).
  Error with_tensor(std::string_view tensor) const;

  Kind kind() const { return kind_; }
  const std::string& context() const { return context_; }
  const std::string& tensor() const { return tensor_; }
  const std::string& detail() const { return detail_; }
  // The operating system's error number behind a kIo or kNotFound error, or 0 where there is none.
  int sys_errno() const { return sys_errno_; }

  // The reference implementation's variant name for this kind, e.g. "HeaderTooLarge". Downstream tools match
  // on these tokens, so they are part of the text.
  std::string_view token() const;
  // The human text without the context, e.g. "invalid offset for tensor `w`". Where the reference has a
  // fixed text for this failure, message() starts with exactly that text.
  std::string message() const;
  // message() followed by the token and the context: "invalid offset for tensor `w` (InvalidOffset) in
  // \"model.safetensors\"" (pseudo-contexts like "<memory>" are left out).
  std::string to_string() const;

 private:
  Error(Kind kind, std::string_view context, std::string_view tensor, std::string_view detail, int sys_errno = 0)
      : kind_(kind), sys_errno_(sys_errno), context_(context), tensor_(tensor), detail_(detail) {}

  Kind kind_;
  int sys_errno_;
  std::string context_;
  std::string tensor_;
  std::string detail_;
};

// A T, or the Error that prevented it.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}      // NOLINT(google-explicit-constructor): implicit by design
  Result(Error error) : v_(std::move(error)) {}  // NOLINT(google-explicit-constructor)

  bool ok() const { return v_.index() == 0; }
  explicit operator bool() const { return ok(); }

  // REQUIRES: ok().
  T& value() & {
    assert(ok());
    return std::get<0>(v_);
  }
  const T& value() const& {
    assert(ok());
    return std::get<0>(v_);
  }
  T&& value() && {
    assert(ok());
    return std::get<0>(std::move(v_));
  }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

  // REQUIRES: !ok().
  const Error& error() const& {
    assert(!ok());
    return std::get<1>(v_);
  }
  Error&& error() && {
    assert(!ok());
    return std::get<1>(std::move(v_));
  }

 private:
  std::variant<T, Error> v_;
};

// Success, or the Error that prevented it.
template <>
class [[nodiscard]] Result<void> {
 public:
  Result() = default;
  Result(Error error) : error_(std::move(error)) {}  // NOLINT(google-explicit-constructor)

  bool ok() const { return !error_.has_value(); }
  explicit operator bool() const { return ok(); }
  // REQUIRES: !ok().
  const Error& error() const& {
    assert(!ok());
    return *error_;
  }
  Error&& error() && {
    assert(!ok());
    return *std::move(error_);
  }

 private:
  std::optional<Error> error_;
};

using Status = Result<void>;

inline Status ok_status() { return Status(); }

}  // namespace safetensors

// Propagation helpers for code that returns Status or Result<U>.
#define SAFETENSORS_CONCAT_INNER_(a, b) a##b
#define SAFETENSORS_CONCAT_(a, b) SAFETENSORS_CONCAT_INNER_(a, b)

#define SAFETENSORS_RETURN_IF_ERROR(expr)                                         \
  do {                                                                            \
    auto safetensors_status_ = (expr);                                            \
    if (!safetensors_status_.ok()) return std::move(safetensors_status_).error(); \
  } while (0)

#define SAFETENSORS_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                                       \
  if (!tmp.ok()) return std::move(tmp).error();            \
  lhs = std::move(tmp).value()

#define SAFETENSORS_ASSIGN_OR_RETURN(lhs, expr) \
  SAFETENSORS_ASSIGN_OR_RETURN_IMPL_(SAFETENSORS_CONCAT_(safetensors_result_, __LINE__), lhs, expr)

#endif  // SAFETENSORS_ERROR_H_
