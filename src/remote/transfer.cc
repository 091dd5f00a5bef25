// One range request's state and libcurl's callbacks (transfer.h).
#include "remote/transfer.h"

#include <algorithm>
#include <cstring>
#include <string_view>

namespace safetensors::internal {

std::size_t on_header(char* data, std::size_t size, std::size_t count, void* user) {
  auto* a = static_cast<Attempt*>(user);
  a->response.add_header_line(std::string_view(data, size * count));
  return size * count;
}

std::size_t on_body(char* data, std::size_t size, std::size_t count, void* user) {
  auto* a = static_cast<Attempt*>(user);
  const std::size_t n = size * count;
  a->received += n;
  HttpResponse& r = a->response;
  if (r.status < 200 || r.status >= 300) {
    r.add_error_body(std::string_view(data, n));
    return n;
  }
  if (a->got == 0 && n > 0) {
    // The first bytes of a success: does the body start where we asked?
    if (r.status == 206) {
      if (!r.range_first || *r.range_first != a->offset) {
        a->abort = Attempt::Abort::kWrongRange;
        return 0;
      }
    } else if (a->offset != 0) {
      // 200 for a ranged request: the whole object follows. Only a read from its start can use it.
      a->abort = Attempt::Abort::kRangeIgnored;
      return 0;
    }
  }
  const std::uint64_t room = a->want - a->got;
  const std::size_t take = static_cast<std::size_t>(std::min<std::uint64_t>(room, n));
  std::memcpy(a->dst + a->got, data, take);
  a->got += take;
  if (take < n) {
    // More than asked for: a 200 carrying the whole object (the rest is not needed), or a server that
    // ignored the range's end. Either way the bytes asked for are here.
    a->abort = Attempt::Abort::kEnough;
    return 0;
  }
  return n;
}

int on_progress(void* user, curl_off_t /*dltotal*/, curl_off_t dlnow, curl_off_t /*ultotal*/, curl_off_t /*ulnow*/) {
  auto* a = static_cast<Attempt*>(user);
  const auto now = std::chrono::steady_clock::now();
  if (dlnow != a->last_dlnow) {
    a->last_dlnow = dlnow;
    a->last_progress = now;
  }
  if (now - a->last_progress > a->stall) {
    a->abort = Attempt::Abort::kStalled;
    return 1;
  }
  if (now > a->deadline) {
    a->abort = Attempt::Abort::kDeadline;
    return 1;
  }
  return 0;
}

}  // namespace safetensors::internal
