// SlabPool (engine.h): a bounded pool of equally sized host slabs shared by every Prefetcher using it.
#include "engine/slab_pool.h"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <new>
#include <string>
#include <utility>
#include <vector>

#include "util/mutex.h"

namespace safetensors {
namespace {

constexpr std::uint64_t kPage = SlabPool::kPageBytes;

std::uint64_t round_up_to_page(std::uint64_t n) { return (n + kPage - 1) / kPage * kPage; }

using internal::SlabDeleter;
using internal::SlabMemory;

std::shared_ptr<const SlabAllocator> default_allocator() {
  static const std::shared_ptr<const SlabAllocator> allocator = std::make_shared<const SlabAllocator>(SlabAllocator{
      // Sizes are whole pages (round_up_to_page), as aligned_alloc requires.
      [](std::size_t size) -> void* { return std::aligned_alloc(kPage, size); },
      [](void* p, std::size_t) { std::free(p); },
  });
  return allocator;
}

// Storage for an object that is constructed once and never destroyed.
template <typename T>
class NoDestructor {
 public:
  NoDestructor() { ::new (static_cast<void*>(storage_)) T(); }
  T& get() { return *std::launder(reinterpret_cast<T*>(storage_)); }

 private:
  alignas(T) unsigned char storage_[sizeof(T)];
};

}  // namespace

struct SlabPool::State {
  internal::Mutex mu;
  // Signalled when a slab comes back, room appears, or a prefetcher is cancelled.
  internal::CondVar cv{&mu};
  std::uint64_t capacity GUARDED_BY(mu) = kDefaultCapacity;
  std::uint64_t slab_bytes GUARDED_BY(mu) = kDefaultSlabBytes;
  std::uint64_t allocated GUARDED_BY(mu) = 0;
  std::uint64_t peak GUARDED_BY(mu) = 0;
  std::chrono::nanoseconds wait GUARDED_BY(mu){0};
  std::uint64_t in_use GUARDED_BY(mu) = 0;
  std::uint64_t allocations GUARDED_BY(mu) = 0;
  std::uint64_t frees GUARDED_BY(mu) = 0;
  std::uint64_t users GUARDED_BY(mu) = 0;
  std::uint64_t allocator_changes GUARDED_BY(mu) = 0;
  bool custom_allocator GUARDED_BY(mu) = false;
  bool release_when_idle GUARDED_BY(mu) = true;
  std::shared_ptr<const SlabAllocator> allocator GUARDED_BY(mu) = default_allocator();
  std::vector<SlabMemory> free_list GUARDED_BY(mu);

  // Moves every free slab for which `doomed_if` holds into *out (freed by the caller after unlocking).
  template <typename Pred>
  void take_free(std::vector<SlabMemory>* out, Pred doomed_if) REQUIRES(mu) {
    auto keep =
        std::stable_partition(free_list.begin(), free_list.end(), [&](const SlabMemory& m) { return !doomed_if(m); });
    for (auto it = keep; it != free_list.end(); ++it) {
      allocated -= it->get_deleter().size;
      ++frees;
      out->push_back(std::move(*it));
    }
    free_list.erase(keep, free_list.end());
  }
};

namespace internal {

Result<Lease> SlabPoolAccess::acquire(SlabPool& pool, std::uint64_t bytes, const std::atomic<bool>& stop,
                                      const std::string& context, std::atomic<std::uint64_t>* wait_ns) {
  SlabPool::State& s = *pool.state_;
  std::vector<SlabMemory> doomed;  // freed after the lock is released
  std::shared_ptr<const SlabAllocator> allocator;
  std::uint64_t size = 0;
  {
    MutexLock lock(&s.mu);
    for (;;) {
      if (stop.load(std::memory_order_acquire)) return Error::invalid_argument(context, "the prefetch was cancelled");
      auto fit = std::find_if(s.free_list.begin(), s.free_list.end(),
                              [&](const SlabMemory& m) { return m.get_deleter().size >= bytes; });
      if (fit != s.free_list.end()) {
        SlabMemory m = std::move(*fit);
        s.free_list.erase(fit);
        ++s.in_use;
        return Lease(&pool, std::move(m));
      }
      size = round_up_to_page(std::max(bytes, s.slab_bytes));
      if (size > s.capacity) {
        return Error::invalid_argument(context, "a staged chunk of " + std::to_string(bytes) +
                                                    " bytes does not fit the slab pool's capacity of " +
                                                    std::to_string(s.capacity) + " bytes");
      }
      if (s.allocated + size <= s.capacity) break;
      if (!s.free_list.empty()) {
        // Free slabs too small for this chunk (left from an earlier slab size) make room.
        s.take_free(&doomed, [](const SlabMemory&) { return true; });
        continue;
      }
      // No room: wait for a slab to come back. The wait counts for the pool and for the acquirer.
      const auto wait_start = std::chrono::steady_clock::now();
      s.cv.wait();
      const auto waited =
          std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - wait_start);
      s.wait += waited;
      wait_ns->fetch_add(static_cast<std::uint64_t>(waited.count()), std::memory_order_relaxed);
    }
    // Reserved before allocating, so concurrent acquirers never exceed the capacity together.
    s.allocated += size;
    s.peak = std::max(s.peak, s.allocated);
    ++s.allocations;
    ++s.in_use;
    allocator = s.allocator;
  }
  doomed.clear();
  void* p = allocator->alloc(size);
  if (p == nullptr) {
    MutexLock lock(&s.mu);
    s.allocated -= size;
    --s.in_use;
    s.cv.notify_all();
    return Error::io(context, "allocate a " + std::to_string(size) + "-byte staging slab", ENOMEM);
  }
  return Lease(&pool, SlabMemory(static_cast<std::byte*>(p), SlabDeleter{std::move(allocator), size}));
}

void SlabPoolAccess::put(SlabPool& pool, SlabMemory memory) {
  SlabPool::State& s = *pool.state_;
  SlabMemory doomed;
  MutexLock lock(&s.mu);
  --s.in_use;
  const SlabDeleter& d = memory.get_deleter();
  const bool keep = d.size == round_up_to_page(s.slab_bytes) && d.allocator == s.allocator &&
                    s.allocated <= s.capacity && !(s.release_when_idle && s.users == 0);
  if (keep) {
    s.free_list.push_back(std::move(memory));
  } else {
    s.allocated -= d.size;
    ++s.frees;
    doomed = std::move(memory);
  }
  s.cv.notify_all();
  // `doomed` is declared before `lock`, so it is freed after the lock is released.
}

void SlabPoolAccess::attach(SlabPool& pool) {
  SlabPool::State& s = *pool.state_;
  MutexLock lock(&s.mu);
  ++s.users;
}

void SlabPoolAccess::detach(SlabPool& pool) {
  SlabPool::State& s = *pool.state_;
  std::vector<SlabMemory> doomed;
  MutexLock lock(&s.mu);
  --s.users;
  if (s.users == 0 && s.release_when_idle) s.take_free(&doomed, [](const SlabMemory&) { return true; });
}

void SlabPoolAccess::wake(SlabPool& pool) {
  SlabPool::State& s = *pool.state_;
  MutexLock lock(&s.mu);
  s.cv.notify_all();
}

void Lease::reset() {
  if (memory_) SlabPoolAccess::put(*pool_, std::move(memory_));
}

}  // namespace internal

using internal::MutexLock;
using internal::SlabPoolAccess;

SlabPool::SlabPool(std::uint64_t capacity, std::uint64_t slab_bytes) : state_(std::make_unique<State>()) {
  State& s = *state_;
  MutexLock lock(&s.mu);
  if (slab_bytes != 0 && slab_bytes % kPage == 0 && capacity >= slab_bytes) {
    s.capacity = capacity;
    s.slab_bytes = slab_bytes;
  }
}

SlabPool::~SlabPool() = default;

SlabPool& SlabPool::global() {
  static NoDestructor<SlabPool> pool;
  return pool.get();
}

Status SlabPool::set_capacity(std::uint64_t bytes) {
  std::vector<SlabMemory> doomed;
  State& s = *state_;
  MutexLock lock(&s.mu);
  if (bytes < s.slab_bytes) {
    return Error::invalid_argument(
        "<slab pool>", "capacity " + std::to_string(bytes) + " is below the slab size " + std::to_string(s.slab_bytes));
  }
  s.capacity = bytes;
  while (s.allocated > s.capacity && !s.free_list.empty()) {
    s.allocated -= s.free_list.back().get_deleter().size;
    ++s.frees;
    doomed.push_back(std::move(s.free_list.back()));
    s.free_list.pop_back();
  }
  s.cv.notify_all();
  return ok_status();
}

std::uint64_t SlabPool::capacity() const {
  MutexLock lock(&state_->mu);
  return state_->capacity;
}

Status SlabPool::set_slab_bytes(std::uint64_t bytes) {
  std::vector<SlabMemory> doomed;
  State& s = *state_;
  MutexLock lock(&s.mu);
  if (bytes == 0 || bytes > s.capacity || bytes % kPage != 0) {
    return Error::invalid_argument("<slab pool>", "slab size " + std::to_string(bytes) +
                                                      " must be a positive multiple of " + std::to_string(kPage) +
                                                      " no larger than the capacity " + std::to_string(s.capacity));
  }
  s.slab_bytes = bytes;
  s.take_free(&doomed, [&](const SlabMemory& m) { return m.get_deleter().size != bytes; });
  s.cv.notify_all();
  return ok_status();
}

std::uint64_t SlabPool::slab_bytes() const {
  MutexLock lock(&state_->mu);
  return state_->slab_bytes;
}

Status SlabPool::set_allocator(SlabAllocator allocator) {
  const bool has_alloc = static_cast<bool>(allocator.alloc), has_free = static_cast<bool>(allocator.free);
  if (has_alloc != has_free) {
    return Error::invalid_argument("<slab pool>", "an allocator needs both alloc and free (or neither)");
  }
  auto shared = has_alloc ? std::make_shared<const SlabAllocator>(std::move(allocator)) : default_allocator();
  std::vector<SlabMemory> doomed;
  MutexLock lock(&state_->mu);
  state_->allocator = std::move(shared);
  state_->allocator_changes += 1;
  state_->custom_allocator = has_alloc;
  state_->take_free(&doomed, [](const SlabMemory&) { return true; });
  return ok_status();
}

void SlabPool::set_release_when_idle(bool release) {
  MutexLock lock(&state_->mu);
  state_->release_when_idle = release;
}

void SlabPool::trim() {
  std::vector<SlabMemory> doomed;
  MutexLock lock(&state_->mu);
  state_->take_free(&doomed, [](const SlabMemory&) { return true; });
}

SlabPoolStats SlabPool::stats() const {
  State& s = *state_;
  MutexLock lock(&s.mu);
  SlabPoolStats out;
  out.capacity = s.capacity;
  out.slab_bytes = s.slab_bytes;
  out.wait = s.wait;
  out.allocated_bytes = s.allocated;
  out.peak_bytes = s.peak;
  out.slabs_in_use = s.in_use;
  out.slabs_free = s.free_list.size();
  out.users = s.users;
  out.custom_allocator = s.custom_allocator;
  out.allocations = s.allocations;
  out.frees = s.frees;
  out.allocator_changes = s.allocator_changes;
  return out;
}

void SlabPool::reset_peak() {
  MutexLock lock(&state_->mu);
  state_->peak = state_->allocated;
}

}  // namespace safetensors
