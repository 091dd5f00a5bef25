// A small fork-join helper: the one place the library starts worker threads, and how work is cut for it.
#ifndef SAFETENSORS_SRC_UTIL_PARALLEL_H_
#define SAFETENSORS_SRC_UTIL_PARALLEL_H_

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "safetensors/error.h"

namespace safetensors::internal {

// Threads for `total_bytes` of I/O in chunks of `chunk_bytes`: one per chunk, at most the hardware's and 8.
inline unsigned default_threads(std::uint64_t total_bytes, std::uint64_t chunk_bytes) {
  const unsigned hw = std::max(1u, std::thread::hardware_concurrency());
  return std::min<unsigned>({hw, 8u, static_cast<unsigned>(total_bytes / chunk_bytes) + 1});
}

// How many chunks ahead of the one being read a reader hints the kernel to fetch (Source::prefetch), so a
// cold read keeps the device busy: several threads reading one descriptor at interleaved offsets defeat the
// kernel's per-descriptor sequential readahead, and a 2 GiB cold read on 2 threads took 7-9 s without the
// hint and 1.4-2.8 s with it (a standalone pread program on this 2-core VM, 8 MiB chunks; warm reads
// unchanged). Four 8 MiB chunks keep about 32 MiB in flight.
inline constexpr std::size_t kReadaheadChunks = 4;

// The readahead schedule over `count` chunks read in order, for the reader that has just taken chunk `i`:
// the taker of chunk 0 hints chunks [0, kReadaheadChunks), and the taker of chunk i hints chunk
// i + kReadaheadChunks, so that many chunks stay hinted ahead of the readers. Calls hint(k) for each chunk k.
template <typename Hint>
void hint_ahead(std::size_t i, std::size_t count, Hint&& hint) {
  if (i == 0) {
    for (std::size_t k = 0; k < std::min(count, kReadaheadChunks); ++k) hint(k);
  }
  if (i + kReadaheadChunks < count) hint(i + kReadaheadChunks);
}

// The one chunk splitter: calls f(offset, length) for consecutive chunks of at most `chunk` bytes covering
// [0, size), in order. REQUIRES: chunk > 0.
template <typename F>
void for_each_chunk(std::uint64_t size, std::uint64_t chunk, F&& f) {
  // off + len <= size: the step cannot overflow, even for sizes near 2^64.
  for (std::uint64_t off = 0; off < size;) {
    const std::uint64_t len = std::min(chunk, size - off);
    f(off, len);
    off += len;
  }
}

// Runs work(i) for every i in [0, count) on up to `threads` threads (the caller's included); items are handed
// out in order. Stops handing out items after the first failure, whose Error is returned.
template <typename Work>
Status run_parallel(std::size_t count, unsigned threads, Work&& work) {
  threads = std::max(1u, std::min<unsigned>(threads, static_cast<unsigned>(std::min<std::size_t>(count, 1024))));
  std::atomic<std::size_t> next{0};
  std::atomic<bool> failed{false};
  std::mutex error_mu;
  std::optional<Error> first_error;
  auto worker = [&]() {
    for (;;) {
      if (failed.load(std::memory_order_relaxed)) return;
      const std::size_t i = next.fetch_add(1, std::memory_order_relaxed);
      if (i >= count) return;
      Status s = work(i);
      if (!s.ok()) {
        std::lock_guard<std::mutex> lock(error_mu);
        if (!first_error) first_error = std::move(s).error();
        failed.store(true, std::memory_order_relaxed);
        return;
      }
    }
  };
  {
    std::vector<std::jthread> pool;
    for (unsigned t = 1; t < threads; ++t) pool.emplace_back(worker);
    worker();
  }
  if (first_error) return std::move(*first_error);
  return ok_status();
}

}  // namespace safetensors::internal

#endif  // SAFETENSORS_SRC_UTIL_PARALLEL_H_
