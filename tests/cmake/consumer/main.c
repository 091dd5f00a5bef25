/* A C program against the installed library and safetensors/c.h: serialize, open from memory, read back. */
#include <safetensors/c.h>

#include <stdint.h>
#include <stdio.h>
#include <string.h>

int main(void) {
  const int32_t values[4] = {1, -2, 3, -4};
  const uint64_t shape[2] = {2, 2};
  const safetensors_tensor_t t = {"w", 1, SAFETENSORS_I32, 2, shape, values, sizeof values};
  const safetensors_metadata_entry_t md = {"by", 2, "c_consumer", 10};
  safetensors_error_t* error = NULL;
  void* bytes = NULL;
  size_t len = 0;
  if (safetensors_serialize(&t, 1, &md, 1, &bytes, &len, &error) != SAFETENSORS_OK) {
    fprintf(stderr, "serialize: %s\n", safetensors_error_message(error));
    safetensors_error_free(error);
    return 1;
  }
  safetensors_file_t* file = NULL;
  int32_t back[4] = {0};
  size_t index = 0;
  int ok = safetensors_open_memory(bytes, len, &file, &error) == SAFETENSORS_OK &&
           safetensors_file_find(file, "w", 1, &index, &error) == SAFETENSORS_OK &&
           safetensors_file_read_into(file, index, back, sizeof back, &error) == SAFETENSORS_OK &&
           memcmp(back, values, sizeof values) == 0;
  if (!ok)
    fprintf(stderr, "round trip failed: %s\n", error ? safetensors_error_message(error) : "values differ");
  else
    printf("c consumer ok: safetensors %s, metadata by=%s\n", safetensors_version(),
           safetensors_file_metadata_get(file, "by", 2, NULL));
  safetensors_error_free(error);
  safetensors_file_free(file);
  safetensors_buffer_free(bytes);
  return ok ? 0 : 1;
}
