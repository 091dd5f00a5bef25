#include "io/residency.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <vector>

#include "io/posix.h"
#include "util/checked.h"

#ifndef RWF_NOWAIT
#define RWF_NOWAIT 0x00000008  // Linux 4.14; older C libraries lack the name
#endif

namespace safetensors::internal {
namespace {

std::uint64_t page_size() {
  static const std::uint64_t page = static_cast<std::uint64_t>(::sysconf(_SC_PAGESIZE));
  return page;
}

bool by_cachestat(int fd, std::uint64_t size, Residency* out) {
  CachestatRange range{0, 0};
  Cachestat cs{};
  if (syscalls().cachestat(fd, &range, &cs, 0) != 0) return false;
  // nr_cache counts pages; the last one may hold less than a page of the file.
  out->resident_bytes = std::min(size, checked_mul(cs.nr_cache, page_size()).value_or(size));
  out->probe = "cachestat";
  return true;
}

// Pages per mincore call: the vector stays at 64 KiB whatever the file's size.
constexpr std::uint64_t kMincoreWindowPages = std::uint64_t{64} << 10;

bool by_mincore(int fd, std::uint64_t size, Residency* out) {
  if (size > SIZE_MAX) return false;
  void* base = ::mmap(nullptr, static_cast<std::size_t>(size), PROT_READ, MAP_SHARED, fd, 0);
  if (base == MAP_FAILED) return false;
  const std::uint64_t page = page_size();
  const std::uint64_t pages = size / page + (size % page != 0);
  std::vector<unsigned char> vec(static_cast<std::size_t>(std::min(pages, kMincoreWindowPages)));
  std::uint64_t resident_pages = 0;
  bool ok = true;
  for (std::uint64_t first = 0; first < pages; first += kMincoreWindowPages) {
    const std::uint64_t count = std::min(kMincoreWindowPages, pages - first);
    // first * page < size: inside the mapping; the last window ends at the mapping's last page.
    const std::uint64_t length = std::min(count * page, size - first * page);
    if (syscalls().mincore(static_cast<char*>(base) + first * page, static_cast<std::size_t>(length), vec.data()) !=
        0) {
      ok = false;
      break;
    }
    for (std::uint64_t i = 0; i < count; ++i) resident_pages += vec[static_cast<std::size_t>(i)] & 1;
  }
  (void)::munmap(base, static_cast<std::size_t>(size));
  if (!ok) return false;
  out->resident_bytes = std::min(size, resident_pages * page);
  out->probe = "mincore";
  return true;
}

bool by_nowait(int fd, std::uint64_t size, Residency* out) {
  const std::uint64_t page = page_size();
  const std::uint64_t pages = size / page + (size % page != 0);
  const std::uint64_t samples = std::min<std::uint64_t>(kNowaitSamples, pages);
  if (samples == 0) return false;
  unsigned resident = 0;
  // A RWF_NOWAIT read of a page that is not cached fails with EAGAIN, but first starts reading it -- with the
  // device's readahead window after it (megabytes), which can bring in the pages of the next samples before
  // they are probed: a cold file judged warm, even with POSIX_FADV_RANDOM on the descriptor, which a kernel
  // need not honour. So the samples are probed from the end of the file back: what one miss reads ahead lies
  // past the samples still to come. POSIX_FADV_RANDOM keeps that read to the page itself where the kernel
  // honours it; the descriptor's readahead is restored after.
  (void)::posix_fadvise(fd, 0, 0, POSIX_FADV_RANDOM);
  struct RestoreReadahead {
    int fd;
    ~RestoreReadahead() { (void)::posix_fadvise(fd, 0, 0, POSIX_FADV_NORMAL); }
  } restore{fd};
  for (std::uint64_t k = samples; k-- > 0;) {
    const std::uint64_t i = k;
    // i * pages / samples < pages: a page of the file. (i < 64 and pages < 2^52: no overflow.)
    const std::uint64_t offset = i * pages / samples * page;
    unsigned char byte;
    struct iovec iov {
      &byte, 1
    };
    ssize_t n;
    do {
      n = syscalls().preadv2(fd, &iov, 1, static_cast<off_t>(offset), RWF_NOWAIT);
    } while (n < 0 && errno == EINTR);
    if (n >= 0) {
      ++resident;
    } else if (errno != EAGAIN) {
      return false;  // EOPNOTSUPP (no RWF_NOWAIT for this file), ENOSYS, an I/O error: cannot tell
    }
  }
  out->resident_bytes = std::min(size, size / samples * resident);
  out->probe = "nowait";
  return true;
}

}  // namespace

Residency probe_residency(int fd, std::uint64_t size, bool may_mincore) {
  Residency out;
  if (size == 0) return out;
  if (by_cachestat(fd, size, &out)) return out;
  if (may_mincore && by_mincore(fd, size, &out)) return out;
  if (by_nowait(fd, size, &out)) return out;
  return Residency{};
}

}  // namespace safetensors::internal
