/* The C API in one program: save two tensors with metadata, open the file, list its tensors, read one back,
   and report an error the way a C caller should.

     tensors_c [FILE]     (default: tensors_c_example.safetensors in the current directory) */
#include <safetensors/c.h>

#include <stdint.h>
#include <stdio.h>
#include <string.h>

static int report(const char* what, safetensors_error_t* error) {
  fprintf(stderr, "%s failed: %s\n", what, error ? safetensors_error_message(error) : "(no details)");
  safetensors_error_free(error);
  return 1;
}

int main(int argc, char** argv) {
  const char* path = argc > 1 ? argv[1] : "tensors_c_example.safetensors";
  safetensors_error_t* error = NULL;

  const float weight[2][3] = {{1.0f, 2.0f, 3.0f}, {4.0f, 5.0f, 6.0f}};
  const uint64_t weight_shape[2] = {2, 3};
  const int64_t step = 1000;
  const safetensors_tensor_t tensors[2] = {
      {"weight", strlen("weight"), SAFETENSORS_F32, 2, weight_shape, weight, sizeof weight},
      {"step", strlen("step"), SAFETENSORS_I64, 0, NULL, &step, sizeof step},
  };
  const safetensors_metadata_entry_t metadata[1] = {{"format", 6, "pt", 2}};
  if (safetensors_save(path, tensors, 2, metadata, 1, 0, &error) != SAFETENSORS_OK) return report("save", error);

  safetensors_file_t* file = NULL;
  if (safetensors_open(path, SAFETENSORS_BACKEND_MMAP, &file, &error) != SAFETENSORS_OK) {
    return report("open", error);
  }
  printf("%s: %zu tensors, format=%s\n", safetensors_file_path(file), safetensors_file_tensor_count(file),
         safetensors_file_metadata_get(file, "format", 6, NULL));
  for (size_t i = 0; i < safetensors_file_tensor_count(file); ++i) {
    const uint64_t* shape = safetensors_file_tensor_shape(file, i);
    printf("  %-8s %-4s [", safetensors_file_tensor_name(file, i, NULL),
           safetensors_dtype_code(safetensors_file_tensor_dtype(file, i)));
    for (size_t d = 0; d < safetensors_file_tensor_rank(file, i); ++d) {
      printf("%s%llu", d ? ", " : "", (unsigned long long)shape[d]);
    }
    printf("] %llu bytes\n", (unsigned long long)safetensors_file_tensor_nbytes(file, i));
  }

  size_t index = 0;
  float back[2][3];
  if (safetensors_file_find(file, "weight", 6, &index, &error) != SAFETENSORS_OK ||
      safetensors_file_read_into(file, index, back, sizeof back, &error) != SAFETENSORS_OK) {
    safetensors_file_free(file);
    return report("read", error);
  }
  printf("weight[1][2] = %g\n", back[1][2]);

  /* A missing tensor is an ordinary error: a code, and a message naming the file and the tensor. */
  if (safetensors_file_find(file, "bias", 4, &index, &error) == SAFETENSORS_TENSOR_NOT_FOUND) {
    printf("as expected: %s\n", safetensors_error_message(error));
  }
  safetensors_error_free(error);
  safetensors_file_free(file);
  return memcmp(back, weight, sizeof weight) == 0 ? 0 : 1;
}
