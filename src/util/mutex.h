// A mutex and condition variable that clang's thread-safety analysis understands (-Wthread-safety), as
// LevelDB's port::Mutex and port/thread_annotations.h: members name the mutex that guards them
// (GUARDED_BY), functions the mutex they need held (REQUIRES) or must not hold (EXCLUDES). libstdc++'s
// std::mutex carries no annotations, so it is wrapped. Other compilers see empty macros.
#ifndef SAFETENSORS_SRC_UTIL_MUTEX_H_
#define SAFETENSORS_SRC_UTIL_MUTEX_H_

#include <chrono>
#include <condition_variable>
#include <mutex>

#if defined(__clang__)
#define ST_THREAD_ANNOTATION_(x) __attribute__((x))
#else
#define ST_THREAD_ANNOTATION_(x)
#endif

#define CAPABILITY(x) ST_THREAD_ANNOTATION_(capability(x))
#define SCOPED_CAPABILITY ST_THREAD_ANNOTATION_(scoped_lockable)
#define GUARDED_BY(x) ST_THREAD_ANNOTATION_(guarded_by(x))
#define PT_GUARDED_BY(x) ST_THREAD_ANNOTATION_(pt_guarded_by(x))
#define REQUIRES(...) ST_THREAD_ANNOTATION_(requires_capability(__VA_ARGS__))
#define EXCLUDES(...) ST_THREAD_ANNOTATION_(locks_excluded(__VA_ARGS__))
#define ACQUIRE(...) ST_THREAD_ANNOTATION_(acquire_capability(__VA_ARGS__))
#define RELEASE(...) ST_THREAD_ANNOTATION_(release_capability(__VA_ARGS__))

namespace safetensors::internal {

class CAPABILITY("mutex") Mutex {
 public:
  Mutex() = default;
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;

  void lock() ACQUIRE() { mu_.lock(); }
  void unlock() RELEASE() { mu_.unlock(); }

 private:
  friend class CondVar;
  std::mutex mu_;
};

// Holds `mu` for its scope.
class SCOPED_CAPABILITY MutexLock {
 public:
  explicit MutexLock(Mutex* mu) ACQUIRE(mu) : mu_(mu) { mu_->lock(); }
  ~MutexLock() RELEASE() { mu_->unlock(); }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

 private:
  Mutex* const mu_;
};

// A condition variable tied to one Mutex. Waits may wake spuriously: callers loop on their condition.
class CondVar {
 public:
  explicit CondVar(Mutex* mu) : mu_(mu) {}
  CondVar(const CondVar&) = delete;
  CondVar& operator=(const CondVar&) = delete;

  // REQUIRES: the caller holds the mutex; it is held again on return.
  void wait() {
    std::unique_lock<std::mutex> lock(mu_->mu_, std::adopt_lock);
    cv_.wait(lock);
    lock.release();
  }
  // As wait(), giving up at `deadline`. Returns false when the deadline passed.
  bool wait_until(std::chrono::steady_clock::time_point deadline) {
    std::unique_lock<std::mutex> lock(mu_->mu_, std::adopt_lock);
    const bool woken = cv_.wait_until(lock, deadline) == std::cv_status::no_timeout;
    lock.release();
    return woken;
  }
  void notify_one() { cv_.notify_one(); }
  void notify_all() { cv_.notify_all(); }

 private:
  Mutex* const mu_;
  std::condition_variable cv_;
};

}  // namespace safetensors::internal

#endif  // SAFETENSORS_SRC_UTIL_MUTEX_H_
