// Symbol visibility for the safetensors library. The library is built with hidden visibility; only
// declarations marked SAFETENSORS_EXPORT form its ABI.
#ifndef SAFETENSORS_EXPORT_H_
#define SAFETENSORS_EXPORT_H_

#if defined(SAFETENSORS_SHARED_LIBRARY)
#if defined(SAFETENSORS_COMPILE_LIBRARY)
#define SAFETENSORS_EXPORT __attribute__((visibility("default")))
#else
#define SAFETENSORS_EXPORT
#endif
#else
#define SAFETENSORS_EXPORT
#endif

#endif  // SAFETENSORS_EXPORT_H_
