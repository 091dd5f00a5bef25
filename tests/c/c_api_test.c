/* The C API, exercised from C11: golden bytes, round trips on every backend, views that outlive their file,
   slices, metadata, every error path's code and message, error-object ownership, and sharded checkpoints. */
#define _POSIX_C_SOURCE 200809L

#include <safetensors/c.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "c_check.h"

static int failures = 0;

static char dir[256];

static const char* path_in(const char* name) {
  static char buf[512];
  snprintf(buf, sizeof buf, "%s/%s", dir, name);
  return buf;
}

static size_t read_whole(const char* path, unsigned char* out, size_t cap) {
  FILE* f = fopen(path, "rb");
  if (!f) return 0;
  size_t n = fread(out, 1, cap, f);
  fclose(f);
  return n;
}

static void write_whole(const char* path, const void* data, size_t n) {
  FILE* f = fopen(path, "wb");
  if (!f) return;
  fwrite(data, 1, n, f);
  fclose(f);
}

/* COMPAT.md's golden file: numpy int32 zeros (2, 2) named "test". */
static void test_golden_save(void) {
  const uint64_t shape[2] = {2, 2};
  const int32_t zeros[4] = {0, 0, 0, 0};
  safetensors_tensor_t t = {"test", 4, SAFETENSORS_I32, 2, shape, zeros, sizeof zeros};
  CHECK_OK(safetensors_save(path_in("golden.safetensors"), &t, 1, NULL, 0, 0, &err_));

  static const char header[] = "{\"test\":{\"dtype\":\"I32\",\"shape\":[2,2],\"data_offsets\":[0,16]}}    ";
  unsigned char expected[88] = {64, 0, 0, 0, 0, 0, 0, 0};
  memcpy(expected + 8, header, 64);
  unsigned char got[128];
  CHECK(read_whole(path_in("golden.safetensors"), got, sizeof got) == 88);
  CHECK(memcmp(got, expected, 88) == 0);

  void* buf = NULL;
  size_t len = 0;
  CHECK_OK(safetensors_serialize(&t, 1, NULL, 0, &buf, &len, &err_));
  CHECK(len == 88 && buf != NULL && memcmp(buf, expected, 88) == 0);
  safetensors_buffer_free(buf);

  /* An empty dict is "{}" and six spaces. */
  CHECK_OK(safetensors_serialize(NULL, 0, NULL, 0, &buf, &len, &err_));
  CHECK(len == 16 && memcmp(buf, "\x08\0\0\0\0\0\0\0{}      ", 16) == 0);
  safetensors_buffer_free(buf);
}

/* Three tensors with metadata, read back on both backends and from memory. */
static void test_round_trip(void) {
  const float w[6] = {1.5f, -2.0f, 3.25f, 0.0f, 7.0f, -0.5f};
  const uint64_t w_shape[2] = {2, 3};
  const int64_t ids[3] = {7, -8, 9};
  const uint64_t ids_shape[1] = {3};
  const uint8_t flag = 1;
  const char odd_name[] = {'a', '\0', 'b'}; /* names may hold NUL */
  safetensors_tensor_t tensors[3] = {
      {"weight", 6, SAFETENSORS_F32, 2, w_shape, w, sizeof w},
      {"ids", 3, SAFETENSORS_I64, 1, ids_shape, ids, sizeof ids},
      {odd_name, sizeof odd_name, SAFETENSORS_BOOL, 0, NULL, &flag, 1},
  };
  safetensors_metadata_entry_t md[2] = {{"format", 6, "pt", 2}, {"note", 4, "caf\xc3\xa9", 5}};
  CHECK_OK(safetensors_save(path_in("rt.safetensors"), tensors, 3, md, 2, SAFETENSORS_SAVE_FSYNC, &err_));

  safetensors_backend_t backends[2] = {SAFETENSORS_BACKEND_MMAP, SAFETENSORS_BACKEND_PREAD};
  for (int b = 0; b < 3; ++b) {
    safetensors_file_t* f = NULL;
    unsigned char bytes[1024];
    size_t nbytes = 0;
    if (b < 2) {
      CHECK_OK(safetensors_open(path_in("rt.safetensors"), backends[b], &f, &err_));
      if (!f) continue;
      CHECK(safetensors_file_backend(f) == backends[b]);
      CHECK(strcmp(safetensors_file_path(f), path_in("rt.safetensors")) == 0);
    } else {
      nbytes = read_whole(path_in("rt.safetensors"), bytes, sizeof bytes);
      CHECK_OK(safetensors_open_memory(bytes, nbytes, &f, &err_));
      if (!f) continue;
      CHECK(safetensors_file_backend(f) == SAFETENSORS_BACKEND_MEMORY);
      CHECK(strcmp(safetensors_file_path(f), "<memory>") == 0);
    }
    CHECK(safetensors_file_tensor_count(f) == 3);
    /* File order: I64 first (rank), then F32, then BOOL. */
    size_t len = 0;
    CHECK(strcmp(safetensors_file_tensor_name(f, 0, &len), "ids") == 0 && len == 3);
    CHECK(strcmp(safetensors_file_tensor_name(f, 1, NULL), "weight") == 0);
    const char* odd = safetensors_file_tensor_name(f, 2, &len);
    CHECK(len == 3 && memcmp(odd, odd_name, 3) == 0 && odd[3] == '\0');
    CHECK(safetensors_file_tensor_name(f, 3, &len) == NULL && len == 0);

    size_t i = 99;
    CHECK_OK(safetensors_file_find(f, "weight", 6, &i, &err_));
    CHECK(i == 1);
    CHECK_OK(safetensors_file_find(f, odd_name, 3, &i, &err_));
    CHECK(i == 2);
    CHECK_CODE(safetensors_file_find(f, "a", 1, &i, NULL), SAFETENSORS_TENSOR_NOT_FOUND);
    CHECK(i == 2);

    CHECK(safetensors_file_tensor_dtype(f, 1) == SAFETENSORS_F32);
    CHECK(safetensors_file_tensor_rank(f, 1) == 2);
    CHECK(safetensors_file_tensor_shape(f, 1)[0] == 2 && safetensors_file_tensor_shape(f, 1)[1] == 3);
    CHECK(safetensors_file_tensor_rank(f, 2) == 0 && safetensors_file_tensor_shape(f, 2) != NULL);
    CHECK(safetensors_file_tensor_shape(f, 3) == NULL);
    uint64_t begin = 1, end = 1;
    safetensors_file_tensor_offsets(f, 1, &begin, &end);
    CHECK(begin == 24 && end == 48);
    CHECK(safetensors_file_tensor_nbytes(f, 1) == 24);
    CHECK(safetensors_file_data_offset(f) % 8 == 0);

    CHECK(safetensors_file_has_metadata(f) == 1);
    CHECK(safetensors_file_metadata_count(f) == 2);
    CHECK(strcmp(safetensors_file_metadata_key(f, 1, &len), "note") == 0 && len == 4);
    CHECK(strcmp(safetensors_file_metadata_value(f, 1, &len), "caf\xc3\xa9") == 0 && len == 5);
    CHECK(strcmp(safetensors_file_metadata_get(f, "format", 6, &len), "pt") == 0 && len == 2);
    CHECK(safetensors_file_metadata_get(f, "nope", 4, NULL) == NULL);
    CHECK(safetensors_file_metadata_key(f, 2, NULL) == NULL);

    float wback[6] = {0};
    CHECK_OK(safetensors_file_read_into(f, 1, wback, sizeof wback, &err_));
    CHECK(memcmp(wback, w, sizeof w) == 0);
    int64_t idback[3] = {0};
    CHECK_OK(safetensors_file_read_into(f, 0, idback, sizeof idback, &err_));
    CHECK(memcmp(idback, ids, sizeof ids) == 0);
    CHECK_CODE(safetensors_file_read_into(f, 1, wback, sizeof wback - 1, NULL), SAFETENSORS_INVALID_ARGUMENT);
    CHECK_CODE(safetensors_file_read_into(f, 3, wback, sizeof wback, NULL), SAFETENSORS_INVALID_ARGUMENT);

    safetensors_view_t* v = NULL;
    if (b == 1) {
      CHECK_CODE(safetensors_file_view(f, 1, &v, &err_), SAFETENSORS_INVALID_ARGUMENT);
      CHECK(v == NULL);
    } else {
      CHECK_OK(safetensors_file_view(f, 1, &v, &err_));
      if (v) {
        CHECK(safetensors_view_size(v) == sizeof w);
        CHECK(safetensors_view_writable(v) == (b == 0));
        /* The view keeps the mapping (or borrows the caller's memory) after the file handle is gone. */
        safetensors_file_free(f);
        f = NULL;
        {
          /* A view holds the file's little-endian bytes; swapped, a copy holds this host's values. */
          float values[6];
          memcpy(values, safetensors_view_data(v), sizeof values);
          safetensors_swap_to_native(SAFETENSORS_F32, values, sizeof values);
          CHECK(memcmp(values, w, sizeof w) == 0);
          CHECK(safetensors_host_must_swap(SAFETENSORS_F32) ==
                (memcmp(values, safetensors_view_data(v), sizeof values) != 0));
        }
        safetensors_view_free(v);
      }
    }
    safetensors_file_free(f);
  }
}

static void test_slices(void) {
  int32_t m[12];
  for (int k = 0; k < 12; ++k) m[k] = k;
  const uint64_t shape[2] = {4, 3};
  safetensors_tensor_t t = {"m", 1, SAFETENSORS_I32, 2, shape, m, sizeof m};
  CHECK_OK(safetensors_save(path_in("slice.safetensors"), &t, 1, NULL, 0, 0, &err_));
  for (int b = 0; b < 2; ++b) {
    safetensors_file_t* f = NULL;
    CHECK_OK(safetensors_open(path_in("slice.safetensors"), b ? SAFETENSORS_BACKEND_PREAD : SAFETENSORS_BACKEND_MMAP,
                              &f, &err_));
    if (!f) continue;
    /* m[::-2, 1:] -> rows 3, 1; columns 1, 2 */
    safetensors_slice_t idx[2] = {
        {SAFETENSORS_SLICE_RANGE, SAFETENSORS_SLICE_HAS_STEP, 0, 0, 0, -2},
        {SAFETENSORS_SLICE_RANGE, SAFETENSORS_SLICE_HAS_START, 0, 1, 0, 0},
    };
    safetensors_slice_plan_t* plan = NULL;
    CHECK_OK(safetensors_file_plan_slice(f, 0, idx, 2, &plan, &err_));
    if (plan) {
      CHECK(safetensors_slice_plan_rank(plan) == 2);
      CHECK(safetensors_slice_plan_shape(plan)[0] == 2 && safetensors_slice_plan_shape(plan)[1] == 2);
      CHECK(safetensors_slice_plan_nbytes(plan) == 16);
      int32_t out[4] = {0};
      CHECK_OK(safetensors_file_read_slice(f, 0, plan, out, sizeof out, &err_));
      CHECK(out[0] == 10 && out[1] == 11 && out[2] == 4 && out[3] == 5);
      CHECK_CODE(safetensors_file_read_slice(f, 0, plan, out, sizeof out - 4, NULL), SAFETENSORS_INVALID_ARGUMENT);
      CHECK_CODE(safetensors_file_read_slice(f, 1, plan, out, sizeof out, NULL), SAFETENSORS_INVALID_ARGUMENT);
      safetensors_slice_plan_free(plan);
    }
    /* m[-1, ...] -> row 3, a rank-1 result */
    safetensors_slice_t last[2] = {{SAFETENSORS_SLICE_INDEX, 0, -1, 0, 0, 0},
                                   {SAFETENSORS_SLICE_ELLIPSIS, 0, 0, 0, 0, 0}};
    CHECK_OK(safetensors_file_plan_slice(f, 0, last, 2, &plan, &err_));
    if (plan) {
      int32_t row[3] = {0};
      CHECK(safetensors_slice_plan_rank(plan) == 1);
      CHECK_OK(safetensors_file_read_slice(f, 0, plan, row, sizeof row, &err_));
      CHECK(row[0] == 9 && row[1] == 10 && row[2] == 11);
      safetensors_slice_plan_free(plan);
    }
    safetensors_slice_t oob = {SAFETENSORS_SLICE_INDEX, 0, 4, 0, 0, 0};
    CHECK_CODE(safetensors_file_plan_slice(f, 0, &oob, 1, &plan, NULL), SAFETENSORS_INVALID_SLICE);
    CHECK(plan == NULL);
    safetensors_slice_t bad_kind = {7, 0, 0, 0, 0, 0};
    CHECK_CODE(safetensors_file_plan_slice(f, 0, &bad_kind, 1, &plan, NULL), SAFETENSORS_INVALID_ARGUMENT);
    CHECK_OK(safetensors_file_plan_slice(f, 0, NULL, 0, &plan, &err_));
    CHECK(plan && safetensors_slice_plan_nbytes(plan) == sizeof m);
    safetensors_slice_plan_free(plan);
    safetensors_file_free(f);
  }
}

static void test_errors(void) {
  safetensors_error_t* err = NULL;
  static int sentinel;
  safetensors_file_t* f = (safetensors_file_t*)(void*)&sentinel; /* a failed open must reset it to NULL */

  CHECK(safetensors_open(path_in("missing.safetensors"), SAFETENSORS_BACKEND_MMAP, &f, &err) == SAFETENSORS_NOT_FOUND);
  CHECK(f == NULL);
  CHECK(err != NULL);
  if (err) {
    char want[600];
    snprintf(want, sizeof want, "No such file or directory: %s", path_in("missing.safetensors"));
    CHECK(strncmp(safetensors_error_message(err), want, strlen(want)) == 0);
    CHECK(safetensors_error_code(err) == SAFETENSORS_NOT_FOUND);
    size_t len = 0;
    CHECK(strcmp(safetensors_error_context(err, &len), path_in("missing.safetensors")) == 0);
    CHECK(len == strlen(path_in("missing.safetensors")));
    CHECK(strcmp(safetensors_error_tensor(err, &len), "") == 0 && len == 0);
  }
  /* A second failure replaces (and frees) the first error; a success leaves it alone. */
  CHECK(safetensors_open(dir, SAFETENSORS_BACKEND_PREAD, &f, &err) == SAFETENSORS_IO);
  CHECK(err && safetensors_error_code(err) == SAFETENSORS_IO);
  size_t idx = 0;
  CHECK(safetensors_open(path_in("golden.safetensors"), SAFETENSORS_BACKEND_MMAP, &f, &err) == SAFETENSORS_OK);
  CHECK(err && safetensors_error_code(err) == SAFETENSORS_IO);
  CHECK(safetensors_file_find(f, "nope", 4, &idx, &err) == SAFETENSORS_TENSOR_NOT_FOUND);
  if (err) {
    CHECK(strcmp(safetensors_error_tensor(err, NULL), "nope") == 0);
    CHECK(strstr(safetensors_error_message(err), "File does not contain tensor nope") != NULL);
  }
  safetensors_file_free(f);
  safetensors_error_free(err);
  err = NULL;

  /* One hostile file per header code. */
  static const struct {
    const char* bytes;
    size_t len;
    safetensors_code_t code;
  } cases[] = {
      {"\x02\0\0\0", 4, SAFETENSORS_HEADER_TOO_SMALL},
      {"\xff\xff\xff\xff\xff\xff\xff\xff{}", 10, SAFETENSORS_HEADER_TOO_LARGE},
      {"\x10\0\0\0\0\0\0\0{}", 10, SAFETENSORS_INVALID_HEADER_LENGTH},
      {"\x02\0\0\0\0\0\0\0\xff\xfe", 10, SAFETENSORS_INVALID_HEADER_UTF8},
      {"\x02\0\0\0\0\0\0\0[]", 10, SAFETENSORS_INVALID_HEADER_JSON},
      {"\x02\0\0\0\0\0\0\0{}x", 11, SAFETENSORS_METADATA_INCOMPLETE_BUFFER},
  };
  for (size_t k = 0; k < sizeof cases / sizeof cases[0]; ++k) {
    write_whole(path_in("bad.safetensors"), cases[k].bytes, cases[k].len);
    safetensors_code_t code = safetensors_open(path_in("bad.safetensors"), SAFETENSORS_BACKEND_MMAP, &f, &err);
    if (code != cases[k].code) {
      fprintf(stderr, "case %zu: got %s, expected %s\n", k, safetensors_code_name(code),
              safetensors_code_name(cases[k].code));
      ++failures;
    }
    CHECK(f == NULL);
    CHECK(err && strcmp(safetensors_error_context(err, NULL), path_in("bad.safetensors")) == 0);
    /* The same bytes from memory give the same code. */
    CHECK(safetensors_open_memory(cases[k].bytes, cases[k].len, &f, &err) == cases[k].code);
  }
  safetensors_error_free(err);
  err = NULL;

  /* Writer errors. */
  const uint64_t shape[1] = {3};
  const uint8_t data[3] = {1, 2, 3};
  safetensors_tensor_t t = {"t", 1, SAFETENSORS_U8, 1, shape, data, 2};
  CHECK_CODE(safetensors_save(path_in("w.safetensors"), &t, 1, NULL, 0, 0, NULL), SAFETENSORS_TENSOR_INVALID_INFO);
  t.size = 3;
  t.dtype = 22;
  CHECK_CODE(safetensors_save(path_in("w.safetensors"), &t, 1, NULL, 0, 0, NULL), SAFETENSORS_INVALID_ARGUMENT);
  t.dtype = SAFETENSORS_F4;
  t.size = 1; /* 3 F4 values are 12 bits */
  CHECK_CODE(safetensors_save(path_in("w.safetensors"), &t, 1, NULL, 0, 0, NULL), SAFETENSORS_MISALIGNED_SLICE);
  t.dtype = SAFETENSORS_U8;
  t.size = 3;
  safetensors_tensor_t two[2] = {t, t};
  CHECK_CODE(safetensors_save(path_in("w.safetensors"), two, 2, NULL, 0, 0, NULL), SAFETENSORS_INVALID_ARGUMENT);
  CHECK_CODE(safetensors_save(path_in("w.safetensors"), &t, 1, NULL, 0, 8, NULL), SAFETENSORS_INVALID_ARGUMENT);
  CHECK_CODE(safetensors_save(path_in("no/such/dir/w.safetensors"), &t, 1, NULL, 0, 0, NULL), SAFETENSORS_NOT_FOUND);
  CHECK(access(path_in("w.safetensors"), F_OK) != 0);
  CHECK_CODE(safetensors_open(path_in("golden.safetensors"), SAFETENSORS_BACKEND_MEMORY, &f, NULL),
             SAFETENSORS_INVALID_ARGUMENT);
  /* An unknown backend value: c_api_unknown_enum_test.c. */

  /* Empty metadata is written as {} and reads back as present-but-empty. */
  safetensors_metadata_entry_t none[1] = {{"", 0, "", 0}};
  CHECK_OK(safetensors_save(path_in("w.safetensors"), &t, 1, none, 0, 0, &err_));
  CHECK_OK(safetensors_open(path_in("w.safetensors"), SAFETENSORS_BACKEND_MMAP, &f, &err_));
  if (f) {
    CHECK(safetensors_file_has_metadata(f) == 1 && safetensors_file_metadata_count(f) == 0);
    safetensors_file_free(f);
  }
  safetensors_error_free(NULL);
}

/* Open options: a backend and remote options, the same open for paths and URLs. */
static void test_open_options(void) {
  safetensors_open_options_t* options = safetensors_open_options_new();
  CHECK(options != NULL);
  if (!options) return;
  safetensors_file_t* f = NULL;
  CHECK_OK(safetensors_open_with(path_in("golden.safetensors"), NULL, &f, &err_));
  if (f) {
    CHECK(safetensors_file_backend(f) == SAFETENSORS_BACKEND_MMAP);
    CHECK(strcmp(safetensors_file_source_kind(f), "mmap") == 0);
    uint64_t requests = 1, bytes = 1, retries = 1;
    safetensors_file_source_stats(f, &requests, &bytes, &retries);
    CHECK(requests == 0 && bytes == 0 && retries == 0);
    safetensors_file_free(f);
  }
  CHECK_OK(safetensors_open_options_set_backend(options, SAFETENSORS_BACKEND_PREAD, &err_));
  CHECK_OK(safetensors_open_options_set_remote(options, "connections", "4", &err_));
  CHECK_OK(safetensors_open_with(path_in("golden.safetensors"), options, &f, &err_));
  if (f) {
    CHECK(safetensors_file_backend(f) == SAFETENSORS_BACKEND_PREAD);
    CHECK(strcmp(safetensors_file_source_kind(f), "pread") == 0);
    safetensors_file_free(f);
  }

  safetensors_sharded_t* s = NULL;
  CHECK_OK(safetensors_sharded_open_index_with(path_in("model.safetensors.index.json"), options, &s, &err_));
  CHECK(s != NULL && safetensors_sharded_tensor_count(s) > 0);
  safetensors_sharded_free(s);

  safetensors_error_t* err = NULL;
  CHECK(safetensors_open_options_set_backend(options, SAFETENSORS_BACKEND_MEMORY, &err) ==
        SAFETENSORS_INVALID_ARGUMENT);
  CHECK(safetensors_open_options_set_remote(options, "max_retries", "s3cr3t", &err) == SAFETENSORS_INVALID_ARGUMENT);
  CHECK(err && strstr(safetensors_error_message(err), "max_retries") != NULL);
  CHECK(err && strstr(safetensors_error_message(err), "s3cr3t") == NULL);
  CHECK(safetensors_open_options_set_remote(options, "no_such_option", "1", &err) == SAFETENSORS_INVALID_ARGUMENT);

  /* A URL nobody answers: an I/O error naming the URL without its query, after no retry. */
  CHECK_OK(safetensors_open_options_set_remote(options, "max_retries", "0", &err_));
  CHECK(safetensors_open_with("http://127.0.0.1:1/m.safetensors?sig=s3cr3t", options, &f, &err) == SAFETENSORS_IO);
  CHECK(f == NULL);
  CHECK(err && strcmp(safetensors_error_context(err, NULL), "http://127.0.0.1:1/m.safetensors") == 0);
  CHECK(err && strstr(safetensors_error_message(err), "s3cr3t") == NULL);
  safetensors_error_free(err);
  safetensors_open_options_free(options);
  safetensors_open_options_free(NULL);
}

static void test_dtypes_and_names(void) {
  /* The dtype numbers are ABI: the code of each number, in rank order, and nothing past U64. */
  static const char* const kByNumber[] = {
      "BOOL", "F4",  "F6_E2M3", "F6_E3M2", "U8",  "I8",  "F8_E5M2", "F8_E4M3", "F8_E8M0", "F8_E4M3FNUZ", "F8_E5M2FNUZ",
      "I16",  "U16", "F16",     "BF16",    "I32", "U32", "F32",     "C64",     "F64",     "I64",         "U64"};
  for (int i = 0; i < (int)(sizeof kByNumber / sizeof kByNumber[0]); ++i) {
    CHECK(safetensors_dtype_code(i) != NULL && strcmp(safetensors_dtype_code(i), kByNumber[i]) == 0);
  }
  CHECK(SAFETENSORS_U64 == 21 && safetensors_dtype_code(22) == NULL);
  CHECK(strcmp(safetensors_dtype_code(SAFETENSORS_BF16), "BF16") == 0);
  CHECK(strcmp(safetensors_dtype_code(SAFETENSORS_F8_E4M3FNUZ), "F8_E4M3FNUZ") == 0);
  CHECK(safetensors_dtype_bits(SAFETENSORS_F4) == 4 && safetensors_dtype_bits(SAFETENSORS_C64) == 64);
  /* Unknown dtype values: c_api_unknown_enum_test.c. */
  safetensors_dtype_t d = SAFETENSORS_BOOL;
  CHECK_OK(safetensors_dtype_from_code("F6_E3M2", 7, &d, &err_));
  CHECK(d == SAFETENSORS_F6_E3M2);
  CHECK_CODE(safetensors_dtype_from_code("f32", 3, &d, NULL), SAFETENSORS_INVALID_ARGUMENT);
  CHECK_CODE(safetensors_dtype_from_code("F32", 2, &d, NULL), SAFETENSORS_INVALID_ARGUMENT);
  CHECK(strcmp(safetensors_code_name(SAFETENSORS_INVALID_OFFSET), "SAFETENSORS_INVALID_OFFSET") == 0);
  CHECK(strcmp(safetensors_code_name(12345), "SAFETENSORS_UNKNOWN") == 0);
  CHECK(strcmp(safetensors_version(), "0.8.0") == 0);
}

static void test_sharded(void) {
  enum { N = 6 };
  uint16_t data[N][10];
  safetensors_tensor_t tensors[N];
  char names[N][16];
  const uint64_t shape[2] = {2, 5};
  for (int k = 0; k < N; ++k) {
    for (int j = 0; j < 10; ++j) data[k][j] = (uint16_t)(k * 100 + j);
    snprintf(names[k], sizeof names[k], "layer.%d", k);
    safetensors_tensor_t t = {names[k], strlen(names[k]), SAFETENSORS_BF16, 2, shape, data[k], sizeof data[k]};
    tensors[k] = t;
  }
  safetensors_metadata_entry_t md = {"format", 6, "pt", 2};
  size_t shards = 0;
  /* 20 bytes per tensor, at most 45 per shard: two per shard. */
  CHECK_OK(safetensors_save_sharded(dir, NULL, 45, tensors, N, &md, 1, 0, &shards, &err_));
  CHECK(shards == 3);
  CHECK(access(path_in("model-00003-of-00003.safetensors"), F_OK) == 0);
  CHECK_CODE(safetensors_save_sharded(dir, "a/b", 45, tensors, N, NULL, 0, 0, NULL, NULL),
             SAFETENSORS_INVALID_ARGUMENT);

  safetensors_sharded_t* s = NULL;
  CHECK_OK(
      safetensors_sharded_open_index(path_in("model.safetensors.index.json"), SAFETENSORS_BACKEND_MMAP, &s, &err_));
  if (s) {
    CHECK(safetensors_sharded_shard_count(s) == 3);
    CHECK(strcmp(safetensors_sharded_shard_path(s, 1), path_in("model-00002-of-00003.safetensors")) == 0);
    CHECK(safetensors_sharded_shard_path(s, 3) == NULL);
    CHECK(safetensors_sharded_metadata_count(s) == 1);
    CHECK(strcmp(safetensors_sharded_metadata_key(s, 0, NULL), "total_size") == 0);
    CHECK(strcmp(safetensors_sharded_metadata_value(s, 0, NULL), "120") == 0);
    CHECK(safetensors_sharded_tensor_count(s) == N);
    size_t i = 0;
    CHECK_OK(safetensors_sharded_find(s, "layer.4", 7, &i, &err_));
    CHECK(strcmp(safetensors_sharded_tensor_name(s, i, NULL), "layer.4") == 0);
    CHECK(safetensors_sharded_tensor_shard(s, i) == 2);
    CHECK(safetensors_sharded_tensor_shard(s, N) == 3);
    CHECK(safetensors_sharded_tensor_dtype(s, i) == SAFETENSORS_BF16);
    CHECK(safetensors_sharded_tensor_rank(s, i) == 2 && safetensors_sharded_tensor_shape(s, i)[1] == 5);
    CHECK(safetensors_sharded_tensor_nbytes(s, i) == 20);
    uint16_t back[10];
    CHECK_OK(safetensors_sharded_read_into(s, i, back, sizeof back, &err_));
    CHECK(memcmp(back, data[4], sizeof back) == 0);
    CHECK_CODE(safetensors_sharded_find(s, "layer.9", 7, &i, NULL), SAFETENSORS_TENSOR_NOT_FOUND);

    uint16_t all[N][10];
    safetensors_read_request_t reqs[N];
    for (size_t k = 0; k < N; ++k) {
      size_t pos = 0;
      CHECK_OK(safetensors_sharded_find(s, names[k], strlen(names[k]), &pos, &err_));
      reqs[k].tensor = pos;
      reqs[k].dst = all[k];
      reqs[k].dst_len = sizeof all[k];
    }
    CHECK_OK(safetensors_sharded_read_many(s, reqs, N, 3, &err_));
    CHECK(memcmp(all, data, sizeof all) == 0);
    reqs[2].dst_len = 3;
    CHECK_CODE(safetensors_sharded_read_many(s, reqs, N, 0, NULL), SAFETENSORS_INVALID_ARGUMENT);
    reqs[2].dst_len = 20;
    reqs[2].tensor = N;
    CHECK_CODE(safetensors_sharded_read_many(s, reqs, N, 0, NULL), SAFETENSORS_INVALID_ARGUMENT);

    safetensors_view_t* v = NULL;
    CHECK_OK(safetensors_sharded_view(s, 0, &v, &err_));
    safetensors_sharded_free(s);
    if (v) {
      uint16_t values[10];
      CHECK(safetensors_view_size(v) == 20);
      memcpy(values, safetensors_view_data(v), sizeof values);
      safetensors_swap_to_native(SAFETENSORS_BF16, values, sizeof values);
      CHECK(memcmp(values, data[0], 20) == 0);
      safetensors_view_free(v);
    }
  }

  /* By file list; the index's shard-3 file repeats nothing, so listing a shard twice is an error. */
  const char* paths[3];
  char p1[512], p2[512];
  snprintf(p1, sizeof p1, "%s", path_in("model-00001-of-00003.safetensors"));
  snprintf(p2, sizeof p2, "%s", path_in("model-00003-of-00003.safetensors"));
  paths[0] = p1;
  paths[1] = p2;
  paths[2] = p1;
  CHECK_OK(safetensors_sharded_open_files(paths, 2, SAFETENSORS_BACKEND_PREAD, &s, &err_));
  if (s) {
    CHECK(safetensors_sharded_tensor_count(s) == 4);
    CHECK(safetensors_sharded_metadata_count(s) == 0);
    safetensors_sharded_free(s);
  }
  safetensors_error_t* err = NULL;
  CHECK(safetensors_sharded_open_files(paths, 3, SAFETENSORS_BACKEND_MMAP, &s, &err) == SAFETENSORS_INVALID_ARGUMENT);
  CHECK(s == NULL);
  CHECK(err && strstr(safetensors_error_message(err), "is also in") != NULL);
  safetensors_error_free(err);

  const char* broken = "{\"weight_map\": {\"x\": 1}}";
  write_whole(path_in("broken.index.json"), broken, strlen(broken));
  CHECK_CODE(safetensors_sharded_open_index(path_in("broken.index.json"), SAFETENSORS_BACKEND_MMAP, &s, NULL),
             SAFETENSORS_INVALID_ARGUMENT);
  const char* gone = "{\"weight_map\": {\"x\": \"gone.safetensors\"}}";
  write_whole(path_in("gone.index.json"), gone, strlen(gone));
  CHECK_CODE(safetensors_sharded_open_index(path_in("gone.index.json"), SAFETENSORS_BACKEND_MMAP, &s, NULL),
             SAFETENSORS_NOT_FOUND);
  CHECK_CODE(safetensors_sharded_open_index(path_in("none.json"), SAFETENSORS_BACKEND_MMAP, &s, NULL),
             SAFETENSORS_NOT_FOUND);
}

/* Prefetch: a plan of a whole tensor (staged), rows of another (direct) and an empty row range, read through
   the global slab pool with a counting allocator; a truncated file's error comes back from next(). */
static size_t slab_allocs = 0, slab_frees = 0;
static void* counting_alloc(size_t size, void* user) {
  (void)user;
  ++slab_allocs;
  return malloc(size);
}
static void counting_free(void* p, size_t size, void* user) {
  (void)size;
  (void)user;
  ++slab_frees;
  free(p);
}

static void test_prefetch(void) {
  enum { kRows = 64, kCols = 300 };
  static uint8_t a[kRows * kCols], b[kRows * kCols];
  for (size_t i = 0; i < sizeof a; ++i) {
    a[i] = (uint8_t)(i * 7 + 1);
    b[i] = (uint8_t)(i * 13 + 5);
  }
  const uint64_t shape[2] = {kRows, kCols};
  safetensors_tensor_t tensors[2] = {
      {"a", 1, SAFETENSORS_U8, 2, shape, a, sizeof a},
      {"b", 1, SAFETENSORS_U8, 2, shape, b, sizeof b},
  };
  CHECK_OK(safetensors_save(path_in("pf.safetensors"), tensors, 2, NULL, 0, 0, &err_));
  CHECK_OK(safetensors_slab_pool_set_allocator(counting_alloc, counting_free, NULL, &err_));
  CHECK_OK(safetensors_slab_pool_set_slab_bytes(4096, &err_));
  CHECK_OK(safetensors_slab_pool_set_capacity(3 * 4096, &err_));
  CHECK_CODE(safetensors_slab_pool_set_capacity(100, &err_), SAFETENSORS_INVALID_ARGUMENT);
  CHECK_CODE(safetensors_slab_pool_set_allocator(counting_alloc, NULL, NULL, &err_), SAFETENSORS_INVALID_ARGUMENT);

  for (int backend = 0; backend < 2; ++backend) {
    safetensors_file_t* f = NULL;
    CHECK_OK(safetensors_open(path_in("pf.safetensors"), backend, &f, &err_));
    if (f == NULL) return;
    size_t ia = 0, ib = 0;
    CHECK_OK(safetensors_file_find(f, "a", 1, &ia, &err_));
    CHECK_OK(safetensors_file_find(f, "b", 1, &ib, &err_));
    safetensors_piece_t plan[3];
    CHECK_OK(safetensors_tensor_piece(f, ia, &plan[0], &err_));
    CHECK_OK(safetensors_row_piece(f, ib, 10, 40, &plan[1], &err_));
    CHECK_OK(safetensors_row_piece(f, ib, 5, 5, &plan[2], &err_));
    CHECK_CODE(safetensors_row_piece(f, ib, 5, 65, &plan[2], &err_), SAFETENSORS_INVALID_SLICE);
    static uint8_t rows[30 * kCols];
    memset(rows, 0, sizeof rows);
    plan[1].delivery = SAFETENSORS_DELIVERY_DIRECT;
    plan[1].dst = rows;
    plan[1].dst_len = sizeof rows;
    static uint8_t staged[sizeof a];
    memset(staged, 0, sizeof staged);

    safetensors_prefetch_options_t options = {2, 0, 0, 0};
    safetensors_prefetcher_t* p = NULL;
    CHECK_OK(safetensors_prefetch_start(f, plan, 3, &options, &p, &err_));
    safetensors_file_free(f); /* the prefetcher keeps the file open */
    if (p == NULL) return;
    int done[3] = {0, 0, 0};
    for (;;) {
      safetensors_prefetch_event_t ev;
      safetensors_error_t* err = NULL;
      safetensors_code_t code = safetensors_prefetch_next(p, -1, &ev, &err);
      if (code != SAFETENSORS_OK) fprintf(stderr, "next: %s\n", safetensors_error_message(err));
      safetensors_error_free(err);
      CHECK(code == SAFETENSORS_OK);
      if (code != SAFETENSORS_OK || ev.kind == SAFETENSORS_EVENT_END) break;
      CHECK(ev.piece < 3);
      if (ev.kind == SAFETENSORS_EVENT_STAGED) {
        CHECK(ev.offset + ev.size <= plan[ev.piece].end - plan[ev.piece].begin);
        CHECK(ev.size == 0 || ((const char*)ev.data >= (const char*)ev.slab_data &&
                               (const char*)ev.data + ev.size <= (const char*)ev.slab_data + 4096));
        if (ev.piece == 0 && ev.size) memcpy(staged + ev.offset, ev.data, ev.size);
        CHECK_OK(safetensors_prefetch_release(p, ev.slab, &err_));
      }
      if (ev.piece_done) ++done[ev.piece];
    }
    CHECK(done[0] == 1 && done[1] == 1 && done[2] == 1);
    CHECK(memcmp(staged, a, sizeof a) == 0);
    CHECK(memcmp(rows, b + 10 * kCols, sizeof rows) == 0);
    CHECK_OK(safetensors_prefetch_wait_piece(p, 1, &err_));
    CHECK_CODE(safetensors_prefetch_wait_piece(p, 0, &err_), SAFETENSORS_INVALID_ARGUMENT);
    CHECK_CODE(safetensors_prefetch_release(p, 99, &err_), SAFETENSORS_INVALID_ARGUMENT);
    safetensors_prefetch_stats_t st;
    safetensors_prefetch_stats(p, &st);
    CHECK(st.bytes_read == sizeof a + sizeof rows);
    CHECK(st.bytes_staged == sizeof a && st.bytes_direct == sizeof rows);
    CHECK(st.events_lent == 0);
    safetensors_slab_pool_stats_t ps;
    safetensors_slab_pool_stats(&ps);
    CHECK(ps.peak_bytes <= ps.capacity && ps.capacity == 3 * 4096);
    safetensors_prefetch_free(p);
    safetensors_slab_pool_stats(&ps);
    CHECK(ps.allocated_bytes == 0 && ps.slabs_in_use == 0);
  }
  CHECK(slab_allocs > 0 && slab_allocs == slab_frees);

  /* A file cut short after it was opened: next() reports SAFETENSORS_IO naming the file and a tensor. */
  {
    safetensors_file_t* f = NULL;
    CHECK_OK(safetensors_open(path_in("pf.safetensors"), SAFETENSORS_BACKEND_MMAP, &f, &err_));
    if (f == NULL) return;
    CHECK(truncate(path_in("pf.safetensors"), (off_t)(safetensors_file_data_offset(f) + 100)) == 0);
    safetensors_piece_t plan[2];
    CHECK_OK(safetensors_tensor_piece(f, 0, &plan[0], &err_));
    CHECK_OK(safetensors_tensor_piece(f, 1, &plan[1], &err_));
    safetensors_prefetcher_t* p = NULL;
    CHECK_OK(safetensors_prefetch_start(f, plan, 2, NULL, &p, &err_));
    safetensors_file_free(f);
    if (p == NULL) return;
    safetensors_error_t* err = NULL;
    safetensors_code_t code = SAFETENSORS_OK;
    for (int k = 0; k < 100 && code == SAFETENSORS_OK; ++k) {
      safetensors_prefetch_event_t ev;
      code = safetensors_prefetch_next(p, 5000, &ev, &err);
      if (code == SAFETENSORS_OK && ev.kind == SAFETENSORS_EVENT_STAGED) {
        CHECK_OK(safetensors_prefetch_release(p, ev.slab, &err_));
      }
      if (code == SAFETENSORS_OK) CHECK(ev.kind == SAFETENSORS_EVENT_STAGED);
    }
    CHECK(code == SAFETENSORS_IO);
    if (err != NULL) {
      size_t len = 0;
      CHECK(strstr(safetensors_error_context(err, &len), "pf.safetensors") != NULL);
      CHECK(safetensors_error_tensor(err, &len)[0] != '\0' && len == 1);
    }
    safetensors_error_free(err);
    safetensors_prefetch_cancel(p);
    safetensors_prefetch_free(p);
  }
  CHECK_OK(safetensors_slab_pool_set_allocator(NULL, NULL, NULL, &err_));
}

static void remove_dir(void) {
  char cmd[600];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
}

int main(void) {
  const char* tmp = getenv("TMPDIR");
  snprintf(dir, sizeof dir, "%s/st_c_api_XXXXXX", tmp && *tmp ? tmp : "/tmp");
  if (mkdtemp(dir) == NULL) {
    perror("mkdtemp");
    return 1;
  }
  test_golden_save();
  test_round_trip();
  test_slices();
  test_errors();
  test_dtypes_and_names();
  test_sharded();
  test_open_options();
  test_prefetch();
  remove_dir();
  if (failures) {
    fprintf(stderr, "%d check(s) failed\n", failures);
    return 1;
  }
  printf("c_api_test: all checks passed\n");
  return 0;
}
