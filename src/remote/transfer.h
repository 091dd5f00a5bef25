// One range request's state and the libcurl callbacks that fill it (used by remote_source.cc).
#ifndef SAFETENSORS_SRC_REMOTE_TRANSFER_H_
#define SAFETENSORS_SRC_REMOTE_TRANSFER_H_

#include <chrono>
#include <cstddef>
#include <cstdint>

#include "remote/curl_api.h"
#include "remote/http_response.h"

namespace safetensors::internal {

// One attempt's state, shared with libcurl's callbacks.
struct Attempt {
  std::byte* dst = nullptr;
  std::uint64_t offset = 0;  // object offset of dst[0]
  std::uint64_t want = 0;
  std::uint64_t got = 0;
  // Body bytes received, including any not kept (an error body, bytes past the range).
  std::uint64_t received = 0;
  HttpResponse response;
  // Why the transfer was aborted from a callback (CURLE_WRITE_ERROR / CURLE_ABORTED_BY_CALLBACK).
  enum class Abort { kNone, kEnough, kRangeIgnored, kWrongRange, kStalled, kDeadline } abort = Abort::kNone;
  std::chrono::steady_clock::time_point last_progress;
  std::chrono::steady_clock::time_point deadline;
  std::chrono::milliseconds stall{0};
  curl_off_t last_dlnow = 0;
};

// CURLOPT_HEADERFUNCTION: each header line into the response. `user` is the Attempt.
std::size_t on_header(char* data, std::size_t size, std::size_t count, void* user);
// CURLOPT_WRITEFUNCTION: body bytes into dst (a success) or the error body (any other status); aborts a body
// that does not start at the asked offset, and stops once the asked bytes are in.
std::size_t on_body(char* data, std::size_t size, std::size_t count, void* user);
// CURLOPT_XFERINFOFUNCTION: aborts a transfer that stalled longer than `stall` or ran past `deadline`.
int on_progress(void* user, curl_off_t dltotal, curl_off_t dlnow, curl_off_t ultotal, curl_off_t ulnow);

}  // namespace safetensors::internal

#endif  // SAFETENSORS_SRC_REMOTE_TRANSFER_H_
