// The libtorch adapter: every dtype torch has round-trips byte for byte, CPU loads are zero-copy views that
// keep their mapping alive, the writer's bytes are the library's bytes, and each refusal names its tensor.
#include "safetensors/libtorch.h"

#include <cstring>
#include <filesystem>
#include <map>

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
      const std::vector<std::int64_t> sizes = row.dtype == Dtype::kF4 ? std::vector<std::int64_t>{3, 2}
                                                                       : std::vector<std::int64_t>{3, 4};
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

TEST(LibtorchTest, EveryDtypeTorchHasRoundTripsOnBothBackends) {
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

  for (Backend backend : {Backend::kMmap, Backend::kPread}) {
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
  ASSERT_ST_OK(libtorch::save(dir.file("rows.safetensors"), {{"rows", rows}, {"scalar", torch::tensor(2.5, torch::kFloat64)}}));
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
  for (Backend backend : {Backend::kMmap, Backend::kPread}) {
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

}  // namespace
}  // namespace safetensors
