#include "remote/http_response.h"

#include <charconv>

namespace safetensors::internal {
namespace {

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r' || s.back() == '\n')) {
    s.remove_suffix(1);
  }
  return s;
}

bool equals_nocase(std::string_view a, std::string_view lower) {
  if (a.size() != lower.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    const char c = a[i] >= 'A' && a[i] <= 'Z' ? static_cast<char>(a[i] - 'A' + 'a') : a[i];
    if (c != lower[i]) return false;
  }
  return true;
}

// A whole decimal number, or nullopt.
std::optional<std::uint64_t> number(std::string_view s) {
  std::uint64_t v = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || end != s.data() + s.size() || s.empty()) return std::nullopt;
  return v;
}

}  // namespace

void HttpResponse::add_header_line(std::string_view line) {
  line = trim(line);
  if (line.rfind("HTTP/", 0) == 0) {
    *this = HttpResponse();
    const auto sp = line.find(' ');
    if (sp == std::string_view::npos) return;
    std::string_view rest = line.substr(sp + 1);
    const auto sp2 = rest.find(' ');
    if (auto code = number(rest.substr(0, sp2))) status = static_cast<long>(*code);
    if (sp2 != std::string_view::npos) reason = std::string(trim(rest.substr(sp2 + 1)));
    return;
  }
  const auto colon = line.find(':');
  if (colon == std::string_view::npos) return;
  const std::string_view name = trim(line.substr(0, colon));
  const std::string_view value = trim(line.substr(colon + 1));
  if (equals_nocase(name, "content-range")) {
    // "bytes 0-99/1234", "bytes 0-99/*", "bytes */1234"
    if (value.rfind("bytes ", 0) != 0) return;
    const std::string_view spec = value.substr(6);
    const auto slash = spec.find('/');
    if (slash == std::string_view::npos) return;
    const std::string_view range = spec.substr(0, slash);
    if (auto t = number(spec.substr(slash + 1))) total = t;
    if (range != "*") {
      const auto dash = range.find('-');
      if (dash != std::string_view::npos) range_first = number(range.substr(0, dash));
    }
  } else if (equals_nocase(name, "content-length")) {
    content_length = number(value);
  } else if (equals_nocase(name, "etag")) {
    etag = std::string(value);
  } else if (equals_nocase(name, "last-modified")) {
    last_modified = std::string(value);
  } else if (equals_nocase(name, "retry-after")) {
    retry_after_seconds = number(value);
    if (!retry_after_seconds && !value.empty()) retry_after_seconds = 1;
  }
}

void HttpResponse::add_error_body(std::string_view bytes) {
  constexpr std::size_t kKeep = 2048;
  if (error_body.size() < kKeep) error_body.append(bytes.substr(0, kKeep - error_body.size()));
}

std::string HttpResponse::error_code() const {
  const auto open = error_body.find("<Code>");
  if (open == std::string::npos) return {};
  const auto close = error_body.find("</Code>", open);
  if (close == std::string::npos || close - open > 70) return {};
  return error_body.substr(open + 6, close - open - 6);
}

}  // namespace safetensors::internal
