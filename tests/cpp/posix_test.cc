// The syscall seam: EINTR and short transfers are retried, errno is mapped in one place.
#include "io/posix.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <memory>

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

// What the counting madvise saw: populate calls and the bytes they covered.
std::atomic<int> g_populates{0};
std::atomic<std::size_t> g_populated{0};

int counting_madvise(void* addr, std::size_t length, int advice) {
  if (advice == 23 /* MADV_POPULATE_WRITE */) {
    g_populates.fetch_add(1);
    g_populated.fetch_add(length);
  }
  return internal::real_syscalls().madvise(addr, length, advice);
}

// Anonymous memory no one has touched, as a fresh allocation of this size is.
struct FreshMemory {
  explicit FreshMemory(std::size_t n) : size(n) {
    void* p = ::mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    EXPECT_NE(p, MAP_FAILED);
    base = static_cast<std::byte*>(p);
  }
  ~FreshMemory() { ::munmap(base, size); }
  std::byte* base;
  std::size_t size;
};

// A read into memory that is not there yet faults each kFillStep step in (one MADV_POPULATE_WRITE)
// just before filling it, whatever the destination's alignment against the file offset; memory already
// resident and small destinations are left to the copy. The bytes are the file's either way.
TEST(PosixTest, ReadsPrefaultEachStepOfFreshMemoryOnly) {
  test::TempDir dir;
  constexpr std::size_t kBytes = 4 * internal::kFillStep + 1000;  // 5 steps, the last one short
  std::vector<std::byte> data = test::random_bytes(kBytes, 16);
  std::vector<std::byte> small = test::random_bytes(1000, 17);
  const std::string path = dir.file("x.safetensors");
  const std::vector<TensorData> ts = {{"small", Dtype::kU8, {1000}, small}, {"w", Dtype::kU8, {kBytes}, data}};
  ASSERT_ST_OK(save_file(path, ts));
  internal::Syscalls counting = internal::real_syscalls();
  counting.madvise = counting_madvise;
  internal::ScopedSyscalls scope(counting);
  for (Backend backend : {Backend::kPread, Backend::kMmap}) {
    auto f = File::open(path, {.backend = backend});
    ASSERT_ST_OK(f);
    // Fresh memory, the destination 100 bytes into a page (not congruent with the file offset).
    FreshMemory fresh(kBytes + 8192);
    const std::span<std::byte> dst(fresh.base + 100, kBytes);
    g_populates = 0;
    g_populated = 0;
    ASSERT_ST_OK(f->read_into("w", dst));
    EXPECT_EQ(std::memcmp(dst.data(), data.data(), kBytes), 0);
    EXPECT_EQ(g_populates.load(), 4);  // the 1000-byte tail is under the 64 KiB floor
    EXPECT_GE(g_populated.load(), 4 * internal::kFillStep);
    // The same memory again: resident now, so nothing is populated.
    g_populates = 0;
    ASSERT_ST_OK(f->read_into("w", dst));
    EXPECT_EQ(g_populates.load(), 0);
    EXPECT_EQ(std::memcmp(dst.data(), data.data(), kBytes), 0);
    // A small tensor into fresh memory: under the floor.
    FreshMemory tiny(4096);
    ASSERT_ST_OK(f->read_into("small", std::span<std::byte>(tiny.base, 1000)));
    EXPECT_EQ(g_populates.load(), 0);
    EXPECT_EQ(std::memcmp(tiny.base, small.data(), 1000), 0);
  }
}

// Populating is advice: where the kernel refuses it the read still fills the memory.
TEST(PosixTest, ReadsFillMemoryWhosePopulateFails) {
  test::TempDir dir;
  constexpr std::size_t kBytes = 2 * internal::kFillStep;
  std::vector<std::byte> data = test::random_bytes(kBytes, 18);
  const std::string path = dir.file("x.safetensors");
  const std::vector<TensorData> ts = {{"w", Dtype::kU8, {kBytes}, data}};
  ASSERT_ST_OK(save_file(path, ts));
  internal::Syscalls refusing = internal::real_syscalls();
  refusing.madvise = [](void*, std::size_t, int) -> int {
    g_populates.fetch_add(1);
    errno = EINVAL;
    return -1;
  };
  internal::ScopedSyscalls scope(refusing);
  auto f = File::open(path, {.backend = Backend::kPread});
  ASSERT_ST_OK(f);
  FreshMemory fresh(kBytes);
  g_populates = 0;
  ASSERT_ST_OK(f->read_into("w", std::span<std::byte>(fresh.base, kBytes)));
  EXPECT_EQ(g_populates.load(), 2);
  EXPECT_EQ(std::memcmp(fresh.base, data.data(), kBytes), 0);
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
