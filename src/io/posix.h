// The one seam between the library and the operating system's file syscalls, and the one errno mapping.
//
// Production code calls the functions through syscalls(); tests replace entries (with ScopedSyscalls) to
// inject EINTR, short transfers, ENOSPC or a failing fsync, as fmt's posix-mock and LevelDB's test Envs do.
#ifndef SAFETENSORS_SRC_IO_POSIX_H_
#define SAFETENSORS_SRC_IO_POSIX_H_

#include <sys/types.h>
#include <sys/uio.h>

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "safetensors/error.h"

namespace safetensors::internal {

// cachestat(2)'s arguments (Linux 6.5, <linux/mman.h>; declared here for C libraries and kernel headers that
// predate it).
struct CachestatRange {
  std::uint64_t off;
  std::uint64_t len;  // 0: to the end of the file
};
struct Cachestat {
  std::uint64_t nr_cache;
  std::uint64_t nr_dirty;
  std::uint64_t nr_writeback;
  std::uint64_t nr_evicted;
  std::uint64_t nr_recently_evicted;
};

struct Syscalls {
  // Every positional read of a file, a direct source's O_DIRECT reads included.
  ssize_t (*pread)(int fd, void* buf, std::size_t count, off_t offset);
  ssize_t (*pwrite)(int fd, const void* buf, std::size_t count, off_t offset);
  int (*fsync)(int fd);
  int (*rename)(const char* from, const char* to);
  // open(2) of a file the library writes (a save's O_TMPFILE or named temporary file) or opens a second time
  // (a direct source's O_DIRECT descriptor, a reopen of an open file).
  int (*open)(const char* path, int flags, mode_t mode);
  int (*linkat)(int from_dir, const char* from, int to_dir, const char* to, int flags);
  // Residency and MADV_POPULATE_WRITE of a read's destination (prefault_for_write), and residency of a file's
  // pages in the page cache (the kAuto probes).
  int (*mincore)(void* addr, std::size_t length, unsigned char* vec);
  int (*madvise)(void* addr, std::size_t length, int advice);
  // The kAuto probes: cachestat(2) (-1 with ENOSYS before Linux 6.5) and preadv2(2) with RWF_NOWAIT.
  int (*cachestat)(int fd, CachestatRange* range, Cachestat* cstat, unsigned flags);
  ssize_t (*preadv2)(int fd, const struct iovec* iov, int iovcnt, off_t offset, int flags);
};

// The table in use. Never null.
const Syscalls& syscalls();

// Replaces the table for the lifetime of the object (tests only; not thread-safe against concurrent I/O).
class ScopedSyscalls {
 public:
  explicit ScopedSyscalls(const Syscalls& replacement);
  ~ScopedSyscalls();
  ScopedSyscalls(const ScopedSyscalls&) = delete;
  ScopedSyscalls& operator=(const ScopedSyscalls&) = delete;

 private:
  const Syscalls* previous_;
};

// The real syscalls, for replacements that forward.
const Syscalls& real_syscalls();

// The only mapping from errno to Error: ENOENT -> kNotFound, everything else -> kIo with strerror text.
// `what` names the operation ("open", "read", ...).
Error errno_error(std::string_view path, std::string_view what, int err);

// The error of a read that met the end of the file before `size` bytes at `offset` (the file shrank after it
// was opened): kIo, "file is shorter than expected ...", naming the read (`what`).
Error short_read_error(std::string_view path, std::string_view what, std::uint64_t size, std::uint64_t offset);

// Reads exactly dst.size() bytes at `offset`, retrying on EINTR and short reads. A read that reaches end of
// file early gives kIo ("file is shorter than expected"). `what` names the read in errors ("read of tensor
// `w`"). The destination is filled in steps of kFillStep bytes, each passed to prefault_for_write() first.
Status pread_full(int fd, std::string_view path, std::uint64_t offset, std::span<std::byte> dst,
                  std::string_view what = "read");
// Bytes per pread of pread_full: small enough that the pages prefault_for_write() just zeroed are still in
// the CPU's cache when the copy writes them.
inline constexpr std::size_t kFillStep = std::size_t{512} << 10;

// Where dst is at least 64 KiB and its last page is not resident (memory never touched, as a fresh allocation is),
// faults all of dst's pages in for writing with one MADV_POPULATE_WRITE; resident memory is left alone (one mincore).
// It never changes dst's contents (a page not yet present reads as zeros, or as its file's bytes, either way), and it
// is advice only: a kernel without MADV_POPULATE_WRITE (before 5.14) or memory that refuses it is simply written by the
// read that follows.
void prefault_for_write(std::span<std::byte> dst);

// Opens the file behind `fd` a second time (O_RDONLY | O_CLOEXEC | `extra_flags`, e.g. O_DIRECT): a new open
// file description with flags of its own, of the same file. /proc/self/fd names exactly that file; without
// /proc, `path` is opened and must turn out to be the same file (device and inode; else ESTALE). Returns the
// descriptor, or -1 with errno set.
int reopen_descriptor(int fd, const std::string& path, int extra_flags);

// Closes `fd` (if >= 0), reporting a failure on stderr instead of returning it: for destructors, which never
// throw.
void close_reporting(int fd, std::string_view path);

// Writes all of `src` at `offset`, retrying on EINTR and short writes.
Status pwrite_full(int fd, std::string_view path, std::uint64_t offset, std::span<const std::byte> src);

}  // namespace safetensors::internal

#endif  // SAFETENSORS_SRC_IO_POSIX_H_
