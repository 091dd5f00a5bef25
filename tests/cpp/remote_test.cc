// The remote source: its parsers (HTTP response headers, s3:// resolution, options, URLs) and, against a loopback
// server, opening, parallel reads, retries, version pinning and the errors. SeaweedFS and fault-proxy tests of
// the whole package live in tests/python/test_remote*.py.
#include <gtest/gtest.h>

#include <cerrno>
#include <cstdlib>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "loopback_http.h"
#include "remote/http_response.h"
#include "remote/s3_config.h"
#include "safetensors/file.h"
#include "safetensors/remote.h"
#include "safetensors/writer.h"
#include "test_util.h"

namespace safetensors {
namespace {

using test::LoopbackHttp;
using test::TempDir;

// -- parsers ---------------------------------------------------------------------------------------------

TEST(HttpResponseTest, ParsesRangeVersionAndRetryHeaders) {
  internal::HttpResponse r;
  r.add_header_line("HTTP/1.1 206 Partial Content\r\n");
  r.add_header_line("content-range: bytes 100-199/1234\r\n");
  r.add_header_line("ETag: \"abc\"\r\n");
  r.add_header_line("Last-Modified: Wed, 21 Oct 2015 07:28:00 GMT\r\n");
  r.add_header_line("Content-Length: 100\r\n");
  EXPECT_EQ(r.status, 206);
  EXPECT_EQ(r.reason, "Partial Content");
  EXPECT_EQ(r.range_first, 100u);
  EXPECT_EQ(r.total, 1234u);
  EXPECT_EQ(r.content_length, 100u);
  EXPECT_EQ(r.etag, "\"abc\"");
  EXPECT_TRUE(r.strong_etag());
  EXPECT_EQ(r.last_modified, "Wed, 21 Oct 2015 07:28:00 GMT");

  // A redirect's headers are forgotten when the next response starts.
  r.add_header_line("HTTP/1.1 503 Slow Down");
  r.add_header_line("Retry-After: 3");
  EXPECT_EQ(r.status, 503);
  EXPECT_FALSE(r.total.has_value());
  EXPECT_EQ(r.retry_after_seconds, 3u);
  r.add_header_line("HTTP/1.1 416 Range Not Satisfiable");
  r.add_header_line("Content-Range: bytes */0");
  EXPECT_EQ(r.total, 0u);
  EXPECT_FALSE(r.range_first.has_value());
  r.add_header_line("HTTP/1.1 200 OK");
  r.add_header_line("ETag: W/\"weak\"");
  EXPECT_FALSE(r.strong_etag());
}

TEST(HttpResponseTest, ErrorCodeFromAnS3Body) {
  internal::HttpResponse r;
  r.add_header_line("HTTP/1.1 403 Forbidden");
  r.add_error_body("<?xml version=\"1.0\"?><Error><Code>SignatureDoesNotMatch</Code><Message>x</Message></Error>");
  EXPECT_EQ(r.error_code(), "SignatureDoesNotMatch");
  r.add_error_body(std::string(5000, 'x'));
  EXPECT_EQ(r.error_body.size(), 2048u);
}

TEST(UrlTest, RedactsQueryFragmentAndUserInformation) {
  EXPECT_EQ(redact_url("https://h.example/a/b.safetensors?X-Amz-Signature=secret&x=1"),
            "https://h.example/a/b.safetensors");
  EXPECT_EQ(redact_url("https://user:pass@h.example:8443/a#frag"), "https://h.example:8443/a");
  EXPECT_EQ(redact_url("s3://bucket/key"), "s3://bucket/key");
  EXPECT_TRUE(is_remote_location("HTTPS://x/y"));
  EXPECT_TRUE(is_remote_location("s3://b/k"));
  EXPECT_FALSE(is_remote_location("model.safetensors"));
  EXPECT_FALSE(is_remote_location("/data/http://x"));
}

TEST(UrlTest, ResolvesShardsBesideTheIndex) {
  EXPECT_EQ(resolve_location("ckpt/model.safetensors.index.json", "model-1.safetensors"), "ckpt/model-1.safetensors");
  EXPECT_EQ(resolve_location("index.json", "s.safetensors"), "s.safetensors");
  EXPECT_EQ(resolve_location("s3://b/dir/index.json", "sub/a b.safetensors"), "s3://b/dir/sub/a%20b.safetensors");
  // A SAS token covering the container travels with every shard; a fragment does not.
  EXPECT_EQ(resolve_location("https://acct.blob.example/c/m/index.json?sv=1&sig=abc#f", "s-1.safetensors"),
            "https://acct.blob.example/c/m/s-1.safetensors?sv=1&sig=abc");
  // A shard name that looks like a URL is still a name under the index's directory.
  EXPECT_EQ(resolve_location("https://h/m/index.json", "s3://evil/x"), "https://h/m/s3%3A//evil/x");
}

TEST(RemoteOptionsTest, ParsesEveryKindOfValueAndNeverEchoesOne) {
  RemoteOptions o;
  ASSERT_ST_OK(o.set("endpoint_url", "http://127.0.0.1:1"));
  ASSERT_ST_OK(o.set("aws_access_key_id", "AKID"));
  ASSERT_ST_OK(o.set("anonymous", "true"));
  ASSERT_ST_OK(o.set("connections", "4"));
  ASSERT_ST_OK(o.set("path_style", "0"));
  // Booleans: the spellings remote.h lists, and no others.
  for (const char* yes : {"true", "True", "1", "yes"}) {
    ASSERT_ST_OK(o.set("verify_tls", "false"));
    ASSERT_ST_OK(o.set("verify_tls", yes));
    EXPECT_TRUE(o.verify_tls) << yes;
  }
  for (const char* no : {"false", "False", "0", "no"}) {
    ASSERT_ST_OK(o.set("verify_tls", "true"));
    ASSERT_ST_OK(o.set("verify_tls", no));
    EXPECT_FALSE(o.verify_tls) << no;
  }
  for (const char* neither : {"TRUE", "on", "2", ""}) EXPECT_ST_ERROR(o.set("verify_tls", neither), kInvalidArgument);
  ASSERT_ST_OK(o.set("header", "X-Test: 1"));
  EXPECT_EQ(o.endpoint_url, "http://127.0.0.1:1");
  EXPECT_EQ(o.access_key_id, "AKID");
  EXPECT_TRUE(o.anonymous);
  EXPECT_EQ(o.connections, 4u);
  EXPECT_EQ(o.path_style, 0);
  EXPECT_EQ(o.headers, std::vector<std::string>{"X-Test: 1"});

  auto e = o.set("connections", "0-secret");
  EXPECT_ST_ERROR(e, kInvalidArgument);
  EXPECT_EQ(e.error().to_string().find("secret"), std::string::npos) << e.error().to_string();
  EXPECT_NE(e.error().to_string().find("connections"), std::string::npos);
  EXPECT_ST_ERROR(o.set("connections", "0"), kInvalidArgument);
  EXPECT_ST_ERROR(o.set("header", "no colon"), kInvalidArgument);
  EXPECT_ST_ERROR(o.set("header", "A: b\r\nInjected: 1"), kInvalidArgument);
  EXPECT_ST_ERROR(o.set("no_such_option", "1"), kInvalidArgument);
}

// An environment of our own for resolve_s3.
struct FakeEnv {
  std::map<std::string, std::string> vars;
  internal::GetEnv get() const {
    return [this](const char* name) -> std::optional<std::string> {
      auto it = vars.find(name);
      if (it == vars.end()) return std::nullopt;
      return it->second;
    };
  }
};

TEST(S3ConfigTest, EnvironmentCredentialsAndAwsVirtualHostedUrl) {
  TempDir home;
  FakeEnv env{{{"HOME", home.path().string()},
               {"AWS_ACCESS_KEY_ID", "AKIDENV"},
               {"AWS_SECRET_ACCESS_KEY", "SECRETENV"},
               {"AWS_SESSION_TOKEN", "TOKENENV"},
               {"AWS_REGION", "eu-west-1"}}};
  auto r = internal::resolve_s3("s3://my-bucket/dir/model +1.safetensors", {}, env.get());
  ASSERT_ST_OK(r);
  EXPECT_EQ(r->url, "https://my-bucket.s3.eu-west-1.amazonaws.com/dir/model%20%2B1.safetensors");
  EXPECT_EQ(r->sigv4, "aws:amz:eu-west-1:s3");
  EXPECT_EQ(r->userpwd, "AKIDENV:SECRETENV");
  EXPECT_EQ(r->credentials_from, "environment");
  EXPECT_NE(std::find(r->headers.begin(), r->headers.end(), "x-amz-security-token: TOKENENV"), r->headers.end());

  // A bucket with dots cannot be a TLS wildcard's label: path-style.
  auto dotted = internal::resolve_s3("s3://my.bucket/k", {}, env.get());
  ASSERT_ST_OK(dotted);
  EXPECT_EQ(dotted->url, "https://s3.eu-west-1.amazonaws.com/my.bucket/k");
}

// A scheme is case-insensitive (RFC 3986): "S3://" is an S3 URL to every part of the library, not a remote
// location that resolve_s3 then refuses.
TEST(S3ConfigTest, TheSchemeIsCaseInsensitive) {
  TempDir home;
  FakeEnv env{{{"HOME", home.path().string()}, {"AWS_ACCESS_KEY_ID", "AKID"}, {"AWS_SECRET_ACCESS_KEY", "SECRET"}}};
  EXPECT_TRUE(is_remote_location("S3://b/k"));
  auto upper = internal::resolve_s3("S3://my-bucket/Key.safetensors", {}, env.get());
  ASSERT_ST_OK(upper);
  auto lower = internal::resolve_s3("s3://my-bucket/Key.safetensors", {}, env.get());
  ASSERT_ST_OK(lower);
  EXPECT_EQ(upper->url, lower->url);
  EXPECT_EQ(upper->sigv4, lower->sigv4);
  EXPECT_ST_ERROR(internal::resolve_s3("https://my-bucket/k", {}, env.get()), kInvalidArgument);
}

TEST(S3ConfigTest, ProfileFilesEndpointAndPrecedence) {
  TempDir home;
  std::filesystem::create_directories(home.path() / ".aws");
  test::write_bytes(home.file(".aws/credentials"),
                    "[default]\naws_access_key_id = AKIDDEF\naws_secret_access_key = SECDEF\n"
                    "[work]\naws_access_key_id=AKIDWORK\naws_secret_access_key=SECWORK\n");
  test::write_bytes(home.file(".aws/config"),
                    "[default]\nregion = us-west-2\n"
                    "[profile work]\nregion = ap-south-1\ns3 =\n  addressing_style = path\n"
                    "endpoint_url = https://store.example:9000/\n");
  FakeEnv env{{{"HOME", home.path().string()}}};
  auto def = internal::resolve_s3("s3://bucket1/k", {}, env.get());
  ASSERT_ST_OK(def);
  EXPECT_EQ(def->userpwd, "AKIDDEF:SECDEF");
  EXPECT_EQ(def->url, "https://bucket1.s3.us-west-2.amazonaws.com/k");

  env.vars["AWS_PROFILE"] = "work";
  auto work = internal::resolve_s3("s3://bucket1/k", {}, env.get());
  ASSERT_ST_OK(work);
  EXPECT_EQ(work->userpwd, "AKIDWORK:SECWORK");
  EXPECT_EQ(work->url, "https://store.example:9000/bucket1/k");
  EXPECT_EQ(work->sigv4, "aws:amz:ap-south-1:s3");

  // Options beat the environment, which beats the profile; AWS_ENDPOINT_URL_S3 beats AWS_ENDPOINT_URL.
  env.vars["AWS_ENDPOINT_URL"] = "http://generic:1";
  env.vars["AWS_ENDPOINT_URL_S3"] = "http://s3only:2";
  env.vars["AWS_REGION"] = "us-east-2";
  RemoteOptions options;
  options.access_key_id = "AKIDOPT";
  options.secret_access_key = "SECOPT";
  auto opt = internal::resolve_s3("s3://bucket1/k", options, env.get());
  ASSERT_ST_OK(opt);
  EXPECT_EQ(opt->userpwd, "AKIDOPT:SECOPT");
  EXPECT_EQ(opt->url, "http://s3only:2/bucket1/k");
  EXPECT_EQ(opt->sigv4, "aws:amz:us-east-2:s3");

  options.anonymous = true;
  auto anon = internal::resolve_s3("s3://bucket1/k", options, env.get());
  ASSERT_ST_OK(anon);
  EXPECT_TRUE(anon->sigv4.empty());
  EXPECT_TRUE(anon->userpwd.empty());
}

TEST(S3ConfigTest, MissingCredentialsAndBadUrlsAreClearErrors) {
  TempDir home;
  FakeEnv env{{{"HOME", home.path().string()}}};
  auto none = internal::resolve_s3("s3://b/k", {}, env.get());
  EXPECT_ST_ERROR(none, kInvalidArgument);
  EXPECT_NE(none.error().to_string().find("no AWS credentials"), std::string::npos);
  env.vars["AWS_PROFILE"] = "missing";
  auto missing = internal::resolve_s3("s3://b/k", {}, env.get());
  EXPECT_ST_ERROR(missing, kInvalidArgument);
  EXPECT_NE(missing.error().to_string().find("\"missing\""), std::string::npos);
  EXPECT_ST_ERROR(internal::resolve_s3("s3://bucket-only", {}, env.get()), kInvalidArgument);
  EXPECT_ST_ERROR(internal::resolve_s3("s3:///key", {}, env.get()), kInvalidArgument);
}

// -- against a loopback server ---------------------------------------------------------------------------

// A file of 40 tensors, some large enough to be read in several parts.
std::string make_file() {
  static const std::vector<std::byte> small = test::random_bytes(1000, 1);
  static const std::vector<std::byte> big = test::random_bytes(3 << 20, 2);
  std::vector<std::string> names;
  std::vector<std::vector<std::uint64_t>> shapes;
  std::vector<TensorData> tensors;
  for (int i = 0; i < 40; ++i) names.push_back("t" + std::to_string(i));
  for (int i = 0; i < 40; ++i) {
    const bool large = i % 10 == 0;
    tensors.push_back({names[i],
                       Dtype::kU8,
                       {large ? big.size() : small.size()},
                       large ? std::span<const std::byte>(big) : std::span<const std::byte>(small)});
  }
  auto bytes = serialize(tensors);
  return test::to_string(*bytes);
}

RemoteOptions quick_options() {
  RemoteOptions o;
  o.retry_base_delay_ms = 1;
  o.retry_max_delay_ms = 5;
  o.header_request_bytes = 4096;
  o.connections = 4;
  return o;
}

Result<File> open_url(const std::string& url, const RemoteOptions& remote) {
  OpenOptions options;
  options.remote = remote;
  return File::open(url, options);
}

// Every tensor read both ways, compared byte for byte.
void expect_same_tensors(const File& remote, const std::string& bytes) {
  auto local = test::open_bytes(bytes);
  ASSERT_ST_OK(local);
  ASSERT_EQ(remote.tensors().size(), local->tensors().size());
  std::vector<std::vector<std::byte>> got(remote.tensors().size());
  std::vector<ReadRequest> requests;
  for (std::size_t i = 0; i < got.size(); ++i) {
    got[i].resize(remote.tensors()[i].nbytes());
    requests.push_back({&remote.tensors()[i], got[i]});
  }
  ASSERT_ST_OK(remote.read_many(requests));
  for (std::size_t i = 0; i < got.size(); ++i) {
    auto view = local->view(local->tensors()[i]);
    ASSERT_ST_OK(view);
    ASSERT_EQ(got[i].size(), view->bytes.size());
    EXPECT_EQ(std::memcmp(got[i].data(), view->bytes.data(), got[i].size()), 0) << remote.tensors()[i].name;
  }
}

TEST(RemoteSourceTest, LoadsEveryTensorByteForByteWithoutRequestingAByteTwice) {
  const std::string bytes = make_file();
  LoopbackHttp server("/m.safetensors", bytes);
  auto file = open_url(server.url() + "?sig=SECRET", quick_options());
  ASSERT_ST_OK(file);
  const int requests_to_open = server.requests();
  EXPECT_EQ(requests_to_open, 1);
  EXPECT_EQ(file->path(), server.url());  // the query is not part of the name
  EXPECT_EQ(file->backend(), ReadPath::kPread);
  EXPECT_EQ(file->source()->kind(), "http");
  EXPECT_EQ(file->source()->read_hints().parallelism, 4u);
  expect_same_tensors(*file, bytes);
  // Ranges never overlap: every byte after the first range was asked for once.
  auto ranges = server.ranges();
  std::sort(ranges.begin(), ranges.end());
  for (std::size_t i = 1; i < ranges.size(); ++i) EXPECT_GT(ranges[i].first, ranges[i - 1].second);
  EXPECT_EQ(server.body_bytes_sent(), bytes.size());
  const SourceStats stats = file->source()->stats();
  EXPECT_EQ(stats.bytes_fetched, bytes.size());
  EXPECT_EQ(stats.retries, 0u);
  EXPECT_GT(server.connections(), 1);  // parallel readers, each on a connection of its own
  // Small tensors next to each other share a request (merge_gap): 4 large tensors, 4 runs of small ones.
  EXPECT_EQ(server.requests() - requests_to_open, 8);
}

TEST(RemoteSourceTest, WithoutMergingEveryTensorIsARequest) {
  const std::string bytes = make_file();
  LoopbackHttp server("/m.safetensors", bytes);
  RemoteOptions o = quick_options();
  o.merge_gap = 0;
  auto file = open_url(server.url(), o);
  ASSERT_ST_OK(file);
  expect_same_tensors(*file, bytes);
  EXPECT_EQ(server.requests(), 1 + 40);  // the first range, then each tensor (t0 without its first bytes)
}

TEST(RemoteSourceTest, RetriesServerErrorsAndResumesCutBodies) {
  const std::string bytes = make_file();
  LoopbackHttp server("/m.safetensors", bytes);
  auto file = open_url(server.url(), quick_options());
  ASSERT_ST_OK(file);
  server.fail_with_503 = 3;
  server.cut_body_after_half = 3;
  expect_same_tensors(*file, bytes);
  EXPECT_EQ(server.fail_with_503.load(), 0);
  EXPECT_EQ(server.cut_body_after_half.load(), 0);
  EXPECT_GE(file->source()->stats().retries, 6u);
  // A cut body resumes after the bytes that arrived: none is fetched twice.
  EXPECT_EQ(server.body_bytes_sent(), bytes.size());
}

TEST(RemoteSourceTest, GivesUpAfterTheRetriesWithTheLastFailure) {
  LoopbackHttp server("/m.safetensors", make_file());
  RemoteOptions o = quick_options();
  o.max_retries = 2;
  server.fail_with_503 = 100;
  auto file = open_url(server.url(), o);
  EXPECT_ST_ERROR(file, kIo);
  EXPECT_NE(file.error().to_string().find("HTTP 503 Service Unavailable (after 3 attempts)"), std::string::npos)
      << file.error().to_string();
  EXPECT_EQ(server.requests(), 3);
}

TEST(RemoteSourceTest, AReplacedObjectIsAnErrorNeverAMix) {
  const std::string bytes = make_file();
  LoopbackHttp server("/m.safetensors", bytes);
  auto file = open_url(server.url(), quick_options());
  ASSERT_ST_OK(file);
  server.replace_at_offset = static_cast<std::int64_t>(bytes.size() / 2);
  std::vector<std::byte> all(bytes.size() - file->data_offset());
  Status st = file->read_range(0, all, 1);
  EXPECT_ST_ERROR(st, kIo);
  EXPECT_EQ(st.error().sys_errno(), ESTALE);
  EXPECT_NE(st.error().to_string().find("changed after it was opened"), std::string::npos) << st.error().to_string();

  // Without If-Match the ETag of every response is still compared.
  server.ignore_if_match = true;
  auto again = open_url(server.url(), quick_options());
  ASSERT_ST_OK(again);
  server.replace_at_offset = static_cast<std::int64_t>(bytes.size() / 2);
  EXPECT_EQ(again->read_range(0, all, 1).error().sys_errno(), ESTALE);
}

TEST(RemoteSourceTest, StatusErrorsMapToKinds) {
  LoopbackHttp server("/m.safetensors", make_file());
  auto missing = open_url(server.url_of("/other.safetensors"), quick_options());
  EXPECT_ST_ERROR(missing, kNotFound);
  server.status_override = 403;
  auto denied = open_url(server.url() + "?token=SECRET", quick_options());
  EXPECT_ST_ERROR(denied, kIo);
  EXPECT_EQ(denied.error().sys_errno(), EACCES);
  EXPECT_EQ(denied.error().to_string().find("SECRET"), std::string::npos) << denied.error().to_string();
  EXPECT_NE(denied.error().to_string().find("HTTP 403"), std::string::npos) << denied.error().to_string();
}

TEST(RemoteSourceTest, AStalledServerEndsTheReadWithinItsBound) {
  LoopbackHttp server("/m.safetensors", make_file());
  RemoteOptions o = quick_options();
  o.stall_timeout_ms = 300;
  o.max_retries = 1;
  auto file = open_url(server.url(), o);
  ASSERT_ST_OK(file);
  server.stall = 100;
  std::vector<std::byte> dst(1 << 20);
  Status st = file->read_range(0, dst, 1);
  EXPECT_ST_ERROR(st, kIo);
  EXPECT_EQ(st.error().sys_errno(), ETIMEDOUT);
  EXPECT_NE(st.error().to_string().find("no data for 300 ms (after 2 attempts)"), std::string::npos)
      << st.error().to_string();
}

TEST(RemoteSourceTest, AnObjectShorterThanItsHeaderSaysFailsAsAShortFile) {
  std::string bytes = make_file();
  bytes.resize(bytes.size() - 10);
  LoopbackHttp server("/m.safetensors", bytes);
  EXPECT_ST_ERROR(open_url(server.url(), quick_options()), kMetadataIncompleteBuffer);
  LoopbackHttp empty("/m.safetensors", "");
  EXPECT_ST_ERROR(open_url(empty.url(), quick_options()), kHeaderTooSmall);
}

TEST(RemoteSourceTest, ATlsFailureSaysSo) {
  // https:// to a server that speaks plain HTTP: the handshake fails, and the error says it was TLS.
  LoopbackHttp server("/m.safetensors", make_file());
  const std::string url = "https" + server.url().substr(4);
  RemoteOptions o = quick_options();
  o.connect_timeout_ms = 5000;
  auto r = open_url(url, o);
  EXPECT_ST_ERROR(r, kIo);
  EXPECT_NE(r.error().to_string().find("TLS: "), std::string::npos) << r.error().to_string();
}

TEST(RemoteSourceTest, AConnectionRefusedIsRetriedThenReported) {
  int port;
  {
    LoopbackHttp gone("/m", "x");
    port = std::stoi(gone.url().substr(std::string("http://127.0.0.1:").size()));
  }
  RemoteOptions o = quick_options();
  o.max_retries = 1;
  auto r = open_url("http://127.0.0.1:" + std::to_string(port) + "/m", o);
  EXPECT_ST_ERROR(r, kIo);
  EXPECT_EQ(r.error().sys_errno(), ECONNREFUSED) << r.error().to_string();
}

// libcurl is loaded once per process: the child of a death test is a process that has not loaded it yet.
void open_without_libcurl() {
  ::setenv("SAFETENSORS_LIBCURL", "/nonexistent/libcurl.so.4", 1);
  auto r = File::open("http://127.0.0.1:1/m.safetensors");
  const bool says_what = !r.ok() && r.error().kind() == Error::Kind::kIo &&
                         r.error().to_string().find("remote locations need libcurl") != std::string::npos;
  // Local files never need it.
  TempDir dir;
  test::write_bytes(dir.file("m.safetensors"), make_file());
  std::exit(says_what && File::open(dir.file("m.safetensors")).ok() ? 0 : 1);
}

TEST(RemoteSourceDeathTest, WithoutLibcurlARemoteOpenSaysWhatIsMissing) {
  // "fast": the child is forked, not re-executed (qemu-user, the big-endian stage, cannot execv a foreign binary
  // without binfmt). gtest runs *DeathTest suites first, so the forked process has not loaded libcurl yet.
  GTEST_FLAG_SET(death_test_style, "fast");
  EXPECT_EXIT(open_without_libcurl(), ::testing::ExitedWithCode(0), "");
}

}  // namespace
}  // namespace safetensors
