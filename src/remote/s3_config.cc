#include "remote/s3_config.h"

#include <cerrno>
#include <cstdlib>
#include <fstream>
#include <map>
#include <string>
#include <utility>

#include "remote/url.h"

namespace safetensors::internal {
namespace {

// SHA-256 of an empty body: what a GET signs as its payload hash (S3 requires the header).
constexpr std::string_view kEmptyPayloadSha256 = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

std::string_view trim(std::string_view s) {
  const auto first = s.find_first_not_of(" \t\r\n");
  if (first == std::string_view::npos) return {};
  const auto last = s.find_last_not_of(" \t\r\n");
  return s.substr(first, last - first + 1);
}

// One INI file of the AWS tools: section -> key -> value. Keys of a nested block ("s3 =" followed by indented
// "addressing_style = path") are stored as "s3.addressing_style".
using Ini = std::map<std::string, std::map<std::string, std::string>, std::less<>>;

// Parses the file at `path`: nullopt when it does not exist. Errors: kIo when it exists and cannot be read.
Result<std::optional<Ini>> read_ini(const std::string& path) {
  std::ifstream in(path);
  if (!in) {
    if (errno == ENOENT || errno == ENOTDIR) return std::optional<Ini>();
    return Error::io(path, "open", errno);
  }
  Ini ini;
  std::string section;
  std::string nested;  // the key of the nested block being read, if any
  std::string line;
  while (std::getline(in, line)) {
    const bool indented = !line.empty() && (line[0] == ' ' || line[0] == '\t');
    const std::string_view t = trim(line);
    if (t.empty() || t[0] == '#' || t[0] == ';') continue;
    if (t.front() == '[' && t.back() == ']') {
      section = std::string(trim(t.substr(1, t.size() - 2)));
      nested.clear();
      continue;
    }
    const auto eq = t.find('=');
    if (eq == std::string_view::npos || section.empty()) continue;
    const std::string key(trim(t.substr(0, eq)));
    const std::string value(trim(t.substr(eq + 1)));
    if (indented && !nested.empty()) {
      ini[section][nested + "." + key] = value;
      continue;
    }
    nested = value.empty() ? key : std::string();
    if (!value.empty()) ini[section][key] = value;
  }
  return std::optional<Ini>(std::move(ini));
}

const std::string* lookup(const std::optional<Ini>& ini, std::string_view section, std::string_view key) {
  if (!ini) return nullptr;
  auto s = ini->find(section);
  if (s == ini->end()) return nullptr;
  auto k = s->second.find(std::string(key));
  return k == s->second.end() || k->second.empty() ? nullptr : &k->second;
}

bool is_unreserved(unsigned char c) {
  return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' || c == '_' ||
         c == '.' || c == '~';
}

// A bucket name that works as a DNS label under a TLS wildcard certificate (no dots, lower case).
bool virtual_host_ok(std::string_view bucket) {
  if (bucket.size() < 3 || bucket.size() > 63) return false;
  for (char c : bucket) {
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-')) return false;
  }
  return bucket.front() != '-' && bucket.back() != '-';
}

std::string first_set(std::initializer_list<std::optional<std::string>> candidates) {
  for (const auto& c : candidates) {
    if (c && !c->empty()) return *c;
  }
  return {};
}

}  // namespace

std::optional<std::string> process_env(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr) return std::nullopt;
  return std::string(v);
}

std::string percent_encode_path(std::string_view key) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  std::string out;
  out.reserve(key.size());
  for (unsigned char c : key) {
    if (is_unreserved(c) || c == '/') {
      out.push_back(static_cast<char>(c));
    } else {
      out.push_back('%');
      out.push_back(kHex[c >> 4]);
      out.push_back(kHex[c & 15]);
    }
  }
  return out;
}

Result<S3Request> resolve_s3(std::string_view url, const RemoteOptions& options, const GetEnv& env) {
  const std::string shown = redact_url(url);
  if (scheme_of(url) != Scheme::kS3) return Error::invalid_argument(shown, "not an s3:// URL");
  std::string_view rest = url.substr(scheme_length(Scheme::kS3));
  const auto slash = rest.find('/');
  if (slash == std::string_view::npos || slash == 0 || slash + 1 >= rest.size()) {
    return Error::invalid_argument(shown, "an s3:// URL names a bucket and a key: s3://BUCKET/KEY");
  }
  const std::string bucket(rest.substr(0, slash));
  const std::string_view key = rest.substr(slash + 1);
  if (bucket.find_first_of("?#@:") != std::string::npos || key.find_first_of("?#") != std::string_view::npos) {
    return Error::invalid_argument(shown, "an s3:// URL takes no query, fragment, user or port");
  }

  const std::string home = env("HOME").value_or("");
  const std::string profile = first_set({options.profile, env("AWS_PROFILE"), std::string("default")});
  const bool profile_named = !options.profile.empty() || env("AWS_PROFILE").has_value();
  const std::string credentials_path =
      first_set({env("AWS_SHARED_CREDENTIALS_FILE"), home.empty() ? std::string() : home + "/.aws/credentials"});
  const std::string config_path =
      first_set({env("AWS_CONFIG_FILE"), home.empty() ? std::string() : home + "/.aws/config"});
  std::optional<Ini> credentials_ini, config_ini;
  if (!credentials_path.empty()) {
    SAFETENSORS_ASSIGN_OR_RETURN(credentials_ini, read_ini(credentials_path));
  }
  if (!config_path.empty()) {
    SAFETENSORS_ASSIGN_OR_RETURN(config_ini, read_ini(config_path));
  }
  // The config file names profiles "profile NAME", except the default one.
  const std::string config_section = profile == "default" ? profile : "profile " + profile;
  const bool profile_exists = (credentials_ini && credentials_ini->count(profile) != 0) ||
                              (config_ini && config_ini->count(config_section) != 0);
  auto profile_value = [&](std::string_view k) -> std::optional<std::string> {
    if (const std::string* v = lookup(credentials_ini, profile, k)) return *v;
    if (const std::string* v = lookup(config_ini, config_section, k)) return *v;
    return std::nullopt;
  };

  S3Request out;
  const std::string region = first_set({options.region, env("AWS_REGION"), env("AWS_DEFAULT_REGION"),
                                        profile_value("region"), std::string("us-east-1")});
  std::string endpoint = first_set({options.endpoint_url, env("AWS_ENDPOINT_URL_S3"), env("AWS_ENDPOINT_URL"),
                                    profile_value("s3.endpoint_url"), profile_value("endpoint_url")});
  while (!endpoint.empty() && endpoint.back() == '/') endpoint.pop_back();
  if (!endpoint.empty() && endpoint.find("://") == std::string::npos) endpoint = "https://" + endpoint;
  bool path_style;
  if (options.path_style >= 0) {
    path_style = options.path_style == 1;
  } else if (auto style = profile_value("s3.addressing_style"); style && *style != "auto") {
    path_style = *style == "path";
  } else {
    path_style = !endpoint.empty() || !virtual_host_ok(bucket);
  }
  const std::string encoded_key = percent_encode_path(key);
  const std::string aws_host = "s3." + region + ".amazonaws.com";
  if (path_style) {
    out.url = (endpoint.empty() ? "https://" + aws_host : endpoint) + "/" + bucket + "/" + encoded_key;
  } else if (endpoint.empty()) {
    out.url = "https://" + bucket + "." + aws_host + "/" + encoded_key;
  } else {
    const auto scheme_end = endpoint.find("://") + 3;
    out.url = endpoint.substr(0, scheme_end) + bucket + "." + endpoint.substr(scheme_end) + "/" + encoded_key;
  }
  if (options.anonymous) return out;

  std::string id, secret, token;
  if (!options.access_key_id.empty() || !options.secret_access_key.empty()) {
    id = options.access_key_id;
    secret = options.secret_access_key;
    token = options.session_token;
    out.credentials_from = "options";
  } else if (auto env_id = env("AWS_ACCESS_KEY_ID"), env_secret = env("AWS_SECRET_ACCESS_KEY");
             env_id && !env_id->empty() && env_secret && !env_secret->empty()) {
    id = *env_id;
    secret = *env_secret;
    token = env("AWS_SESSION_TOKEN").value_or("");
    out.credentials_from = "environment";
  } else if (profile_exists) {
    id = profile_value("aws_access_key_id").value_or("");
    secret = profile_value("aws_secret_access_key").value_or("");
    token = profile_value("aws_session_token").value_or("");
    out.credentials_from = "profile " + profile;
  } else if (profile_named) {
    return Error::invalid_argument(shown, "the AWS profile \"" + profile + "\" is not in " +
                                              (credentials_path.empty() ? "~/.aws/credentials" : credentials_path) +
                                              " or " + (config_path.empty() ? "~/.aws/config" : config_path));
  }
  if (id.empty() || secret.empty()) {
    return Error::invalid_argument(
        shown,
        "no AWS credentials: set aws_access_key_id and aws_secret_access_key, AWS_ACCESS_KEY_ID and "
        "AWS_SECRET_ACCESS_KEY, or a profile (AWS_PROFILE) in ~/.aws/credentials; or anonymous for a "
        "public bucket" +
            (out.credentials_from.empty() ? std::string() : " (" + out.credentials_from + " has no key pair)"));
  }
  out.sigv4 = "aws:amz:" + region + ":s3";
  out.userpwd = id + ":" + secret;
  out.headers.push_back("x-amz-content-sha256: " + std::string(kEmptyPayloadSha256));
  if (!token.empty()) out.headers.push_back("x-amz-security-token: " + token);
  return out;
}

}  // namespace safetensors::internal
