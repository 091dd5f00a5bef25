#include "safetensors/error.h"

#include <cerrno>
#include <cstring>
#include <string>

#include "util/quote.h"

namespace safetensors {
namespace {

// strerror, thread-safe: the GNU strerror_r returns the text (maybe not in buf); the XSI one fills buf.
[[maybe_unused]] const char* strerror_result(const char* text, const char*) { return text; }
[[maybe_unused]] const char* strerror_result(int, const char* buf) { return buf; }
const char* system_error_text(int err, char* buf, std::size_t size) {
  buf[0] = '\0';
  return strerror_result(strerror_r(err, buf, size), buf);
}

}  // namespace

Error Error::header_too_small(std::string_view context) { return {Kind::kHeaderTooSmall, context, {}, {}}; }
Error Error::header_too_large(std::string_view context, std::string_view detail) {
  return {Kind::kHeaderTooLarge, context, {}, detail};
}
Error Error::invalid_header_length(std::string_view context, std::string_view detail) {
  return {Kind::kInvalidHeaderLength, context, {}, detail};
}
Error Error::invalid_header_utf8(std::string_view context, std::string_view detail) {
  return {Kind::kInvalidHeaderUtf8, context, {}, detail};
}
Error Error::invalid_header_json(std::string_view context, std::string_view detail) {
  return {Kind::kInvalidHeaderJson, context, {}, detail};
}
Error Error::invalid_offset(std::string_view context, std::string_view tensor) {
  return {Kind::kInvalidOffset, context, tensor, {}};
}
Error Error::validation_overflow(std::string_view context, std::string_view tensor) {
  return {Kind::kValidationOverflow, context, tensor, {}};
}
Error Error::misaligned_slice(std::string_view context, std::string_view tensor) {
  return {Kind::kMisalignedSlice, context, tensor, {}};
}
Error Error::tensor_invalid_info(std::string_view context, std::string_view tensor, std::string_view detail) {
  return {Kind::kTensorInvalidInfo, context, tensor, detail};
}
Error Error::metadata_incomplete_buffer(std::string_view context, std::string_view detail) {
  return {Kind::kMetadataIncompleteBuffer, context, {}, detail};
}
Error Error::tensor_not_found(std::string_view context, std::string_view tensor) {
  return {Kind::kTensorNotFound, context, tensor, {}};
}
Error Error::invalid_slice(std::string_view context, std::string_view tensor, std::string_view detail) {
  return {Kind::kInvalidSlice, context, tensor, detail};
}
Error Error::not_found(std::string_view context) { return {Kind::kNotFound, context, {}, {}, ENOENT}; }
Error Error::io(std::string_view context, std::string_view detail, int sys_errno) {
  return {Kind::kIo, context, {}, detail, sys_errno};
}
Error Error::invalid_argument(std::string_view context, std::string_view detail) {
  return {Kind::kInvalidArgument, context, {}, detail};
}

Error Error::with_tensor(std::string_view tensor) const {
  Error e = *this;
  e.tensor_ = tensor;
  return e;
}

std::string_view Error::token() const {
  switch (kind_) {
    case Kind::kHeaderTooSmall: return "HeaderTooSmall";
    case Kind::kHeaderTooLarge: return "HeaderTooLarge";
    case Kind::kInvalidHeaderLength: return "InvalidHeaderLength";
    case Kind::kInvalidHeaderUtf8: return "InvalidHeader";
    case Kind::kInvalidHeaderJson: return "InvalidHeaderDeserialization";
    case Kind::kInvalidOffset: return "InvalidOffset";
    case Kind::kValidationOverflow: return "ValidationOverflow";
    case Kind::kMisalignedSlice: return "MisalignedSlice";
    case Kind::kTensorInvalidInfo: return "TensorInvalidInfo";
    case Kind::kMetadataIncompleteBuffer: return "MetadataIncompleteBuffer";
    case Kind::kTensorNotFound: return "TensorNotFound";
    case Kind::kInvalidSlice: return "InvalidSlice";
    case Kind::kNotFound: return "IoError";
    case Kind::kIo: return "IoError";
    case Kind::kInvalidArgument: return "InvalidArgument";
  }
  return "Unknown";
}

// All human text lives here. Where the reference has a fixed text for a failure, the text starts with it.
std::string Error::message() const {
  std::string s;
  const std::string quoted = internal::quote(tensor_);
  switch (kind_) {
    case Kind::kHeaderTooSmall: s = "header too small"; break;
    case Kind::kHeaderTooLarge: s = "header too large"; break;
    case Kind::kInvalidHeaderLength: s = "invalid header length"; break;
    case Kind::kInvalidHeaderUtf8: s = "invalid UTF-8 in header"; break;
    case Kind::kInvalidHeaderJson: s = "invalid JSON in header"; break;
    case Kind::kInvalidOffset: s = "invalid offset for tensor " + quoted; break;
    case Kind::kValidationOverflow:
      s = "overflow computing buffer size from shape and/or element type";
      if (!tensor_.empty()) s += " for tensor " + quoted;
      break;
    case Kind::kMisalignedSlice:
      s = "The slice is slicing for subbytes dtypes, and the slice does not end up at a byte boundary, this is "
          "invalid.";
      if (!tensor_.empty()) s += " (tensor " + quoted + ")";
      break;
    case Kind::kTensorInvalidInfo:
      s = "invalid shape, data type, or offset for tensor";
      if (!tensor_.empty()) s += " " + quoted;
      break;
    case Kind::kMetadataIncompleteBuffer: s = "incomplete metadata, file not fully covered"; break;
    case Kind::kTensorNotFound: s = "File does not contain tensor " + tensor_; break;
    case Kind::kInvalidSlice:
      s = "invalid slice";
      if (!tensor_.empty()) s += " for tensor " + quoted;
      break;
    case Kind::kNotFound: s = "No such file or directory: " + context_; break;
    case Kind::kIo:
      // Starts as the reference's text ("I/O error: No space left on device (os error 28)"), then says what
      // was being done.
      s = "I/O error";
      if (sys_errno_ != 0) {
        char buf[256];
        s += ": ";
        s += system_error_text(sys_errno_, buf, sizeof buf);
        s += " (os error " + std::to_string(sys_errno_) + ")";
        if (!detail_.empty()) s += " during " + detail_;
        if (!tensor_.empty()) s += " (tensor " + quoted + ")";
        return s;
      }
      if (!tensor_.empty()) {
        if (!detail_.empty()) s += ": " + detail_;
        return s + " (tensor " + quoted + ")";
      }
      break;
    case Kind::kInvalidArgument: s = "invalid argument"; break;
  }
  if (!detail_.empty()) {
    s += ": ";
    s += detail_;
  }
  return s;
}

std::string Error::to_string() const {
  std::string s = message();
  s += " (";
  s += token();
  s += ")";
  // Pseudo-contexts such as "<memory>" name no file worth repeating.
  if (!context_.empty() && context_.front() != '<' && kind_ != Kind::kNotFound) {
    s += " in \"";
    s += context_;
    s += "\"";
  }
  return s;
}

}  // namespace safetensors
