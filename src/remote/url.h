// URL helpers of the remote sources (the public ones, is_remote_location, redact_url and resolve_location, are
// declared in include/safetensors/remote.h and defined in url.cc beside these).
#ifndef SAFETENSORS_SRC_REMOTE_URL_H_
#define SAFETENSORS_SRC_REMOTE_URL_H_

#include <string>
#include <string_view>

namespace safetensors::internal {

// Whether `s` starts with `prefix`, ASCII letters of `s` compared lower-cased (`prefix` is lower case).
bool starts_with_nocase(std::string_view s, std::string_view prefix);

// The host of an http(s) URL, lower-cased, without port or user information.
std::string host_of(std::string_view url);

// Whether `host` is the Hugging Face hub's (huggingface.co, hf.co or a subdomain), whose URLs get HF_TOKEN.
bool is_hub_host(const std::string& host);

}  // namespace safetensors::internal

#endif  // SAFETENSORS_SRC_REMOTE_URL_H_
