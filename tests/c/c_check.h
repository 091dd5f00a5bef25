/* CHECK macros for the C API tests: a failed check is reported with its line and counted in `failures`, an
   int each test program defines (`static int failures = 0;`). */
#ifndef SAFETENSORS_TESTS_C_CHECK_H_
#define SAFETENSORS_TESTS_C_CHECK_H_

#include <safetensors/c.h>

#include <stdio.h>

#define CHECK(cond)                                                            \
  do {                                                                         \
    if (!(cond)) {                                                             \
      fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
      ++failures;                                                              \
    }                                                                          \
  } while (0)

/* Asserts that `expr` returned `want`, printing the error's message otherwise. `expr` may pass `&err_`
   (declared here) as its error out-parameter; the error object is freed afterwards. */
#define CHECK_CODE(expr, want)                                                               \
  do {                                                                                       \
    safetensors_error_t* err_ = NULL;                                                        \
    safetensors_code_t got_ = (expr);                                                        \
    if (got_ != (want)) {                                                                    \
      fprintf(stderr, "%s:%d: %s returned %s, expected %s: %s\n", __FILE__, __LINE__, #expr, \
              safetensors_code_name(got_), safetensors_code_name(want),                      \
              err_ ? safetensors_error_message(err_) : "(no error object)");                 \
      ++failures;                                                                            \
    }                                                                                        \
    safetensors_error_free(err_);                                                            \
  } while (0)

#define CHECK_OK(expr) CHECK_CODE(expr, SAFETENSORS_OK)

#endif /* SAFETENSORS_TESTS_C_CHECK_H_ */
