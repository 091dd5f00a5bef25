// The one seam between the library and the operating system's file syscalls, and the one errno mapping.
//
// Production code calls the functions through syscalls(); tests replace entries (with ScopedSyscalls) to
// inject EINTR, short transfers, ENOSPC or a failing fsync, as fmt's posix-mock and LevelDB's test Envs do.
#ifndef SAFETENSORS_SRC_POSIX_H_
#define SAFETENSORS_SRC_POSIX_H_

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

#include "safetensors/error.h"

namespace safetensors::internal {

struct Syscalls {
  ssize_t (*pread)(int fd, void* buf, std::size_t count, off_t offset);
  ssize_t (*pwrite)(int fd, const void* buf, std::size_t count, off_t offset);
  int (*fsync)(int fd);
  int (*rename)(const char* from, const char* to);
  // open(2) of the file a save writes (O_TMPFILE or a named temporary file).
  int (*open)(const char* path, int flags, mode_t mode);
  int (*linkat)(int from_dir, const char* from, int to_dir, const char* to, int flags);
  // Residency and MADV_POPULATE_WRITE of a read's destination (prefault_for_write).
  int (*mincore)(void* addr, std::size_t length, unsigned char* vec);
  int (*madvise)(void* addr, std::size_t length, int advice);
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

// Writes all of `src` at `offset`, retrying on EINTR and short writes.
Status pwrite_full(int fd, std::string_view path, std::uint64_t offset, std::span<const std::byte> src);

}  // namespace safetensors::internal

#endif  // SAFETENSORS_SRC_POSIX_H_
