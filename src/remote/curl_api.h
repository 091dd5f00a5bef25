// libcurl, loaded at run time: the functions the remote source calls, resolved once per process with dlopen.
//
// The library does not link libcurl, so a program (or a Python wheel) that never opens a URL has no
// dependency on it, and one that does uses the system's libcurl -- with the system's TLS library and its
// security updates -- wherever it is installed. Types and constants come from <curl/curl.h>, whose option
// numbers and signatures libcurl keeps stable across versions.
#ifndef SAFETENSORS_SRC_REMOTE_CURL_API_H_
#define SAFETENSORS_SRC_REMOTE_CURL_API_H_

#include <curl/curl.h>

#include "safetensors/error.h"

namespace safetensors::internal {

struct CurlApi {
  CURL* (*easy_init)();
  void (*easy_cleanup)(CURL*);
  CURLcode (*easy_setopt)(CURL*, CURLoption, ...);
  CURLcode (*easy_perform)(CURL*);
  CURLcode (*easy_getinfo)(CURL*, CURLINFO, ...);
  const char* (*easy_strerror)(CURLcode);
  curl_slist* (*slist_append)(curl_slist*, const char*);
  void (*slist_free_all)(curl_slist*);
  // libcurl's version as LIBCURL_VERSION_NUM spells it (0xXXYYZZ).
  unsigned version_num;
  // What the library loaded is called, for messages ("libcurl.so.4").
  const char* soname;
};

// The API, loaded and initialised (curl_global_init) on the first call; later calls return the same table.
// The library tried is $SAFETENSORS_LIBCURL when set, else libcurl.so.4 and its Debian TLS variants.
// Errors: kIo ("remote locations need libcurl ...") naming `context` when no libcurl could be loaded, or
// it lacks a function.
Result<const CurlApi*> curl_api(const std::string& context);

}  // namespace safetensors::internal

#endif  // SAFETENSORS_SRC_REMOTE_CURL_API_H_
