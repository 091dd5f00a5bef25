/* The C API of the safetensors library: a C-callable layer over the C++ API (file.h, writer.h, sharded.h,
   engine.h). This header is longer than the project's 500 lines per file because its length is the API: one
   declaration per C function with its contract, in one header (src/c_api*.cc implement it).

   Conventions, which hold for every function below unless its comment says otherwise:

   (1) Handles are opaque. Each object is a pointer to an incomplete struct (safetensors_file_t, ...) made
       by one function of this header and released by its matching *_free() function; passing NULL to a
       *_free() function does nothing. Their layout is private, so the library can change without
       recompiling callers. The plain structs safetensors_slice_t and safetensors_tensor_t (and the enums)
       are the exceptions: callers fill them in, so their layout is part of the ABI.

   (2) Bytes and strings travel as a pointer and a length (`const char* name, size_t name_len`), never as a
       NUL-terminated string alone: tensor names and metadata may contain any byte, NUL included. Strings the
       library returns are additionally NUL-terminated for convenience; their length comes back through a
       `size_t* len` out-parameter, which may be NULL when the caller does not need it. Paths are the one
       exception: they are NUL-terminated `const char*`, as the operating system takes them.

   (3) Errors are returned, never thrown or printed. A function that can fail returns a
       safetensors_code_t: SAFETENSORS_OK (0) on success, otherwise the kind of failure (one code per
       safetensors::Error::Kind, plus SAFETENSORS_OUT_OF_MEMORY and SAFETENSORS_INTERNAL). Its last parameter
       is `safetensors_error_t** error`, which may be NULL when the code is all the caller wants. On failure,
       when error is not NULL, *error receives a new error object describing it (message, file, tensor),
       which the caller owns and frees with safetensors_error_free(); an error object already in *error is
       freed first, so *error must be NULL or an error from this library on entry. On success *error is
       left unchanged. Outputs of a failed call are set to NULL (handles) or left unchanged (other values).

   (4) Ownership and lifetimes. The caller owns every handle it receives and frees it once. Pointers
       returned by accessors (names, shapes, metadata strings, view data) borrow from the handle they came
       from and stay valid until that handle is freed. A safetensors_view_t keeps its mapping alive by
       itself: it stays valid after the file handle that made it is freed. Buffers the caller passes in
       (tensor data to save, an in-memory file) are borrowed only for the duration of the call, except as
       noted for safetensors_open_memory().

   (5) Non-null rules. Pointer parameters must not be NULL, except: `error` and `len` out-parameters; a data
       pointer whose length is 0; and parameters whose comment says "may be NULL".

   (6) Enums. Parameters that take an enum value (a dtype, a backend) are declared `int`, and struct fields
       that hold one are int32_t, so that a value this library does not know is refused with
       SAFETENSORS_INVALID_ARGUMENT (or a NULL/0 result) instead of being undefined behaviour in C++.

   (7) Thread safety. File, sharded-file, view and slice-plan handles are immutable after creation and
       safe for concurrent use by multiple threads; freeing a handle requires that no other thread is using
       it. A prefetcher handle is used by one consumer thread, except safetensors_prefetch_cancel(), which
       any thread may call at any time; the slab-pool functions are safe from any thread. Error objects are
       plain values. Tensors are addressed by position (0 <= i < count, in file order);
       a position out of range makes accessors return NULL/0 and fallible functions return
       SAFETENSORS_INVALID_ARGUMENT.

   (8) Byte order. The format is little-endian. Reads into caller memory (read_into, read_slice, read_many,
       the prefetcher's events) deliver native values: on a big-endian host multi-byte dtypes are swapped
       after reading. Data given to the save functions is native values too, swapped on the way out without
       modifying the caller's buffer. A view's bytes are the file's own: where
       safetensors_host_must_swap(dtype) is 1, copy them and apply safetensors_swap_to_native to the copy.
*/
#ifndef SAFETENSORS_C_H_
#define SAFETENSORS_C_H_

#include <stddef.h>
#include <stdint.h>

#include "safetensors/export.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------------------------------------------- */
/* Codes and errors */

/* The numeric values are stable. SAFETENSORS_HEADER_TOO_SMALL .. SAFETENSORS_INVALID_ARGUMENT follow
   safetensors::Error::Kind one for one (see error.h for when each happens). */
typedef enum safetensors_code_t {
  SAFETENSORS_OK = 0,
  SAFETENSORS_HEADER_TOO_SMALL = 1,
  SAFETENSORS_HEADER_TOO_LARGE = 2,
  SAFETENSORS_INVALID_HEADER_LENGTH = 3,
  SAFETENSORS_INVALID_HEADER_UTF8 = 4,
  SAFETENSORS_INVALID_HEADER_JSON = 5,
  SAFETENSORS_INVALID_OFFSET = 6,
  SAFETENSORS_VALIDATION_OVERFLOW = 7,
  SAFETENSORS_MISALIGNED_SLICE = 8,
  SAFETENSORS_TENSOR_INVALID_INFO = 9,
  SAFETENSORS_METADATA_INCOMPLETE_BUFFER = 10,
  SAFETENSORS_TENSOR_NOT_FOUND = 11,
  SAFETENSORS_INVALID_SLICE = 12,
  SAFETENSORS_NOT_FOUND = 13,
  SAFETENSORS_IO = 14,
  SAFETENSORS_INVALID_ARGUMENT = 15,
  /* Memory could not be allocated (a std::bad_alloc inside the library). */
  SAFETENSORS_OUT_OF_MEMORY = 100,
  /* Any other unexpected C++ exception; the message carries its text. */
  SAFETENSORS_INTERNAL = 101
} safetensors_code_t;

typedef struct safetensors_error_t safetensors_error_t;

/* The code of the failure. */
SAFETENSORS_EXPORT safetensors_code_t safetensors_error_code(const safetensors_error_t* error);
/* The full human-readable text, e.g. "invalid offset for tensor `w` (InvalidOffset) in \"model.safetensors\"".
   The library's variant token (here InvalidOffset) is part of it. */
SAFETENSORS_EXPORT const char* safetensors_error_message(const safetensors_error_t* error);
/* The file (or index, or "<memory>") the error concerns; "" when none. */
SAFETENSORS_EXPORT const char* safetensors_error_context(const safetensors_error_t* error, size_t* len);
/* The tensor the error concerns; "" when none. */
SAFETENSORS_EXPORT const char* safetensors_error_tensor(const safetensors_error_t* error, size_t* len);
SAFETENSORS_EXPORT void safetensors_error_free(safetensors_error_t* error);

/* A static name for a code, e.g. "SAFETENSORS_NOT_FOUND"; "SAFETENSORS_UNKNOWN" for other values. */
SAFETENSORS_EXPORT const char* safetensors_code_name(int code);
/* The library version, e.g. "0.8.0". */
SAFETENSORS_EXPORT const char* safetensors_version(void);

/* ---------------------------------------------------------------------------------------------------- */
/* Dtypes */

/* In rank order (the writer's sort order), numbered from 0 one after another: BOOL is 0, BF16 is 14, U64 is 21.
   The numeric values are stable (tests/c/c_api_test.c checks each against its code). */
typedef enum safetensors_dtype_t {
  SAFETENSORS_BOOL = 0,
  SAFETENSORS_F4,
  SAFETENSORS_F6_E2M3,
  SAFETENSORS_F6_E3M2,
  SAFETENSORS_U8,
  SAFETENSORS_I8,
  SAFETENSORS_F8_E5M2,
  SAFETENSORS_F8_E4M3,
  SAFETENSORS_F8_E8M0,
  SAFETENSORS_F8_E4M3FNUZ,
  SAFETENSORS_F8_E5M2FNUZ,
  SAFETENSORS_I16,
  SAFETENSORS_U16,
  SAFETENSORS_F16,
  SAFETENSORS_BF16,
  SAFETENSORS_I32,
  SAFETENSORS_U32,
  SAFETENSORS_F32,
  SAFETENSORS_C64,
  SAFETENSORS_F64,
  SAFETENSORS_I64,
  SAFETENSORS_U64
} safetensors_dtype_t;

/* The header code ("F32"), or NULL for a value outside the enum. */
SAFETENSORS_EXPORT const char* safetensors_dtype_code(int dtype);
/* Bits per element (4 for F4, 6 for F6_*), or 0 for a value outside the enum. */
SAFETENSORS_EXPORT uint32_t safetensors_dtype_bits(int dtype);
/* Width in bytes of the units a big-endian host swaps for the dtype (2, 4 or 8; 4 for C64's halves), 0 for
   8-bit and sub-byte dtypes and for a value outside the enum. */
SAFETENSORS_EXPORT uint32_t safetensors_dtype_swap_bytes(int dtype);
/* 1 when this host's values of the dtype differ from the file's bytes (a multi-byte dtype on a big-endian
   host), else 0 (also for a value outside the enum). See convention (8). */
SAFETENSORS_EXPORT int safetensors_host_must_swap(int dtype);
/* Turns [data, data + len), whole elements of the dtype in the file's byte order, into native values in place
   (and native values into the file's order: the swap is its own inverse). Does nothing where
   safetensors_host_must_swap(dtype) is 0. REQUIRES: len is a multiple of safetensors_dtype_swap_bytes. */
SAFETENSORS_EXPORT void safetensors_swap_to_native(int dtype, void* data, size_t len);
/* The dtype whose header code is exactly [code, code + len). Errors: SAFETENSORS_INVALID_ARGUMENT. */
SAFETENSORS_EXPORT safetensors_code_t safetensors_dtype_from_code(const char* code, size_t len,
                                                                  safetensors_dtype_t* dtype,
                                                                  safetensors_error_t** error);

/* ---------------------------------------------------------------------------------------------------- */
/* Reading one file */

typedef enum safetensors_backend_t {
  /* Map the file (private, copy-on-write); views are zero-copy. Falls back to PREAD when mapping fails. */
  SAFETENSORS_BACKEND_MMAP = 0,
  /* Positional reads; no views. */
  SAFETENSORS_BACKEND_PREAD = 1,
  /* A caller's buffer (safetensors_open_memory). */
  SAFETENSORS_BACKEND_MEMORY = 2,
  /* Positional reads with O_DIRECT, past the page cache; through the cache where the filesystem refuses
     O_DIRECT (safetensors_file_direct_stats says so). */
  SAFETENSORS_BACKEND_DIRECT = 3,
  /* DIRECT or PREAD, chosen per file when it is opened from how much of it the page cache holds (a file of at
     least 64 MiB with less than a third of it cached is read directly). safetensors_file_backend reports the
     choice, never AUTO. */
  SAFETENSORS_BACKEND_AUTO = 4
} safetensors_backend_t;

typedef struct safetensors_file_t safetensors_file_t;

/* Opens and fully validates the file at `path` (backend MMAP, PREAD, DIRECT or AUTO). On success *file is a new handle.
   Errors: SAFETENSORS_NOT_FOUND, SAFETENSORS_IO, every header code (HEADER_TOO_SMALL ..
   METADATA_INCOMPLETE_BUFFER), SAFETENSORS_INVALID_ARGUMENT (backend MEMORY or out of range). */
SAFETENSORS_EXPORT safetensors_code_t safetensors_open(const char* path, int backend, safetensors_file_t** file,
                                                       safetensors_error_t** error);
/* Options for an open (safetensors_open_with, safetensors_sharded_open_index_with): a backend and, for
   http://, https:// and s3:// locations, remote options (credentials, endpoint, headers, concurrency; the keys
   of safetensors::RemoteOptions::set in remote.h, e.g. "endpoint_url", "aws_access_key_id", "anonymous",
   "header" (one "Name: value" per call), "connections"). Without options a URL is opened with the
   environment's settings (AWS_ACCESS_KEY_ID, AWS_ENDPOINT_URL_S3, HF_TOKEN, ...). Returns NULL when out of
   memory. The backend starts as MMAP. */
typedef struct safetensors_open_options_t safetensors_open_options_t;
SAFETENSORS_EXPORT safetensors_open_options_t* safetensors_open_options_new(void);
SAFETENSORS_EXPORT void safetensors_open_options_free(safetensors_open_options_t* options);
/* Errors: SAFETENSORS_INVALID_ARGUMENT (MEMORY or out of range). */
SAFETENSORS_EXPORT safetensors_code_t safetensors_open_options_set_backend(safetensors_open_options_t* options,
                                                                           int backend, safetensors_error_t** error);
/* Sets remote option `key` to `value` (both NUL-terminated text). Errors: SAFETENSORS_INVALID_ARGUMENT naming
   the key (never the value: it may be a secret) for an unknown key or a malformed value. */
SAFETENSORS_EXPORT safetensors_code_t safetensors_open_options_set_remote(safetensors_open_options_t* options,
                                                                          const char* key, const char* value,
                                                                          safetensors_error_t** error);
/* Opens and fully validates the file at `location`: a path, or an http://, https:// or s3:// URL read with
   range requests. `options` may be NULL (the defaults). Errors: those of safetensors_open, with
   SAFETENSORS_IO for network failures and SAFETENSORS_NOT_FOUND for a missing object. Errors name a URL
   without its query string (where presigned URLs keep their signature). */
SAFETENSORS_EXPORT safetensors_code_t safetensors_open_with(const char* location,
                                                            const safetensors_open_options_t* options,
                                                            safetensors_file_t** file, safetensors_error_t** error);
/* What the file's bytes come from: "mmap", "pread", "direct", "memory", "http" or "s3". */
SAFETENSORS_EXPORT const char* safetensors_file_source_kind(const safetensors_file_t* file);
/* What a remote source did so far: requests sent (retries included), body bytes received, retries. Zeros for
   a local file. Any pointer may be NULL. */
SAFETENSORS_EXPORT void safetensors_file_source_stats(const safetensors_file_t* file, uint64_t* requests,
                                                      uint64_t* bytes_fetched, uint64_t* retries);
/* What a file opened with backend DIRECT or AUTO did so far: bytes transferred with O_DIRECT, bytes copied out of
   bounce memory (destinations or edges that were not aligned), bytes read through the page cache, whether the
   filesystem refused O_DIRECT (1) and, for AUTO, the bytes the page cache held when the choice was made. Zeros
   for other files. Any pointer may be NULL. */
SAFETENSORS_EXPORT void safetensors_file_direct_stats(const safetensors_file_t* file, uint64_t* direct_bytes,
                                                      uint64_t* bounced_bytes, uint64_t* cached_bytes,
                                                      int* direct_refused, uint64_t* resident_bytes);
/* One counter of what the file's source did so far, by the name Python's File.source_stats() gives it:
   "requests", "bytes_fetched", "retries", "direct_bytes", "bounced_bytes", "cached_bytes", "direct_refused",
   "resident_bytes" (source.h, kSourceCounters; the two functions above read the same counters). Returns 1 with
   *value set, or 0 with *value unchanged for a name that is not a counter. */
SAFETENSORS_EXPORT int safetensors_file_source_counter(const safetensors_file_t* file, const char* name,
                                                       size_t name_len, uint64_t* value);
/* Opens the bytes [data, data + size) as a file, without copying them. REQUIRES: the bytes stay alive and
   unchanged until the handle and every view made from it are freed. Errors: the header codes. */
SAFETENSORS_EXPORT safetensors_code_t safetensors_open_memory(const void* data, size_t size, safetensors_file_t** file,
                                                              safetensors_error_t** error);
SAFETENSORS_EXPORT void safetensors_file_free(safetensors_file_t* file);

/* The path ("<memory>" for safetensors_open_memory). */
SAFETENSORS_EXPORT const char* safetensors_file_path(const safetensors_file_t* file);
/* The backend in use (MMAP may have fallen back to PREAD, DIRECT to PREAD where the filesystem refused
   O_DIRECT; AUTO is reported as what it chose). */
SAFETENSORS_EXPORT safetensors_backend_t safetensors_file_backend(const safetensors_file_t* file);
/* 8 + the header length: where the data buffer begins. */
SAFETENSORS_EXPORT uint64_t safetensors_file_data_offset(const safetensors_file_t* file);

/* Tensors by position, in file order (by data_offsets). */
SAFETENSORS_EXPORT size_t safetensors_file_tensor_count(const safetensors_file_t* file);
/* The position of the tensor named [name, name + name_len). Errors: SAFETENSORS_TENSOR_NOT_FOUND. */
SAFETENSORS_EXPORT safetensors_code_t safetensors_file_find(const safetensors_file_t* file, const char* name,
                                                            size_t name_len, size_t* index,
                                                            safetensors_error_t** error);
SAFETENSORS_EXPORT const char* safetensors_file_tensor_name(const safetensors_file_t* file, size_t i, size_t* len);
SAFETENSORS_EXPORT safetensors_dtype_t safetensors_file_tensor_dtype(const safetensors_file_t* file, size_t i);
/* The number of dimensions (0 for a scalar). */
SAFETENSORS_EXPORT size_t safetensors_file_tensor_rank(const safetensors_file_t* file, size_t i);
/* `rank` dimensions; not NULL for a valid i, even for a scalar. */
SAFETENSORS_EXPORT const uint64_t* safetensors_file_tensor_shape(const safetensors_file_t* file, size_t i);
/* data_offsets [begin, end), relative to the data buffer. Out of range: both 0. */
SAFETENSORS_EXPORT void safetensors_file_tensor_offsets(const safetensors_file_t* file, size_t i, uint64_t* begin,
                                                        uint64_t* end);
/* end - begin: the size of the tensor's bytes. */
SAFETENSORS_EXPORT uint64_t safetensors_file_tensor_nbytes(const safetensors_file_t* file, size_t i);

/* `__metadata__`: whether the header has it (a `{}` counts, an absent or null one does not), and its
   entries in header order. */
SAFETENSORS_EXPORT int safetensors_file_has_metadata(const safetensors_file_t* file);
SAFETENSORS_EXPORT size_t safetensors_file_metadata_count(const safetensors_file_t* file);
SAFETENSORS_EXPORT const char* safetensors_file_metadata_key(const safetensors_file_t* file, size_t i, size_t* len);
SAFETENSORS_EXPORT const char* safetensors_file_metadata_value(const safetensors_file_t* file, size_t i, size_t* len);
/* The value for `key`, or NULL when there is no such key. */
SAFETENSORS_EXPORT const char* safetensors_file_metadata_get(const safetensors_file_t* file, const char* key,
                                                             size_t key_len, size_t* len);

/* Copies tensor i's bytes into [dst, dst + dst_len). REQUIRES: dst_len == its nbytes.
   Errors: SAFETENSORS_INVALID_ARGUMENT (i out of range, wrong dst_len), SAFETENSORS_IO. */
SAFETENSORS_EXPORT safetensors_code_t safetensors_file_read_into(const safetensors_file_t* file, size_t i, void* dst,
                                                                 size_t dst_len, safetensors_error_t** error);

/* ---------------------------------------------------------------------------------------------------- */
/* Zero-copy views */

typedef struct safetensors_view_t safetensors_view_t;

/* A view of tensor i's bytes inside the mapping (or the caller's memory), in the file's little-endian byte
   order (convention 8). Errors: SAFETENSORS_INVALID_ARGUMENT
   (i out of range; the PREAD backend, which has no mapping: use safetensors_file_read_into). Unlike every
   read, which reports a file that shrank or fails underneath as SAFETENSORS_IO, touching such a page of a
   view raises SIGBUS. */
SAFETENSORS_EXPORT safetensors_code_t safetensors_file_view(const safetensors_file_t* file, size_t i,
                                                            safetensors_view_t** view, safetensors_error_t** error);
/* The bytes; valid until the view is freed. NULL only for an empty tensor on some backends. */
SAFETENSORS_EXPORT const void* safetensors_view_data(const safetensors_view_t* view);
SAFETENSORS_EXPORT size_t safetensors_view_size(const safetensors_view_t* view);
/* 1 when the bytes lie in a private copy-on-write mapping: writing through a cast pointer changes this
   process's copy only, never the file. 0 otherwise (memory files): the bytes must not be written. */
SAFETENSORS_EXPORT int safetensors_view_writable(const safetensors_view_t* view);
SAFETENSORS_EXPORT void safetensors_view_free(safetensors_view_t* view);

/* ---------------------------------------------------------------------------------------------------- */
/* Slices (numpy semantics; see slice.h) */

typedef enum safetensors_slice_kind_t {
  /* `index`: one position (negative counts from the end); the axis is dropped. */
  SAFETENSORS_SLICE_INDEX = 0,
  /* start:stop:step, each present only when its flag is set (absent = numpy's default). */
  SAFETENSORS_SLICE_RANGE = 1,
  /* `...`: as many full ranges as needed (at most one per expression). */
  SAFETENSORS_SLICE_ELLIPSIS = 2
} safetensors_slice_kind_t;

#define SAFETENSORS_SLICE_HAS_START 1u
#define SAFETENSORS_SLICE_HAS_STOP 2u
#define SAFETENSORS_SLICE_HAS_STEP 4u

/* One component of an index expression. Part of the ABI (convention 1). */
typedef struct safetensors_slice_t {
  int32_t kind;   /* a safetensors_slice_kind_t */
  uint32_t flags; /* SAFETENSORS_SLICE_HAS_* for RANGE; ignored otherwise */
  int64_t index;  /* INDEX only */
  int64_t start;  /* RANGE only */
  int64_t stop;
  int64_t step; /* must not be 0 when present */
} safetensors_slice_t;

typedef struct safetensors_slice_plan_t safetensors_slice_plan_t;

/* Plans `indices[0 .. count)` over tensor i; `indices` may be NULL when count is 0 (the whole tensor).
   Errors: SAFETENSORS_INVALID_SLICE, SAFETENSORS_MISALIGNED_SLICE, SAFETENSORS_INVALID_ARGUMENT (i out of
   range, an unknown kind). */
SAFETENSORS_EXPORT safetensors_code_t safetensors_file_plan_slice(const safetensors_file_t* file, size_t i,
                                                                  const safetensors_slice_t* indices, size_t count,
                                                                  safetensors_slice_plan_t** plan,
                                                                  safetensors_error_t** error);
/* The result's shape (rank entries; not NULL) and size in bytes. */
SAFETENSORS_EXPORT size_t safetensors_slice_plan_rank(const safetensors_slice_plan_t* plan);
SAFETENSORS_EXPORT const uint64_t* safetensors_slice_plan_shape(const safetensors_slice_plan_t* plan);
SAFETENSORS_EXPORT uint64_t safetensors_slice_plan_nbytes(const safetensors_slice_plan_t* plan);
SAFETENSORS_EXPORT void safetensors_slice_plan_free(safetensors_slice_plan_t* plan);
/* Copies the selected bytes into [dst, dst + dst_len), reading only what the slice needs.
   REQUIRES: plan was made by safetensors_file_plan_slice for this file and tensor i; dst_len == its nbytes.
   Errors: SAFETENSORS_INVALID_ARGUMENT (a broken requirement), SAFETENSORS_IO. */
SAFETENSORS_EXPORT safetensors_code_t safetensors_file_read_slice(const safetensors_file_t* file, size_t i,
                                                                  const safetensors_slice_plan_t* plan, void* dst,
                                                                  size_t dst_len, safetensors_error_t** error);

/* ---------------------------------------------------------------------------------------------------- */
/* Writing */

/* A tensor to save. Part of the ABI (convention 1). The data is borrowed for the duration of the call. */
typedef struct safetensors_tensor_t {
  const char* name;
  size_t name_len;
  int32_t dtype; /* a safetensors_dtype_t */
  size_t rank;
  const uint64_t* shape; /* rank entries; may be NULL when rank is 0 */
  const void* data;      /* the tensor's bytes, little-endian, row-major */
  size_t size;           /* must equal what dtype and shape need */
} safetensors_tensor_t;

/* One `__metadata__` entry. */
typedef struct safetensors_metadata_entry_t {
  const char* key;
  size_t key_len;
  const char* value;
  size_t value_len;
} safetensors_metadata_entry_t;

/* Flags for the save functions. */
#define SAFETENSORS_SAVE_FSYNC 1u /* fsync the file before publishing it, and its directory after */

/* Writes `tensors[0 .. count)` to `path` atomically (a temporary file renamed over the target), byte for
   byte as the reference implementation does. `metadata` may be NULL: no `__metadata__` is written; otherwise
   its `metadata_count` entries are (0 entries write `{}`). `tensors` may be NULL when count is 0.
   Errors: SAFETENSORS_INVALID_ARGUMENT (duplicate or reserved name, unknown dtype, NULL shape with rank > 0,
   unknown flags), SAFETENSORS_TENSOR_INVALID_INFO (size differs from what dtype and shape need),
   SAFETENSORS_VALIDATION_OVERFLOW, SAFETENSORS_MISALIGNED_SLICE, SAFETENSORS_HEADER_TOO_LARGE,
   SAFETENSORS_NOT_FOUND (no such directory), SAFETENSORS_IO. */
SAFETENSORS_EXPORT safetensors_code_t safetensors_save(const char* path, const safetensors_tensor_t* tensors,
                                                       size_t count, const safetensors_metadata_entry_t* metadata,
                                                       size_t metadata_count, uint32_t flags,
                                                       safetensors_error_t** error);

/* Serializes into a new buffer instead of a file. On success *out is a buffer of *out_len bytes that the
   caller frees with safetensors_buffer_free(). Errors: those of safetensors_save except the I/O ones. */
SAFETENSORS_EXPORT safetensors_code_t safetensors_serialize(const safetensors_tensor_t* tensors, size_t count,
                                                            const safetensors_metadata_entry_t* metadata,
                                                            size_t metadata_count, void** out, size_t* out_len,
                                                            safetensors_error_t** error);
SAFETENSORS_EXPORT void safetensors_buffer_free(void* buffer);

/* Splits `tensors` into `<prefix>-00001-of-0000N.safetensors` files in `directory` so that no shard holds
   more than max_shard_bytes of tensor data (a larger tensor gets a shard of its own), then writes
   `<prefix>.safetensors.index.json` as transformers does; everything atomically, the index last. `prefix`
   may be NULL for "model". `metadata` (may be NULL) is written into every shard. On success, when
   shard_count is not NULL, *shard_count is the number of shards written.
   Errors: those of safetensors_save; SAFETENSORS_INVALID_ARGUMENT also for a bad prefix. */
SAFETENSORS_EXPORT safetensors_code_t safetensors_save_sharded(const char* directory, const char* prefix,
                                                               uint64_t max_shard_bytes,
                                                               const safetensors_tensor_t* tensors, size_t count,
                                                               const safetensors_metadata_entry_t* metadata,
                                                               size_t metadata_count, uint32_t flags,
                                                               size_t* shard_count, safetensors_error_t** error);

/* ---------------------------------------------------------------------------------------------------- */
/* Sharded checkpoints (sharded.h) */

typedef struct safetensors_sharded_t safetensors_sharded_t;

/* Opens a `*.safetensors.index.json` and every shard it names (relative to the index's directory); only the
   tensors the index assigns to each shard are visible. Errors: SAFETENSORS_NOT_FOUND (the index or a shard),
   SAFETENSORS_INVALID_ARGUMENT (a malformed index), SAFETENSORS_TENSOR_NOT_FOUND (a shard lacks a tensor the
   index assigns to it), SAFETENSORS_IO, and the header codes for a shard that fails validation. */
SAFETENSORS_EXPORT safetensors_code_t safetensors_sharded_open_index(const char* index_path, int backend,
                                                                     safetensors_sharded_t** sharded,
                                                                     safetensors_error_t** error);
/* safetensors_sharded_open_index with options (see safetensors_open_with): the index may be a URL, its
   shards are then resolved under the same URL path. `options` may be NULL. */
SAFETENSORS_EXPORT safetensors_code_t safetensors_sharded_open_index_with(const char* index_location,
                                                                          const safetensors_open_options_t* options,
                                                                          safetensors_sharded_t** sharded,
                                                                          safetensors_error_t** error);
/* Opens `paths[0 .. count)`; every tensor of every file is visible. Errors: those of safetensors_open, and
   SAFETENSORS_INVALID_ARGUMENT when two files hold a tensor of the same name. */
SAFETENSORS_EXPORT safetensors_code_t safetensors_sharded_open_files(const char* const* paths, size_t count,
                                                                     int backend, safetensors_sharded_t** sharded,
                                                                     safetensors_error_t** error);
SAFETENSORS_EXPORT void safetensors_sharded_free(safetensors_sharded_t* sharded);

/* The shard files, in order (sorted by name for an index; as given for a list). */
SAFETENSORS_EXPORT size_t safetensors_sharded_shard_count(const safetensors_sharded_t* sharded);
SAFETENSORS_EXPORT const char* safetensors_sharded_shard_path(const safetensors_sharded_t* sharded, size_t shard);

/* The index's `metadata` object: string values as themselves, others as compact JSON text ("total_size" ->
   "123"). Count 0 when there is none. */
SAFETENSORS_EXPORT size_t safetensors_sharded_metadata_count(const safetensors_sharded_t* sharded);
SAFETENSORS_EXPORT const char* safetensors_sharded_metadata_key(const safetensors_sharded_t* sharded, size_t i,
                                                                size_t* len);
SAFETENSORS_EXPORT const char* safetensors_sharded_metadata_value(const safetensors_sharded_t* sharded, size_t i,
                                                                  size_t* len);

/* Visible tensors by position: shard by shard, file order within a shard. The accessors mean what their
   safetensors_file_* counterparts mean; offsets are relative to the data buffer of the tensor's shard. */
SAFETENSORS_EXPORT size_t safetensors_sharded_tensor_count(const safetensors_sharded_t* sharded);
SAFETENSORS_EXPORT safetensors_code_t safetensors_sharded_find(const safetensors_sharded_t* sharded, const char* name,
                                                               size_t name_len, size_t* index,
                                                               safetensors_error_t** error);
SAFETENSORS_EXPORT const char* safetensors_sharded_tensor_name(const safetensors_sharded_t* sharded, size_t i,
                                                               size_t* len);
SAFETENSORS_EXPORT safetensors_dtype_t safetensors_sharded_tensor_dtype(const safetensors_sharded_t* sharded, size_t i);
SAFETENSORS_EXPORT size_t safetensors_sharded_tensor_rank(const safetensors_sharded_t* sharded, size_t i);
SAFETENSORS_EXPORT const uint64_t* safetensors_sharded_tensor_shape(const safetensors_sharded_t* sharded, size_t i);
SAFETENSORS_EXPORT uint64_t safetensors_sharded_tensor_nbytes(const safetensors_sharded_t* sharded, size_t i);
/* The shard (an index for safetensors_sharded_shard_path) holding tensor i; the shard count when i is out of
   range. */
SAFETENSORS_EXPORT size_t safetensors_sharded_tensor_shard(const safetensors_sharded_t* sharded, size_t i);

/* As safetensors_file_read_into and safetensors_file_view, on the tensor's shard. */
SAFETENSORS_EXPORT safetensors_code_t safetensors_sharded_read_into(const safetensors_sharded_t* sharded, size_t i,
                                                                    void* dst, size_t dst_len,
                                                                    safetensors_error_t** error);
SAFETENSORS_EXPORT safetensors_code_t safetensors_sharded_view(const safetensors_sharded_t* sharded, size_t i,
                                                               safetensors_view_t** view, safetensors_error_t** error);

/* One destination for safetensors_sharded_read_many. Part of the ABI (convention 1). */
typedef struct safetensors_read_request_t {
  size_t tensor; /* a position, 0 <= tensor < count */
  void* dst;
  size_t dst_len; /* must equal the tensor's nbytes */
} safetensors_read_request_t;

/* Reads many tensors, from any shards, in parallel with up to `threads` threads (0 = a default).
   Errors: SAFETENSORS_INVALID_ARGUMENT (a bad position or length), SAFETENSORS_IO; on error the contents of
   every destination are unspecified. */
SAFETENSORS_EXPORT safetensors_code_t safetensors_sharded_read_many(const safetensors_sharded_t* sharded,
                                                                    const safetensors_read_request_t* requests,
                                                                    size_t count, unsigned threads,
                                                                    safetensors_error_t** error);

/* ---------------------------------------------------------------------------------------------------- */
/* Prefetch: a plan of byte ranges read in the background (engine.h) */

typedef enum safetensors_delivery_t {
  /* Read into slabs of the process-wide slab pool and handed out chunk by chunk. */
  SAFETENSORS_DELIVERY_STAGED = 0,
  /* Read straight into the caller's destination. */
  SAFETENSORS_DELIVERY_DIRECT = 1
} safetensors_delivery_t;

/* One range of a plan: data-buffer offsets [begin, end) of the tensor at position `tensor` (which names it in
   errors). Part of the ABI (convention 1). */
typedef struct safetensors_piece_t {
  uint64_t begin;
  uint64_t end;
  size_t tensor;
  int32_t delivery; /* a safetensors_delivery_t */
  void* dst;        /* DIRECT: end - begin bytes, valid until the piece is done or the prefetcher freed */
  size_t dst_len;
} safetensors_piece_t;

/* Fills *piece with all of tensor i (delivery STAGED, no dst). Errors: SAFETENSORS_INVALID_ARGUMENT (i out of
   range). */
SAFETENSORS_EXPORT safetensors_code_t safetensors_tensor_piece(const safetensors_file_t* file, size_t i,
                                                               safetensors_piece_t* piece, safetensors_error_t** error);
/* Fills *piece with rows [r0, r1) of tensor i's first dimension (delivery STAGED). Errors:
   SAFETENSORS_INVALID_SLICE (0-d tensor, rows out of range), SAFETENSORS_MISALIGNED_SLICE (a sub-byte row
   boundary inside a byte), SAFETENSORS_INVALID_ARGUMENT. */
SAFETENSORS_EXPORT safetensors_code_t safetensors_row_piece(const safetensors_file_t* file, size_t i, uint64_t r0,
                                                            uint64_t r1, safetensors_piece_t* piece,
                                                            safetensors_error_t** error);

/* Options of safetensors_prefetch_start; 0 in a field means its default. Part of the ABI (convention 1). */
typedef struct safetensors_prefetch_options_t {
  unsigned threads;     /* reader threads, at most 64 (default: engine.h's kDefaultReaderThreads) */
  uint64_t chunk_bytes; /* largest read (default kDefaultChunkBytes; staged chunks are also at most the slab size) */
  uint64_t merge_gap;   /* staged pieces this close are read together, the gap included (default 0) */
  size_t max_slabs;     /* slabs this prefetcher holds at once (default 2 * threads) */
} safetensors_prefetch_options_t;

typedef struct safetensors_prefetcher_t safetensors_prefetcher_t;

/* Validates the plan and starts reading it in the background. The prefetcher keeps the file open: `file` may
   be freed right after. `options` may be NULL. Errors: SAFETENSORS_INVALID_ARGUMENT (a piece outside the data
   buffer, a DIRECT piece whose dst_len differs from its size, an unknown delivery, a tensor position out of
   range, bad options). */
SAFETENSORS_EXPORT safetensors_code_t safetensors_prefetch_start(const safetensors_file_t* file,
                                                                 const safetensors_piece_t* pieces, size_t count,
                                                                 const safetensors_prefetch_options_t* options,
                                                                 safetensors_prefetcher_t** prefetcher,
                                                                 safetensors_error_t** error);
/* Cancels, joins the readers and returns every slab. REQUIRES: nothing reads a lent slab any more. */
SAFETENSORS_EXPORT void safetensors_prefetch_free(safetensors_prefetcher_t* prefetcher);

typedef enum safetensors_event_kind_t {
  SAFETENSORS_EVENT_STAGED = 0, /* bytes of a staged piece in a slab: copy them, then release the slab */
  SAFETENSORS_EVENT_DIRECT = 1, /* a direct piece is complete in its destination */
  SAFETENSORS_EVENT_END = 2,    /* every piece was delivered */
  SAFETENSORS_EVENT_TIMEOUT = 3 /* nothing came within the timeout */
} safetensors_event_kind_t;

/* Part of the ABI (convention 1). */
typedef struct safetensors_prefetch_event_t {
  int32_t kind;       /* a safetensors_event_kind_t */
  int32_t piece_done; /* the piece's last chunk (STAGED), always 1 (DIRECT) */
  size_t piece;       /* position in the plan */
  uint64_t offset;    /* STAGED: where data lies in the piece */
  const void* data;   /* STAGED: valid until the slab is released or the prefetcher freed */
  size_t size;
  uint64_t slab;         /* STAGED: the handle to release (0: none) */
  const void* slab_data; /* STAGED: the start of the slab's allocation (what the allocator returned) */
} safetensors_prefetch_event_t;

/* Waits for the next event, at most timeout_ms milliseconds (negative: no limit), and stores it in *event.
   Errors: the readers' first error (SAFETENSORS_IO and others, naming the file and the tensor) on this and
   every later call; SAFETENSORS_INVALID_ARGUMENT after safetensors_prefetch_cancel. */
SAFETENSORS_EXPORT safetensors_code_t safetensors_prefetch_next(safetensors_prefetcher_t* prefetcher,
                                                                int64_t timeout_ms, safetensors_prefetch_event_t* event,
                                                                safetensors_error_t** error);
/* Returns an event's slab to the pool (0 does nothing). Errors: SAFETENSORS_INVALID_ARGUMENT (not lent). */
SAFETENSORS_EXPORT safetensors_code_t safetensors_prefetch_release(safetensors_prefetcher_t* prefetcher, uint64_t slab,
                                                                   safetensors_error_t** error);
/* Waits until DIRECT piece i is complete. Errors: the readers' error; SAFETENSORS_INVALID_ARGUMENT (not a
   direct piece, or cancelled first). */
SAFETENSORS_EXPORT safetensors_code_t safetensors_prefetch_wait_piece(safetensors_prefetcher_t* prefetcher, size_t i,
                                                                      safetensors_error_t** error);
/* Stops the readers and wakes every waiter. Any thread, any time, idempotent. */
SAFETENSORS_EXPORT void safetensors_prefetch_cancel(safetensors_prefetcher_t* prefetcher);

/* Counters, for tests and benchmarks. Part of the ABI (convention 1). */
typedef struct safetensors_prefetch_stats_t {
  uint64_t bytes_read;
  uint64_t reads;
  uint64_t bytes_staged;
  uint64_t bytes_direct;
  uint64_t chunks;
  uint64_t slab_wait_ns;
  uint64_t events_lent;
} safetensors_prefetch_stats_t;
SAFETENSORS_EXPORT void safetensors_prefetch_stats(const safetensors_prefetcher_t* prefetcher,
                                                   safetensors_prefetch_stats_t* stats);

/* The process-wide slab pool. Errors: SAFETENSORS_INVALID_ARGUMENT (capacity below the slab size; a slab size
   that is 0, above the capacity or not a multiple of 4096). */
SAFETENSORS_EXPORT safetensors_code_t safetensors_slab_pool_set_capacity(uint64_t bytes, safetensors_error_t** error);
SAFETENSORS_EXPORT safetensors_code_t safetensors_slab_pool_set_slab_bytes(uint64_t bytes, safetensors_error_t** error);
/* Slabs allocated from now on come from alloc(size, user) (NULL on failure) and go back through
   free(p, size, user); both NULL restores the default. The callbacks may run on any thread, and `user` must
   stay valid while any slab they made is alive. Errors: SAFETENSORS_INVALID_ARGUMENT (exactly one NULL). */
SAFETENSORS_EXPORT safetensors_code_t safetensors_slab_pool_set_allocator(void* (*alloc)(size_t size, void* user),
                                                                          void (*free)(void* p, size_t size,
                                                                                       void* user),
                                                                          void* user, safetensors_error_t** error);
/* Frees every idle slab now. */
SAFETENSORS_EXPORT void safetensors_slab_pool_trim(void);

/* Part of the ABI (convention 1). */
typedef struct safetensors_slab_pool_stats_t {
  uint64_t capacity;
  uint64_t slab_bytes;
  uint64_t allocated_bytes;
  uint64_t peak_bytes;
  uint64_t slabs_in_use;
  uint64_t slabs_free;
} safetensors_slab_pool_stats_t;
SAFETENSORS_EXPORT void safetensors_slab_pool_stats(safetensors_slab_pool_stats_t* stats);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* SAFETENSORS_C_H_ */
