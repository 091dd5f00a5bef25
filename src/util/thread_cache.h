// A value each thread keeps for its next use and that is destroyed when the thread exits: what a
// `thread_local` object with a destructor gives, without one. Such an object registers its destructor through
// glibc's __cxa_thread_atexit_impl, a symbol of glibc 2.18, and the binary wheels must need no glibc newer than
// 2.17 (manylinux2014). zig's libc++abi only falls back to a pthread key when it targets a glibc older than
// 2.18, and for ppc64le the oldest glibc zig provides is 2.19 (scripts/wheel.sh); this class takes the pthread
// key itself, so every target links the same way.
#ifndef SAFETENSORS_SRC_UTIL_THREAD_CACHE_H_
#define SAFETENSORS_SRC_UTIL_THREAD_CACHE_H_

#include <pthread.h>

#include <cstdlib>
#include <memory>

namespace safetensors::internal {

// Declare one as a function-local static. It is never destroyed (its destructor is trivial, the key is never
// deleted), so a thread that exits during or after static destruction still frees its value. The main thread's
// value lives until the process ends (glibc runs key destructors only when a thread exits).
template <typename T>
class ThreadCache {
 public:
  ThreadCache() {
    // Fails only when the process has used all PTHREAD_KEYS_MAX (1024) keys: nothing sensible to do then.
    if (pthread_key_create(&key_, [](void* value) { delete static_cast<T*>(value); }) != 0) std::abort();
  }
  ThreadCache(const ThreadCache&) = delete;
  ThreadCache& operator=(const ThreadCache&) = delete;

  // This thread's value, value-initialised on its first call.
  T& get() {
    if (void* value = pthread_getspecific(key_)) return *static_cast<T*>(value);
    auto fresh = std::make_unique<T>();
    if (pthread_setspecific(key_, fresh.get()) != 0) std::abort();  // ENOMEM for the key's second-level table
    return *fresh.release();  // owned by the key from here: its destructor frees it at thread exit
  }

 private:
  pthread_key_t key_{};
};

}  // namespace safetensors::internal

#endif  // SAFETENSORS_SRC_UTIL_THREAD_CACHE_H_
