// Bug (af687f5): a tensor larger than max_shard_bytes closed the open shard, so the split differed from
// huggingface_hub's split_torch_state_dict_into_shards (and save_pretrained's files). Now the oversized tensor
// is a shard of its own at once and the open shard stays open.
#include "safetensors/sharded.h"

#include "test_util.h"

namespace safetensors {
namespace {

TEST(PlanShardsOversizedTensorTest, ATensorLargerThanTheLimitGetsAShardOfItsOwn) {
  const std::vector<std::byte> bytes(100);
  const std::span<const std::byte> all(bytes);
  const std::vector<TensorData> tensors = {
      {"small0", Dtype::kU8, {10}, all.first(10)},  {"huge", Dtype::kU8, {100}, all},
      {"small1", Dtype::kU8, {10}, all.first(10)},  {"small2", Dtype::kU8, {20}, all.first(20)},
      {"empty", Dtype::kF32, {0, 3}, all.first(0)},
  };
  auto plan = plan_shards(tensors, {.max_shard_bytes = 30});
  ASSERT_ST_OK(plan);
  // huggingface_hub's split: the oversized tensor is a shard at once; the open shard stays open.
  ASSERT_EQ(plan->shards.size(), 3u);
  EXPECT_EQ(plan->shards[0].inputs, (std::vector<std::size_t>{1}));
  EXPECT_EQ(plan->shards[0].bytes, 100u);
  EXPECT_EQ(plan->shards[1].inputs, (std::vector<std::size_t>{0, 2}));
  EXPECT_EQ(plan->shards[1].bytes, 20u);
  EXPECT_EQ(plan->shards[2].inputs, (std::vector<std::size_t>{3, 4}));
  EXPECT_EQ(plan->shards[2].bytes, 20u);
  EXPECT_EQ(plan->shards[2].file_name, "model-00003-of-00003.safetensors");
  EXPECT_EQ(plan->total_size, 140u);
}

}  // namespace
}  // namespace safetensors
