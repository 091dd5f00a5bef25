/* Bug (79c386b, found by UBSan): enum-typed parameters of the C API let a C caller pass a value outside the
   enum (a backend or dtype from a newer header, or garbage), which is undefined behaviour once it reaches a
   C++ enum. The parameters are int now, and an unknown value is refused (or answered with NULL / 0). */
#define _POSIX_C_SOURCE 200809L

#include <safetensors/c.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "c_check.h"

static int failures = 0;

int main(void) {
  char dir[256];
  char path[512];
  const char* tmp = getenv("TMPDIR");
  snprintf(dir, sizeof dir, "%s/st_c_enum_XXXXXX", tmp && *tmp ? tmp : "/tmp");
  if (mkdtemp(dir) == NULL) {
    perror("mkdtemp");
    return 1;
  }
  snprintf(path, sizeof path, "%s/a.safetensors", dir);
  const uint8_t byte = 7;
  const uint64_t one = 1;
  safetensors_tensor_t t = {"a", 1, SAFETENSORS_U8, 1, &one, &byte, 1};
  CHECK_OK(safetensors_save(path, &t, 1, NULL, 0, 0, &err_));

  /* Backends: an existing, valid file is refused for the value alone, by every open. */
  safetensors_file_t* f = NULL;
  CHECK_CODE(safetensors_open(path, 9, &f, NULL), SAFETENSORS_INVALID_ARGUMENT);
  CHECK_CODE(safetensors_open(path, -1, &f, NULL), SAFETENSORS_INVALID_ARGUMENT);
  CHECK(f == NULL);
  safetensors_sharded_t* s = NULL;
  const char* paths[1] = {path};
  CHECK_CODE(safetensors_sharded_open_files(paths, 1, 9, &s, NULL), SAFETENSORS_INVALID_ARGUMENT);
  CHECK(s == NULL);
  CHECK_OK(safetensors_sharded_open_files(paths, 1, SAFETENSORS_BACKEND_PREAD, &s, &err_));
  safetensors_sharded_free(s);

  /* Dtypes: no code and no bits for a value outside the table, and a save of one is refused. */
  CHECK(safetensors_dtype_code(22) == NULL);
  CHECK(safetensors_dtype_code(-1) == NULL);
  CHECK(safetensors_dtype_bits(-1) == 0);
  CHECK(safetensors_dtype_bits(22) == 0);
  t.dtype = 22;
  CHECK_CODE(safetensors_save(path, &t, 1, NULL, 0, 0, NULL), SAFETENSORS_INVALID_ARGUMENT);

  unlink(path);
  rmdir(dir);
  if (failures) {
    fprintf(stderr, "%d check(s) failed\n", failures);
    return 1;
  }
  printf("c_api_unknown_enum_test: all checks passed\n");
  return 0;
}
