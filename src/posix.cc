#include "posix.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>

namespace safetensors::internal {
namespace {

int open_syscall(const char* path, int flags, mode_t mode) { return ::open(path, flags, mode); }

const Syscalls kReal = {
    .pread = ::pread,
    .pwrite = ::pwrite,
    .fsync = ::fsync,
    .rename = ::rename,
    .open = open_syscall,
    .linkat = ::linkat,
};

std::atomic<const Syscalls*> g_syscalls{&kReal};

// Linux transfers at most 0x7ffff000 bytes per call; ask for no more than 1 GiB at a time.
constexpr std::size_t kMaxTransfer = std::size_t{1} << 30;

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

Status pread_full(int fd, std::string_view path, std::uint64_t offset, std::span<std::byte> dst,
                  std::string_view what) {
  std::size_t done = 0;
  while (done < dst.size()) {
    const std::size_t want = std::min(dst.size() - done, kMaxTransfer);
    const ssize_t n = syscalls().pread(fd, dst.data() + done, want, static_cast<off_t>(offset + done));
    if (n < 0) {
      if (errno == EINTR) continue;
      return errno_error(path, what, errno);
    }
    if (n == 0) {
      return Error::io(path, "file is shorter than expected (it changed after it was opened): " + std::string(what) +
                                 " (" + std::to_string(dst.size()) + " bytes at offset " + std::to_string(offset) +
                                 ") reached end of file");
    }
    done += static_cast<std::size_t>(n);
  }
  return ok_status();
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
