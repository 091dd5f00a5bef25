#include "remote/curl_api.h"

#include <dlfcn.h>

#include <cstdlib>
#include <mutex>
#include <string>

namespace safetensors::internal {
namespace {

// Resolves `name` in `lib` into `*fn`; false when it is missing.
template <typename Fn>
bool resolve(void* lib, const char* name, Fn* fn) {
  *fn = reinterpret_cast<Fn>(::dlsym(lib, name));
  return *fn != nullptr;
}

struct Loaded {
  CurlApi api{};
  std::string error;  // empty when api is usable
};

// RTLD_DEEPBIND: libcurl and the libraries it brings (OpenSSL) resolve their own symbols first. Without it a
// library already in the global scope that exports the same names wins: TensorFlow's libtensorflow_framework
// exports its own curl_* and BoringSSL SSL_* functions, and libcurl's internal calls landed there ("Failed
// initialization", then a crash). The sanitizers' runtimes refuse RTLD_DEEPBIND, so their builds go without.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define SAFETENSORS_NO_DEEPBIND 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer) || __has_feature(memory_sanitizer)
#define SAFETENSORS_NO_DEEPBIND 1
#endif
#endif
#if defined(RTLD_DEEPBIND) && !defined(SAFETENSORS_NO_DEEPBIND)
constexpr int kOpenFlags = RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND;
#else
constexpr int kOpenFlags = RTLD_NOW | RTLD_LOCAL;
#endif

Loaded load() {
  Loaded out;
  const char* forced = std::getenv("SAFETENSORS_LIBCURL");
  static const char* const kNames[] = {"libcurl.so.4", "libcurl-gnutls.so.4", "libcurl-nss.so.4", "libcurl.so"};
  void* lib = nullptr;
  const char* soname = nullptr;
  if (forced != nullptr && *forced != '\0') {
    lib = ::dlopen(forced, kOpenFlags);
    soname = forced;
  } else {
    for (const char* name : kNames) {
      lib = ::dlopen(name, kOpenFlags);
      if (lib != nullptr) {
        soname = name;
        break;
      }
    }
  }
  if (lib == nullptr) {
    const char* why = ::dlerror();
    out.error = std::string("remote locations need libcurl, which could not be loaded (") +
                (forced != nullptr && *forced != '\0' ? std::string("SAFETENSORS_LIBCURL=") + forced
                                                      : std::string("libcurl.so.4")) +
                (why != nullptr ? std::string(": ") + why : std::string()) +
                "): install it (Debian/Ubuntu: libcurl4, RHEL/openEuler: libcurl)";
    return out;
  }
  CurlApi& api = out.api;
  CURLcode (*global_init)(long) = nullptr;
  curl_version_info_data* (*version_info)(CURLversion) = nullptr;
  const bool ok =
      resolve(lib, "curl_easy_init", &api.easy_init) && resolve(lib, "curl_easy_cleanup", &api.easy_cleanup) &&
      resolve(lib, "curl_easy_setopt", &api.easy_setopt) && resolve(lib, "curl_easy_perform", &api.easy_perform) &&
      resolve(lib, "curl_easy_getinfo", &api.easy_getinfo) && resolve(lib, "curl_easy_strerror", &api.easy_strerror) &&
      resolve(lib, "curl_slist_append", &api.slist_append) &&
      resolve(lib, "curl_slist_free_all", &api.slist_free_all) && resolve(lib, "curl_global_init", &global_init) &&
      resolve(lib, "curl_version_info", &version_info);
  if (!ok) {
    out.error = std::string("remote locations need libcurl: ") + soname + " lacks a function this library calls";
    return out;
  }
  // curl_global_init is not thread-safe: it runs here, once, under the call_once of curl_api().
  if (global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK) {
    out.error = std::string("remote locations need libcurl: ") + soname + " failed to initialise";
    return out;
  }
  const curl_version_info_data* info = version_info(CURLVERSION_NOW);
  api.version_num = info != nullptr ? info->version_num : 0;
  api.soname = soname;
  // The library stays loaded for the life of the process: handles may be cleaned up during exit.
  return out;
}

}  // namespace

Result<const CurlApi*> curl_api(const std::string& context) {
  static std::once_flag once;
  static Loaded loaded;
  std::call_once(once, [] { loaded = load(); });
  if (!loaded.error.empty()) return Error::io(context, loaded.error);
  return &loaded.api;
}

}  // namespace safetensors::internal
