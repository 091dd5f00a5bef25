// The one table of safetensors element types.
//
// Every fact about a dtype -- its header code, its size in bits, its sort rank, its kind, how a big-endian
// host swaps it, its DLPack code, how torch packs it and the names frameworks give it -- lives in exactly one
// row of kDtypeTable. Every other layer (the header parser, the writer's sort, the
// slicer, the Python adapters) asks this table; nothing else spells a dtype code or a bit size.
//
// Thread safety: everything here is constexpr or reads immutable data, and is safe from any thread.
#ifndef SAFETENSORS_DTYPE_H_
#define SAFETENSORS_DTYPE_H_

#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "safetensors/error.h"
#include "safetensors/export.h"

namespace safetensors {

// The enumerators are in *rank* order: the order the writer sorts by (highest rank first) and the order of
// the format's definition. The numeric value of an enumerator is its rank.
enum class Dtype : std::uint8_t {
  kBool,
  kF4,
  kF6_E2M3,
  kF6_E3M2,
  kU8,
  kI8,
  kF8_E5M2,
  kF8_E4M3,
  kF8_E8M0,
  kF8_E4M3FNUZ,
  kF8_E5M2FNUZ,
  kI16,
  kU16,
  kF16,
  kBF16,
  kI32,
  kU32,
  kF32,
  kC64,
  kF64,
  kI64,
  kU64,
};

// What an element holds (for tools that treat families alike: a float comparison, an integer range).
enum class DtypeKind : std::uint8_t { kBool, kSigned, kUnsigned, kFloat, kComplex };

// DLPack type code (dlpack.h's DLDataTypeCode) in the legacy, unversioned ABI every torch release reads, or
// kNoDlpack where that ABI (or torch's reader of it) cannot describe the type (float8, float6, float4).
inline constexpr std::uint8_t kNoDlpack = 0xFF;

struct DtypeInfo {
  Dtype dtype;
  // The code written in the header, e.g. "F32".
  std::string_view code;
  // Size of one element in bits. Sub-byte types (F4, F6_*) have bits % 8 != 0; a tensor of them must hold a
  // whole number of bytes.
  std::uint32_t bits;
  DtypeKind kind;
  // Width in bytes of the units a big-endian host byte-swaps to turn the file's little-endian bytes into
  // native values (and back when writing): the element size for 16/32/64-bit scalars, 4 for C64 (two F32
  // halves), 0 for 8-bit and sub-byte types, which have no byte order.
  std::uint8_t swap_bytes;
  // See kNoDlpack.
  std::uint8_t dlpack_code;
  // Logical values per element of torch's type: 2 for F4 (torch.float4_e2m1fn_x2 packs the last dimension two
  // to a byte, so torch's shape halves the header's last dimension, which must be even), otherwise 1.
  std::uint8_t torch_pack;
  // torch dtype attribute name (torch.<name>), or "" where torch has none.
  std::string_view torch_name;
  // numpy / ml_dtypes type name (numpy.<name> or ml_dtypes.<name>), or "" where neither has one.
  std::string_view numpy_name;
};

// One row per dtype, indexed by rank: {dtype, code, bits, kind, swap_bytes, dlpack_code, torch_pack, torch name,
// numpy name}. The header always holds the logical element count (see torch_pack for F4).
inline constexpr std::array<DtypeInfo, 22> kDtypeTable = {{
    {Dtype::kBool, "BOOL", 8, DtypeKind::kBool, 0, 6, 1, "bool", "bool"},
    {Dtype::kF4, "F4", 4, DtypeKind::kFloat, 0, kNoDlpack, 2, "float4_e2m1fn_x2", "float4_e2m1fn"},
    {Dtype::kF6_E2M3, "F6_E2M3", 6, DtypeKind::kFloat, 0, kNoDlpack, 1, "", "float6_e2m3fn"},
    {Dtype::kF6_E3M2, "F6_E3M2", 6, DtypeKind::kFloat, 0, kNoDlpack, 1, "", "float6_e3m2fn"},
    {Dtype::kU8, "U8", 8, DtypeKind::kUnsigned, 0, 1, 1, "uint8", "uint8"},
    {Dtype::kI8, "I8", 8, DtypeKind::kSigned, 0, 0, 1, "int8", "int8"},
    {Dtype::kF8_E5M2, "F8_E5M2", 8, DtypeKind::kFloat, 0, kNoDlpack, 1, "float8_e5m2", "float8_e5m2"},
    {Dtype::kF8_E4M3, "F8_E4M3", 8, DtypeKind::kFloat, 0, kNoDlpack, 1, "float8_e4m3fn", "float8_e4m3fn"},
    {Dtype::kF8_E8M0, "F8_E8M0", 8, DtypeKind::kFloat, 0, kNoDlpack, 1, "float8_e8m0fnu", "float8_e8m0fnu"},
    {Dtype::kF8_E4M3FNUZ, "F8_E4M3FNUZ", 8, DtypeKind::kFloat, 0, kNoDlpack, 1, "float8_e4m3fnuz", "float8_e4m3fnuz"},
    {Dtype::kF8_E5M2FNUZ, "F8_E5M2FNUZ", 8, DtypeKind::kFloat, 0, kNoDlpack, 1, "float8_e5m2fnuz", "float8_e5m2fnuz"},
    {Dtype::kI16, "I16", 16, DtypeKind::kSigned, 2, 0, 1, "int16", "int16"},
    {Dtype::kU16, "U16", 16, DtypeKind::kUnsigned, 2, 1, 1, "uint16", "uint16"},
    {Dtype::kF16, "F16", 16, DtypeKind::kFloat, 2, 2, 1, "float16", "float16"},
    {Dtype::kBF16, "BF16", 16, DtypeKind::kFloat, 2, 4, 1, "bfloat16", "bfloat16"},
    {Dtype::kI32, "I32", 32, DtypeKind::kSigned, 4, 0, 1, "int32", "int32"},
    {Dtype::kU32, "U32", 32, DtypeKind::kUnsigned, 4, 1, 1, "uint32", "uint32"},
    {Dtype::kF32, "F32", 32, DtypeKind::kFloat, 4, 2, 1, "float32", "float32"},
    {Dtype::kC64, "C64", 64, DtypeKind::kComplex, 4, 5, 1, "complex64", "complex64"},
    {Dtype::kF64, "F64", 64, DtypeKind::kFloat, 8, 2, 1, "float64", "float64"},
    {Dtype::kI64, "I64", 64, DtypeKind::kSigned, 8, 0, 1, "int64", "int64"},
    {Dtype::kU64, "U64", 64, DtypeKind::kUnsigned, 8, 1, 1, "uint64", "uint64"},
}};

namespace detail {
constexpr bool table_is_in_rank_order() {
  for (std::size_t i = 0; i < kDtypeTable.size(); ++i) {
    if (static_cast<std::size_t>(kDtypeTable[i].dtype) != i) return false;
  }
  return true;
}
constexpr bool table_is_consistent() {
  for (const DtypeInfo& r : kDtypeTable) {
    const std::uint32_t unit = r.kind == DtypeKind::kComplex ? r.bits / 2 : r.bits;
    if (r.swap_bytes != (unit >= 16 ? unit / 8 : 0)) return false;      // swapping follows the scalar width
    if (r.torch_pack != 1 && r.bits * r.torch_pack != 8) return false;  // a packed type fills whole bytes
  }
  return true;
}
}  // namespace detail
static_assert(detail::table_is_in_rank_order(), "kDtypeTable rows must be indexed by Dtype (rank order)");
static_assert(detail::table_is_consistent(), "kDtypeTable: swap_bytes or torch_pack contradicts bits");

constexpr const DtypeInfo& dtype_info(Dtype d) { return kDtypeTable[static_cast<std::size_t>(d)]; }
constexpr std::string_view dtype_code(Dtype d) { return dtype_info(d).code; }
constexpr std::uint32_t dtype_bits(Dtype d) { return dtype_info(d).bits; }
constexpr DtypeKind dtype_kind(Dtype d) { return dtype_info(d).kind; }
constexpr std::uint8_t dtype_swap_bytes(Dtype d) { return dtype_info(d).swap_bytes; }
// Sort rank: the writer places higher ranks first.
constexpr int dtype_rank(Dtype d) { return static_cast<int>(d); }

// Byte order. The format's bytes are little-endian. Every read into caller memory (File::read_into,
// read_many, read_slice, the Prefetcher's deliveries, the C API and the libtorch adapter) delivers native
// values, swapping on a big-endian host; the writer turns native values into little-endian bytes without
// touching the caller's memory. Only the bytes of a zero-copy view (File::view) and of File::read_range,
// which knows no dtype, are the file's own: a big-endian caller swaps them with swap_to_native().
static_assert(std::endian::native == std::endian::little || std::endian::native == std::endian::big,
              "mixed-endian hosts are not supported");
constexpr bool host_is_little_endian() { return std::endian::native == std::endian::little; }
// The width of the units this host swaps for dtype `d` (see DtypeInfo::swap_bytes): 0 on a little-endian host.
constexpr std::uint8_t host_swap_bytes(Dtype d) { return host_is_little_endian() ? 0 : dtype_swap_bytes(d); }
// True when the file's bytes of `d` are not this host's values: multi-byte types on a big-endian host.
constexpr bool host_must_swap(Dtype d) { return host_swap_bytes(d) != 0; }

// Reverses the byte order of each `width`-byte unit of `bytes`, on any host (width 0 or 1: nothing).
// REQUIRES: width is 0, 1, 2, 4 or 8; bytes.size() is a multiple of width.
SAFETENSORS_EXPORT void byteswap_units(std::span<std::byte> bytes, unsigned width);
// Copies `src` into `dst` reversing each `width`-byte unit. REQUIRES: as byteswap_units; dst.size() ==
// src.size(); the two do not overlap.
SAFETENSORS_EXPORT void byteswap_copy(std::span<const std::byte> src, std::span<std::byte> dst, unsigned width);
// Turns the file's little-endian bytes of whole `d` elements into native values in place, or native values
// into the file's bytes (the swap is its own inverse): a no-op where !host_must_swap(d).
inline void swap_to_native(Dtype d, std::span<std::byte> bytes) {
  if (host_must_swap(d)) byteswap_units(bytes, host_swap_bytes(d));
}

// Packed torch types (DtypeInfo::torch_pack > 1: F4 as torch.float4_e2m1fn_x2), the one statement of the
// rule: a header shape counts values, torch's shape counts its elements, torch_pack values to an element of
// the last dimension. libtorch.h and the Python binding (safetensors.torch, TensorSpec, numpy's TensorSpecs)
// convert through these two.
//
// torch's shape for a header shape of `d`: the last dimension divided by torch_pack (the shape itself where
// torch_pack is 1). Errors (kInvalidArgument, no context): no dimension, or a last dimension that is not a
// multiple of torch_pack.
SAFETENSORS_EXPORT Result<std::vector<std::uint64_t>> torch_shape(Dtype d, std::span<const std::uint64_t> shape);
// The header shape for torch's shape of `d`: the last dimension multiplied by torch_pack. Errors
// (kInvalidArgument, no context): no dimension (a packed scalar has no shape to hold its values), or a last
// dimension whose product overflows.
SAFETENSORS_EXPORT Result<std::vector<std::uint64_t>> header_shape(Dtype d, std::span<const std::uint64_t> shape);

// The dtype whose header code is `code` (exact, case-sensitive), or nullopt.
SAFETENSORS_EXPORT std::optional<Dtype> dtype_from_code(std::string_view code);
// The dtype whose torch name is `name` (e.g. "bfloat16"), or nullopt.
SAFETENSORS_EXPORT std::optional<Dtype> dtype_from_torch_name(std::string_view name);

}  // namespace safetensors

#endif  // SAFETENSORS_DTYPE_H_
