// Bug (c99364a): a tensor whose data does not match its dtype and shape was refused by the writer as
// kInvalidArgument; the reference's kind for it is TensorInvalidInfo, and so is ours.
#include "safetensors/writer.h"

#include "test_util.h"

namespace safetensors {
namespace {

TEST(WriterSizeMismatchKindTest, ASizeMismatchIsTensorInvalidInfo) {
  std::vector<std::byte> b(8);
  std::vector<TensorData> wrong_size = {{"a", Dtype::kF32, {2}, std::span<const std::byte>(b).first(4)}};
  auto plan = WritePlan::make(wrong_size, {});
  EXPECT_ST_ERROR(plan, kTensorInvalidInfo);
  EXPECT_EQ(plan.error().tensor(), "a");
  EXPECT_NE(plan.error().to_string().find("F32 with 2 elements needs 8 bytes but 4 were given"), std::string::npos)
      << plan.error().to_string();
  EXPECT_ST_ERROR(serialize(wrong_size), kTensorInvalidInfo);
}

}  // namespace
}  // namespace safetensors
