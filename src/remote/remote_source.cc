// The remote Source: range requests over a pool of kept-alive libcurl handles (the contract is in
// include/safetensors/remote.h).
#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "io/posix.h"
#include "remote/curl_api.h"
#include "remote/http_response.h"
#include "remote/s3_config.h"
#include "remote/transfer.h"
#include "remote/url.h"
#include "safetensors/remote.h"
#include "util/checked.h"
#include "util/parallel.h"

namespace safetensors {
namespace {

using Clock = std::chrono::steady_clock;
using internal::Attempt;
using internal::CurlApi;
using internal::HttpResponse;

// Reads longer than this are split into parts of about this size, read side by side on several connections.
constexpr std::uint64_t kPartBytes = 16u << 20;

// Everything a request needs besides its range: the URL and what authenticates it.
struct Target {
  // The URL as given (or built for s3://), and the one a redirect led to (reused for later ranges).
  std::string url;
  // CURLOPT_AWS_SIGV4 / CURLOPT_USERPWD for s3:// (empty otherwise). userpwd is a secret.
  std::string sigv4;
  std::string userpwd;
  std::vector<std::string> headers;
};

// The object's version pinned at open: later responses must show the same.
struct Pin {
  std::uint64_t size = 0;
  std::string etag;           // as the server sent it, quotes included; empty when none
  std::string last_modified;  // the HTTP date, when there was no strong ETag
};

// What an attempt came to.
struct Outcome {
  enum class Kind { kDone, kRetry, kFail } kind;
  std::optional<Error> error;  // kFail: the error; kRetry: what went wrong, for the final message
  std::string reason;          // kRetry: what went wrong
  int sys_errno = 0;
  std::optional<std::chrono::milliseconds> retry_after;
};

bool is_tls_error(CURLcode rc) {
  switch (rc) {
    case CURLE_SSL_CONNECT_ERROR:
    case CURLE_PEER_FAILED_VERIFICATION:
    case CURLE_SSL_CERTPROBLEM:
    case CURLE_SSL_CIPHER:
    case CURLE_SSL_CACERT_BADFILE:
    case CURLE_SSL_ENGINE_NOTFOUND:
    case CURLE_SSL_ENGINE_SETFAILED:
    case CURLE_SSL_ENGINE_INITFAILED:
    case CURLE_USE_SSL_FAILED:
    case CURLE_SSL_SHUTDOWN_FAILED:
    case CURLE_SSL_CRL_BADFILE:
    case CURLE_SSL_ISSUER_ERROR:
    case CURLE_SSL_PINNEDPUBKEYNOTMATCH:
    case CURLE_SSL_INVALIDCERTSTATUS:
    case CURLE_SSL_CLIENTCERT: return true;
    default: return false;
  }
}

class RemoteSource final : public Source {
 public:
  RemoteSource(const CurlApi* api, std::string name, std::string_view kind, Target target, RemoteOptions options)
      : api_(api), name_(std::move(name)), kind_(kind), target_(std::move(target)), options_(std::move(options)) {}

  ~RemoteSource() override {
    for (CURL* h : idle_) api_->easy_cleanup(h);
  }

  // The first request: the object's size and version, and its first header_request_bytes.
  Status open() {
    const std::uint64_t first = std::max<std::uint64_t>(options_.header_request_bytes, 16);
    head_.resize(static_cast<std::size_t>(first));
    Handle h(this);
    if (!h) return Error::io(name_, "libcurl could not make a handle");
    const auto deadline = read_deadline();
    for (unsigned attempt = 0;; ++attempt) {
      Attempt a = start_attempt(0, head_.data(), first, deadline);
      const CURLcode rc = perform(h.get(), a, /*pinned=*/false);
      Outcome o = judge(rc, a, "GET of the header", /*opening=*/true);
      if (o.kind == Outcome::Kind::kDone) {
        if (a.response.status == 416) {  // an empty object has no byte 0
          pin_.size = a.response.total.value_or(0);
          head_.clear();
        } else {
          pin_.size =
              a.response.status == 206 ? a.response.total.value_or(0) : a.response.content_length.value_or(a.got);
          if (a.response.status == 200) ranges_ignored_ = true;
          head_.resize(static_cast<std::size_t>(std::min<std::uint64_t>(a.got, pin_.size)));
          if (head_.size() < std::min(first, pin_.size)) {
            return Error::io(name_, "the server sent " + std::to_string(a.got) + " bytes of the first " +
                                        std::to_string(std::min(first, pin_.size)) + " the object holds");
          }
        }
        pin_.etag = a.response.etag;
        if (!a.response.strong_etag()) pin_.last_modified = a.response.last_modified;
        return ok_status();
      }
      if (o.kind == Outcome::Kind::kFail) return std::move(*o.error);
      SAFETENSORS_RETURN_IF_ERROR(wait_to_retry(attempt, o, deadline, "GET of the header"));
    }
  }

  const std::string& name() const override { return name_; }
  std::uint64_t size() const override { return pin_.size; }
  std::string_view kind() const override { return kind_; }
  ReadHints read_hints() const override {
    return {.parallelism = std::max(1u, options_.connections), .merge_gap = options_.merge_gap};
  }
  SourceStats stats() const override {
    return {.requests = requests_.load(std::memory_order_relaxed),
            .bytes_fetched = bytes_.load(std::memory_order_relaxed),
            .retries = retries_.load(std::memory_order_relaxed)};
  }

 private:
  // A handle of the pool, returned on destruction: each concurrent reader has its own connection, kept alive
  // between its requests.
  class Handle {
   public:
    explicit Handle(const RemoteSource* s) : s_(s) {
      std::lock_guard<std::mutex> lock(s_->mu_);
      if (!s_->idle_.empty()) {
        h_ = s_->idle_.back();
        s_->idle_.pop_back();
      }
      if (h_ == nullptr) h_ = s_->api_->easy_init();
    }
    ~Handle() {
      if (h_ == nullptr) return;
      std::lock_guard<std::mutex> lock(s_->mu_);
      s_->idle_.push_back(h_);
    }
    Handle(const Handle&) = delete;
    Handle& operator=(const Handle&) = delete;
    explicit operator bool() const { return h_ != nullptr; }
    CURL* get() const { return h_; }

   private:
    const RemoteSource* s_;
    CURL* h_ = nullptr;
  };

  Clock::time_point read_deadline() const {
    return options_.read_timeout_ms == 0 ? Clock::time_point::max()
                                         : Clock::now() + std::chrono::milliseconds(options_.read_timeout_ms);
  }

  Attempt start_attempt(std::uint64_t offset, std::byte* dst, std::uint64_t want, Clock::time_point deadline) const {
    Attempt a;
    a.dst = dst;
    a.offset = offset;
    a.want = want;
    a.last_progress = Clock::now();
    a.deadline = deadline;
    a.stall = std::chrono::milliseconds(std::max<std::uint64_t>(options_.stall_timeout_ms, 1));
    return a;
  }

  std::string url() const {
    std::lock_guard<std::mutex> lock(mu_);
    return effective_url_.empty() ? target_.url : effective_url_;
  }

  // One request of [a.offset, a.offset + a.want). `pinned`: send the version conditions.
  CURLcode perform(CURL* h, Attempt& a, bool pinned) const {
    const CurlApi& c = *api_;
    const std::string request_url = url();
    const std::string range = std::to_string(a.offset) + "-" + std::to_string(a.offset + a.want - 1);
    curl_slist* headers = nullptr;
    for (const std::string& line : target_.headers) headers = c.slist_append(headers, line.c_str());
    if (pinned && !pin_.etag.empty() && pin_.last_modified.empty()) {
      headers = c.slist_append(headers, ("If-Match: " + pin_.etag).c_str());
    } else if (pinned && !pin_.last_modified.empty()) {
      headers = c.slist_append(headers, ("If-Unmodified-Since: " + pin_.last_modified).c_str());
    }
    c.easy_setopt(h, CURLOPT_URL, request_url.c_str());
    c.easy_setopt(h, CURLOPT_HTTPGET, 1L);
    c.easy_setopt(h, CURLOPT_RANGE, range.c_str());
    c.easy_setopt(h, CURLOPT_HTTPHEADER, headers);
    c.easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    c.easy_setopt(h, CURLOPT_FOLLOWLOCATION, 1L);
    c.easy_setopt(h, CURLOPT_MAXREDIRS, 10L);
    c.easy_setopt(h, CURLOPT_TCP_KEEPALIVE, 1L);
    c.easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, static_cast<long>(options_.connect_timeout_ms));
    c.easy_setopt(h, CURLOPT_SSL_VERIFYPEER, options_.verify_tls ? 1L : 0L);
    c.easy_setopt(h, CURLOPT_SSL_VERIFYHOST, options_.verify_tls ? 2L : 0L);
    if (!options_.ca_bundle.empty()) c.easy_setopt(h, CURLOPT_CAINFO, options_.ca_bundle.c_str());
    if (!target_.sigv4.empty()) {
      c.easy_setopt(h, CURLOPT_AWS_SIGV4, target_.sigv4.c_str());
      c.easy_setopt(h, CURLOPT_USERPWD, target_.userpwd.c_str());
    }
    c.easy_setopt(h, CURLOPT_HEADERFUNCTION, &internal::on_header);
    c.easy_setopt(h, CURLOPT_HEADERDATA, &a);
    c.easy_setopt(h, CURLOPT_WRITEFUNCTION, &internal::on_body);
    c.easy_setopt(h, CURLOPT_WRITEDATA, &a);
    c.easy_setopt(h, CURLOPT_NOPROGRESS, 0L);
    c.easy_setopt(h, CURLOPT_XFERINFOFUNCTION, &internal::on_progress);
    c.easy_setopt(h, CURLOPT_XFERINFODATA, &a);
    const CURLcode rc = c.easy_perform(h);
    c.easy_setopt(h, CURLOPT_HTTPHEADER, static_cast<curl_slist*>(nullptr));
    c.slist_free_all(headers);
    requests_.fetch_add(1, std::memory_order_relaxed);
    bytes_.fetch_add(a.received, std::memory_order_relaxed);
    if (rc == CURLE_OK || a.got > 0) {
      // Later ranges go straight to where a redirect led (a CDN), without the redirect's round trip.
      char* effective = nullptr;
      if (c.easy_getinfo(h, CURLINFO_EFFECTIVE_URL, &effective) == CURLE_OK && effective != nullptr &&
          request_url != effective && a.response.status / 100 == 2) {
        std::lock_guard<std::mutex> lock(mu_);
        effective_url_ = effective;
      }
    }
    return rc;
  }

  std::string status_text(const HttpResponse& r) const {
    std::string s = "HTTP " + std::to_string(r.status);
    if (!r.reason.empty()) s += " " + r.reason;
    if (const std::string code = r.error_code(); !code.empty()) s += " (" + code + ")";
    return s;
  }

  // What attempt `a`, ended with `rc`, came to. `what` names the read.
  Outcome judge(CURLcode rc, const Attempt& a, std::string_view what, bool opening) const {
    const HttpResponse& r = a.response;
    auto fail = [&](Error e) { return Outcome{Outcome::Kind::kFail, std::move(e), {}, 0, {}}; };
    auto retry = [&](std::string reason, int err = 0) {
      Outcome o{Outcome::Kind::kRetry, std::nullopt, std::move(reason), err, {}};
      if (r.retry_after_seconds) o.retry_after = std::chrono::seconds(*r.retry_after_seconds);
      return o;
    };
    const std::string during = std::string(what);
    switch (a.abort) {
      case Attempt::Abort::kStalled:
        return retry("no data for " + std::to_string(options_.stall_timeout_ms) + " ms", ETIMEDOUT);
      case Attempt::Abort::kDeadline:
        return fail(Error::io(
            name_,
            during + ": the read took longer than its bound of " + std::to_string(options_.read_timeout_ms) + " ms",
            ETIMEDOUT));
      case Attempt::Abort::kRangeIgnored:
        return fail(Error::io(name_, during + ": the server does not support range requests (HTTP 200 for a "
                                              "Range request)"));
      case Attempt::Abort::kWrongRange:
        return fail(Error::io(name_, during + ": the server answered a different range than asked for"));
      case Attempt::Abort::kEnough:
      case Attempt::Abort::kNone: break;
    }
    if (rc != CURLE_OK && a.abort != Attempt::Abort::kEnough) {
      const std::string text = std::string(api_->easy_strerror(rc));
      switch (rc) {
        case CURLE_COULDNT_RESOLVE_HOST:
        case CURLE_COULDNT_RESOLVE_PROXY:
          return fail(Error::io(name_, during + ": DNS: could not resolve the host (" + text + ")"));
        case CURLE_UNSUPPORTED_PROTOCOL:
        case CURLE_URL_MALFORMAT: return fail(Error::invalid_argument(name_, during + ": " + text));
        case CURLE_TOO_MANY_REDIRECTS: return fail(Error::io(name_, during + ": " + text));
        case CURLE_COULDNT_CONNECT: return retry("could not connect (" + text + ")", ECONNREFUSED);
        case CURLE_OPERATION_TIMEDOUT: return retry(text, ETIMEDOUT);
        case CURLE_RECV_ERROR:
        case CURLE_SEND_ERROR:
        case CURLE_GOT_NOTHING:
        case CURLE_PARTIAL_FILE:
        case CURLE_HTTP2:
        case CURLE_HTTP2_STREAM: return retry("the connection failed (" + text + ")", ECONNRESET);
        default:
          if (is_tls_error(rc)) return fail(Error::io(name_, during + ": TLS: " + text));
          return fail(Error::io(name_, during + ": " + text));
      }
    }
    const long s = r.status;
    if (s == 200 || s == 206) {
      if (s == 206 && !r.total) {
        return fail(Error::io(name_, during + ": the server did not say the object's size (Content-Range)"));
      }
      if (!opening && s == 206 && *r.total != pin_.size) {
        return fail(Error::io(name_, during + ": the object's size changed after it was opened", ESTALE));
      }
      if (!opening && !pin_.etag.empty() && !r.etag.empty() && r.etag != pin_.etag) return fail(changed(during));
      // Complete when every byte asked for arrived, or, for the first range, when the object ended first.
      if (a.got == a.want || (opening && (rc == CURLE_OK || a.abort == Attempt::Abort::kEnough))) {
        return Outcome{Outcome::Kind::kDone, std::nullopt, {}, 0, {}};
      }
      return retry("the body ended after " + std::to_string(a.got) + " of " + std::to_string(a.want) + " bytes",
                   ECONNRESET);
    }
    if (s == 416) {
      if (opening) return Outcome{Outcome::Kind::kDone, std::nullopt, {}, 0, {}};
      return fail(Error::io(name_, "file is shorter than expected (it changed after it was opened): " + during + " (" +
                                       status_text(r) + ")"));
    }
    if (s == 404 || s == 410) return fail(Error::not_found(name_));
    if (s == 401 || s == 403) {
      return fail(Error::io(name_, during + ": " + status_text(r) + ": access denied (check the credentials)", EACCES));
    }
    if (s == 412) return fail(changed(during));
    if (s == 408 || s == 429 || s >= 500) return retry(status_text(r), s == 408 ? ETIMEDOUT : 0);
    return fail(Error::io(name_, during + ": " + status_text(r)));
  }

  Error changed(const std::string& during) const {
    return Error::io(name_,
                     during + ": the object changed after it was opened (its version is no longer " +
                         (pin_.etag.empty() ? pin_.last_modified : pin_.etag) + "): open it again",
                     ESTALE);
  }

  // Sleeps before retry `attempt`, or gives up: after max_retries, or when the deadline would pass.
  Status wait_to_retry(unsigned attempt, const Outcome& o, Clock::time_point deadline, std::string_view what) const {
    retries_.fetch_add(1, std::memory_order_relaxed);
    auto give_up = [&](const std::string& why) {
      return Error::io(name_, std::string(what) + ": " + o.reason + why, o.sys_errno);
    };
    if (attempt >= options_.max_retries) {
      return give_up(" (after " + std::to_string(attempt + 1) + " attempts)");
    }
    const std::uint64_t shift = std::min<unsigned>(attempt, 30);
    std::chrono::milliseconds delay(
        std::min<std::uint64_t>(options_.retry_base_delay_ms << shift, options_.retry_max_delay_ms));
    if (o.retry_after)
      delay = std::min(std::max(delay, *o.retry_after), std::chrono::milliseconds(options_.retry_max_delay_ms));
    if (deadline != Clock::time_point::max() && Clock::now() + delay >= deadline) {
      return give_up(" (the read's bound of " + std::to_string(options_.read_timeout_ms) + " ms would pass)");
    }
    std::this_thread::sleep_for(delay);
    return ok_status();
  }

  // Fetches [offset, offset + dst.size()) with retries, each resuming after the bytes that arrived.
  Status fetch(std::uint64_t offset, std::span<std::byte> dst, std::string_view what) const {
    if (ranges_ignored_) {
      return Error::io(name_, std::string(what) +
                                  ": the server does not support range requests (HTTP 200 for a "
                                  "Range request), so only the first " +
                                  std::to_string(head_.size()) + " bytes can be read");
    }
    Handle h(this);
    if (!h) return Error::io(name_, "libcurl could not make a handle");
    // New memory is faulted in with one call rather than a page at a time inside the body's copies (as
    // pread_full does for files).
    internal::prefault_for_write(dst);
    const auto deadline = read_deadline();
    std::uint64_t done = 0;
    for (unsigned attempt = 0;;) {
      Attempt a = start_attempt(offset + done, dst.data() + done, dst.size() - done, deadline);
      const CURLcode rc = perform(h.get(), a, /*pinned=*/true);
      Outcome o = judge(rc, a, what, /*opening=*/false);
      done += a.got;
      if (o.kind == Outcome::Kind::kDone && done == dst.size()) return ok_status();
      if (o.kind == Outcome::Kind::kFail) return std::move(*o.error);
      if (o.kind == Outcome::Kind::kDone) {
        o = Outcome{Outcome::Kind::kRetry, std::nullopt, "the body ended early", ECONNRESET, {}};
      }
      SAFETENSORS_RETURN_IF_ERROR(wait_to_retry(attempt, o, deadline, what));
      // A request that made progress does not use up the retries: a slow but live server finishes (the
      // read's deadline still bounds it).
      if (a.got == 0 || deadline == Clock::time_point::max()) ++attempt;
    }
  }

  Result<std::span<const std::byte>> read_checked(std::uint64_t offset, std::span<std::byte> dst,
                                                  std::string_view what) const override {
    if (dst.empty()) return std::span<const std::byte>(dst);  // an empty tensor: no request
    // The part of the first request's range that is kept: never requested again.
    if (offset < head_.size()) {
      const std::uint64_t n = std::min<std::uint64_t>(dst.size(), head_.size() - offset);
      std::memcpy(dst.data(), head_.data() + offset, static_cast<std::size_t>(n));
      if (n == dst.size()) return std::span<const std::byte>(dst);
      SAFETENSORS_RETURN_IF_ERROR(fetch_parts(offset + n, dst.subspan(static_cast<std::size_t>(n)), what));
      return std::span<const std::byte>(dst);
    }
    SAFETENSORS_RETURN_IF_ERROR(fetch_parts(offset, dst, what));
    return std::span<const std::byte>(dst);
  }

  // A long read in parts on several connections (a caller that reads one large tensor gets the parallelism
  // that File::read_many gives a whole load).
  Status fetch_parts(std::uint64_t offset, std::span<std::byte> dst, std::string_view what) const {
    if (dst.size() <= 2 * kPartBytes) return fetch(offset, dst, what);
    const std::size_t parts = static_cast<std::size_t>((dst.size() + kPartBytes - 1) / kPartBytes);
    return internal::run_parallel(parts, std::max(1u, options_.connections), [&](std::size_t i) {
      const std::uint64_t begin = i * kPartBytes;
      const std::uint64_t n = std::min<std::uint64_t>(kPartBytes, dst.size() - begin);
      return fetch(offset + begin, dst.subspan(static_cast<std::size_t>(begin), static_cast<std::size_t>(n)), what);
    });
  }

  const CurlApi* api_;
  std::string name_;
  std::string_view kind_;
  Target target_;
  RemoteOptions options_;
  Pin pin_;
  std::vector<std::byte> head_;
  bool ranges_ignored_ = false;

  mutable std::mutex mu_;
  mutable std::vector<CURL*> idle_;    // guarded by mu_
  mutable std::string effective_url_;  // guarded by mu_
  mutable std::atomic<std::uint64_t> requests_{0};
  mutable std::atomic<std::uint64_t> bytes_{0};
  mutable std::atomic<std::uint64_t> retries_{0};
};

}  // namespace

Result<std::shared_ptr<const Source>> open_remote_source(const std::string& url, const RemoteOptions& options) {
  const std::string name = redact_url(url);
  Target target;
  std::string_view kind;
  const internal::Scheme scheme = internal::scheme_of(url);
  if (scheme == internal::Scheme::kS3) {
    SAFETENSORS_ASSIGN_OR_RETURN(internal::S3Request s3, internal::resolve_s3(url, options));
    target.url = std::move(s3.url);
    target.sigv4 = std::move(s3.sigv4);
    target.userpwd = std::move(s3.userpwd);
    target.headers = std::move(s3.headers);
    kind = "s3";
  } else if (scheme != internal::Scheme::kNone) {
    target.url = url;
    std::string token = options.bearer_token;
    if (token.empty() && internal::is_hub_host(internal::host_of(url))) {
      token = internal::process_env("HF_TOKEN").value_or(internal::process_env("HUGGING_FACE_HUB_TOKEN").value_or(""));
    }
    if (!token.empty()) target.headers.push_back("Authorization: Bearer " + token);
    kind = "http";
  } else {
    return Error::invalid_argument(name, "not a remote location (http://, https:// or s3://)");
  }
  for (const std::string& h : options.headers) target.headers.push_back(h);
  SAFETENSORS_ASSIGN_OR_RETURN(const internal::CurlApi* api, internal::curl_api(name));
  if (!target.sigv4.empty() && api->version_num < 0x074b00) {
    return Error::io(name, std::string("s3:// needs libcurl 7.75 or newer for AWS Signature Version 4; ") +
                               api->soname + " is older");
  }
  auto source = std::make_shared<RemoteSource>(api, name, kind, std::move(target), options);
  SAFETENSORS_RETURN_IF_ERROR(source->open());
  return std::shared_ptr<const Source>(std::move(source));
}

}  // namespace safetensors
