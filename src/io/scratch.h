// Scratch memory for reads that land somewhere other than their destination (merged reads, coalesced slice
// runs): placed where a direct source reads into it without a bounce.
#ifndef SAFETENSORS_SRC_IO_SCRATCH_H_
#define SAFETENSORS_SRC_IO_SCRATCH_H_

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <new>
#include <span>

namespace safetensors::internal {

// Grows as needed; its memory is freed with it.
class Scratch {
 public:
  // `length` bytes for a read at file offset `offset`, at an address congruent to `offset` modulo `alignment`
  // (a source's ReadHints::alignment, a power of two; 0: any address). Valid until the next call. Throws
  // std::bad_alloc when memory is short, as new[] would.
  std::span<std::byte> get(std::uint64_t offset, std::uint64_t length, std::uint64_t alignment) {
    const std::uint64_t a = alignment == 0 ? 64 : alignment;
    const std::uint64_t pad = offset & (a - 1);
    // Scratch spans are at most a few MiB (kReadChunk, kCoalesceSpan): the sums cannot overflow.
    const std::uint64_t need = (pad + length + a - 1) & ~(a - 1);
    if (need > capacity_ || a != alignment_) {
      memory_.reset(static_cast<std::byte*>(std::aligned_alloc(static_cast<std::size_t>(a), need == 0 ? a : need)));
      if (memory_ == nullptr) throw std::bad_alloc();
      capacity_ = need;
      alignment_ = a;
    }
    return {memory_.get() + pad, static_cast<std::size_t>(length)};
  }

 private:
  struct Free {
    void operator()(std::byte* p) const { std::free(p); }
  };
  std::unique_ptr<std::byte, Free> memory_;
  std::uint64_t capacity_ = 0;
  std::uint64_t alignment_ = 0;
};

}  // namespace safetensors::internal

#endif  // SAFETENSORS_SRC_IO_SCRATCH_H_
