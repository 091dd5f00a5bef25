#include "safetensors/dtype.h"

#include <gtest/gtest.h>

#include <set>
#include <string>
#include <vector>

namespace safetensors {
namespace {

TEST(DtypeTest, TableHoldsTheFormatsCodesBitsAndRankOrder) {
  const char* codes[] = {"BOOL",    "F4",          "F6_E2M3",     "F6_E3M2", "U8",  "I8",  "F8_E5M2", "F8_E4M3",
                         "F8_E8M0", "F8_E4M3FNUZ", "F8_E5M2FNUZ", "I16",     "U16", "F16", "BF16",    "I32",
                         "U32",     "F32",         "C64",         "F64",     "I64", "U64"};
  const unsigned bits[] = {8, 4, 6, 6, 8, 8, 8, 8, 8, 8, 8, 16, 16, 16, 16, 32, 32, 32, 64, 64, 64, 64};
  ASSERT_EQ(kDtypeTable.size(), 22u);
  for (std::size_t i = 0; i < kDtypeTable.size(); ++i) {
    EXPECT_EQ(kDtypeTable[i].code, codes[i]);
    EXPECT_EQ(kDtypeTable[i].bits, bits[i]) << codes[i];
    EXPECT_EQ(dtype_rank(kDtypeTable[i].dtype), static_cast<int>(i));
    EXPECT_EQ(dtype_from_code(codes[i]), kDtypeTable[i].dtype);
  }
}

TEST(DtypeTest, LookupsRejectUnknownNames) {
  EXPECT_FALSE(dtype_from_code("F33").has_value());
  EXPECT_FALSE(dtype_from_code("f32").has_value());
  EXPECT_FALSE(dtype_from_code("").has_value());
  EXPECT_FALSE(dtype_from_torch_name("").has_value());  // F6 has no torch name; "" must not find it
  EXPECT_FALSE(dtype_from_torch_name("float128").has_value());
}

TEST(DtypeTest, TorchNamesAreUniqueAndRoundTrip) {
  std::set<std::string_view> seen;
  for (const auto& row : kDtypeTable) {
    if (row.torch_name.empty()) continue;
    EXPECT_TRUE(seen.insert(row.torch_name).second) << row.torch_name;
    EXPECT_EQ(dtype_from_torch_name(row.torch_name), row.dtype);
  }
  EXPECT_EQ(dtype_from_torch_name("bfloat16"), Dtype::kBF16);
  EXPECT_EQ(dtype_from_torch_name("float4_e2m1fn_x2"), Dtype::kF4);
  EXPECT_EQ(dtype_from_torch_name("float8_e8m0fnu"), Dtype::kF8_E8M0);
}

// Golden values: the byte-swap units a big-endian host uses, DLPack codes (dlpack.h: kDLInt 0, kDLUInt 1,
// kDLFloat 2, kDLBfloat 4, kDLComplex 5, kDLBool 6) and torch's packing.
TEST(DtypeTest, SwapWidthsDlpackCodesAndPacking) {
  EXPECT_EQ(dtype_swap_bytes(Dtype::kBF16), 2);
  EXPECT_EQ(dtype_swap_bytes(Dtype::kU16), 2);
  EXPECT_EQ(dtype_swap_bytes(Dtype::kF32), 4);
  EXPECT_EQ(dtype_swap_bytes(Dtype::kC64), 4);  // two F32 halves, each swapped on its own
  EXPECT_EQ(dtype_swap_bytes(Dtype::kI64), 8);
  EXPECT_EQ(dtype_swap_bytes(Dtype::kF8_E4M3), 0);
  EXPECT_EQ(dtype_swap_bytes(Dtype::kF4), 0);
  EXPECT_EQ(dtype_swap_bytes(Dtype::kBool), 0);
  EXPECT_EQ(dtype_info(Dtype::kBF16).dlpack_code, 4);
  EXPECT_EQ(dtype_info(Dtype::kC64).dlpack_code, 5);
  EXPECT_EQ(dtype_info(Dtype::kBool).dlpack_code, 6);
  EXPECT_EQ(dtype_info(Dtype::kU64).dlpack_code, 1);
  EXPECT_EQ(dtype_info(Dtype::kF8_E5M2).dlpack_code, kNoDlpack);
  EXPECT_EQ(dtype_info(Dtype::kF4).torch_pack, 2);
  EXPECT_EQ(dtype_info(Dtype::kF6_E2M3).torch_pack, 1);
  EXPECT_EQ(dtype_kind(Dtype::kBF16), DtypeKind::kFloat);
  EXPECT_EQ(dtype_kind(Dtype::kU8), DtypeKind::kUnsigned);
  EXPECT_EQ(dtype_kind(Dtype::kI8), DtypeKind::kSigned);
  EXPECT_EQ(dtype_kind(Dtype::kC64), DtypeKind::kComplex);
  EXPECT_EQ(dtype_kind(Dtype::kBool), DtypeKind::kBool);
}

// torch's packed F4 (float4_e2m1fn_x2): the header counts values, torch counts its elements, two to one along
// the last dimension; other dtypes keep their shape. One text per refusal.
TEST(DtypeTest, TorchShapesOfPackedTypes) {
  using Shape = std::vector<std::uint64_t>;
  EXPECT_EQ(*torch_shape(Dtype::kF4, Shape{2, 6}), (Shape{2, 3}));
  EXPECT_EQ(*header_shape(Dtype::kF4, Shape{2, 3}), (Shape{2, 6}));
  EXPECT_EQ(*torch_shape(Dtype::kF32, Shape{}), Shape{});
  EXPECT_EQ(*header_shape(Dtype::kF6_E2M3, Shape{5}), Shape{5});
  auto odd = torch_shape(Dtype::kF4, Shape{2, 3});
  ASSERT_FALSE(odd.ok());
  EXPECT_EQ(odd.error().kind(), Error::Kind::kInvalidArgument);
  EXPECT_EQ(odd.error().detail(),
            "cannot represent an F4 tensor of shape [2, 3] as torch.float4_e2m1fn_x2, which packs 2 values per "
            "element of the last dimension (it must be even)");
  EXPECT_FALSE(torch_shape(Dtype::kF4, Shape{}).ok());
  auto scalar = header_shape(Dtype::kF4, Shape{});
  ASSERT_FALSE(scalar.ok());
  EXPECT_NE(scalar.error().detail().find("float4_e2m1fn_x2 scalar"), std::string::npos);
  EXPECT_FALSE(header_shape(Dtype::kF4, Shape{std::uint64_t{1} << 63}).ok());
}

}  // namespace
}  // namespace safetensors
