// Opening files on every backend, zero-copy views and their lifetimes, reads, parallel reads and files that
// change under us.
#include "safetensors/file.h"

#include <unistd.h>

#include <filesystem>
#include <thread>

#include "safetensors/writer.h"
#include "test_util.h"

namespace safetensors {
namespace {

using test::TempDir;

struct Fixture {
  std::vector<std::vector<std::byte>> data;
  std::vector<TensorData> tensors;
};

// n tensors of varied dtypes and sizes with deterministic contents.
Fixture make_tensors(int n, std::size_t big = 0) {
  Fixture fx;
  fx.data.reserve(n + 1);
  for (int i = 0; i < n; ++i) {
    const Dtype dt = (i % 3 == 0) ? Dtype::kF32 : (i % 3 == 1) ? Dtype::kBF16 : Dtype::kI64;
    const std::uint64_t rows = 1 + i % 7, cols = 3 + i % 5;
    fx.data.push_back(test::random_bytes(rows * cols * dtype_bits(dt) / 8, 100 + i));
    fx.tensors.push_back({"layer." + std::to_string(i) + ".weight", dt, {rows, cols}, fx.data.back()});
  }
  if (big) {
    fx.data.push_back(test::random_bytes(big, 7));
    fx.tensors.push_back({"big", Dtype::kU8, {big}, fx.data.back()});
  }
  return fx;
}

std::string save(const TempDir& dir, const Fixture& fx, const char* name = "f.safetensors") {
  const std::string path = dir.file(name);
  auto st = save_file(path, fx.tensors, Metadata{{"format", "pt"}});
  EXPECT_TRUE(st.ok()) << st.error().to_string();
  return path;
}

bool same(std::span<const std::byte> a, std::span<const std::byte> b) {
  return std::equal(a.begin(), a.end(), b.begin(), b.end());
}

TEST(FileTest, MissingFileAndDirectory) {
  TempDir dir;
  auto f = File::open(dir.file("missing.safetensors"));
  EXPECT_ST_ERROR(f, kNotFound);
  EXPECT_EQ(f.error().message(), "No such file or directory: " + dir.file("missing.safetensors"));
  EXPECT_ST_ERROR(File::open(dir.path().string()), kIo);
}

TEST(FileTest, OpensOnEveryBackendWithTheSameContents) {
  TempDir dir;
  Fixture fx = make_tensors(20);
  const std::string path = save(dir, fx);
  auto bytes = std::make_shared<std::string>(test::read_bytes(path));
  std::vector<File> files;
  for (Backend b : {Backend::kMmap, Backend::kPread}) {
    auto f = File::open(path, {.backend = b});
    ASSERT_ST_OK(f);
    EXPECT_EQ(f->backend(), test::read_path_of(b));
    files.push_back(*f);
  }
  auto m = File::open(memory_source(test::as_bytes(*bytes), bytes, "mem"));
  ASSERT_ST_OK(m);
  EXPECT_EQ(m->backend(), ReadPath::kMemory);
  EXPECT_EQ(m->path(), "mem");
  files.push_back(*m);

  for (const File& f : files) {
    EXPECT_EQ(f.tensors().size(), fx.tensors.size());
    EXPECT_EQ(f.metadata()->at(0).second, "pt");
    auto keys = f.keys();
    EXPECT_TRUE(std::is_sorted(keys.begin(), keys.end()));
    EXPECT_EQ(f.size(), bytes->size());
    for (const TensorData& t : fx.tensors) {
      auto info = f.info(t.name);
      ASSERT_ST_OK(info);
      std::vector<std::byte> got((*info)->nbytes());
      ASSERT_ST_OK(f.read_into(**info, got));
      EXPECT_TRUE(same(got, t.data));
      auto view = f.view(t.name);
      if (f.backend() == ReadPath::kPread) {
        EXPECT_ST_ERROR(view, kInvalidArgument);
      } else {
        ASSERT_ST_OK(view);
        EXPECT_TRUE(same(test::native_copy(view->bytes, t.dtype), t.data));
        EXPECT_EQ(view->writable, f.backend() == ReadPath::kMmap);
      }
    }
    auto missing = f.info("nope");
    EXPECT_ST_ERROR(missing, kTensorNotFound);
    EXPECT_EQ(missing.error().message(), "File does not contain tensor nope");
    std::vector<std::byte> wrong(3);
    EXPECT_ST_ERROR(f.read_into("layer.0.weight", wrong), kInvalidArgument);
    EXPECT_ST_ERROR(f.read_into("nope", wrong), kTensorNotFound);
  }
}

TEST(FileTest, ViewsOutliveTheFileAndReleaseTheMappingWithTheLastView) {
  TempDir dir;
  Fixture fx = make_tensors(3);
  const std::string path = save(dir, fx);
  const std::uint64_t before = testing::live_mappings();
  TensorView view;
  {
    auto f = File::open(path);
    ASSERT_ST_OK(f);
    EXPECT_EQ(testing::live_mappings(), before + 1);
    auto v = f->view("layer.1.weight");
    ASSERT_ST_OK(v);
    view = *v;
  }
  EXPECT_EQ(testing::live_mappings(), before + 1);  // the view keeps it
  EXPECT_TRUE(same(test::native_copy(view.bytes, fx.tensors[1].dtype), fx.tensors[1].data));
  // Writing through a copy-on-write view never reaches the file.
  const std::string on_disk = test::read_bytes(path);
  const_cast<std::byte&>(view.bytes[0]) = ~view.bytes[0];
  EXPECT_EQ(test::read_bytes(path), on_disk);
  view = {};
  EXPECT_EQ(testing::live_mappings(), before);
}

TEST(FileTest, ForcePreadHookAndEmptyFiles) {
  TempDir dir;
  const std::string path = save(dir, make_tensors(2));
  testing::set_force_pread(true);
  auto f = File::open(path, {.backend = Backend::kMmap});
  testing::set_force_pread(false);
  ASSERT_ST_OK(f);
  EXPECT_EQ(f->backend(), ReadPath::kPread);
  test::write_bytes(dir.file("empty"), "");
  EXPECT_ST_ERROR(File::open(dir.file("empty")), kHeaderTooSmall);
}

TEST(FileTest, ReadManyInParallelOnBothBackends) {
  TempDir dir;
  Fixture fx = make_tensors(50, 40u << 20);  // a 40 MiB tensor is split across threads
  const std::string path = save(dir, fx);
  for (Backend b : {Backend::kMmap, Backend::kPread}) {
    auto f = File::open(path, {.backend = b});
    ASSERT_ST_OK(f);
    for (unsigned threads : {0u, 1u, 3u, 8u}) {
      std::vector<std::vector<std::byte>> out;
      std::vector<ReadRequest> reqs;
      out.reserve(fx.tensors.size());
      for (const TensorData& t : fx.tensors) {
        const TensorInfo* info = f->find(t.name);
        out.emplace_back(info->nbytes());
        reqs.push_back({info, out.back()});
      }
      ASSERT_ST_OK(f->read_many(reqs, threads));
      for (std::size_t i = 0; i < fx.tensors.size(); ++i) EXPECT_TRUE(same(out[i], fx.tensors[i].data));
    }
    std::vector<std::byte> small(1);
    ReadRequest bad{f->find("big"), small};
    EXPECT_ST_ERROR(f->read_many({&bad, 1}), kInvalidArgument);
  }
}

TEST(FileTest, EightThreadsReadOnePreadFileConcurrently) {
  TempDir dir;
  Fixture fx = make_tensors(64, 4u << 20);
  const std::string path = save(dir, fx);
  auto f = File::open(path, {.backend = Backend::kPread});
  ASSERT_ST_OK(f);
  std::atomic<int> mismatches{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      for (int round = 0; round < 20; ++round) {
        for (std::size_t i = t; i < fx.tensors.size(); i += 3) {
          const TensorData& td = fx.tensors[i];
          std::vector<std::byte> got(td.data.size());
          if (!f->read_into(td.name, got).ok() || !same(got, td.data)) ++mismatches;
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(mismatches.load(), 0);
}

TEST(FileTest, AFileThatShrinksAfterOpenGivesAnErrorOnThePreadPath) {
  TempDir dir;
  Fixture fx = make_tensors(4, 1u << 20);
  const std::string path = save(dir, fx);
  auto f = File::open(path, {.backend = Backend::kPread});
  ASSERT_ST_OK(f);
  ASSERT_EQ(::truncate(path.c_str(), static_cast<off_t>(f->data_offset() + 16)), 0);
  std::vector<std::byte> got(1u << 20);
  auto st = f->read_into("big", got);
  EXPECT_ST_ERROR(st, kIo);
  EXPECT_NE(st.error().message().find("shorter than expected"), std::string::npos);
  std::vector<ReadRequest> reqs = {{f->find("big"), got}};
  EXPECT_ST_ERROR(f->read_many(reqs), kIo);
}

TEST(FileTest, FaultySourceInjectsReadErrors) {
  TempDir dir;
  Fixture fx = make_tensors(4, 1u << 16);
  const std::string path = save(dir, fx);
  auto base = open_file_source(path, Backend::kPread);
  ASSERT_ST_OK(base);
  auto faulty = std::make_shared<testing::FaultySource>(*base);
  auto f = File::open(faulty);
  ASSERT_ST_OK(f);
  const TensorInfo* big = f->find("big");
  std::vector<std::byte> got(big->nbytes());
  faulty->eio_at_offset = static_cast<std::int64_t>(f->data_offset() + big->begin + 100);
  auto st = f->read_into(*big, got);
  EXPECT_ST_ERROR(st, kIo);
  EXPECT_NE(st.error().message().find("Input/output error"), std::string::npos);
  faulty->eio_at_offset = -1;
  faulty->short_read = true;
  EXPECT_ST_ERROR(f->read_into(*big, got), kIo);
  faulty->short_read = false;
  ASSERT_ST_OK(f->read_into(*big, got));
  EXPECT_TRUE(same(got, fx.data.back()));
  // A failed header read fails the open.
  faulty->short_read = true;
  EXPECT_ST_ERROR(File::open(faulty), kIo);
}

}  // namespace
}  // namespace safetensors

namespace safetensors {
namespace {

// Several threads reading one descriptor defeat the kernel's sequential readahead; each reader hints the
// chunks ahead of it (internal::kReadaheadChunks), so a multi-chunk read hints every one of its bytes.
TEST(FileTest, ParallelReadsHintEveryChunkAheadOfTheReaders) {
  test::TempDir dir;
  std::vector<std::byte> a = test::random_bytes(80u << 20, 3);  // ten 8 MiB chunks
  std::vector<TensorData> ts = {{"a", Dtype::kU8, {a.size()}, a}};
  const std::string path = dir.file("h.safetensors");
  ASSERT_ST_OK(save_file(path, ts));
  auto base = open_file_source(path, Backend::kPread);
  ASSERT_ST_OK(base);
  auto faulty = std::make_shared<testing::FaultySource>(*base);
  auto f = File::open(faulty);
  ASSERT_ST_OK(f);
  std::vector<std::byte> got(a.size());
  const TensorInfo* t = f->find("a");
  ReadRequest req{t, got};
  ASSERT_ST_OK(f->read_many(std::span<const ReadRequest>(&req, 1), 2));
  EXPECT_TRUE(got == a);
  EXPECT_EQ(faulty->bytes_prefetched.load(), a.size());
  faulty->bytes_prefetched = 0;
  ASSERT_ST_OK(f->read_range(0, got, 2));
  EXPECT_EQ(faulty->bytes_prefetched.load(), a.size());
}

TEST(FileTest, ReadRangeCopiesAdjacentTensorsInOneCall) {
  test::TempDir dir;
  std::vector<std::byte> a = test::random_bytes(3 << 20, 1), b = test::random_bytes(1000, 2);
  std::vector<TensorData> ts = {{"a", Dtype::kU8, {a.size()}, a}, {"b", Dtype::kU8, {b.size()}, b}};
  const std::string path = dir.file("r.safetensors");
  ASSERT_ST_OK(save_file(path, ts));
  for (Backend backend : {Backend::kMmap, Backend::kPread}) {
    auto f = File::open(path, {.backend = backend});
    ASSERT_ST_OK(f);
    std::vector<std::byte> all(a.size() + b.size());
    ASSERT_ST_OK(f->read_range(0, all, 3));
    EXPECT_TRUE(std::equal(a.begin(), a.end(), all.begin()));
    EXPECT_TRUE(std::equal(b.begin(), b.end(), all.begin() + a.size()));
    std::vector<std::byte> tail(10);
    ASSERT_ST_OK(f->read_range(a.size() + b.size() - 10, tail));
    EXPECT_TRUE(std::equal(tail.begin(), tail.end(), b.end() - 10));
    EXPECT_ST_ERROR(f->read_range(a.size() + b.size() - 9, tail), kInvalidArgument);
    EXPECT_ST_ERROR(f->read_range(UINT64_MAX - 2, tail), kInvalidArgument);
  }
}

}  // namespace
}  // namespace safetensors

namespace safetensors {
namespace {

TEST(FileTest, KeysAreSortedWhateverTheFileOrder) {
  // Names in dtype-rank-then-name order form several sorted runs; any header order must sort the same.
  std::vector<std::byte> b(8);
  std::vector<std::string> names;
  std::mt19937 rng(5);
  for (int i = 0; i < 300; ++i) names.push_back("t" + std::to_string(rng() % 100000) + "_" + std::to_string(i));
  for (int dtypes : {1, 3, 22}) {
    std::vector<TensorData> ts;
    for (std::size_t i = 0; i < names.size(); ++i) {
      const Dtype d = kDtypeTable[i % static_cast<std::size_t>(dtypes)].dtype;
      if (dtype_bits(d) % 8) continue;
      ts.push_back({names[i], d, {}, std::span(b).first(dtype_bits(d) / 8)});
    }
    auto bytes = serialize(ts);
    ASSERT_ST_OK(bytes);
    auto f = test::open_bytes(test::to_string(*bytes));
    ASSERT_ST_OK(f);
    std::vector<std::string_view> keys = f->keys();
    std::vector<std::string_view> expected;
    for (const auto& t : ts) expected.emplace_back(t.name);
    std::sort(expected.begin(), expected.end());
    EXPECT_EQ(keys, expected) << dtypes;
    EXPECT_EQ(f->keys(), keys);  // cached
  }
  // A header in descending name order: every name is a run of its own.
  std::string header = "{";
  for (int i = 99; i >= 0; --i) {
    header += (i == 99 ? "\"" : ",\"") + std::to_string(1000 + i) +
              "\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[0,0]}";
  }
  header += "}";
  auto f = test::open_bytes(test::raw_file(header));
  ASSERT_ST_OK(f);
  std::vector<std::string_view> keys = f->keys();
  ASSERT_EQ(keys.size(), 100u);
  EXPECT_TRUE(std::is_sorted(keys.begin(), keys.end()));
  EXPECT_EQ(keys.front(), "1000");
}

// find() tries the tensor after the one it found last, in file order and in keys() order, before the index
// (file.cc): whatever the order of the questions, and from several threads at once, every name gives its own
// tensor and a missing name nullptr -- also a name that differs from the guess in its last byte only.
TEST(FileTest, FindAnswersEveryOrderOfQuestions) {
  std::vector<std::byte> b(8);
  std::vector<TensorData> ts;
  std::vector<std::string> names;
  for (int i = 0; i < 600; ++i) names.push_back("layer." + std::to_string(i % 200) + ".w" + std::to_string(i / 200));
  for (std::size_t i = 0; i < names.size(); ++i) {
    const Dtype d = i % 3 ? Dtype::kF16 : Dtype::kF32;  // two dtype groups: file order is not keys() order
    ts.push_back({names[i], d, {1}, std::span(b).first(dtype_bits(d) / 8)});
  }
  auto bytes = serialize(ts);
  ASSERT_ST_OK(bytes);
  auto f = test::open_bytes(test::to_string(*bytes));
  ASSERT_ST_OK(f);
  auto expect_all = [&](const std::vector<std::string_view>& order) {
    for (std::string_view name : order) {
      const TensorInfo* t = f->find(name);
      ASSERT_NE(t, nullptr) << name;
      EXPECT_EQ(t->name, name);
      // The guess for the next question is the tensor after `t`: a near miss must not be taken for it.
      const std::string near = std::string(name.substr(0, name.size() - 1)) + "x";
      EXPECT_EQ(f->find(near), nullptr) << near;
      EXPECT_EQ(f->find(name), t);
    }
  };
  std::vector<std::string_view> file_order;
  for (const TensorInfo& t : f->tensors()) file_order.push_back(t.name);
  expect_all(file_order);  // before keys() has sorted anything
  const std::vector<std::string_view> keys = f->keys();
  ASSERT_NE(keys, file_order);
  expect_all(keys);
  expect_all(file_order);
  std::vector<std::string_view> shuffled = keys;
  std::mt19937 rng(7);
  std::shuffle(shuffled.begin(), shuffled.end(), rng);
  expect_all(shuffled);
  std::vector<std::string_view> reversed(keys.rbegin(), keys.rend());
  std::vector<std::thread> threads;
  const std::vector<std::string_view>* orders[] = {&keys, &file_order, &shuffled, &reversed};
  for (const std::vector<std::string_view>* order : orders) {
    threads.emplace_back([&, order] {
      for (int round = 0; round < 20; ++round) {
        for (std::string_view name : *order) {
          const TensorInfo* t = f->find(name);
          if (t == nullptr || t->name != name) ADD_FAILURE() << name;
        }
      }
    });
  }
  for (auto& t : threads) t.join();
}

}  // namespace
}  // namespace safetensors
