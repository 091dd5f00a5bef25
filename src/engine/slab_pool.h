// The SlabPool's side that Prefetchers use (engine.h holds the pool's contract): slab memory, a Lease that
// returns its slab when destroyed, and SlabPoolAccess, the one way into a pool's state.
#ifndef SAFETENSORS_SRC_ENGINE_SLAB_POOL_H_
#define SAFETENSORS_SRC_ENGINE_SLAB_POOL_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "safetensors/engine.h"
#include "safetensors/error.h"

namespace safetensors::internal {

// Slab memory, freed by the allocator that made it.
struct SlabDeleter {
  std::shared_ptr<const SlabAllocator> allocator;
  std::size_t size = 0;
  void operator()(std::byte* p) const { allocator->free(p, size); }
};
using SlabMemory = std::unique_ptr<std::byte, SlabDeleter>;

// A slab lent by a pool; returns it on destruction. Move-only.
class Lease {
 public:
  Lease() = default;
  Lease(SlabPool* pool, SlabMemory memory) : pool_(pool), memory_(std::move(memory)) {}
  Lease(Lease&& other) noexcept : pool_(other.pool_), memory_(std::move(other.memory_)) {}
  Lease& operator=(Lease&& other) noexcept {
    if (this != &other) {
      reset();
      pool_ = other.pool_;
      memory_ = std::move(other.memory_);
    }
    return *this;
  }
  ~Lease() { reset(); }

  std::byte* data() const { return memory_.get(); }
  explicit operator bool() const { return memory_ != nullptr; }
  void reset();

 private:
  SlabPool* pool_ = nullptr;  // not owned
  SlabMemory memory_;
};

struct SlabPoolAccess {
  // A slab of at least `bytes`, waiting while the pool is at capacity. Errors: kInvalidArgument when `stop` was
  // set (the caller stops quietly) or when `bytes` can never fit; kIo (ENOMEM) when the allocator fails.
  // Nanoseconds spent waiting are added to *wait_ns.
  static Result<Lease> acquire(SlabPool& pool, std::uint64_t bytes, const std::atomic<bool>& stop,
                               const std::string& context, std::atomic<std::uint64_t>* wait_ns);
  // Takes back a slab (Lease::reset): kept for reuse, or freed when it no longer fits the pool's settings.
  static void put(SlabPool& pool, SlabMemory memory);
  // A Prefetcher starts / stops using the pool (idle memory is released when the last one stops).
  static void attach(SlabPool& pool);
  static void detach(SlabPool& pool);
  // Wakes the pool's waiters so that they notice a stop flag set before this call.
  static void wake(SlabPool& pool);
};

}  // namespace safetensors::internal

#endif  // SAFETENSORS_SRC_ENGINE_SLAB_POOL_H_
