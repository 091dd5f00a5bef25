// What an HTTP response said, from its header lines and the start of an error body: the one parser of the
// headers a range request needs (status, Content-Range, Content-Length, ETag, Last-Modified, Retry-After).
#ifndef SAFETENSORS_SRC_REMOTE_HTTP_RESPONSE_H_
#define SAFETENSORS_SRC_REMOTE_HTTP_RESPONSE_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace safetensors::internal {

struct HttpResponse {
  long status = 0;
  std::string reason;
  // Content-Range: bytes FIRST-LAST/TOTAL (TOTAL "*" leaves total unset; "bytes */TOTAL" sets total only).
  std::optional<std::uint64_t> range_first;
  std::optional<std::uint64_t> total;
  std::optional<std::uint64_t> content_length;
  std::string etag;
  std::string last_modified;
  // Retry-After in seconds (an HTTP date is taken as 1 second).
  std::optional<std::uint64_t> retry_after_seconds;
  // The first bytes of a non-2xx body (S3 explains its errors there).
  std::string error_body;

  // Feeds one header line (with or without its CRLF). A status line ("HTTP/1.1 206 Partial Content") starts
  // a new response, as each redirect does: what earlier responses said is dropped.
  void add_header_line(std::string_view line);
  // Keeps up to 2 KiB of an error body.
  void add_error_body(std::string_view bytes);
  // A strong ETag (not W/"..."): one If-Match can compare.
  bool strong_etag() const { return !etag.empty() && etag.rfind("W/", 0) != 0; }
  // The <Code> of an S3-style XML error body ("AccessDenied", "NoSuchKey"), or "".
  std::string error_code() const;
};

}  // namespace safetensors::internal

#endif  // SAFETENSORS_SRC_REMOTE_HTTP_RESPONSE_H_
