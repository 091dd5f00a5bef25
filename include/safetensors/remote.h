// Remote sources: a safetensors file behind an http://, https:// or s3:// URL, read with HTTP range requests.
//
//   safetensors::OpenOptions options;
//   (void)options.remote.set("endpoint_url", "http://127.0.0.1:8333");   // an S3-compatible store
//   auto file = safetensors::File::open("s3://models/gpt2/model.safetensors", options);
//
// A remote source is a Source (source.h) like a file: every layer above reads it with positional reads, in
// parallel, and never learns where the bytes come from. What makes it remote is below this line:
//   - Opening costs one request: a range of the first header_request_bytes of the object, which gives its size
//     (Content-Range) and its version (ETag, else Last-Modified); a header longer than that costs a second
//     request for the rest. The first range is kept, so no byte of it is requested again.
//   - Every later request carries If-Match with that ETag (If-Unmodified-Since with the Last-Modified time
//     where the server gave no ETag), and every response is checked against the size and ETag pinned at open:
//     an object replaced during a load is an error (kIo, ESTALE), never a mix of two versions.
//   - Each concurrent reader has its own connection, kept alive between its requests (a pool of libcurl
//     handles). read_hints() asks for `connections` readers and merges reads closer than `merge_gap`.
//   - A request that fails with 5xx, 429, a timeout, a reset connection or a body shorter than asked for is
//     retried after an exponential backoff (Retry-After honoured up to retry_max_delay), resuming after the
//     bytes that arrived. A request that receives nothing for stall_timeout fails (and is retried); no read
//     takes longer than read_timeout, retries included. A dead server therefore ends a load with an error.
//   - Errors name the URL without its query string or credentials (presigned URLs carry their signature in the
//     query): 401/403 are kIo with EACCES, 404 kNotFound, a version mismatch (412) kIo with ESTALE, an object
//     shorter than its header says the same header errors as a short file, DNS and TLS failures kIo saying what
//     failed. No secret appears in any message.
//
// URLs:
//   - http(s)://host/path?query: sent as given (presigned S3/GCS URLs, Azure SAS URLs); redirects are followed
//     (the hub's resolve/ URLs redirect to a CDN) and the final URL is reused for later ranges. A bearer token
//     (bearer_token, else HF_TOKEN or HUGGING_FACE_HUB_TOKEN for huggingface.co and hf.co hosts) and extra
//     headers are sent; libcurl never sends an Authorization header to a host a redirect leads to.
//   - s3://bucket/key: signed with AWS Signature Version 4 (libcurl's CURLOPT_AWS_SIGV4). Credentials, region
//     and endpoint are resolved as the AWS tools resolve them: options set here; then AWS_ACCESS_KEY_ID,
//     AWS_SECRET_ACCESS_KEY and AWS_SESSION_TOKEN; then the profile (profile, else AWS_PROFILE, else
//     "default") in the shared credentials file (AWS_SHARED_CREDENTIALS_FILE, else ~/.aws/credentials) and the
//     config file (AWS_CONFIG_FILE, else ~/.aws/config). Region: region, AWS_REGION, AWS_DEFAULT_REGION, the
//     profile's region, else us-east-1. Endpoint: endpoint_url, AWS_ENDPOINT_URL_S3, AWS_ENDPOINT_URL, the
//     profile's endpoint_url, else AWS itself. A custom endpoint (MinIO, Ceph, SeaweedFS, GCS's
//     https://storage.googleapis.com with HMAC keys) is addressed path-style (endpoint/bucket/key), AWS
//     virtual-hosted style (bucket.s3.region.amazonaws.com/key); path_style overrides. anonymous sends unsigned
//     requests (public buckets). Instance-metadata and SSO credentials are not read.
//
// libcurl is loaded when the first remote source is opened (dlopen of libcurl.so.4, or SAFETENSORS_LIBCURL),
// so the library has no link-time dependency on it; without libcurl a remote open fails with kIo saying so.
//
// Thread safety: a remote Source is safe for concurrent use by multiple threads, like every Source.
// RemoteOptions is a value.
#ifndef SAFETENSORS_REMOTE_H_
#define SAFETENSORS_REMOTE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "safetensors/error.h"
#include "safetensors/export.h"
#include "safetensors/source.h"

namespace safetensors {

struct SAFETENSORS_EXPORT RemoteOptions {
  // -- http(s) ---------------------------------------------------------------------------------------------
  // Extra request headers, each "Name: value".
  std::vector<std::string> headers;
  // Sent as "Authorization: Bearer ..."; empty: HF_TOKEN (or HUGGING_FACE_HUB_TOKEN) for hub hosts.
  std::string bearer_token;

  // -- s3 --------------------------------------------------------------------------------------------------
  std::string access_key_id;
  std::string secret_access_key;
  std::string session_token;
  std::string profile;
  std::string region;
  std::string endpoint_url;
  // Unsigned requests: a public bucket.
  bool anonymous = false;
  // -1: path-style for custom endpoints, virtual-hosted for AWS; 0: virtual-hosted; 1: path-style.
  int path_style = -1;

  // -- transfers -------------------------------------------------------------------------------------------
  // Concurrent requests worth issuing (ReadHints::parallelism).
  unsigned connections = 16;
  // Reads closer than this are merged into one request (ReadHints::merge_gap): the gap is fetched and
  // dropped, which costs less than a request's round trip.
  std::uint64_t merge_gap = 256u << 10;
  // The first request of an open: the header and, where the header is shorter, the start of the data.
  std::uint64_t header_request_bytes = 256u << 10;
  // Attempts after the first for one request.
  unsigned max_retries = 6;
  // Backoff before retry k (k = 0, 1, ...): retry_base_delay_ms * 2^k, at most retry_max_delay_ms.
  std::uint64_t retry_base_delay_ms = 100;
  std::uint64_t retry_max_delay_ms = 10'000;
  // A request that receives no byte for this long fails (and is retried).
  std::uint64_t stall_timeout_ms = 30'000;
  std::uint64_t connect_timeout_ms = 15'000;
  // No read takes longer than this, retries and backoff included (0: no bound but the stall limit and the
  // retry count).
  std::uint64_t read_timeout_ms = 600'000;
  // TLS: verify the server's certificate (never turn off outside tests), and an optional CA bundle file.
  bool verify_tls = true;
  std::string ca_bundle;

  // Sets one option from text: the one parser behind the C API and the Python keyword arguments. Keys are
  // the field names above ("header" appends one to `headers`; "token" is bearer_token; "aws_access_key_id",
  // "aws_secret_access_key", "aws_session_token" and "region_name" are accepted as the AWS tools spell
  // them, "profile_name" as boto3 does). Booleans are "true", "True", "1" or "yes" and "false", "False", "0" or
  // "no" (Python's str() of a bool and the usual spellings of a flag); numbers decimal. Errors: kInvalidArgument
  // naming the key (never the value: it may be a secret).
  Status set(std::string_view key, std::string_view value);
};

// True for the locations open_source() sends to open_remote_source(): http://, https:// and s3:// URLs, the
// scheme in any case ("S3://", "HTTPS://").
SAFETENSORS_EXPORT bool is_remote_location(std::string_view location);

// Opens the object at `url` (see the top of this file). Errors: kInvalidArgument (a malformed URL, no
// credentials for s3:// without anonymous), kNotFound (404), kIo (everything else, with EACCES for 401/403),
// and from the first range every error reading a short file gives (the size is the object's).
SAFETENSORS_EXPORT Result<std::shared_ptr<const Source>> open_remote_source(const std::string& url,
                                                                            const RemoteOptions& options = {});

// `url` without its query string, fragment and user information: what names a remote source in errors.
SAFETENSORS_EXPORT std::string redact_url(std::string_view url);

// `relative` (a file name from a sharded checkpoint's index, checked to be relative) resolved against the
// location of the index: a sibling of the index's file, in its directory ("a/b/index.json" + "s.safetensors"
// -> "a/b/s.safetensors") or under its URL's path, percent-encoded, keeping the URL's query (which carries a
// SAS token that covers the container). `relative` is never taken as a location of its own.
SAFETENSORS_EXPORT std::string resolve_location(std::string_view base, std::string_view relative);

}  // namespace safetensors

#endif  // SAFETENSORS_REMOTE_H_
