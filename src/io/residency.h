// How much of an open file the page cache holds: what Backend::kAuto decides by (direct_source.h).
#ifndef SAFETENSORS_SRC_IO_RESIDENCY_H_
#define SAFETENSORS_SRC_IO_RESIDENCY_H_

#include <cstdint>
#include <string>
#include <string_view>

namespace safetensors::internal {

struct Residency {
  // Bytes of the file in the page cache (an estimate from samples for "nowait"), at most the file's size.
  std::uint64_t resident_bytes = 0;
  // How it was measured: "cachestat", "mincore" or "nowait"; empty when no probe could tell.
  std::string_view probe;
};

// Measures the page-cache residency of the `size`-byte file open as `fd`, with the first probe that works:
//   1. cachestat(2) over the whole file (Linux 6.5): exact, and cheap at any size.
//   2. mincore(2) over a shared read-only mapping of the file, in windows. Since Linux 5.2 the kernel reports
//      page-cache pages only to a caller that owns the file or may write it (else only the pages mapped in
//      its own page tables, which would read as "not cached"), so this probe runs only where `may_mincore`.
//   3. preadv2(RWF_NOWAIT) of one byte at each of kNowaitSamples evenly spaced pages: a read that would block
//      (EAGAIN) found its page uncached. The kernel may start readahead for such a page; the probe reads
//      nothing more itself.
// Each syscall goes through the syscalls() seam, so tests can take probes away. Never fails: an empty probe
// says nothing could tell.
Residency probe_residency(int fd, std::uint64_t size, bool may_mincore);

// Samples of the RWF_NOWAIT probe.
inline constexpr unsigned kNowaitSamples = 64;

}  // namespace safetensors::internal

#endif  // SAFETENSORS_SRC_IO_RESIDENCY_H_
