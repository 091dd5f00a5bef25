// The writer: golden bytes, the plan's order and escaping, round trips for every dtype, and the atomic,
// streaming publish (permissions, failures leave the target untouched, saving over a mapped file).
#include "safetensors/writer.h"

#include <sys/stat.h>

#include <cerrno>
#include <filesystem>

#include "io/posix.h"
#include "test_util.h"

namespace safetensors {
namespace {

using test::as_bytes;
using test::read_bytes;
using test::TempDir;
using test::to_string;

TensorData tensor(std::string name, Dtype dtype, std::vector<std::uint64_t> shape, std::span<const std::byte> data) {
  return TensorData{std::move(name), dtype, std::move(shape), data};
}

std::string serialize_str(std::span<const TensorData> tensors, const std::optional<Metadata>& md = {}) {
  auto out = serialize(tensors, md);
  EXPECT_TRUE(out.ok()) << out.error().to_string();
  return out.ok() ? to_string(*out) : std::string();
}

TEST(WriterTest, GoldenBytesFromCompat) {
  std::vector<std::byte> zeros(16, std::byte{0});
  TensorData t = tensor("test", Dtype::kI32, {2, 2}, zeros);
  const std::string json = R"({"test":{"dtype":"I32","shape":[2,2],"data_offsets":[0,16]}})";
  std::string expected("\x40\0\0\0\0\0\0\0", 8);
  expected += json + "    " + std::string(16, '\0');
  EXPECT_EQ(serialize_str({&t, 1}), expected);
  EXPECT_EQ(expected.size(), 8u + 64u + 16u);

  std::string empty("\x08\0\0\0\0\0\0\0{}      ", 16);
  EXPECT_EQ(serialize_str({}), empty);
}

TEST(WriterTest, SortsByDtypeRankDescendingThenNameBytes) {
  std::vector<std::byte> b(16);
  std::vector<TensorData> ts = {
      tensor("x", Dtype::kF32, {1}, std::span(b).first(4)), tensor("a", Dtype::kF32, {0}, {}),
      tensor("B", Dtype::kU8, {2}, std::span(b).first(2)),  tensor("b", Dtype::kU64, {2}, std::span(b).first(16)),
      tensor("s", Dtype::kI8, {}, std::span(b).first(1)),   tensor("\xc3\xa9", Dtype::kF32, {1}, std::span(b).first(4)),
  };
  const std::string s = serialize_str(ts);
  const std::string json =
      R"({"b":{"dtype":"U64","shape":[2],"data_offsets":[0,16]},"a":{"dtype":"F32","shape":[0],"data_offsets":[16,16]},)"
      R"("x":{"dtype":"F32","shape":[1],"data_offsets":[16,20]},"\u00e9":{"dtype":"F32","shape":[1],"data_offsets":[20,24]},)"
      R"("s":{"dtype":"I8","shape":[],"data_offsets":[24,25]},"B":{"dtype":"U8","shape":[2],"data_offsets":[25,27]}})";
  // Non-ASCII names are written raw, so the expected header spells é as UTF-8 bytes.
  std::string raw_json = json;
  raw_json.replace(raw_json.find("\\u00e9"), 6, "\xc3\xa9");
  EXPECT_EQ(s.substr(8, raw_json.size()), raw_json);
  EXPECT_EQ((8 + s.size() - 27) % 8, 0u);
}

TEST(WriterTest, MetadataFirstAndEscaping) {
  Metadata md = {{"k\"\\", "\n\t\r\b\f\x01\x1f\x7f\xc3\xa9/"}};
  const std::string s = serialize_str({}, md);
  EXPECT_EQ(s.substr(8, s.find('}') + 2 - 8),
            "{\"__metadata__\":{\"k\\\"\\\\\":\"\\n\\t\\r\\b\\f\\u0001\\u001f\x7f\xc3\xa9/\"}}");
  // An empty metadata map is written; none is omitted.
  EXPECT_EQ(serialize_str({}, Metadata{}).substr(8, 19), R"({"__metadata__":{}})");
  // What was written reads back identically.
  auto f = test::open_bytes(s);
  ASSERT_ST_OK(f);
  EXPECT_EQ(*f->metadata(), md);
}

TEST(WriterTest, PlanRejectsBadInput) {
  std::vector<std::byte> b(8);
  std::vector<TensorData> dup = {tensor("a", Dtype::kU8, {1}, std::span(b).first(1)),
                                 tensor("a", Dtype::kU8, {1}, std::span(b).first(1))};
  EXPECT_ST_ERROR(WritePlan::make(dup, {}), kInvalidArgument);
  std::vector<TensorData> reserved = {tensor("__metadata__", Dtype::kU8, {1}, std::span(b).first(1))};
  EXPECT_ST_ERROR(WritePlan::make(reserved, {}), kInvalidArgument);
  // A size mismatch (kTensorInvalidInfo): writer_size_mismatch_kind_test.cc.
  std::vector<TensorData> misaligned = {tensor("a", Dtype::kF4, {3}, std::span(b).first(1))};
  EXPECT_ST_ERROR(WritePlan::make(misaligned, {}), kMisalignedSlice);
  std::vector<TensorData> overflow = {tensor("a", Dtype::kF64, {1ull << 62, 4}, {})};
  EXPECT_ST_ERROR(WritePlan::make(overflow, {}), kValidationOverflow);
  Metadata dup_md = {{"k", "1"}, {"k", "2"}};
  EXPECT_ST_ERROR(WritePlan::make({}, dup_md), kInvalidArgument);
  EXPECT_ST_ERROR(WritePlan::make({}, Metadata{{std::string(64, 'x'), "v"}}, 32), kHeaderTooLarge);
}

// Every dtype, with empty and scalar tensors, through memory and through files on both backends.
TEST(WriterTest, RoundTripsEveryDtype) {
  TempDir dir;
  std::vector<std::vector<std::byte>> storage;
  std::vector<TensorData> ts;
  std::uint32_t seed = 1;
  for (const DtypeInfo& row : kDtypeTable) {
    // Shapes whose bit count is whole for every dtype (F4 needs an even count, F6 a multiple of 4).
    for (std::vector<std::uint64_t> shape : {std::vector<std::uint64_t>{4, 8}, {0}, {3, 0, 2}, {8}, {}}) {
      std::uint64_t numel = 1;
      for (auto d : shape) numel *= d;
      if ((numel * row.bits) % 8 != 0) continue;  // a scalar F4/F6 cannot exist
      storage.push_back(test::random_bytes(numel * row.bits / 8, seed++));
      std::string name = std::string(row.code) + "_" + std::to_string(shape.size()) + "d_" + std::to_string(numel);
      ts.push_back(tensor(name, row.dtype, shape, storage.back()));
    }
  }
  const Metadata md = {{"format", "pt"}};
  auto bytes = serialize(ts, md);
  ASSERT_ST_OK(bytes);
  const std::string path = dir.file("all.safetensors");
  ASSERT_ST_OK(save_file(path, ts, md));
  EXPECT_EQ(read_bytes(path), to_string(*bytes));

  for (Backend backend : {Backend::kMmap, Backend::kPread}) {
    auto f = File::open(path, {.backend = backend});
    ASSERT_ST_OK(f);
    EXPECT_EQ(f->backend(), test::read_path_of(backend));
    EXPECT_EQ(*f->metadata(), md);
    ASSERT_EQ(f->tensors().size(), ts.size());
    for (const TensorData& t : ts) {
      auto info = f->info(t.name);
      ASSERT_ST_OK(info);
      EXPECT_EQ((*info)->dtype, t.dtype);
      EXPECT_EQ(test::shape_of(**info), t.shape);
      std::vector<std::byte> got((*info)->nbytes());
      ASSERT_ST_OK(f->read_into(t.name, got));
      EXPECT_TRUE(std::equal(got.begin(), got.end(), t.data.begin(), t.data.end())) << t.name;
    }
  }
}

TEST(WriterTest, NewFilesGetTheUmaskDefaultAndExistingTargetsKeepTheirMode) {
  TempDir dir;
  const mode_t old = ::umask(022);
  const std::string path = dir.file("m.safetensors");
  ASSERT_ST_OK(save_file(path, {}));
  struct stat st;
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0644u);
  ASSERT_EQ(::chmod(path.c_str(), 0640), 0);
  ASSERT_ST_OK(save_file(path, {}, Metadata{{"v", "2"}}));
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0640u);
  ::umask(old);
}

std::size_t count_files(const TempDir& dir) {
  return static_cast<std::size_t>(std::distance(std::filesystem::directory_iterator(dir.path()), {}));
}

TEST(WriterTest, FailedSavesLeaveThePreviousFileUntouched) {
  TempDir dir;
  const std::string path = dir.file("keep.safetensors");
  ASSERT_ST_OK(save_file(path, {}, Metadata{{"v", "old"}}));
  const std::string before = read_bytes(path);
  std::vector<std::byte> data(1 << 20, std::byte{7});
  std::vector<TensorData> ts = {tensor("w", Dtype::kU8, {1 << 20}, data)};

  {  // ENOSPC in the middle of the data.
    static std::atomic<int> calls{0};
    calls = 0;
    internal::Syscalls faulty = internal::real_syscalls();
    faulty.pwrite = [](int fd, const void* buf, std::size_t n, off_t off) -> ssize_t {
      if (++calls >= 2) {
        errno = ENOSPC;
        return -1;
      }
      return internal::real_syscalls().pwrite(fd, buf, n, off);
    };
    internal::ScopedSyscalls scope(faulty);
    auto st = save_file(path, ts, Metadata{{"v", "new"}});
    EXPECT_ST_ERROR(st, kIo);
    EXPECT_NE(st.error().message().find("No space left on device"), std::string::npos);
  }
  EXPECT_EQ(read_bytes(path), before);
  EXPECT_EQ(count_files(dir), 1u);  // the temporary file is gone

  {  // fsync fails.
    internal::Syscalls faulty = internal::real_syscalls();
    faulty.fsync = [](int) -> int {
      errno = EIO;
      return -1;
    };
    internal::ScopedSyscalls scope(faulty);
    EXPECT_ST_ERROR(save_file(path, ts, {}, {.fsync = true}), kIo);
  }
  EXPECT_EQ(read_bytes(path), before);
  EXPECT_EQ(count_files(dir), 1u);

  {  // rename fails.
    internal::Syscalls faulty = internal::real_syscalls();
    faulty.rename = [](const char*, const char*) -> int {
      errno = EXDEV;
      return -1;
    };
    internal::ScopedSyscalls scope(faulty);
    EXPECT_ST_ERROR(save_file(path, ts), kIo);
  }
  EXPECT_EQ(read_bytes(path), before);
  EXPECT_EQ(count_files(dir), 1u);

  // A plan failure never touches the disk.
  std::vector<TensorData> bad = {tensor("w", Dtype::kF32, {3}, data)};
  EXPECT_ST_ERROR(save_file(path, bad), kTensorInvalidInfo);
  EXPECT_EQ(read_bytes(path), before);

  // A missing directory is reported as such.
  EXPECT_ST_ERROR(save_file(dir.file("no/such/dir/x.safetensors"), ts), kNotFound);
  // A directory in the way is not replaced.
  std::filesystem::create_directory(dir.file("adir"));
  EXPECT_ST_ERROR(save_file(dir.file("adir"), ts), kIo);
}

TEST(WriterTest, FsyncOptionWritesAndSyncs) {
  TempDir dir;
  static std::atomic<int> syncs{0};
  syncs = 0;
  internal::Syscalls counting = internal::real_syscalls();
  counting.fsync = [](int fd) -> int {
    ++syncs;
    return internal::real_syscalls().fsync(fd);
  };
  internal::ScopedSyscalls scope(counting);
  ASSERT_ST_OK(save_file(dir.file("a"), {}, {}, {.fsync = true}));
  EXPECT_EQ(syncs.load(), 2);  // the file, then its directory
  ASSERT_ST_OK(save_file(dir.file("b"), {}, {}, {.fsync = false}));
  EXPECT_EQ(syncs.load(), 2);
}

TEST(WriterTest, FileWriterProtocol) {
  TempDir dir;
  const std::string path = dir.file("p.safetensors");
  std::vector<std::byte> a(16, std::byte{1}), b(4, std::byte{2});
  std::vector<TensorData> ts = {tensor("a", Dtype::kF64, {2}, a), tensor("b", Dtype::kF32, {1}, b)};
  auto plan = WritePlan::make(ts, {});
  ASSERT_ST_OK(plan);
  {
    auto w = FileWriter::create(path, *plan);
    ASSERT_ST_OK(w);
    EXPECT_ST_ERROR(w->write(0, b), kInvalidArgument);  // wrong size
    EXPECT_ST_ERROR(w->write(5, b), kInvalidArgument);  // no such input
    ASSERT_ST_OK(w->write(1, b));                       // any order
    EXPECT_ST_ERROR(w->finish(), kInvalidArgument);     // input 0 missing: abandoned
    EXPECT_FALSE(std::filesystem::exists(path));
    EXPECT_EQ(count_files(dir), 0u);
  }
  {
    auto w = FileWriter::create(path, *plan);
    ASSERT_ST_OK(w);
    ASSERT_ST_OK(w->write_part(0, 8, std::span(a).subspan(8)));
    // Parts hold whole elements on every host (a big-endian one swaps each part on its own).
    EXPECT_ST_ERROR(w->write_part(0, 0, std::span(a).first(4)), kInvalidArgument);
    EXPECT_ST_ERROR(w->write_part(0, 4, std::span(a).first(8)), kInvalidArgument);
    ASSERT_ST_OK(w->write_part(0, 0, std::span(a).first(8)));
    EXPECT_ST_ERROR(w->write_part(0, 8, std::span(a).first(16)), kInvalidArgument);  // past the end
    ASSERT_ST_OK(w->write(1, b));
    ASSERT_ST_OK(w->finish());
  }
  auto bytes = serialize(ts);
  ASSERT_ST_OK(bytes);
  EXPECT_EQ(read_bytes(path), to_string(*bytes));
  {
    auto w = FileWriter::create(dir.file("q"), *plan);
    ASSERT_ST_OK(w);
    w->abandon();
    EXPECT_FALSE(std::filesystem::exists(dir.file("q")));
  }
  EXPECT_EQ(count_files(dir), 1u);
}

TEST(WriterTest, SavingOverAMappedFileKeepsOldViewsIntact) {
  TempDir dir;
  const std::string path = dir.file("mapped.safetensors");
  std::vector<std::byte> old_data(1 << 16, std::byte{0x11}), new_data(1 << 16, std::byte{0x22});
  std::vector<TensorData> old_ts = {tensor("w", Dtype::kU8, {1 << 16}, old_data)};
  ASSERT_ST_OK(save_file(path, old_ts));
  auto f = File::open(path, {.backend = Backend::kMmap});
  ASSERT_ST_OK(f);
  ASSERT_EQ(f->backend(), ReadPath::kMmap);
  auto view = f->view("w");
  ASSERT_ST_OK(view);
  // The caller may even save data that lives in the old mapping.
  std::vector<TensorData> from_mapping = {tensor("w", Dtype::kU8, {1 << 16}, view->bytes)};
  ASSERT_ST_OK(save_file(path, from_mapping, Metadata{{"gen", "2"}}));
  std::vector<TensorData> new_ts = {tensor("w", Dtype::kU8, {1 << 16}, new_data)};
  ASSERT_ST_OK(save_file(path, new_ts));
  EXPECT_TRUE(std::all_of(view->bytes.begin(), view->bytes.end(), [](std::byte b) { return b == std::byte{0x11}; }));
  auto g = File::open(path);
  ASSERT_ST_OK(g);
  auto v2 = g->view("w");
  ASSERT_ST_OK(v2);
  EXPECT_TRUE(std::all_of(v2->bytes.begin(), v2->bytes.end(), [](std::byte b) { return b == std::byte{0x22}; }));
}

}  // namespace
}  // namespace safetensors

namespace safetensors {
namespace {

TEST(WriterTest, SavesLargeTensorsInParallelPieces) {
  test::TempDir dir;
  std::vector<std::byte> big = test::random_bytes(40u << 20, 11), mid = test::random_bytes(9u << 20, 12),
                         small = test::random_bytes(100, 13);
  std::vector<TensorData> ts = {{"big", Dtype::kU8, {big.size()}, big},
                                {"mid", Dtype::kU8, {mid.size()}, mid},
                                {"small", Dtype::kU8, {small.size()}, small},
                                {"empty", Dtype::kF32, {0}, {}}};
  const std::string path = dir.file("p.safetensors");
  ASSERT_ST_OK(save_file(path, ts));
  auto expected = serialize(ts);
  ASSERT_ST_OK(expected);
  EXPECT_EQ(test::read_bytes(path), test::to_string(*expected));
}

}  // namespace
}  // namespace safetensors
