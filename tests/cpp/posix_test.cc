// The syscall seam: EINTR and short transfers are retried, errno is mapped in one place.
#include "posix.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>

#include "safetensors/file.h"
#include "safetensors/writer.h"
#include "test_util.h"

namespace safetensors {
namespace {

std::atomic<int> g_interrupts{0};

TEST(PosixTest, ReadsAndWritesRetryOnEintrAndShortTransfers) {
  test::TempDir dir;
  std::vector<std::byte> data = test::random_bytes(100000, 9);
  std::vector<TensorData> ts = {{"w", Dtype::kU8, {100000}, data}};
  internal::Syscalls flaky = internal::real_syscalls();
  // Every other call is interrupted; the others transfer at most 1000 bytes.
  flaky.pread = [](int fd, void* buf, std::size_t n, off_t off) -> ssize_t {
    if (++g_interrupts % 2) {
      errno = EINTR;
      return -1;
    }
    return internal::real_syscalls().pread(fd, buf, std::min<std::size_t>(n, 1000), off);
  };
  flaky.pwrite = [](int fd, const void* buf, std::size_t n, off_t off) -> ssize_t {
    if (++g_interrupts % 2) {
      errno = EINTR;
      return -1;
    }
    return internal::real_syscalls().pwrite(fd, buf, std::min<std::size_t>(n, 1000), off);
  };
  internal::ScopedSyscalls scope(flaky);
  const std::string path = dir.file("x.safetensors");
  ASSERT_ST_OK(save_file(path, ts));
  auto f = File::open(path, {.backend = Backend::kPread});
  ASSERT_ST_OK(f);
  std::vector<std::byte> got(100000);
  ASSERT_ST_OK(f->read_into("w", got));
  EXPECT_EQ(got, data);
  EXPECT_GT(g_interrupts.load(), 200);
}

TEST(PosixTest, ErrnoMapping) {
  Error missing = internal::errno_error("p", "open", ENOENT);
  EXPECT_EQ(missing.kind(), Error::Kind::kNotFound);
  EXPECT_EQ(missing.sys_errno(), ENOENT);
  Error e = internal::errno_error("p", "read", EACCES);
  EXPECT_EQ(e.kind(), Error::Kind::kIo);
  EXPECT_EQ(e.sys_errno(), EACCES);
  // The reference's text ("I/O error: <strerror> (os error N)"), then what was being done.
  EXPECT_EQ(e.message(), "I/O error: Permission denied (os error 13) during read");
  EXPECT_EQ(e.to_string(), "I/O error: Permission denied (os error 13) during read (IoError) in \"p\"");
  Error changed = Error::io("p", "file is shorter than expected");
  EXPECT_EQ(changed.sys_errno(), 0);
  EXPECT_EQ(changed.message(), "I/O error: file is shorter than expected");
}

}  // namespace
}  // namespace safetensors
