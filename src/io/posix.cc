#include "io/posix.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>

namespace safetensors::internal {
namespace {

int open_syscall(const char* path, int flags, mode_t mode) { return ::open(path, flags, mode); }
int mincore_syscall(void* addr, std::size_t length, unsigned char* vec) { return ::mincore(addr, length, vec); }
int madvise_syscall(void* addr, std::size_t length, int advice) { return ::madvise(addr, length, advice); }

// cachestat(2) has the number 451 on every architecture (it came after the syscall tables were unified).
constexpr long kCachestatNr = 451;
int cachestat_syscall(int fd, CachestatRange* range, Cachestat* cstat, unsigned flags) {
  return static_cast<int>(::syscall(kCachestatNr, fd, range, cstat, flags));
}
// preadv2(2) through syscall(2): glibc wraps it only from 2.26, and the wheels target glibc 2.17 (README,
// "Wheels"). The kernel takes the offset as two longs, low then high; on 64-bit hosts the high one is shifted
// out (the same split glibc's wrapper makes).
ssize_t preadv2_syscall(int fd, const struct iovec* iov, int iovcnt, off_t offset, int flags) {
#ifdef SYS_preadv2
  const auto pos = static_cast<std::uint64_t>(offset);
  return ::syscall(SYS_preadv2, fd, iov, iovcnt, static_cast<long>(pos), static_cast<long>(pos >> 32), flags);
#else
  (void)fd, (void)iov, (void)iovcnt, (void)offset, (void)flags;
  errno = ENOSYS;
  return -1;
#endif
}

const Syscalls kReal = {
    .pread = ::pread,
    .pwrite = ::pwrite,
    .fsync = ::fsync,
    .rename = ::rename,
    .open = open_syscall,
    .linkat = ::linkat,
    .mincore = mincore_syscall,
    .madvise = madvise_syscall,
    .cachestat = cachestat_syscall,
    .preadv2 = preadv2_syscall,
};

std::atomic<const Syscalls*> g_syscalls{&kReal};

// Linux transfers at most 0x7ffff000 bytes per call; ask for no more than 1 GiB at a time.
constexpr std::size_t kMaxTransfer = std::size_t{1} << 30;

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23  // Linux 5.14; older C libraries lack the name
#endif

// Destinations smaller than this are not worth a mincore: they take at most 16 faults.
constexpr std::size_t kMinPrefault = std::size_t{64} << 10;

// Whether the kernel knows MADV_POPULATE_WRITE (Linux 5.14): asked once, with an empty range (the kernel checks the
// advice, then accepts the range).
bool populate_supported() {
  static const bool supported = ::madvise(nullptr, 0, MADV_POPULATE_WRITE) == 0;
  return supported;
}

}  // namespace

const Syscalls& syscalls() { return *g_syscalls.load(std::memory_order_acquire); }
const Syscalls& real_syscalls() { return kReal; }

ScopedSyscalls::ScopedSyscalls(const Syscalls& replacement)
    : previous_(g_syscalls.exchange(&replacement, std::memory_order_acq_rel)) {}
ScopedSyscalls::~ScopedSyscalls() { g_syscalls.store(previous_, std::memory_order_release); }

Error errno_error(std::string_view path, std::string_view what, int err) {
  if (err == ENOENT) return Error::not_found(path);
  return Error::io(path, what, err);
}

void prefault_for_write(std::span<std::byte> dst) {
  // Why: a read into pages that are not there takes one page fault per 4 KiB inside the kernel's copy, and
  // where the file offset and the destination are not congruent modulo the page size (a tensor's offset in
  // the file against a fresh allocation: nearly always) each fault lands mid-copy, which costs more than the
  // faults of a congruent copy. Faulting one step in first with a single madvise and then reading it makes the
  // read as fast whatever the alignment, and faster than either; the step is kFillStep rather than the whole
  // chunk because populating a whole chunk at once lets its zeroed lines leave the cache before the read.
  // Memory already resident costs the mincore alone. The load this serves is measured in BENCHMARKS.md,
  // section "Materialized load, warm page cache".
  if (dst.size() < kMinPrefault || !populate_supported()) return;
  static const std::uintptr_t page = static_cast<std::uintptr_t>(::sysconf(_SC_PAGESIZE));
  const auto first = reinterpret_cast<std::uintptr_t>(dst.data());
  const std::uintptr_t begin = first & ~(page - 1);
  const std::uintptr_t end = first + dst.size();  // dst is a live object: no wrap
  // The last page decides: the first may be the one the step before it faulted in (it ended inside it).
  unsigned char resident = 0;
  void* last = reinterpret_cast<void*>((end - 1) & ~(page - 1));
  if (syscalls().mincore(last, page, &resident) != 0 || (resident & 1) != 0) return;
  // Failure changes nothing (EFAULT, EINVAL for device memory, EINTR, ENOMEM): the read faults them in itself.
  (void)syscalls().madvise(reinterpret_cast<void*>(begin), end - begin, MADV_POPULATE_WRITE);
}

Error short_read_error(std::string_view path, std::string_view what, std::uint64_t size, std::uint64_t offset) {
  return Error::io(path, "file is shorter than expected (it changed after it was opened): " + std::string(what) + " (" +
                             std::to_string(size) + " bytes at offset " + std::to_string(offset) +
                             ") reached end of file");
}

Status pread_full(int fd, std::string_view path, std::uint64_t offset, std::span<std::byte> dst,
                  std::string_view what) {
  std::size_t done = 0;
  std::size_t prefaulted = 0;  // dst[0, prefaulted) went through prefault_for_write
  while (done < dst.size()) {
    const std::size_t want = std::min(dst.size() - done, kFillStep);
    if (done + want > prefaulted) {
      prefault_for_write(dst.subspan(done, want));
      prefaulted = done + want;
    }
    const ssize_t n = syscalls().pread(fd, dst.data() + done, want, static_cast<off_t>(offset + done));
    if (n < 0) {
      if (errno == EINTR) continue;
      return errno_error(path, what, errno);
    }
    if (n == 0) return short_read_error(path, what, dst.size(), offset);
    done += static_cast<std::size_t>(n);
  }
  return ok_status();
}

int reopen_descriptor(int fd, const std::string& path, int extra_flags) {
  const std::string self = "/proc/self/fd/" + std::to_string(fd);
  const int flags = O_RDONLY | O_CLOEXEC | O_NOCTTY | extra_flags;
  int again = syscalls().open(self.c_str(), flags, 0);
  if (again >= 0 || errno != ENOENT) return again;
  // No /proc: the path, without blocking on whatever it may name by now, checked to be the same file.
  again = syscalls().open(path.c_str(), flags | O_NONBLOCK, 0);
  if (again < 0) return -1;
  struct stat a, b;
  int err = ESTALE;
  if (::fstat(fd, &a) == 0 && ::fstat(again, &b) == 0 && a.st_dev == b.st_dev && a.st_ino == b.st_ino) {
    const int fl = ::fcntl(again, F_GETFL);
    if (fl >= 0 && ::fcntl(again, F_SETFL, fl & ~O_NONBLOCK) == 0) return again;
    err = errno;
  }
  close_reporting(again, path);
  errno = err;
  return -1;
}

void close_reporting(int fd, std::string_view path) {
  if (fd >= 0 && ::close(fd) != 0) {
    std::fprintf(stderr, "safetensors: close(\"%.*s\") failed: %s\n", static_cast<int>(path.size()), path.data(),
                 std::strerror(errno));
  }
}

Status pwrite_full(int fd, std::string_view path, std::uint64_t offset, std::span<const std::byte> src) {
  std::size_t done = 0;
  while (done < src.size()) {
    const std::size_t want = std::min(src.size() - done, kMaxTransfer);
    const ssize_t n = syscalls().pwrite(fd, src.data() + done, want, static_cast<off_t>(offset + done));
    if (n < 0) {
      if (errno == EINTR) continue;
      return errno_error(path, "write", errno);
    }
    if (n == 0) return Error::io(path, "write: no progress");
    done += static_cast<std::size_t>(n);
  }
  return ok_status();
}

}  // namespace safetensors::internal
