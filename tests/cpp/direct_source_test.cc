// The direct source (source.h, "direct") and Backend::kAuto:
// - every alignment case reads the file's exact bytes: tensor offsets that are not multiples of 512 or 4096,
//   tensors smaller than a block, a tensor in the file's last partial block, a file size that is not
//   aligned, slices of rows that start mid-block, destinations at every alignment, on every read path
//   (read_into, read_many, read_range, read_slice, the engine's direct and staged deliveries);
// - aligned destinations are read straight into, others through bounce memory (the source's statistics);
// - a filesystem that refuses O_DIRECT (at open, or on the first read) is read through the page cache, no
//   error, and the statistics say so; tmpfs reads whichever way the kernel allows;
// - kAuto reads a cached file through the cache and an evicted one directly, with each residency probe;
// - File::with_backend reads the same open file another way, sharing the header;
// - EIO under direct reads gives the same error as under buffered reads.
// Threaded tests carry Thread in their names for the TSan stage.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "io/posix.h"
#include "safetensors/c.h"
#include "safetensors/engine.h"
#include "safetensors/file.h"
#include "safetensors/source.h"
#include "safetensors/testing.h"
#include "safetensors/writer.h"
#include "test_util.h"

namespace safetensors {
namespace {

using test::TempDir;

// The file's data bytes: a pattern with period 251 (prime), so no two blocks of any power-of-two size agree.
std::byte pattern(std::uint64_t i) { return static_cast<std::byte>((i * 131 + 7) % 251); }

// Tensor sizes, in file order (names sort as listed): smaller than a block, straddling 512 and 4096 boundaries,
// larger than a read chunk, and a last one that ends the file inside a block.
const std::vector<std::uint64_t> kSizes = {
    3, 509, 4093, 1, 4097, (std::uint64_t{1} << 20) + 13, 700, 8191, (std::uint64_t{17} << 20) + 5, 65537, 333,
};
// A 2-D U8 tensor of kRows x kRowBytes after them: rows straddle blocks, so row slices start mid-block.
constexpr std::uint64_t kRows = 3000;
constexpr std::uint64_t kRowBytes = 100;

struct Fixture {
  std::string path;
  std::vector<std::byte> data;  // the data buffer
};

// The model above saved under `dir` (fsynced, so eviction works), its data buffer the pattern.
Fixture write_model(const TempDir& dir, const char* name = "m.safetensors") {
  std::uint64_t total = kRows * kRowBytes;
  for (std::uint64_t n : kSizes) total += n;
  Fixture f{dir.file(name), std::vector<std::byte>(total)};
  for (std::uint64_t i = 0; i < total; ++i) f.data[i] = pattern(i);
  std::vector<TensorData> tensors;
  std::uint64_t at = 0;
  for (std::size_t i = 0; i < kSizes.size(); ++i) {
    tensors.push_back(
        {"t" + std::to_string(10 + i), Dtype::kU8, {kSizes[i]}, std::span(f.data).subspan(at, kSizes[i])});
    at += kSizes[i];
  }
  tensors.push_back({"z_rows", Dtype::kU8, {kRows, kRowBytes}, std::span(f.data).subspan(at)});
  auto st = save_file(f.path, tensors, std::nullopt, {.fsync = true});
  EXPECT_TRUE(st.ok()) << st.error().to_string();
  return f;
}

// Memory of `n` bytes whose address is congruent to `file_offset` + `shift` modulo 4096.
struct Congruent {
  struct Free {
    void operator()(std::byte* p) const { std::free(p); }
  };
  std::unique_ptr<std::byte, Free> memory;
  std::span<std::byte> bytes;
};
Congruent congruent(std::uint64_t n, std::uint64_t file_offset, std::uint64_t shift) {
  Congruent c;
  const std::uint64_t pad = (file_offset + shift) % 4096;
  c.memory.reset(static_cast<std::byte*>(std::aligned_alloc(4096, (n + pad + 4096) / 4096 * 4096)));
  c.bytes = std::span<std::byte>(c.memory.get() + pad, n);
  return c;
}

std::span<const std::byte> expected(const Fixture& fx, const TensorInfo& t) {
  return std::span<const std::byte>(fx.data).subspan(t.begin, t.nbytes());
}

// Whether `f` reads past the page cache (a filesystem may refuse; that is tested on its own below).
bool reads_directly(const File& f) { return f.backend() == ReadPath::kDirect; }

// Direct sources opened while it lives read everything through bounce memory, or straight into aligned
// destinations where they can, whatever the device under the file suggests.
class ScopedBounce {
 public:
  explicit ScopedBounce(bool always) { testing::set_direct_bounce(always); }
  ~ScopedBounce() { testing::set_direct_bounce(std::nullopt); }
  ScopedBounce(const ScopedBounce&) = delete;
  ScopedBounce& operator=(const ScopedBounce&) = delete;
};

// Both ways of reading: straight into aligned destinations (false), everything through bounce memory (true).
class DirectAlignment : public ::testing::TestWithParam<bool> {
 protected:
  ScopedBounce bounce_{GetParam()};
};

INSTANTIATE_TEST_SUITE_P(Copies, DirectAlignment, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? "Bounced" : "Straight"; });

TEST_P(DirectAlignment, EveryReadPathIsByteIdenticalAtEveryAlignment) {
  TempDir dir;
  const Fixture fx = write_model(dir);
  auto f = File::open(fx.path, {.backend = Backend::kDirect});
  ASSERT_ST_OK(f);
  ASSERT_TRUE(reads_directly(*f)) << "O_DIRECT refused under " << dir.path() << ": "
                                  << f->source()->stats().direct_refused;
  EXPECT_EQ(f->source()->kind(), "direct");
  ASSERT_NE(f->size() % 512, 0u) << "the file's size should not be aligned";
  ASSERT_NE(f->data_offset() % 512, 0u);

  // read_into, each tensor into memory at every alignment against its file offset.
  for (const TensorInfo& t : f->tensors()) {
    for (std::uint64_t shift : {0, 1, 8, 511, 512, 4095}) {
      Congruent dst = congruent(t.nbytes(), f->data_offset() + t.begin, shift);
      ASSERT_ST_OK(f->read_into(t, dst.bytes));
      ASSERT_TRUE(std::ranges::equal(dst.bytes, expected(fx, t))) << t.name << " shift " << shift;
    }
  }

  // read_many of every tensor into vectors (whatever malloc gives), with threads.
  std::vector<std::vector<std::byte>> out;
  std::vector<ReadRequest> reqs;
  for (const TensorInfo& t : f->tensors()) out.emplace_back(t.nbytes());
  for (std::size_t i = 0; i < f->tensors().size(); ++i) reqs.push_back({&f->tensors()[i], out[i]});
  ASSERT_ST_OK(f->read_many(reqs, 4));
  for (std::size_t i = 0; i < out.size(); ++i) {
    ASSERT_TRUE(std::ranges::equal(out[i], expected(fx, f->tensors()[i]))) << f->tensors()[i].name;
  }

  // read_range: odd offsets and lengths, the whole buffer, the last byte.
  const std::uint64_t data_size = fx.data.size();
  const std::vector<std::pair<std::uint64_t, std::uint64_t>> ranges = {
      {0, data_size}, {1, 1}, {511, 2}, {4095, 4098}, {12345, 9'000'001}, {data_size - 1, 1}, {data_size - 4097, 4097},
  };
  for (const auto& [offset, length] : ranges) {
    for (std::uint64_t shift : {0, 3}) {
      Congruent dst = congruent(length, f->data_offset() + offset, shift);
      ASSERT_ST_OK(f->read_range(offset, dst.bytes, 3));
      ASSERT_TRUE(std::ranges::equal(dst.bytes, std::span(fx.data).subspan(offset, length)))
          << "range " << offset << "+" << length << " shift " << shift;
    }
  }

  // read_slice of rows starting mid-block, a column (many short runs, coalesced), one element.
  const TensorInfo* rows = f->find("z_rows");
  ASSERT_NE(rows, nullptr);
  ASSERT_NE((f->data_offset() + rows->begin) % 512, 0u);
  const std::vector<std::vector<SliceIndex>> specs = {
      {SliceIndex::range(7, 2999, 1)},
      {SliceIndex::range(41, 42, 1)},
      {SliceIndex::ellipsis(), SliceIndex::range(13, 17, 1)},
      {SliceIndex::range(5, 2000, 3), SliceIndex::range(90, 100, 1)},
      {SliceIndex::at(2999), SliceIndex::at(99)},
  };
  const std::span<const std::byte> all_rows = expected(fx, *rows);
  for (const auto& spec : specs) {
    auto plan = f->plan_slice(*rows, spec);
    ASSERT_ST_OK(plan);
    std::vector<std::byte> got(plan->nbytes());
    ASSERT_ST_OK(f->read_slice(*rows, *plan, got));
    std::vector<std::byte> want(plan->nbytes());
    plan->for_each_run([&](const SliceRun& r) {
      std::memcpy(want.data() + r.dest_offset, all_rows.data() + r.source_offset, r.length);
      return true;
    });
    ASSERT_EQ(got, want);
  }
  const SourceStats s = f->source()->stats();
  EXPECT_GT(s.direct_bytes, 0u);
  EXPECT_EQ(s.cached_bytes, 0u);
  EXPECT_FALSE(s.direct_refused);
  EXPECT_TRUE(f->source()->read_hints().uncached);
}

TEST_P(DirectAlignment, ThreadedEngineDeliversExactBytesDirectAndStaged) {
  TempDir dir;
  const Fixture fx = write_model(dir);
  auto f = File::open(fx.path, {.backend = Backend::kDirect});
  ASSERT_ST_OK(f);
  ASSERT_TRUE(reads_directly(*f));
  SlabPool pool(std::uint64_t{32} << 20, std::uint64_t{4} << 20);
  for (Delivery delivery : {Delivery::kStaged, Delivery::kDirect}) {
    std::vector<Piece> plan;
    std::vector<std::vector<std::byte>> out;
    for (const TensorInfo& t : f->tensors()) out.emplace_back(t.nbytes());
    for (std::size_t i = 0; i < f->tensors().size(); ++i) {
      auto p = tensor_piece(*f, f->tensors()[i]);
      ASSERT_ST_OK(p);
      p->delivery = delivery;
      if (delivery == Delivery::kDirect) p->dst = out[i];
      plan.push_back(*p);
    }
    // Rows of the 2-D tensor from a row that starts mid-block.
    const TensorInfo* rows = f->find("z_rows");
    auto part = row_piece(*f, *rows, 11, 1234);
    ASSERT_ST_OK(part);
    part->delivery = delivery;
    out.emplace_back(part->size());
    if (delivery == Delivery::kDirect) part->dst = out.back();
    plan.push_back(*part);
    auto pf = Prefetcher::start(*f, plan, {.threads = 4, .chunk_bytes = std::uint64_t{3} << 20, .pool = &pool});
    ASSERT_ST_OK(pf);
    for (;;) {
      auto ev = (*pf)->next();
      ASSERT_ST_OK(ev);
      if (ev->kind == PrefetchEvent::Kind::kEnd) break;
      if (ev->kind == PrefetchEvent::Kind::kStaged) {
        std::memcpy(out[ev->piece].data() + ev->offset, ev->bytes.data(), ev->bytes.size());
        ASSERT_ST_OK((*pf)->release(ev->slab));
      }
    }
    for (std::size_t i = 0; i < plan.size(); ++i) {
      ASSERT_TRUE(std::ranges::equal(out[i], std::span(fx.data).subspan(plan[i].begin, plan[i].size())))
          << "piece " << i << (delivery == Delivery::kStaged ? " staged" : " direct");
    }
  }
}

TEST(DirectCopies, AlignedDestinationsAreReadStraightIntoOthersThroughBounceMemory) {
  ScopedBounce straight(false);
  TempDir dir;
  const Fixture fx = write_model(dir);
  auto f = File::open(fx.path, {.backend = Backend::kDirect});
  ASSERT_ST_OK(f);
  ASSERT_TRUE(reads_directly(*f));
  const std::uint64_t unit = f->source()->read_hints().alignment;
  ASSERT_GE(unit, 512u);
  const TensorInfo* big = f->find("t18");  // 17 MiB + 5, at an unaligned offset
  ASSERT_NE(big, nullptr);
  ASSERT_NE((f->data_offset() + big->begin) % unit, 0u);

  // Congruent memory: only the unaligned head and tail go through bounce memory.
  Congruent lined_up = congruent(big->nbytes(), f->data_offset() + big->begin, 0);
  std::uint64_t before = f->source()->stats().bounced_bytes;
  ASSERT_ST_OK(f->read_into(*big, lined_up.bytes));
  EXPECT_LE(f->source()->stats().bounced_bytes - before, 2 * unit);
  // Through read_many its pieces are cut at aligned file offsets: still only the head and the tail.
  before = f->source()->stats().bounced_bytes;
  std::vector<ReadRequest> reqs = {{big, lined_up.bytes}};
  ASSERT_ST_OK(f->read_many(reqs, 3));
  EXPECT_LE(f->source()->stats().bounced_bytes - before, 2 * unit);
  ASSERT_TRUE(std::ranges::equal(lined_up.bytes, expected(fx, *big)));

  // Memory one byte off: everything bounces (and is still right).
  Congruent off_by_one = congruent(big->nbytes(), f->data_offset() + big->begin, 1);
  before = f->source()->stats().bounced_bytes;
  ASSERT_ST_OK(f->read_into(*big, off_by_one.bytes));
  EXPECT_EQ(f->source()->stats().bounced_bytes - before, big->nbytes());
  ASSERT_TRUE(std::ranges::equal(off_by_one.bytes, expected(fx, *big)));

  // The engine puts staged chunks in their slabs congruent with the file: a whole-file plan bounces only the
  // run's two edges.
  std::vector<Piece> plan;
  for (const TensorInfo& t : f->tensors()) plan.push_back(*tensor_piece(*f, t));
  SlabPool pool(std::uint64_t{32} << 20, std::uint64_t{4} << 20);
  before = f->source()->stats().bounced_bytes;
  auto pf = Prefetcher::start(*f, plan, {.threads = 2, .pool = &pool});
  ASSERT_ST_OK(pf);
  for (;;) {
    auto ev = (*pf)->next();
    ASSERT_ST_OK(ev);
    if (ev->kind == PrefetchEvent::Kind::kEnd) break;
    ASSERT_ST_OK((*pf)->release(ev->slab));
  }
  EXPECT_LE(f->source()->stats().bounced_bytes - before, 2 * unit);
}

TEST(DirectCopies, ADeviceThatSplitsScatteredReadsGetsEveryReadThroughBounceMemory) {
  ScopedBounce always(true);
  TempDir dir;
  const Fixture fx = write_model(dir);
  auto f = File::open(fx.path, {.backend = Backend::kDirect});
  ASSERT_ST_OK(f);
  ASSERT_TRUE(reads_directly(*f));
  // Aligned destinations would not help: the source does not ask for them.
  EXPECT_EQ(f->source()->read_hints().alignment, 0u);
  const TensorInfo* big = f->find("t18");
  Congruent lined_up = congruent(big->nbytes(), f->data_offset() + big->begin, 0);
  const std::uint64_t before = f->source()->stats().bounced_bytes;
  ASSERT_ST_OK(f->read_into(*big, lined_up.bytes));
  EXPECT_EQ(f->source()->stats().bounced_bytes - before, big->nbytes());
  ASSERT_TRUE(std::ranges::equal(lined_up.bytes, expected(fx, *big)));
}

// A syscall table whose O_DIRECT opens, or O_DIRECT reads, fail with EINVAL as a filesystem that refuses direct
// I/O makes them fail; counts the refusals.
std::atomic<int> g_refusals{0};
int refuse_direct_open(const char* path, int flags, mode_t mode) {
  if (flags & O_DIRECT) {
    ++g_refusals;
    errno = EINVAL;
    return -1;
  }
  return internal::real_syscalls().open(path, flags, mode);
}
ssize_t refuse_direct_read(int fd, void* buf, std::size_t n, off_t off) {
  const int fl = ::fcntl(fd, F_GETFL);
  if (fl >= 0 && (fl & O_DIRECT) != 0) {
    ++g_refusals;
    errno = EINVAL;
    return -1;
  }
  return internal::real_syscalls().pread(fd, buf, n, off);
}

void expect_whole_model(const Fixture& fx, const File& f) {
  std::vector<std::byte> all(fx.data.size());
  ASSERT_ST_OK(f.read_range(0, all, 2));
  EXPECT_EQ(all, fx.data);
}

TEST(DirectFallback, AFilesystemThatRefusesODirectAtOpenIsReadThroughTheCache) {
  TempDir dir;
  const Fixture fx = write_model(dir);
  internal::Syscalls refusing = internal::real_syscalls();
  refusing.open = refuse_direct_open;
  internal::ScopedSyscalls scope(refusing);
  g_refusals = 0;
  auto f = File::open(fx.path, {.backend = Backend::kDirect});
  ASSERT_ST_OK(f);
  EXPECT_GT(g_refusals.load(), 0);
  EXPECT_EQ(f->backend(), ReadPath::kPread);
  EXPECT_EQ(f->source()->kind(), "pread");
  expect_whole_model(fx, *f);
  const SourceStats s = f->source()->stats();
  EXPECT_TRUE(s.direct_refused);
  EXPECT_EQ(s.direct_bytes, 0u);
  EXPECT_GE(s.cached_bytes, fx.data.size());
  std::uint64_t bytes = 0;
  int refused = 0;
  safetensors_file_t* c = nullptr;
  ASSERT_EQ(safetensors_open(fx.path.c_str(), SAFETENSORS_BACKEND_DIRECT, &c, nullptr), SAFETENSORS_OK);
  EXPECT_EQ(safetensors_file_backend(c), SAFETENSORS_BACKEND_PREAD);
  EXPECT_STREQ(safetensors_file_source_kind(c), "pread");
  safetensors_file_direct_stats(c, &bytes, nullptr, nullptr, &refused, nullptr);
  EXPECT_EQ(bytes, 0u);
  EXPECT_EQ(refused, 1);
  std::uint64_t counter = 7;
  EXPECT_EQ(safetensors_file_source_counter(c, "direct_refused", 14, &counter), 1);
  EXPECT_EQ(counter, 1u);
  EXPECT_EQ(safetensors_file_source_counter(c, "direct_refusedX", 15, &counter), 0);
  EXPECT_EQ(safetensors_file_source_counter(c, "direct", 6, &counter), 0);
  EXPECT_EQ(counter, 1u);
  safetensors_file_free(c);
}

TEST(DirectFallback, AFilesystemThatRefusesTheFirstDirectReadIsReadThroughTheCacheFromThen) {
  TempDir dir;
  const Fixture fx = write_model(dir);
  internal::Syscalls refusing = internal::real_syscalls();
  refusing.pread = refuse_direct_read;
  internal::ScopedSyscalls scope(refusing);
  g_refusals = 0;
  // The header is the first read: refused, then read through the cache.
  auto f = File::open(fx.path, {.backend = Backend::kDirect});
  ASSERT_ST_OK(f);
  EXPECT_EQ(g_refusals.load(), 1);
  EXPECT_EQ(f->backend(), ReadPath::kPread);
  expect_whole_model(fx, *f);
  EXPECT_EQ(g_refusals.load(), 1);  // no direct read was tried again
  const SourceStats s = f->source()->stats();
  EXPECT_TRUE(s.direct_refused);
  EXPECT_EQ(f->source()->kind(), "pread");
  EXPECT_EQ(f->source()->read_hints().alignment, 0u);
}

TEST(DirectFallback, TmpfsIsReadWhicheverWayTheKernelAllowsWithoutAnError) {
  struct statfs sfs;
  if (::statfs("/dev/shm", &sfs) != 0 || sfs.f_type != 0x01021994 /* TMPFS_MAGIC */) {
    GTEST_SKIP() << "no tmpfs at /dev/shm";
  }
  TempDir disk;
  const Fixture fx = write_model(disk);
  const std::string shm = "/dev/shm/st_direct_test_" + std::to_string(::getpid()) + ".safetensors";
  test::write_bytes(shm, test::read_bytes(fx.path));
  auto f = File::open(shm, {.backend = Backend::kDirect});
  ASSERT_ST_OK(f);
  expect_whole_model(fx, *f);
  const SourceStats s = f->source()->stats();
  // Linux 6.6 and later accept O_DIRECT on tmpfs (it reads from memory either way); before, it is refused.
  EXPECT_TRUE(s.direct_refused ? s.cached_bytes >= fx.data.size() : s.direct_bytes >= fx.data.size())
      << "refused " << s.direct_refused << " direct " << s.direct_bytes << " cached " << s.cached_bytes;
  // Resident, as tmpfs always is: kAuto reads it through the cache (where it is large enough to ask).
  auto a = File::open(shm, {.backend = Backend::kAuto});
  ASSERT_ST_OK(a);
  EXPECT_EQ(a->backend(), ReadPath::kPread);
  expect_whole_model(fx, *a);
  ::unlink(shm.c_str());
}

// Residency of `path` in the page cache, by mincore over a mapping (we own the file).
double resident_fraction(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  struct stat st;
  ::fstat(fd, &st);
  const std::size_t size = static_cast<std::size_t>(st.st_size);
  void* p = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
  ::close(fd);
  const std::size_t page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  std::vector<unsigned char> vec((size + page - 1) / page);
  ::mincore(p, size, vec.data());
  ::munmap(p, size);
  std::size_t n = 0;
  for (unsigned char v : vec) n += v & 1;
  return static_cast<double>(n) / static_cast<double>(vec.size());
}

void evict(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  ::fdatasync(fd);
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
}

void warm(const std::string& path) { (void)test::read_bytes(path); }

// A file of at least kAutoDirectMinBytes, fsynced.
std::string write_big(const TempDir& dir) {
  const std::uint64_t n = kAutoDirectMinBytes + (std::uint64_t{1} << 20) + 3;
  std::vector<std::byte> data(n);
  for (std::uint64_t i = 0; i < n; ++i) data[i] = pattern(i);
  const std::string path = dir.file("big.safetensors");
  std::vector<TensorData> tensors = {{"w", Dtype::kU8, {n}, data}};
  auto st = save_file(path, tensors, std::nullopt, {.fsync = true});
  EXPECT_TRUE(st.ok()) << st.error().to_string();
  return path;
}

int no_cachestat(int, internal::CachestatRange*, internal::Cachestat*, unsigned) {
  errno = ENOSYS;
  return -1;
}
int no_mincore(void*, std::size_t, unsigned char*) {
  errno = ENOMEM;
  return -1;
}

class AutoChoice : public ::testing::TestWithParam<std::string_view> {};

TEST_P(AutoChoice, ACachedFileIsReadThroughTheCacheAnEvictedOneDirectly) {
  TempDir dir;
  const std::string path = write_big(dir);
  internal::Syscalls probes = internal::real_syscalls();
  if (GetParam() != "cachestat") probes.cachestat = no_cachestat;
  if (GetParam() == "nowait") probes.mincore = no_mincore;
  if (GetParam() == "cachestat") {
    // Asked of the kernel directly: before Linux 6.5, and under qemu-user (the big-endian stage), there is none.
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    ASSERT_GE(fd, 0);
    internal::CachestatRange range{0, 0};
    internal::Cachestat cs{};
    const bool has_cachestat = probes.cachestat(fd, &range, &cs, 0) == 0;
    ::close(fd);
    if (!has_cachestat) GTEST_SKIP() << "no cachestat(2) here";
  }
  internal::ScopedSyscalls scope(probes);

  // Another process's I/O can take a few of the file's pages back out of the cache right after a warm read
  // (seen under the sanitizer stage's parallel tests): warm again, a bounded number of times.
  warm(path);
  for (int attempt = 0; attempt < 4 && resident_fraction(path) <= 0.99; ++attempt) warm(path);
  if (resident_fraction(path) <= 0.99) GTEST_SKIP() << "the page cache does not keep " << path << " whole here";
  auto cached = File::open(path, {.backend = Backend::kAuto});
  ASSERT_ST_OK(cached);
  SourceStats s = cached->source()->stats();
  if (s.residency_probe.empty()) GTEST_SKIP() << "no residency probe works here";
  ASSERT_EQ(s.residency_probe, GetParam());
  EXPECT_GE(s.resident_bytes, cached->size() * 9 / 10);
  EXPECT_EQ(cached->backend(), ReadPath::kPread);
  EXPECT_EQ(cached->source()->kind(), "pread");

  evict(path);
  if (resident_fraction(path) > 0.05) GTEST_SKIP() << "posix_fadvise(DONTNEED) did not evict " << path;
  auto cold = File::open(path, {.backend = Backend::kAuto});
  ASSERT_ST_OK(cold);
  s = cold->source()->stats();
  EXPECT_EQ(s.residency_probe, GetParam());
  EXPECT_LT(s.resident_bytes, cold->size() / 10);
  EXPECT_EQ(cold->backend(), ReadPath::kDirect);
  EXPECT_EQ(cold->source()->kind(), "direct");
  // Read directly: the file stays out of the cache.
  std::vector<std::byte> w(cold->tensors()[0].nbytes());
  ASSERT_ST_OK(cold->read_into("w", w));
  for (std::uint64_t i = 0; i < w.size(); i += 4099) ASSERT_EQ(w[i], pattern(i)) << i;
  EXPECT_LT(resident_fraction(path), 0.05);
  EXPECT_EQ(cold->source()->stats().cached_bytes, 0u);
}

INSTANTIATE_TEST_SUITE_P(Probes, AutoChoice, ::testing::Values("cachestat", "mincore", "nowait"),
                         [](const auto& info) { return std::string(info.param); });

TEST(AutoChoiceSmall, AFileBelowTheThresholdIsReadThroughTheCacheWithoutAProbe) {
  TempDir dir;
  const Fixture fx = write_model(dir);
  evict(fx.path);
  auto f = File::open(fx.path, {.backend = Backend::kAuto});
  ASSERT_ST_OK(f);
  EXPECT_EQ(f->backend(), ReadPath::kPread);
  EXPECT_TRUE(f->source()->stats().residency_probe.empty());
  expect_whole_model(fx, *f);
}

TEST(WithBackend, ReadsTheSameOpenFileAnotherWaySharingTheHeader) {
  TempDir dir;
  const Fixture fx = write_model(dir);
  auto mapped = File::open(fx.path, {.backend = Backend::kMmap});
  ASSERT_ST_OK(mapped);
  // The path now names another file: the reopened source still reads the one that was opened.
  const std::string other = dir.file("other.safetensors");
  std::vector<std::byte> zeros(16);
  std::vector<TensorData> replacement = {{"x", Dtype::kU8, {16}, zeros}};
  ASSERT_ST_OK(save_file(other, replacement));
  ASSERT_EQ(::rename(other.c_str(), fx.path.c_str()), 0);

  auto direct = mapped->with_backend(Backend::kDirect);
  ASSERT_ST_OK(direct);
  EXPECT_EQ(direct->backend(), ReadPath::kDirect);
  EXPECT_EQ(&direct->tensors(), &mapped->tensors());
  EXPECT_EQ(direct->find("t15"), mapped->find("t15"));
  expect_whole_model(fx, *direct);
  auto back = direct->with_backend(Backend::kPread);
  ASSERT_ST_OK(back);
  EXPECT_EQ(back->backend(), ReadPath::kPread);
  expect_whole_model(fx, *back);

  // A memory source has no other way: the same File.
  auto mem = test::open_bytes(test::read_bytes(dir.file("m.safetensors")));
  ASSERT_ST_OK(mem);
  auto same = mem->with_backend(Backend::kDirect);
  ASSERT_ST_OK(same);
  EXPECT_EQ(same->source(), mem->source());
}

// EIO at a chosen file offset, for the O_DIRECT descriptor or the buffered one.
std::atomic<std::int64_t> g_eio_at{-1};
std::atomic<bool> g_eio_direct{true};
ssize_t eio_read(int fd, void* buf, std::size_t n, off_t off) {
  const int fl = ::fcntl(fd, F_GETFL);
  const bool direct = fl >= 0 && (fl & O_DIRECT) != 0;
  const std::int64_t at = g_eio_at.load();
  if (direct == g_eio_direct.load() && at >= off && at < off + static_cast<std::int64_t>(n)) {
    errno = EIO;
    return -1;
  }
  return internal::real_syscalls().pread(fd, buf, n, off);
}

TEST(DirectErrors, EioGivesTheSameErrorAsABufferedRead) {
  TempDir dir;
  const Fixture fx = write_model(dir);
  auto direct = File::open(fx.path, {.backend = Backend::kDirect});
  auto buffered = File::open(fx.path, {.backend = Backend::kPread});
  ASSERT_ST_OK(direct);
  ASSERT_ST_OK(buffered);
  ASSERT_TRUE(reads_directly(*direct));
  const TensorInfo* t = direct->find("t15");
  internal::Syscalls faulty = internal::real_syscalls();
  faulty.pread = eio_read;
  internal::ScopedSyscalls scope(faulty);
  g_eio_at = static_cast<std::int64_t>(direct->data_offset() + t->begin + 70000);
  std::vector<std::byte> dst(t->nbytes());
  g_eio_direct = true;
  const Status d = direct->read_into(*t, dst);
  g_eio_direct = false;
  const Status b = buffered->read_into(*t, dst);
  g_eio_at = -1;
  ASSERT_FALSE(d.ok());
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(d.error().kind(), Error::Kind::kIo);
  EXPECT_EQ(d.error().to_string(), b.error().to_string());
  EXPECT_NE(d.error().to_string().find("Input/output error"), std::string::npos) << d.error().to_string();
  EXPECT_FALSE(direct->source()->stats().direct_refused);
}

}  // namespace
}  // namespace safetensors
