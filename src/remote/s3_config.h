// s3:// locations: the one resolution of bucket, key, credentials, region and endpoint into a signed HTTP
// request, the way the AWS command-line tools resolve them (the rules are listed in safetensors/remote.h).
#ifndef SAFETENSORS_SRC_REMOTE_S3_CONFIG_H_
#define SAFETENSORS_SRC_REMOTE_S3_CONFIG_H_

#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "safetensors/error.h"
#include "safetensors/remote.h"

namespace safetensors::internal {

// What a request to an s3:// object is made of.
struct S3Request {
  // The https:// (or the endpoint's http://) URL of the object, its key percent-encoded.
  std::string url;
  // CURLOPT_AWS_SIGV4's provider string, "aws:amz:REGION:s3"; empty for anonymous requests.
  std::string sigv4;
  // "ACCESS_KEY:SECRET" for CURLOPT_USERPWD; empty for anonymous requests. A secret: never in a message.
  std::string userpwd;
  // Headers every request sends (x-amz-content-sha256, x-amz-security-token).
  std::vector<std::string> headers;
  // Where the credentials came from ("environment", "profile default in ~/.aws/credentials", ...), for
  // messages; empty for anonymous requests.
  std::string credentials_from;
};

// The environment: a variable's value, or nullopt when unset. Tests pass their own.
using GetEnv = std::function<std::optional<std::string>(const char* name)>;
// The process environment.
std::optional<std::string> process_env(const char* name);

// Resolves `url` ("s3://bucket/key"). Errors: kInvalidArgument naming the URL for a malformed URL, a profile
// that does not exist when one was asked for by name, or no credentials anywhere without options.anonymous
// (the text lists where they were looked for); kIo for a config file that exists but cannot be read.
Result<S3Request> resolve_s3(std::string_view url, const RemoteOptions& options, const GetEnv& env = process_env);

// `key` percent-encoded for a URL path: every byte but unreserved ones (A-Z a-z 0-9 - _ . ~) and '/'.
std::string percent_encode_path(std::string_view key);

}  // namespace safetensors::internal

#endif  // SAFETENSORS_SRC_REMOTE_S3_CONFIG_H_
