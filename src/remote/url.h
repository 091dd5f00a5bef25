// URL helpers of the remote sources (the public ones, is_remote_location, redact_url and resolve_location, are
// declared in include/safetensors/remote.h and defined in url.cc beside these).
#ifndef SAFETENSORS_SRC_REMOTE_URL_H_
#define SAFETENSORS_SRC_REMOTE_URL_H_

#include <cstddef>
#include <string>
#include <string_view>

namespace safetensors::internal {

// Whether `s` starts with `prefix`, ASCII letters of `s` compared lower-cased (`prefix` is lower case).
bool starts_with_nocase(std::string_view s, std::string_view prefix);

// The scheme a location names, compared without regard to case as RFC 3986 asks ("S3://b/k" is "s3://b/k"): the
// one test of it, behind is_remote_location(), open_remote_source() and resolve_s3().
enum class Scheme { kNone, kHttp, kHttps, kS3 };
Scheme scheme_of(std::string_view location);
// The length of the scheme and its "://" (0 for kNone).
std::size_t scheme_length(Scheme scheme);

// The host of an http(s) URL, lower-cased, without port or user information.
std::string host_of(std::string_view url);

// Whether `host` is the Hugging Face hub's (huggingface.co, hf.co or a subdomain), whose URLs get HF_TOKEN.
bool is_hub_host(const std::string& host);

}  // namespace safetensors::internal

#endif  // SAFETENSORS_SRC_REMOTE_URL_H_
