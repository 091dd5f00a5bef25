// The libtorch adapter's device path against a device whose copies complete later: the simulated NPU of
// tests/python/npu_sim (a PrivateUse1 backend, renamed "npu", whose non-blocking copies from its pinned host
// memory are queued and run after a delay, reading the source only then), compiled into this test. A slab the
// adapter recycled before its copy's event completed would put a later chunk's bytes on the device, so every
// load here must equal the plain CPU load byte for byte.
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/DeviceType.h>
#include <unistd.h>

#include <cstdint>
#include <string>
#include <vector>

#include "safetensors/libtorch.h"
#include "test_util.h"

namespace safetensors {
namespace {

using test::TempDir;

template <typename Signature>
c10::TypedOperatorHandle<Signature> sim_op(const char* name) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, "").typed<Signature>();
}

// Installs the simulator once for the process (one device), as npu_sim.install(1) does from Python.
void install_sim() {
  static const bool installed = [] {
    sim_op<void(std::int64_t, bool)>("npu_sim::configure").call(1, true);
    c10::register_privateuse1_backend("npu");
    return true;
  }();
  (void)installed;
}

void set_copy_delay_us(std::int64_t us) { sim_op<void(std::int64_t)>("npu_sim::set_copy_delay_us").call(us); }
void reset_copy_stats() { sim_op<void()>("npu_sim::reset_copy_stats").call(); }
// [h2d count, h2d bytes, ..., non_blocking count, asynchronous copies run, their bytes, deepest queue]
std::vector<std::int64_t> copy_stats() { return sim_op<std::vector<std::int64_t>()>("npu_sim::copy_stats").call(); }

std::span<const std::byte> bytes_of(const torch::Tensor& t) {
  return {static_cast<const std::byte*>(t.data_ptr()), t.nbytes()};
}

void expect_equal_on_cpu(const libtorch::TensorMap& on_device, const libtorch::TensorMap& want) {
  ASSERT_EQ(on_device.size(), want.size());
  for (const auto& [name, w] : want) {
    const torch::Tensor& got = on_device.at(name);
    EXPECT_EQ(got.device().type(), c10::DeviceType::PrivateUse1) << name;
    EXPECT_EQ(got.scalar_type(), w.scalar_type()) << name;
    EXPECT_EQ(got.sizes(), w.sizes()) << name;
    const torch::Tensor back = got.cpu();
    EXPECT_TRUE(std::equal(bytes_of(back).begin(), bytes_of(back).end(), bytes_of(w).begin(), bytes_of(w).end()))
        << name;
  }
}

class LibtorchNpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    install_sim();
    set_copy_delay_us(2000);
    reset_copy_stats();
  }
  void TearDown() override { set_copy_delay_us(2000); }
};

TEST_F(LibtorchNpuTest, TheSimulatorHasAPinnedAllocatorTheAdapterUses) {
  EXPECT_TRUE(libtorch::pinned_slab_allocator(c10::DeviceType::PrivateUse1).has_value());
}

// Every dtype torch has, onto the device through the adapter's own pinned pool: the copies went through the
// device queue (non-blocking, from page-locked slabs) and the bytes are the file's.
TEST_F(LibtorchNpuTest, EveryDtypeLandsExactlyThroughQueuedCopies) {
  TempDir dir;
  libtorch::TensorMap model;
  std::vector<std::vector<std::byte>> storage;
  std::uint32_t seed = 3;
  for (const DtypeInfo& row : kDtypeTable) {
    const auto type = libtorch::to_torch_dtype(row.dtype);
    if (!type) continue;
    const std::int64_t last = row.torch_pack == 1 ? 40 : 40 / row.torch_pack;
    storage.push_back(test::random_bytes(static_cast<std::size_t>(30 * last * c10::elementSize(*type)), seed++));
    if (row.dtype == Dtype::kBool) {
      for (auto& b : storage.back()) b &= std::byte{1};
    }
    model["t_" + std::string(row.code)] =
        torch::from_blob(storage.back().data(), {30, last}, torch::TensorOptions().dtype(*type));
  }
  const std::string path = dir.file("all.safetensors");
  ASSERT_ST_OK(libtorch::save(path, model));
  auto plain = libtorch::load(path, torch::kCPU, Backend::kPread);
  ASSERT_ST_OK(plain);
  for (Backend backend : {Backend::kMmap, Backend::kPread}) {
    reset_copy_stats();
    auto loaded = libtorch::load(path, torch::Device("npu:0"), backend);
    ASSERT_ST_OK(loaded);
    const std::vector<std::int64_t> stats = copy_stats();
    EXPECT_GT(stats[9], 0) << "no copy went through the device queue";
    EXPECT_EQ(stats[9], stats[8]);  // every non-blocking copy was queued
    expect_equal_on_cpu(*loaded, *plain);
  }
}

// A model many times the pool, through two one-page slabs, every copy delayed 5 ms: each slab is refilled
// dozens of times, each time only after the device copied out of it.
TEST_F(LibtorchNpuTest, ASmallPoolIsRefilledOnlyAfterEachCopyCompleted) {
  TempDir dir;
  libtorch::TensorMap model;
  for (int i = 0; i < 12; ++i) {  // distinct values everywhere, so a chunk from the wrong slab shows
    const std::int64_t cols = 64 + 3 * i;
    model["w" + std::to_string(i)] = torch::arange(17 * cols, torch::kFloat32).reshape({17, cols}) + 1e5 * i;
  }
  const std::string path = dir.file("m.safetensors");
  ASSERT_ST_OK(libtorch::save(path, model));
  auto plain = libtorch::load(path, torch::kCPU, Backend::kPread);
  ASSERT_ST_OK(plain);

  auto pinned = libtorch::pinned_slab_allocator(c10::DeviceType::PrivateUse1);
  ASSERT_TRUE(pinned.has_value());
  SlabPool pool(2 * SlabPool::kPageBytes, SlabPool::kPageBytes);
  ASSERT_ST_OK(pool.set_allocator(std::move(*pinned)));
  set_copy_delay_us(5000);
  auto loaded = libtorch::load(path, torch::Device("npu:0"), Backend::kMmap, {.threads = 2, .pool = &pool});
  ASSERT_ST_OK(loaded);
  const std::vector<std::int64_t> stats = copy_stats();
  EXPECT_GE(stats[9], 20);         // queued copies, many more than the two slabs
  EXPECT_EQ(stats[10], stats[1]);  // every byte copied to the device went through the queue
  expect_equal_on_cpu(*loaded, *plain);
  EXPECT_LE(pool.stats().peak_bytes, pool.capacity());
  EXPECT_EQ(pool.stats().allocated_bytes, 0u);  // returned once the load ended

  // Without page-locked memory: pageable slabs, synchronous copies, the same bytes.
  reset_copy_stats();
  auto pageable = libtorch::load(path, torch::Device("npu:0"), Backend::kPread, {.pinned = false});
  ASSERT_ST_OK(pageable);
  EXPECT_EQ(copy_stats()[8], 0);  // nothing was non-blocking
  expect_equal_on_cpu(*pageable, *plain);
}

// A file that shrank after open, onto the device: the copies already queued are waited for, then the error
// names the file and a tensor.
TEST_F(LibtorchNpuTest, TruncationMidLoadNamesFileAndTensor) {
  TempDir dir;
  libtorch::TensorMap model;
  for (int i = 0; i < 16; ++i) model["layer." + std::to_string(i)] = torch::full({32, 64}, i, torch::kFloat32);
  const std::string path = dir.file("t.safetensors");
  ASSERT_ST_OK(libtorch::save(path, model));
  auto file = File::open(path);
  ASSERT_ST_OK(file);
  ASSERT_EQ(::truncate(path.c_str(), static_cast<off_t>(file->data_offset() + file->tensors().back().begin + 8)), 0);
  auto pinned = libtorch::pinned_slab_allocator(c10::DeviceType::PrivateUse1);
  ASSERT_TRUE(pinned.has_value());
  SlabPool pool(4 * SlabPool::kPageBytes, SlabPool::kPageBytes);
  ASSERT_ST_OK(pool.set_allocator(std::move(*pinned)));
  auto loaded = libtorch::load(*file, torch::Device("npu:0"), {.threads = 2, .pool = &pool});
  ASSERT_FALSE(loaded.ok());
  EXPECT_EQ(loaded.error().kind(), Error::Kind::kIo) << loaded.error().to_string();
  EXPECT_EQ(loaded.error().context(), path);
  EXPECT_NE(file->find(loaded.error().tensor()), nullptr) << loaded.error().to_string();
  EXPECT_EQ(pool.stats().allocated_bytes, 0u);
}

}  // namespace
}  // namespace safetensors
