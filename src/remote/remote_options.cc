// RemoteOptions::set: the one parser of remote options given as text (C API, Python keyword arguments).
#include <charconv>
#include <string>

#include "safetensors/remote.h"

namespace safetensors {
namespace {

Error bad(std::string_view key, std::string_view expected) {
  // The value is never repeated: it may be a secret.
  return Error::invalid_argument("<remote options>",
                                 "option \"" + std::string(key) + "\" takes " + std::string(expected));
}

// The spellings RemoteOptions::set documents (remote.h), and no others.
Result<bool> parse_bool(std::string_view key, std::string_view v) {
  if (v == "1" || v == "true" || v == "True" || v == "yes") return true;
  if (v == "0" || v == "false" || v == "False" || v == "no") return false;
  return bad(key, "a boolean (true or false)");
}

template <typename T>
Result<T> parse_number(std::string_view key, std::string_view v, T min) {
  T out{};
  const auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), out);
  if (ec != std::errc() || end != v.data() + v.size() || v.empty() || out < min) {
    return bad(key, "a whole number of at least " + std::to_string(min));
  }
  return out;
}

}  // namespace

Status RemoteOptions::set(std::string_view key, std::string_view value) {
  auto text = [&](std::string& field) {
    field = std::string(value);
    return ok_status();
  };
  auto flag = [&](bool& field) -> Status {
    SAFETENSORS_ASSIGN_OR_RETURN(field, parse_bool(key, value));
    return ok_status();
  };
  auto u64 = [&](std::uint64_t& field, std::uint64_t min) -> Status {
    SAFETENSORS_ASSIGN_OR_RETURN(field, parse_number<std::uint64_t>(key, value, min));
    return ok_status();
  };
  if (key == "header") {
    if (value.find(':') == std::string_view::npos || value.find_first_of("\r\n") != std::string_view::npos) {
      return bad(key, "one \"Name: value\" line");
    }
    headers.emplace_back(value);
    return ok_status();
  }
  if (key == "bearer_token" || key == "token") return text(bearer_token);
  if (key == "access_key_id" || key == "aws_access_key_id") return text(access_key_id);
  if (key == "secret_access_key" || key == "aws_secret_access_key") return text(secret_access_key);
  if (key == "session_token" || key == "aws_session_token") return text(session_token);
  if (key == "profile" || key == "profile_name") return text(profile);
  if (key == "region" || key == "region_name") return text(region);
  if (key == "endpoint_url") return text(endpoint_url);
  if (key == "anonymous") return flag(anonymous);
  if (key == "path_style") {
    bool b = false;
    SAFETENSORS_RETURN_IF_ERROR(flag(b));
    path_style = b ? 1 : 0;
    return ok_status();
  }
  if (key == "connections") {
    SAFETENSORS_ASSIGN_OR_RETURN(connections, parse_number<unsigned>(key, value, 1));
    return ok_status();
  }
  if (key == "merge_gap") return u64(merge_gap, 0);
  if (key == "header_request_bytes") return u64(header_request_bytes, 16);
  if (key == "max_retries") {
    SAFETENSORS_ASSIGN_OR_RETURN(max_retries, parse_number<unsigned>(key, value, 0));
    return ok_status();
  }
  if (key == "retry_base_delay_ms") return u64(retry_base_delay_ms, 0);
  if (key == "retry_max_delay_ms") return u64(retry_max_delay_ms, 0);
  if (key == "stall_timeout_ms") return u64(stall_timeout_ms, 1);
  if (key == "connect_timeout_ms") return u64(connect_timeout_ms, 1);
  if (key == "read_timeout_ms") return u64(read_timeout_ms, 0);
  if (key == "verify_tls") return flag(verify_tls);
  if (key == "ca_bundle") return text(ca_bundle);
  return Error::invalid_argument("<remote options>", "unknown remote option \"" + std::string(key) + "\"");
}

}  // namespace safetensors
