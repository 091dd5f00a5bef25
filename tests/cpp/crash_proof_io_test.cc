// Crash-proof I/O.
//
// - Every read the library makes for a caller is a positional read, on the mmap backend too: a file that
//   shrank after it was opened gives kIo naming the file and the tensor, never SIGBUS (C++ and C API); the
//   direct backend's reads (O_DIRECT, whole blocks) give the same errors.
// - Only regular files are opened: a FIFO (without blocking), a socket, a device or a directory is refused
//   at open with "not a regular file (...)".
// - A save in progress is an anonymous file (O_TMPFILE): nothing but the previous file is in the directory
//   until it is published, so a crash leaves nothing behind; without O_TMPFILE a named temporary file.
#include <dirent.h>
#include <fcntl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <future>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "io/posix.h"
#include "safetensors/c.h"
#include "safetensors/file.h"
#include "safetensors/slice.h"
#include "safetensors/source.h"
#include "safetensors/testing.h"
#include "safetensors/writer.h"
#include "test_util.h"

namespace safetensors {
namespace {

using test::TempDir;

constexpr std::size_t kBig = 1u << 20;

// "small" (16 bytes, first in the file) and "big" (1 MiB of U8 as 1024 x 1024, after it).
std::string save_two(const TempDir& dir, std::vector<std::byte>* small, std::vector<std::byte>* big) {
  *small = test::random_bytes(16, 1);
  *big = test::random_bytes(kBig, 2);
  std::vector<TensorData> tensors = {{"small", Dtype::kI32, {4}, *small}, {"big", Dtype::kU8, {1024, 1024}, *big}};
  const std::string path = dir.file("model.safetensors");
  auto st = save_file(path, tensors);
  EXPECT_TRUE(st.ok()) << st.error().to_string();
  return path;
}

// A clean error for a read of tensor `big` of the file at `path` that ended early.
void expect_shrunk(const Status& st, const std::string& path, const char* what) {
  ASSERT_FALSE(st.ok()) << what;
  EXPECT_EQ(st.error().kind(), Error::Kind::kIo) << what << ": " << st.error().to_string();
  EXPECT_EQ(st.error().context(), path) << what;
  const std::string text = st.error().to_string();
  EXPECT_NE(text.find("shorter than expected"), std::string::npos) << what << ": " << text;
  EXPECT_NE(text.find("`big`"), std::string::npos) << what << ": " << text;
}

class TruncatedAfterOpen : public ::testing::TestWithParam<Backend> {};

// The file is cut to its header and 16 bytes of data after open: every page of `big` past the first lies
// beyond the end of the file, where a copy out of the mapping would raise SIGBUS.
TEST_P(TruncatedAfterOpen, EveryReadPathGivesAnErrorNamingTheFileAndTheTensor) {
  TempDir dir;
  std::vector<std::byte> small, big;
  const std::string path = save_two(dir, &small, &big);
  auto f = File::open(path, {.backend = GetParam()});
  ASSERT_ST_OK(f);
  ASSERT_EQ(f->backend(), test::read_path_of(GetParam()));
  ASSERT_EQ(::truncate(path.c_str(), static_cast<off_t>(f->data_offset() + 16)), 0);

  std::vector<std::byte> got(kBig);
  expect_shrunk(f->read_into("big", got), path, "read_into");
  const TensorInfo* t = f->find("big");
  std::vector<ReadRequest> reqs = {{t, got}};
  expect_shrunk(f->read_many(reqs, 2), path, "read_many");
  // read_range names no tensor: it reads a stretch of the data buffer.
  std::vector<std::byte> all(f->size() - f->data_offset());
  auto range = f->read_range(0, all, 2);
  ASSERT_FALSE(range.ok());
  EXPECT_EQ(range.error().kind(), Error::Kind::kIo) << range.error().to_string();
  EXPECT_NE(range.error().to_string().find("shorter than expected"), std::string::npos);

  // Slices: long runs (rows), many short runs (a column, the coalescing path), one element.
  const std::vector<std::vector<SliceIndex>> specs = {
      {SliceIndex::range(100, 900, 1)},
      {SliceIndex::ellipsis(), SliceIndex::range(3, 5, 1)},
      {SliceIndex::at(1000), SliceIndex::at(7)},
      {},
  };
  for (const auto& spec : specs) {
    auto plan = f->plan_slice(*t, spec);
    ASSERT_ST_OK(plan);
    std::vector<std::byte> dst(plan->nbytes());
    expect_shrunk(f->read_slice(*t, *plan, dst), path, "read_slice");
  }

  // What lies before the cut still reads.
  std::vector<std::byte> first(16);
  ASSERT_ST_OK(f->read_into("small", first));
  EXPECT_EQ(first, small);

  // The C API over the same kind of handle.
  safetensors_file_t* c = nullptr;
  ASSERT_EQ(::truncate(path.c_str(), static_cast<off_t>(f->size())), 0);
  // The C API's backend numbers are the C++ ones.
  ASSERT_EQ(safetensors_open(path.c_str(), static_cast<int>(GetParam()), &c, nullptr), SAFETENSORS_OK);
  ASSERT_EQ(::truncate(path.c_str(), static_cast<off_t>(f->data_offset() + 16)), 0);
  size_t i = 0;
  ASSERT_EQ(safetensors_file_find(c, "big", 3, &i, nullptr), SAFETENSORS_OK);
  safetensors_error_t* err = nullptr;
  EXPECT_EQ(safetensors_file_read_into(c, i, got.data(), got.size(), &err), SAFETENSORS_IO);
  ASSERT_NE(err, nullptr);
  EXPECT_NE(std::string(safetensors_error_message(err)).find("shorter than expected"), std::string::npos);
  size_t len = 0;
  const char* context = safetensors_error_context(err, &len);
  EXPECT_EQ(std::string(context, len), path);
  safetensors_error_free(err);
  err = nullptr;
  safetensors_slice_t rows{};
  rows.kind = SAFETENSORS_SLICE_RANGE;
  rows.flags = SAFETENSORS_SLICE_HAS_START | SAFETENSORS_SLICE_HAS_STOP;
  rows.start = 10;
  rows.stop = 20;
  safetensors_slice_plan_t* plan = nullptr;
  ASSERT_EQ(safetensors_file_plan_slice(c, i, &rows, 1, &plan, nullptr), SAFETENSORS_OK);
  std::vector<std::byte> part(safetensors_slice_plan_nbytes(plan));
  EXPECT_EQ(safetensors_file_read_slice(c, i, plan, part.data(), part.size(), &err), SAFETENSORS_IO);
  safetensors_error_free(err);
  safetensors_slice_plan_free(plan);
  safetensors_file_free(c);
}

INSTANTIATE_TEST_SUITE_P(Backends, TruncatedAfterOpen,
                         ::testing::Values(Backend::kMmap, Backend::kPread, Backend::kDirect), [](const auto& info) {
                           return info.param == Backend::kMmap    ? "Mmap"
                                  : info.param == Backend::kPread ? "Pread"
                                                                  : "Direct";
                         });

TEST(FaultySource, EndAtOffsetActsLikeAFileThatShrank) {
  std::vector<std::byte> a = test::random_bytes(64, 3), b = test::random_bytes(4096, 4);
  std::vector<TensorData> tensors = {{"a", Dtype::kU8, {64}, a}, {"b", Dtype::kU8, {64, 64}, b}};
  auto src = test::serialized_source(tensors);
  ASSERT_ST_OK(src);
  auto faulty = test::without_mapping(*src);
  auto f = File::open(faulty);
  ASSERT_ST_OK(f);
  faulty->end_at_offset = static_cast<std::int64_t>(f->data_offset() + f->find("b")->begin + 100);
  std::vector<std::byte> got_a(64), got_b(4096);
  ASSERT_ST_OK(f->read_into("a", got_a));
  EXPECT_EQ(got_a, a);
  auto st = f->read_into("b", got_b);
  EXPECT_ST_ERROR(st, kIo);
  EXPECT_NE(st.error().to_string().find("read of tensor `b`"), std::string::npos) << st.error().to_string();
  auto plan = f->plan_slice(*f->find("b"), std::vector<SliceIndex>{SliceIndex::at(0)});
  ASSERT_ST_OK(plan);
  std::vector<std::byte> row(64);
  ASSERT_ST_OK(f->read_slice(*f->find("b"), *plan, row));  // bytes [0, 64) of b are before the end
  EXPECT_TRUE(std::equal(row.begin(), row.end(), b.begin()));
}

// Refused at open on both backends, through C++ and the C API, with the file named.
void expect_not_regular(const std::string& path, const std::string& kind) {
  for (Backend backend : {Backend::kMmap, Backend::kPread}) {
    auto f = File::open(path, {.backend = backend});
    ASSERT_FALSE(f.ok()) << path;
    EXPECT_EQ(f.error().kind(), Error::Kind::kIo) << f.error().to_string();
    EXPECT_EQ(f.error().context(), path);
    EXPECT_NE(f.error().to_string().find("not a regular file (" + kind + ")"), std::string::npos)
        << f.error().to_string();
  }
  safetensors_file_t* c = nullptr;
  safetensors_error_t* err = nullptr;
  EXPECT_EQ(safetensors_open(path.c_str(), SAFETENSORS_BACKEND_MMAP, &c, &err), SAFETENSORS_IO);
  ASSERT_NE(err, nullptr);
  EXPECT_NE(std::string(safetensors_error_message(err)).find("not a regular file"), std::string::npos);
  safetensors_error_free(err);
}

TEST(OnlyRegularFiles, AFifoIsRefusedWithoutBlocking) {
  TempDir dir;
  const std::string fifo = dir.file("pipe.safetensors");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  // Opened in another thread: if open() blocked waiting for a writer, the watchdog opens the FIFO for
  // writing (which releases the reader) and the test fails instead of hanging.
  auto opened = std::async(std::launch::async, [&] { return File::open(fifo); });
  if (opened.wait_for(std::chrono::seconds(20)) != std::future_status::ready) {
    const int w = ::open(fifo.c_str(), O_WRONLY | O_NONBLOCK);
    ADD_FAILURE() << "File::open blocked on a FIFO";
    if (w >= 0) ::close(w);
    (void)opened.get();
    return;  // the opens below would block too
  }
  auto f = opened.get();
  ASSERT_FALSE(f.ok());
  EXPECT_NE(f.error().to_string().find("not a regular file (a FIFO)"), std::string::npos) << f.error().to_string();
  expect_not_regular(fifo, "a FIFO");
}

TEST(OnlyRegularFiles, ADirectoryADeviceAndASocketAreRefused) {
  TempDir dir;
  expect_not_regular(dir.path().string(), "a directory");
  expect_not_regular("/dev/null", "a character device");

  const std::string sock = dir.file("s.safetensors");
  const int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  ASSERT_LT(sock.size(), sizeof addr.sun_path);
  std::memcpy(addr.sun_path, sock.c_str(), sock.size() + 1);
  ASSERT_EQ(::bind(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof addr), 0);
  expect_not_regular(sock, "a socket");
  ::close(fd);
}

// The names in `dir`, sorted.
std::vector<std::string> names_in(const TempDir& dir) {
  std::vector<std::string> names;
  for (const auto& e : std::filesystem::directory_iterator(dir.path())) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

bool supports_tmpfile(const TempDir& dir) {
  const int fd = ::open(dir.path().c_str(), O_TMPFILE | O_WRONLY | O_CLOEXEC, 0600);
  if (fd < 0) return false;
  ::close(fd);
  return true;
}

// O_TMPFILE refused as by a filesystem without it (NFS, FUSE).
int open_without_tmpfile(const char* path, int flags, mode_t mode) {
  if ((flags & O_TMPFILE) == O_TMPFILE) {
    errno = EOPNOTSUPP;
    return -1;
  }
  return internal::real_syscalls().open(path, flags, mode);
}

std::atomic<int> g_renames{0};
int counting_rename(const char* from, const char* to) {
  ++g_renames;
  return internal::real_syscalls().rename(from, to);
}

class SaveInProgress : public ::testing::TestWithParam<bool> {};

// What a crash at this point would leave: with O_TMPFILE only the previous file, else also the named
// temporary file; after finish() or abandon() only the target, either way.
TEST_P(SaveInProgress, LeavesNothingButThePreviousFileUntilItIsPublished) {
  const bool tmpfile = GetParam();
  TempDir dir;
  if (tmpfile && !supports_tmpfile(dir)) GTEST_SKIP() << dir.path() << " has no O_TMPFILE";
  internal::Syscalls syscalls = internal::real_syscalls();
  if (!tmpfile) syscalls.open = open_without_tmpfile;
  internal::ScopedSyscalls scope(syscalls);

  const std::string path = dir.file("model.safetensors");
  std::vector<std::byte> a = test::random_bytes(4096, 5), b = test::random_bytes(4096, 6);
  std::vector<TensorData> old_tensors = {{"w", Dtype::kU8, {4096}, a}};
  std::vector<TensorData> new_tensors = {{"w", Dtype::kU8, {4096}, b}};
  ASSERT_ST_OK(save_file(path, old_tensors));
  const std::string before = test::read_bytes(path);
  for (bool publish : {true, false}) {
    auto plan = WritePlan::make(new_tensors, {});
    ASSERT_ST_OK(plan);
    auto w = FileWriter::create(path, std::move(*plan));
    ASSERT_ST_OK(w);
    ASSERT_ST_OK(w->write_part(0, 0, std::span(b).first(100)));
    const auto during = names_in(dir);
    if (tmpfile) {
      EXPECT_EQ(during, std::vector<std::string>{"model.safetensors"});
    } else {
      ASSERT_EQ(during.size(), 2u);
      EXPECT_EQ(during[0].rfind(".model.safetensors.", 0), 0u) << during[0];
      EXPECT_EQ(during[0].size(), std::string(".model.safetensors.").size() + 16 + 4) << during[0];
    }
    EXPECT_EQ(test::read_bytes(path), before);
    if (publish) {
      ASSERT_ST_OK(w->write_part(0, 100, std::span(b).subspan(100)));
      ASSERT_ST_OK(w->finish());
      auto f = File::open(path);
      ASSERT_ST_OK(f);
      std::vector<std::byte> got(4096);
      ASSERT_ST_OK(f->read_into("w", got));
      EXPECT_EQ(got, b);
      ASSERT_ST_OK(save_file(path, old_tensors));
    } else {
      w->abandon();
      EXPECT_EQ(test::read_bytes(path), before);
    }
    EXPECT_EQ(names_in(dir), std::vector<std::string>{"model.safetensors"});
  }
}

INSTANTIATE_TEST_SUITE_P(Tmpfile, SaveInProgress, ::testing::Values(true, false),
                         [](const auto& info) { return info.param ? "Anonymous" : "NamedFallback"; });

TEST(AtomicPublish, ANewFileIsLinkedStraightToItsNameAndAnExistingOneReplacedByRename) {
  TempDir dir;
  if (!supports_tmpfile(dir)) GTEST_SKIP() << dir.path() << " has no O_TMPFILE";
  internal::Syscalls syscalls = internal::real_syscalls();
  syscalls.rename = counting_rename;
  internal::ScopedSyscalls scope(syscalls);
  const mode_t old_umask = ::umask(027);
  const std::string path = dir.file("m.safetensors");
  g_renames = 0;
  ASSERT_ST_OK(save_file(path, {}));
  EXPECT_EQ(g_renames.load(), 0);
  struct stat st;
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0640u);  // 0666 minus the umask
  ASSERT_EQ(::chmod(path.c_str(), 0604), 0);
  ASSERT_ST_OK(save_file(path, {}, Metadata{{"k", "v"}}, {.fsync = true}));
  EXPECT_EQ(g_renames.load(), 1);
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0604u);  // the target's bits, not the umask's
  EXPECT_EQ(names_in(dir), std::vector<std::string>{"m.safetensors"});
  ::umask(old_umask);
}

TEST(AtomicPublish, AFailedLinkOrRenameLeavesThePreviousFileAndNothingElse) {
  TempDir dir;
  if (!supports_tmpfile(dir)) GTEST_SKIP() << dir.path() << " has no O_TMPFILE";
  const std::string path = dir.file("m.safetensors");
  ASSERT_ST_OK(save_file(path, {}, Metadata{{"v", "old"}}));
  const std::string before = test::read_bytes(path);
  {
    internal::Syscalls syscalls = internal::real_syscalls();
    syscalls.linkat = [](int, const char*, int, const char*, int) -> int {
      errno = EPERM;
      return -1;
    };
    internal::ScopedSyscalls scope(syscalls);
    auto st = save_file(path, {}, Metadata{{"v", "new"}});
    EXPECT_ST_ERROR(st, kIo);
    EXPECT_NE(st.error().to_string().find("link"), std::string::npos) << st.error().to_string();
  }
  EXPECT_EQ(test::read_bytes(path), before);
  EXPECT_EQ(names_in(dir), std::vector<std::string>{"m.safetensors"});
  {
    internal::Syscalls syscalls = internal::real_syscalls();
    syscalls.rename = [](const char*, const char*) -> int {
      errno = EIO;
      return -1;
    };
    internal::ScopedSyscalls scope(syscalls);
    EXPECT_ST_ERROR(save_file(path, {}, Metadata{{"v", "new"}}), kIo);
  }
  EXPECT_EQ(test::read_bytes(path), before);
  EXPECT_EQ(names_in(dir), std::vector<std::string>{"m.safetensors"});  // the temporary link is gone too
}

}  // namespace
}  // namespace safetensors
