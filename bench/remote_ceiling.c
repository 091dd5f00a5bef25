/* The ceiling of a remote load: raw parallel range requests for a whole object into memory that is already
   there (allocated and touched before the clock starts), nothing parsed, nothing checked. bench/remote_load.py
   builds and runs it against the same server and object as the loads it compares.

   usage: remote_ceiling URL SIZE THREADS CHUNK [SIGV4 USERPWD]
     URL     the object's http:// URL (path-style for an S3 endpoint)
     SIZE    its size in bytes; THREADS parallel connections; CHUNK bytes per request
     SIGV4   CURLOPT_AWS_SIGV4's provider string ("aws:amz:us-east-1:s3"); USERPWD "KEY:SECRET"
   With REMOTE_CEILING_FRESH=1 in the environment the memory is not touched first: each page is faulted in
   (and zeroed by the kernel) as the bodies land, as a load's fresh tensors are.
   Prints one JSON line: {"seconds": ..., "bytes": ...}. Exits 1 on any failed request. */
#define _POSIX_C_SOURCE 200809L

#include <curl/curl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static const char* url;
static const char* sigv4;
static const char* userpwd;
static uint64_t size, chunk;
static unsigned char* buffer;
static atomic_uint_fast64_t next_chunk;
static atomic_uint_fast64_t received;
static atomic_int failed;

struct sink {
  unsigned char* at;
  uint64_t room;
};

static size_t write_body(char* data, size_t one, size_t n, void* user) {
  struct sink* s = user;
  size_t len = one * n;
  if (len > s->room) return 0;
  memcpy(s->at, data, len);
  s->at += len;
  s->room -= len;
  atomic_fetch_add(&received, len);
  return len;
}

static void* reader(void* arg) {
  (void)arg;
  CURL* h = curl_easy_init();
  struct curl_slist* headers = NULL;
  if (sigv4) {
    headers = curl_slist_append(
        headers, "x-amz-content-sha256: e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    curl_easy_setopt(h, CURLOPT_AWS_SIGV4, sigv4);
    curl_easy_setopt(h, CURLOPT_USERPWD, userpwd);
  }
  curl_easy_setopt(h, CURLOPT_URL, url);
  curl_easy_setopt(h, CURLOPT_HTTPHEADER, headers);
  curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, write_body);
  for (;;) {
    uint64_t i = atomic_fetch_add(&next_chunk, 1);
    uint64_t begin = i * chunk;
    if (begin >= size || atomic_load(&failed)) break;
    uint64_t end = begin + chunk < size ? begin + chunk : size;
    char range[64];
    snprintf(range, sizeof range, "%llu-%llu", (unsigned long long)begin, (unsigned long long)(end - 1));
    struct sink s = {buffer + begin, end - begin};
    curl_easy_setopt(h, CURLOPT_RANGE, range);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, &s);
    long status = 0;
    if (curl_easy_perform(h) != CURLE_OK || curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &status) != CURLE_OK ||
        status != 206 || s.room != 0) {
      fprintf(stderr, "remote_ceiling: request %s failed (HTTP %ld)\n", range, status);
      atomic_store(&failed, 1);
    }
  }
  curl_slist_free_all(headers);
  curl_easy_cleanup(h);
  return NULL;
}

int main(int argc, char** argv) {
  if (argc != 5 && argc != 7) {
    fprintf(stderr, "usage: remote_ceiling URL SIZE THREADS CHUNK [SIGV4 USERPWD]\n");
    return 2;
  }
  url = argv[1];
  size = strtoull(argv[2], NULL, 10);
  unsigned threads = (unsigned)strtoul(argv[3], NULL, 10);
  chunk = strtoull(argv[4], NULL, 10);
  if (argc == 7) {
    sigv4 = argv[5];
    userpwd = argv[6];
  }
  if (threads == 0 || threads > 256 || chunk == 0) return 2;
  buffer = malloc(size);
  if (!buffer) return 1;
  const char* fresh = getenv("REMOTE_CEILING_FRESH");
  if (fresh == NULL || strcmp(fresh, "1") != 0) {
    memset(buffer, 1, size); /* pre-faulted: the ceiling does not pay for fresh memory */
  }
  curl_global_init(CURL_GLOBAL_DEFAULT);
  pthread_t tids[256];
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  for (unsigned t = 0; t < threads; ++t) pthread_create(&tids[t], NULL, reader, NULL);
  for (unsigned t = 0; t < threads; ++t) pthread_join(tids[t], NULL);
  clock_gettime(CLOCK_MONOTONIC, &t1);
  double seconds = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
  printf("{\"seconds\": %.6f, \"bytes\": %llu}\n", seconds, (unsigned long long)atomic_load(&received));
  curl_global_cleanup();
  free(buffer);
  return atomic_load(&failed) ? 1 : 0;
}
