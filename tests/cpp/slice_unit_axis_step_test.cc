// Found by fuzz/slice_fuzzer.cc: a range with a step other than 1 over a length-1 axis kept its
// step in the plan, which split a contiguous sub-byte selection into runs that are not whole bytes. F6
// x[:, ::-1, :] over shape [2, 1, 2] -- the whole tensor -- was refused with kMisalignedSlice.
// Regression inputs: fuzz/regressions/slice/f6_unit_axis_*.
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "safetensors/file.h"
#include "safetensors/slice.h"
#include "safetensors/writer.h"
#include "test_util.h"

namespace safetensors {
namespace {

using S = SliceIndex;

TEST(SliceUnitAxisStep, AStepOverALengthOneAxisKeepsTheRunWhole) {
  // Four F6 elements are 24 bits; two of them (one run per outer position) would be 12 bits.
  const std::vector<std::uint64_t> shape{2, 1, 2};
  for (std::int64_t step : {std::int64_t{-1}, std::int64_t{3}, INT64_MIN, INT64_MAX}) {
    SCOPED_TRACE(step);
    const std::vector<SliceIndex> ix{S::all(), S::range(std::nullopt, std::nullopt, step), S::all()};
    auto plan = SlicePlan::make(Dtype::kF6_E2M3, shape, ix, "<memory>", "t");
    ASSERT_ST_OK(plan);
    EXPECT_TRUE(plan->is_whole());
    EXPECT_EQ(plan->run_count(), 1u);
    EXPECT_EQ(plan->nbytes(), 3u);
    EXPECT_EQ(plan->shape(), shape);
  }
  // F4 [2, 1, 1]: one element (4 bits) per outer position before the fix, one whole byte after it.
  const std::vector<SliceIndex> ix{S::all(), S::range(0, 1, 7), S::all()};
  auto f4 = SlicePlan::make(Dtype::kF4, std::vector<std::uint64_t>{2, 1, 1}, ix, "<memory>", "t");
  ASSERT_ST_OK(f4);
  EXPECT_TRUE(f4->is_whole());
  EXPECT_EQ(f4->nbytes(), 1u);
}

TEST(SliceUnitAxisStep, ReadSliceReturnsTheWholeTensor) {
  const std::vector<std::byte> data = test::random_bytes(3, 6);
  std::vector<TensorData> td = {{"t", Dtype::kF6_E3M2, {2, 1, 2}, data}};
  auto mem = test::serialized_source(td);
  ASSERT_ST_OK(mem);
  for (auto source : {*mem, std::shared_ptr<const Source>(test::without_mapping(*mem))}) {
    auto f = File::open(source);
    ASSERT_ST_OK(f);
    const TensorInfo& t = f->tensors()[0];
    const std::vector<SliceIndex> ix{S::all(), S::range(std::nullopt, std::nullopt, -1), S::all()};
    auto plan = f->plan_slice(t, ix);
    ASSERT_ST_OK(plan);
    std::vector<std::byte> got(plan->nbytes());
    ASSERT_ST_OK(f->read_slice(t, *plan, got));
    EXPECT_EQ(got, data);
  }
}

}  // namespace
}  // namespace safetensors
