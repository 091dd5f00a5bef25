// URL helpers of the remote sources: recognizing, redacting and resolving locations (remote.h, url.h).
#include "remote/url.h"

#include <algorithm>
#include <string>
#include <string_view>

#include "remote/s3_config.h"
#include "safetensors/remote.h"

namespace safetensors {
namespace internal {

bool starts_with_nocase(std::string_view s, std::string_view prefix) {
  if (s.size() < prefix.size()) return false;
  for (std::size_t i = 0; i < prefix.size(); ++i) {
    const char a = s[i] >= 'A' && s[i] <= 'Z' ? static_cast<char>(s[i] - 'A' + 'a') : s[i];
    if (a != prefix[i]) return false;
  }
  return true;
}

Scheme scheme_of(std::string_view location) {
  for (const Scheme s : {Scheme::kHttp, Scheme::kHttps, Scheme::kS3}) {
    const std::string_view prefix = s == Scheme::kHttp ? "http://" : s == Scheme::kHttps ? "https://" : "s3://";
    if (starts_with_nocase(location, prefix)) return s;
  }
  return Scheme::kNone;
}

std::size_t scheme_length(Scheme scheme) {
  switch (scheme) {
    case Scheme::kNone: return 0;
    case Scheme::kHttp: return std::string_view("http://").size();
    case Scheme::kHttps: return std::string_view("https://").size();
    case Scheme::kS3: return std::string_view("s3://").size();
  }
  return 0;
}

std::string host_of(std::string_view url) {
  const auto scheme = url.find("://");
  if (scheme == std::string_view::npos) return {};
  std::string_view rest = url.substr(scheme + 3);
  rest = rest.substr(0, rest.find_first_of("/?#"));
  if (const auto at = rest.rfind('@'); at != std::string_view::npos) rest = rest.substr(at + 1);
  rest = rest.substr(0, rest.find(':'));
  std::string host(rest);
  for (char& ch : host) ch = ch >= 'A' && ch <= 'Z' ? static_cast<char>(ch - 'A' + 'a') : ch;
  return host;
}

bool is_hub_host(const std::string& host) {
  for (std::string_view base : {"huggingface.co", "hf.co"}) {
    if (host == base) return true;
    if (host.size() > base.size() && host.ends_with(base) && host[host.size() - base.size() - 1] == '.') return true;
  }
  return false;
}

}  // namespace internal

bool is_remote_location(std::string_view location) { return internal::scheme_of(location) != internal::Scheme::kNone; }

std::string redact_url(std::string_view url) {
  std::string_view s = url.substr(0, url.find_first_of("?#"));
  const auto scheme = s.find("://");
  if (scheme == std::string_view::npos) return std::string(s);
  const std::size_t host_start = scheme + 3;
  const std::size_t path_start = std::min(s.find('/', host_start), s.size());
  const auto at = s.substr(host_start, path_start - host_start).rfind('@');
  if (at == std::string_view::npos) return std::string(s);
  return std::string(s.substr(0, host_start)) + std::string(s.substr(host_start + at + 1));
}

std::string resolve_location(std::string_view base, std::string_view relative) {
  if (!is_remote_location(base)) {
    const auto slash = base.rfind('/');
    if (slash == std::string_view::npos) return std::string(relative);
    return std::string(base.substr(0, slash + 1)) + std::string(relative);
  }
  const auto query = base.find_first_of("?#");
  const std::string_view path = base.substr(0, query);
  const std::string_view tail = query == std::string_view::npos ? std::string_view() : base.substr(query);
  const auto slash = path.rfind('/');
  // "s3://bucket" + "/" at least: an URL always has a slash after its scheme.
  return std::string(path.substr(0, slash + 1)) + internal::percent_encode_path(relative) +
         std::string(tail.substr(0, tail.find('#')));
}

}  // namespace safetensors
