// The libtorch adapter: every dtype torch has round-trips byte for byte, CPU loads are zero-copy views that
// keep their mapping alive, the writer's bytes are the library's bytes, each refusal names its tensor, and the
// engine path (what device loads run, here onto the CPU) gives the plain load's bytes with bounded staging.
#include "safetensors/libtorch.h"

#include <torch/cuda.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <map>
#include <mutex>

#include "test_util.h"

namespace safetensors {
namespace {

using test::TempDir;

std::span<const std::byte> bytes_of(const torch::Tensor& t) {
  return {static_cast<const std::byte*>(t.data_ptr()), t.nbytes()};
}

bool same(std::span<const std::byte> a, std::span<const std::byte> b) {
  return std::equal(a.begin(), a.end(), b.begin(), b.end());
}

// One tensor per dtype torch has, over caller-owned bytes (so no torch kernel is needed to make them).
struct Fixture {
  std::vector<std::vector<std::byte>> storage;
  libtorch::TensorMap tensors;
  std::map<std::string, Dtype> dtype_of;

  Fixture() {
    std::uint32_t seed = 1;
    for (const DtypeInfo& row : kDtypeTable) {
      const auto type = libtorch::to_torch_dtype(row.dtype);
      if (!type) continue;
      // 3 x 4 logical elements; F4 packs them into 3 x 2 bytes.
      const std::vector<std::int64_t> sizes =
          row.dtype == Dtype::kF4 ? std::vector<std::int64_t>{3, 2} : std::vector<std::int64_t>{3, 4};
      const std::size_t nbytes = 12 * row.bits / 8;
      storage.push_back(test::random_bytes(nbytes, seed++));
      if (row.dtype == Dtype::kBool) {
        for (auto& b : storage.back()) b &= std::byte{1};
      }
      const std::string name = "t_" + std::string(row.code);
      tensors[name] = torch::from_blob(storage.back().data(), sizes, torch::TensorOptions().dtype(*type));
      dtype_of[name] = row.dtype;
    }
  }
};

TEST(LibtorchTest, EveryDtypeTorchHasRoundTripsOnEveryBackend) {
  TempDir dir;
  Fixture fx;
  ASSERT_EQ(fx.tensors.size(), kDtypeTable.size() - 2);  // all but F6_E2M3 and F6_E3M2
  const std::string path = dir.file("all.safetensors");
  ASSERT_ST_OK(libtorch::save(path, fx.tensors, Metadata{{"format", "pt"}}));

  // The file holds the logical shape (F4's last dimension doubled) and the tensors' own bytes.
  auto file = File::open(path);
  ASSERT_ST_OK(file);
  EXPECT_EQ(*file->metadata(), (Metadata{{"format", "pt"}}));
  for (const auto& [name, tensor] : fx.tensors) {
    const TensorInfo* info = file->find(name);
    ASSERT_NE(info, nullptr) << name;
    EXPECT_EQ(info->dtype, fx.dtype_of[name]);
    EXPECT_EQ(test::shape_of(*info), (std::vector<std::uint64_t>{3, 4})) << name;
    std::vector<std::byte> buf(info->nbytes());
    ASSERT_ST_OK(file->read_into(*info, buf));
    EXPECT_TRUE(same(buf, bytes_of(tensor))) << name;
  }

  for (Backend backend : {Backend::kMmap, Backend::kPread, Backend::kDirect}) {
    auto loaded = libtorch::load(path, torch::kCPU, backend);
    ASSERT_ST_OK(loaded);
    ASSERT_EQ(loaded->size(), fx.tensors.size());
    for (const auto& [name, want] : fx.tensors) {
      const torch::Tensor& got = loaded->at(name);
      EXPECT_EQ(got.scalar_type(), want.scalar_type()) << name;
      EXPECT_EQ(got.sizes(), want.sizes()) << name;
      EXPECT_TRUE(got.is_contiguous());
      EXPECT_TRUE(same(bytes_of(got), bytes_of(want))) << name;
    }
  }
}

TEST(LibtorchTest, SavedBytesAreTheLibrarysBytes) {
  TempDir dir;
  // COMPAT.md's golden file.
  ASSERT_ST_OK(libtorch::save(dir.file("golden.safetensors"), {{"test", torch::zeros({2, 2}, torch::kInt32)}}));
  EXPECT_EQ(test::read_bytes(dir.file("golden.safetensors")),
            test::raw_file(R"({"test":{"dtype":"I32","shape":[2,2],"data_offsets":[0,16]}})"
                           "    ",
                           std::string(16, '\0')));

  // A contiguous view with a storage offset is written from its own bytes.
  torch::Tensor base = torch::arange(12, torch::kFloat32).reshape({4, 3});
  torch::Tensor rows = base.narrow(0, 1, 2);
  ASSERT_TRUE(rows.is_contiguous());
  ASSERT_EQ(rows.storage_offset(), 3);
  ASSERT_ST_OK(
      libtorch::save(dir.file("rows.safetensors"), {{"rows", rows}, {"scalar", torch::tensor(2.5, torch::kFloat64)}}));
  const std::vector<float> want = {3, 4, 5, 6, 7, 8};
  const double scalar = 2.5;
  const std::vector<TensorData> same_data = {
      {"rows", Dtype::kF32, {2, 3}, std::as_bytes(std::span(want))},
      {"scalar", Dtype::kF64, {}, std::as_bytes(std::span(&scalar, 1))},
  };
  ASSERT_ST_OK(save_file(dir.file("direct.safetensors"), same_data));
  EXPECT_EQ(test::read_bytes(dir.file("rows.safetensors")), test::read_bytes(dir.file("direct.safetensors")));
}

TEST(LibtorchTest, CpuTensorsAreViewsThatKeepTheMappingAlive) {
  TempDir dir;
  const std::string path = dir.file("m.safetensors");
  const torch::Tensor w = torch::arange(64, torch::kFloat32).reshape({8, 8});
  ASSERT_ST_OK(libtorch::save(path, {{"w", w}, {"b", torch::ones({8}, torch::kBFloat16)}}));
  const std::string before_bytes = test::read_bytes(path);
  const std::uint64_t before = testing::live_mappings();

  torch::Tensor kept;
  {
    auto loaded = libtorch::load(path);
    ASSERT_ST_OK(loaded);
    EXPECT_EQ(testing::live_mappings(), before + 1);
    kept = loaded->at("w");
  }
  // The map and the File are gone; the tensor still holds the mapping.
  EXPECT_EQ(testing::live_mappings(), before + 1);
  EXPECT_TRUE(torch::equal(kept, w));
  // The mapping is private: writing the tensor never reaches the file.
  kept.mul_(2);
  EXPECT_EQ(kept[7][7].item<float>(), 126.0f);
  EXPECT_EQ(test::read_bytes(path), before_bytes);
  torch::Tensor alias = kept.view({64});
  kept = torch::Tensor();
  EXPECT_EQ(testing::live_mappings(), before + 1);  // a view of the storage is enough
  alias = torch::Tensor();
  EXPECT_EQ(testing::live_mappings(), before);

  // pread tensors own their memory: no mapping at all.
  auto owned = libtorch::load(path, torch::kCPU, Backend::kPread);
  ASSERT_ST_OK(owned);
  EXPECT_EQ(testing::live_mappings(), before);
  EXPECT_TRUE(torch::equal(owned->at("w"), w));
}

TEST(LibtorchTest, MisalignedBytesAreCopiedNotViewed) {
  TempDir dir;
  // A header of 61 bytes puts the data at offset 69: F32 data there is not 4-byte aligned in the mapping.
  const std::string header = R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}       )";
  ASSERT_EQ(header.size(), 61u);
  const float values[2] = {1.25f, -3.5f};
  test::write_bytes(dir.file("odd.safetensors"),
                    test::raw_file(header, std::string(reinterpret_cast<const char*>(values), sizeof values)));
  const std::uint64_t before = testing::live_mappings();
  auto loaded = libtorch::load(dir.file("odd.safetensors"));
  ASSERT_ST_OK(loaded);
  const torch::Tensor& x = loaded->at("x");
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(x.data_ptr()) % 4, 0u);
  EXPECT_EQ(x[0].item<float>(), 1.25f);
  EXPECT_EQ(x[1].item<float>(), -3.5f);
  EXPECT_EQ(testing::live_mappings(), before);  // the copy holds no mapping
}

TEST(LibtorchTest, LoadsOntoAnotherDeviceAndFromShards) {
  TempDir dir;
  torch::manual_seed(0);  // the same values on every run
  const torch::Tensor a = torch::randn({4, 5});
  const torch::Tensor b = torch::arange(10, torch::kInt64);
  ASSERT_ST_OK(libtorch::save(dir.file("f.safetensors"), {{"a", a}, {"b", b}}));
  auto meta = libtorch::load(dir.file("f.safetensors"), torch::Device(torch::kMeta));
  ASSERT_ST_OK(meta);
  EXPECT_TRUE(meta->at("a").is_meta());
  EXPECT_EQ(meta->at("a").sizes(), a.sizes());
  EXPECT_EQ(meta->at("b").scalar_type(), torch::kInt64);

  // A meta tensor has no bytes to save.
  auto st = libtorch::save(dir.file("meta.safetensors"), {{"m", meta->at("a")}});
  EXPECT_ST_ERROR(st, kInvalidArgument);
  EXPECT_NE(st.error().to_string().find("tensor `m` cannot be copied to the CPU"), std::string::npos)
      << st.error().to_string();

  const std::vector<TensorData> parts = {
      {"a", Dtype::kF32, {4, 5}, bytes_of(a)},
      {"b", Dtype::kI64, {10}, bytes_of(b)},
  };
  ASSERT_ST_OK(save_sharded(dir.path().string(), parts, {.max_shard_bytes = 80}));
  for (Backend backend : {Backend::kMmap, Backend::kPread, Backend::kDirect}) {
    auto sharded = ShardedFile::open_index(dir.file("model.safetensors.index.json"), {.backend = backend});
    ASSERT_ST_OK(sharded);
    ASSERT_EQ(sharded->shards().size(), 2u);
    auto loaded = libtorch::load(*sharded);
    ASSERT_ST_OK(loaded);
    EXPECT_TRUE(torch::equal(loaded->at("a"), a));
    EXPECT_TRUE(torch::equal(loaded->at("b"), b));
  }
}

TEST(LibtorchTest, RefusalsNameTheTensor) {
  TempDir dir;
  const std::string path = dir.file("x.safetensors");
  struct Case {
    const char* what;
    torch::Tensor tensor;
    const char* text;
  };
  const Case cases[] = {
      {"transposed", torch::ones({2, 3}).t(), "tensor `transposed` is not contiguous"},
      {"c128", torch::ones({2}, torch::kComplexDouble), "tensor `c128` has dtype ComplexDouble"},
      {"sparse", torch::ones({2, 2}).to_sparse(), "tensor `sparse` is not a strided"},
      {"undefined", torch::Tensor(), "tensor `undefined` is undefined"},
  };
  for (const Case& c : cases) {
    auto st = libtorch::save(path, {{c.what, c.tensor}, {"fine", torch::ones({1})}});
    ASSERT_FALSE(st.ok()) << c.what;
    EXPECT_EQ(st.error().kind(), Error::Kind::kInvalidArgument);
    EXPECT_NE(st.error().to_string().find(c.text), std::string::npos) << st.error().to_string();
  }
  EXPECT_FALSE(std::filesystem::exists(path));
  EXPECT_ST_ERROR(libtorch::save(dir.file("no/dir.safetensors"), {{"a", torch::ones({1})}}), kNotFound);

  // Dtypes torch lacks, and F4 that cannot be packed in pairs along the last dimension.
  const std::vector<std::byte> three(3);
  ASSERT_ST_OK(save_file(dir.file("f6.safetensors"), std::vector<TensorData>{{"six", Dtype::kF6_E2M3, {4}, three}}));
  auto f6 = libtorch::load(dir.file("f6.safetensors"));
  EXPECT_ST_ERROR(f6, kInvalidArgument);
  EXPECT_NE(f6.error().to_string().find("tensor `six` has dtype F6_E2M3, which torch has no dtype for"),
            std::string::npos)
      << f6.error().to_string();
  ASSERT_ST_OK(save_file(dir.file("f4.safetensors"), std::vector<TensorData>{{"odd", Dtype::kF4, {2, 3}, three}}));
  auto f4 = libtorch::load(dir.file("f4.safetensors"));
  EXPECT_ST_ERROR(f4, kInvalidArgument);
  EXPECT_EQ(f4.error().context(), dir.file("f4.safetensors"));
  EXPECT_NE(f4.error().to_string().find("tensor `odd`"), std::string::npos);

  EXPECT_ST_ERROR(libtorch::load(dir.file("missing.safetensors")), kNotFound);
  EXPECT_EQ(libtorch::from_torch_dtype(torch::kComplexHalf), std::nullopt);
  EXPECT_EQ(libtorch::from_torch_dtype(torch::kFloat4_e2m1fn_x2), Dtype::kF4);
}

// A slab allocator that counts what it has handed out, so a test sees staging memory from the allocator's side.
struct CountingAllocator {
  struct Counts {
    std::mutex mu;
    std::uint64_t live = 0;
    std::uint64_t max_live = 0;
    std::uint64_t allocations = 0;
  };
  std::shared_ptr<Counts> counts = std::make_shared<Counts>();

  SlabAllocator allocator() const {
    return {
        [c = counts](std::size_t size) -> void* {
          void* p = std::aligned_alloc(SlabPool::kPageBytes, size);
          if (p == nullptr) return nullptr;
          std::lock_guard<std::mutex> lock(c->mu);
          c->live += size;
          c->max_live = std::max(c->max_live, c->live);
          c->allocations += 1;
          return p;
        },
        [c = counts](void* p, std::size_t size) {
          std::free(p);
          std::lock_guard<std::mutex> lock(c->mu);
          c->live -= size;
        },
    };
  }
};

void expect_same_tensors(const libtorch::TensorMap& got, const libtorch::TensorMap& want) {
  ASSERT_EQ(got.size(), want.size());
  for (const auto& [name, w] : want) {
    ASSERT_TRUE(got.count(name)) << name;
    const torch::Tensor& g = got.at(name);
    EXPECT_TRUE(g.device().is_cpu()) << name;
    EXPECT_EQ(g.scalar_type(), w.scalar_type()) << name;
    EXPECT_EQ(g.sizes(), w.sizes()) << name;
    EXPECT_TRUE(g.is_contiguous()) << name;
    EXPECT_TRUE(same(bytes_of(g), bytes_of(w))) << name;
  }
}

// The engine path (stage_cpu: what a device load runs, with the CPU as the device) against the plain load.
TEST(LibtorchEngineTest, EveryDtypeStagedOntoTheCpuEqualsThePlainLoad) {
  TempDir dir;
  Fixture fx;
  const std::string path = dir.file("all.safetensors");
  ASSERT_ST_OK(libtorch::save(path, fx.tensors));
  for (Backend backend : {Backend::kMmap, Backend::kPread, Backend::kDirect}) {
    auto plain = libtorch::load(path, torch::kCPU, backend);
    ASSERT_ST_OK(plain);
    // Slabs of one page, so tensors share slabs and chunks; three readers land them out of order.
    SlabPool pool(2 * SlabPool::kPageBytes, SlabPool::kPageBytes);
    const libtorch::LoadOptions staged{.threads = 3, .pool = &pool, .stage_cpu = true};
    auto via_engine = libtorch::load(path, torch::kCPU, backend, staged);
    ASSERT_ST_OK(via_engine);
    expect_same_tensors(*via_engine, *plain);
    EXPECT_GT(pool.stats().allocations, 0u);  // it did stage
    auto file = File::open(path, {.backend = backend});
    ASSERT_ST_OK(file);
    for (const TensorInfo& t : file->tensors()) {
      auto one = libtorch::load_tensor(*file, t, torch::kCPU, staged);
      ASSERT_ST_OK(one);
      EXPECT_TRUE(same(bytes_of(*one), bytes_of(plain->at(std::string(t.name))))) << t.name;
    }
  }

  // Sharded: one prefetch per shard, scalars and empty tensors included.
  const torch::Tensor a = torch::arange(3000, torch::kInt32).reshape({30, 100});
  const torch::Tensor b = torch::arange(7, torch::kFloat64);
  const torch::Tensor empty = torch::empty({0, 3}, torch::kFloat16);
  const torch::Tensor scalar = torch::tensor(7, torch::kInt64);
  const std::vector<TensorData> parts = {
      {"a", Dtype::kI32, {30, 100}, bytes_of(a)},
      {"b", Dtype::kF64, {7}, bytes_of(b)},
      {"empty", Dtype::kF16, {0, 3}, bytes_of(empty)},
      {"scalar", Dtype::kI64, {}, bytes_of(scalar)},
  };
  ASSERT_ST_OK(save_sharded(dir.path().string(), parts, {.max_shard_bytes = 4096}));
  auto sharded = ShardedFile::open_index(dir.file("model.safetensors.index.json"));
  ASSERT_ST_OK(sharded);
  ASSERT_GE(sharded->shards().size(), 2u);
  auto plain = libtorch::load(*sharded);
  ASSERT_ST_OK(plain);
  auto via_engine = libtorch::load(*sharded, torch::kCPU, {.threads = 2, .stage_cpu = true});
  ASSERT_ST_OK(via_engine);
  expect_same_tensors(*via_engine, *plain);
  EXPECT_EQ(via_engine->at("scalar").item<std::int64_t>(), 7);
}

// Host staging stays within the pool's capacity for a model many times its size, and is returned after.
TEST(LibtorchEngineTest, StagingMemoryIsBoundedByThePool) {
  TempDir dir;
  libtorch::TensorMap model;
  torch::manual_seed(0);
  for (int i = 0; i < 48; ++i) {
    model["w" + std::to_string(i)] = torch::randn({64, 64 + i});  // 16 KiB and up, not page multiples
  }
  const std::string path = dir.file("m.safetensors");
  ASSERT_ST_OK(libtorch::save(path, model));
  auto file = File::open(path);
  ASSERT_ST_OK(file);
  const std::uint64_t data_bytes = file->size() - file->data_offset();

  constexpr std::uint64_t kCap = 4 * SlabPool::kPageBytes;
  ASSERT_GT(data_bytes, 50 * kCap);
  CountingAllocator counting;
  SlabPool pool(kCap, SlabPool::kPageBytes);
  ASSERT_ST_OK(pool.set_allocator(counting.allocator()));
  auto loaded = libtorch::load(*file, torch::kCPU, {.threads = 4, .pool = &pool, .stage_cpu = true});
  ASSERT_ST_OK(loaded);
  auto plain = libtorch::load(path, torch::kCPU, Backend::kPread);
  ASSERT_ST_OK(plain);
  expect_same_tensors(*loaded, *plain);

  // Every byte went through the pool's slabs, reusing them: never more than the cap at once.
  EXPECT_GE(counting.counts->allocations, 1u);
  EXPECT_LE(counting.counts->max_live, kCap);
  EXPECT_LE(pool.stats().peak_bytes, kCap);
  EXPECT_EQ(counting.counts->live, 0u);  // returned once the load ended
  EXPECT_EQ(pool.stats().slabs_in_use, 0u);
}

// A file that shrank after open: a kIo error naming the file and a tensor, every slab back in the pool.
TEST(LibtorchEngineTest, TruncatedFileNamesTheFileAndTheTensor) {
  for (Backend backend : {Backend::kMmap, Backend::kPread, Backend::kDirect}) {
    TempDir dir;
    libtorch::TensorMap model;
    for (int i = 0; i < 16; ++i) model["layer." + std::to_string(i)] = torch::full({32, 64}, i, torch::kFloat32);
    const std::string path = dir.file("t.safetensors");
    ASSERT_ST_OK(libtorch::save(path, model));
    auto file = File::open(path, {.backend = backend});
    ASSERT_ST_OK(file);
    const TensorInfo& last = file->tensors().back();
    ASSERT_EQ(::truncate(path.c_str(), static_cast<off_t>(file->data_offset() + last.begin + 8)), 0);

    SlabPool pool(4 * SlabPool::kPageBytes, SlabPool::kPageBytes);
    auto loaded = libtorch::load(*file, torch::kCPU, {.threads = 2, .pool = &pool, .stage_cpu = true});
    ASSERT_FALSE(loaded.ok());
    const Error& e = loaded.error();
    EXPECT_EQ(e.kind(), Error::Kind::kIo) << e.to_string();
    EXPECT_EQ(e.context(), path);
    // The tensor that starts the failed read (an adjacent one may share it).
    EXPECT_NE(file->find(e.tensor()), nullptr) << e.to_string();
    EXPECT_NE(e.to_string().find(path), std::string::npos) << e.to_string();
    EXPECT_NE(e.to_string().find("`" + std::string(e.tensor()) + "`"), std::string::npos) << e.to_string();
    EXPECT_EQ(pool.stats().allocated_bytes, 0u);

    auto one = libtorch::load_tensor(*file, last, torch::kCPU, {.pool = &pool, .stage_cpu = true});
    EXPECT_ST_ERROR(one, kIo);
  }
}

// A CPU-only torch has no page-locked allocator; a device load there fails cleanly, naming the tensor.
TEST(LibtorchEngineTest, WithoutAnAcceleratorThereIsNoPinnedAllocator) {
  EXPECT_EQ(libtorch::pinned_slab_allocator(torch::kCPU).has_value(), false);
  EXPECT_EQ(libtorch::pinned_slab_allocator(torch::kMeta).has_value(), false);
  if (torch::cuda::is_available()) GTEST_SKIP() << "this torch has CUDA";
  EXPECT_EQ(libtorch::pinned_slab_allocator(torch::kCUDA).has_value(), false);
  TempDir dir;
  const std::string path = dir.file("c.safetensors");
  ASSERT_ST_OK(libtorch::save(path, {{"w", torch::ones({4})}}));
  auto on_cuda = libtorch::load(path, torch::Device(torch::kCUDA, 0));
  EXPECT_ST_ERROR(on_cuda, kInvalidArgument);
  EXPECT_NE(on_cuda.error().to_string().find("cannot move tensor `w` to cuda:0"), std::string::npos)
      << on_cuda.error().to_string();
}

}  // namespace
}  // namespace safetensors
