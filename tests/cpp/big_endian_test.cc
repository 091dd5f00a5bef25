// Big-endian hosts. The format is little-endian; reads into caller memory deliver native values,
// the writer writes little-endian from native values without touching the caller's memory, and views are
// the file's bytes. On a little-endian host the golden checks pin the file bytes; under qemu-s390x
// (scripts/test.d/60-big-endian.sh) the same tests check the swaps.
#include <gtest/gtest.h>

#include <bit>
#include <cstring>
#include <string>
#include <vector>

#include "golden_le.h"
#include "safetensors/c.h"
#include "safetensors/engine.h"
#include "safetensors/file.h"
#include "safetensors/writer.h"
#include "test_util.h"

namespace safetensors {
namespace {

using test::golden_data;
using test::golden_tensors;
using test::GoldenTensor;
using test::to_string;

std::vector<std::byte> bytes_of(std::string_view s) {
  std::vector<std::byte> out(s.size());
  std::memcpy(out.data(), s.data(), s.size());
  return out;
}

TEST(BigEndianTest, HostByteOrderIsWhatTheHardwareSays) {
  const std::uint32_t one = 1;
  unsigned char first;
  std::memcpy(&first, &one, 1);
  EXPECT_EQ(host_is_little_endian(), first == 1);
  EXPECT_EQ(host_must_swap(Dtype::kF32), first != 1);
  EXPECT_EQ(host_swap_bytes(Dtype::kC64), first == 1 ? 0 : 4);
  EXPECT_FALSE(host_must_swap(Dtype::kU8));
  EXPECT_FALSE(host_must_swap(Dtype::kF4));
  EXPECT_EQ(safetensors_host_must_swap(SAFETENSORS_F64), first != 1);
  EXPECT_EQ(safetensors_dtype_swap_bytes(SAFETENSORS_BF16), 2u);
  EXPECT_EQ(safetensors_dtype_swap_bytes(-1), 0u);
}

TEST(BigEndianTest, ByteswapReversesEachUnit) {
  const auto in = bytes_of("\x01\x02\x03\x04\x05\x06\x07\x08");
  auto b = in;
  byteswap_units(b, 2);
  EXPECT_EQ(to_string(b), "\x02\x01\x04\x03\x06\x05\x08\x07");
  b = in;
  byteswap_units(b, 4);
  EXPECT_EQ(to_string(b), "\x04\x03\x02\x01\x08\x07\x06\x05");
  b = in;
  byteswap_units(b, 8);
  EXPECT_EQ(to_string(b), "\x08\x07\x06\x05\x04\x03\x02\x01");
  b = in;
  byteswap_units(b, 0);
  byteswap_units(b, 1);
  EXPECT_EQ(b, in);
  std::vector<std::byte> out(8);
  byteswap_copy(in, out, 4);
  EXPECT_EQ(to_string(out), "\x04\x03\x02\x01\x08\x07\x06\x05");
  EXPECT_EQ(to_string(in), "\x01\x02\x03\x04\x05\x06\x07\x08");  // the source is untouched
  // swap_to_native is the host's decision: a swap on big-endian hosts only.
  b = in;
  swap_to_native(Dtype::kI16, b);
  EXPECT_EQ(to_string(b), host_is_little_endian() ? to_string(in) : "\x02\x01\x04\x03\x06\x05\x08\x07");
}

// The writer turns native values into the golden little-endian bytes, on any host, and leaves the
// caller's memory as it was.
TEST(BigEndianTest, WriterWritesLittleEndianFromNativeValues) {
  const std::vector<GoldenTensor> golden = golden_tensors();
  const std::vector<TensorData> data = golden_data(golden);
  test::TempDir dir;
  const std::string path = dir.file("golden.safetensors");
  ASSERT_ST_OK(save_file(path, data));
  auto serialized = serialize(data);
  ASSERT_ST_OK(serialized);
  EXPECT_EQ(test::read_bytes(path), to_string(*serialized));
  for (const GoldenTensor& g : golden) {
    EXPECT_EQ(to_string(golden_data({g})[0].data), to_string(g.native)) << g.name;
  }
  const std::vector<GoldenTensor> untouched = golden_tensors();
  for (std::size_t i = 0; i < golden.size(); ++i) EXPECT_EQ(golden[i].native, untouched[i].native);

  auto file = File::open(path);
  ASSERT_ST_OK(file);
  for (const GoldenTensor& g : golden) {
    const TensorInfo* t = file->find(g.name);
    ASSERT_NE(t, nullptr) << g.name;
    auto view = file->view(*t);
    ASSERT_ST_OK(view);
    EXPECT_EQ(to_string(view->bytes), g.file_bytes) << g.name << ": views hold the file's bytes";
  }
}

// A FileWriter swaps each part through its scratch memory; a part past the scratch size is swapped in
// several rounds, and the caller's buffer never changes.
TEST(BigEndianTest, FileWriterPartsAndLargeTensorsAreSwappedWithoutTouchingTheCaller) {
  constexpr std::size_t kCount = (3u << 20) / 4 + 3;  // 3 MiB + 12 bytes of U32: several scratch rounds
  std::vector<std::uint32_t> values(kCount);
  for (std::size_t i = 0; i < kCount; ++i) values[i] = static_cast<std::uint32_t>(i * 2654435761u);
  const std::vector<std::uint32_t> before = values;
  const std::span<const std::byte> bytes = std::as_bytes(std::span(values));
  std::vector<TensorData> ts = {{"v", Dtype::kU32, {kCount}, bytes}};
  auto plan = WritePlan::make(ts, {});
  ASSERT_ST_OK(plan);
  test::TempDir dir;
  const std::string path = dir.file("parts.safetensors");
  auto w = FileWriter::create(path, *plan);
  ASSERT_ST_OK(w);
  ASSERT_ST_OK(w->write_part(0, 4, bytes.subspan(4)));
  ASSERT_ST_OK(w->write_part(0, 0, bytes.first(4)));
  ASSERT_ST_OK(w->finish());
  EXPECT_EQ(values, before);

  const std::string file = test::read_bytes(path);
  const std::size_t data = plan->data_offset();
  ASSERT_EQ(file.size(), data + kCount * 4);
  for (std::size_t i : {std::size_t{0}, std::size_t{1}, std::size_t{262144}, kCount - 1}) {
    std::uint32_t le = 0;
    for (int b = 3; b >= 0; --b)
      le = (le << 8) | static_cast<unsigned char>(file[data + 4 * i + static_cast<std::size_t>(b)]);
    EXPECT_EQ(le, values[i]) << i;
  }
}

// Every read into caller memory gives native values: read_into, read_many, read_slice, on every backend.
TEST(BigEndianTest, ReadsDeliverNativeValuesOnEveryBackend) {
  const std::vector<GoldenTensor> golden = golden_tensors();
  test::TempDir dir;
  const std::string path = dir.file("golden.safetensors");
  ASSERT_ST_OK(save_file(path, golden_data(golden)));
  for (Backend backend : {Backend::kMmap, Backend::kPread}) {
    auto opened = File::open(path, {.backend = backend});
    ASSERT_ST_OK(opened);
    const File& file = *opened;
    std::vector<std::vector<std::byte>> many(golden.size());
    std::vector<ReadRequest> requests;
    for (std::size_t i = 0; i < golden.size(); ++i) {
      const TensorInfo* t = file.find(golden[i].name);
      ASSERT_NE(t, nullptr);
      std::vector<std::byte> one(t->nbytes());
      ASSERT_ST_OK(file.read_into(*t, one));
      EXPECT_EQ(one, golden[i].native) << golden[i].name;
      many[i].resize(t->nbytes());
      requests.push_back({t, many[i]});
    }
    ASSERT_ST_OK(file.read_many(requests, 2));
    for (std::size_t i = 0; i < golden.size(); ++i) EXPECT_EQ(many[i], golden[i].native) << golden[i].name;

    // Rows 1.. of i32 (3 x 1) and the second element of i64, through the slice planner.
    const TensorInfo& i32 = **file.info("i32");
    const SliceIndex rows[] = {SliceIndex::range(1, std::nullopt, 1)};
    auto plan = file.plan_slice(i32, rows);
    ASSERT_ST_OK(plan);
    std::vector<std::int32_t> got(2);
    ASSERT_ST_OK(file.read_slice(i32, *plan, std::as_writable_bytes(std::span(got))));
    EXPECT_EQ(got, (std::vector<std::int32_t>{-1, 0x01020304}));
    const TensorInfo& i64 = **file.info("i64");
    const SliceIndex second[] = {SliceIndex::at(1)};
    auto plan64 = file.plan_slice(i64, second);
    ASSERT_ST_OK(plan64);
    std::int64_t v = 0;
    ASSERT_ST_OK(file.read_slice(i64, *plan64, std::as_writable_bytes(std::span(&v, 1))));
    EXPECT_EQ(v, 0x1122334455667788);
  }
}

// The view's bytes plus swap_to_native give the same values as read_into (the C API's helper too).
TEST(BigEndianTest, ViewBytesSwappedByTheHelperAreTheValues) {
  const std::vector<GoldenTensor> golden = golden_tensors();
  auto source = test::serialized_source(golden_data(golden));
  ASSERT_ST_OK(source);
  auto file = File::open(*source);
  ASSERT_ST_OK(file);
  for (const GoldenTensor& g : golden) {
    auto view = file->view(g.name);
    ASSERT_ST_OK(view);
    std::vector<std::byte> copy(view->bytes.begin(), view->bytes.end());
    swap_to_native(file->find(g.name)->dtype, copy);
    EXPECT_EQ(copy, g.native) << g.name;
    std::vector<std::byte> c_copy(view->bytes.begin(), view->bytes.end());
    safetensors_swap_to_native(static_cast<int>(file->find(g.name)->dtype), c_copy.data(), c_copy.size());
    EXPECT_EQ(c_copy, g.native) << g.name;
  }
}

// A file whose F32 tensor starts at an odd offset (valid: the format does not align tensors), read by the
// engine in small chunks: chunk boundaries fall on whole elements of the piece they cut, so each chunk's part
// is swapped on its own, staged or direct.
TEST(BigEndianTest, EngineChunksCutWholeElementsAndDeliverNativeValues) {
  constexpr std::size_t kCount = 5000;  // 20000 bytes: several 4 KiB chunks
  std::vector<float> values(kCount);
  for (std::size_t i = 0; i < kCount; ++i) values[i] = static_cast<float>(i) * 0.25f - 7.0f;
  const std::vector<std::uint8_t> pad = {9};
  std::vector<TensorData> ts = {{"pad", Dtype::kU8, {1}, std::as_bytes(std::span(pad))},
                                {"w", Dtype::kF32, {kCount}, std::as_bytes(std::span(values))}};
  // The writer puts F32 first; build the odd layout by hand: U8 at [0, 1), F32 at [1, 20001).
  std::string header = R"({"pad":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"w":{"dtype":"F32","shape":[)" +
                       std::to_string(kCount) + R"(],"data_offsets":[1,)" + std::to_string(1 + 4 * kCount) + "]}}";
  // Trailing spaces (valid JSON whitespace) put the tensor 2 bytes past a 4-byte boundary of the file, so
  // every page-aligned chunk boundary would cut an element in half.
  while ((8 + header.size() + 1) % 4 != 2) header.push_back(' ');
  auto serialized = serialize(std::span(ts).subspan(1));
  ASSERT_ST_OK(serialized);
  const std::size_t w_data = serialized->size() - 4 * kCount;
  std::string data(1, '\x09');
  data.append(reinterpret_cast<const char*>(serialized->data() + w_data), 4 * kCount);  // little-endian already
  auto file = test::open_bytes(test::raw_file(header, data));
  ASSERT_ST_OK(file);
  const TensorInfo& w = **file->info("w");
  std::vector<float> direct(kCount);
  auto p_direct = tensor_piece(*file, w);
  auto p_staged = row_piece(*file, w, 3, kCount);
  ASSERT_ST_OK(p_direct);
  ASSERT_ST_OK(p_staged);
  EXPECT_EQ(p_direct->swap_bytes, 4);
  p_direct->delivery = Delivery::kDirect;
  p_direct->dst = std::as_writable_bytes(std::span(direct));
  PrefetchOptions options;
  options.threads = 2;
  options.chunk_bytes = 4096;
  auto pf = Prefetcher::start(*file, {*p_direct, *p_staged}, options);
  ASSERT_ST_OK(pf);
  std::vector<float> staged(kCount - 3, -1.0f);
  for (;;) {
    auto ev = (*pf)->next();
    ASSERT_ST_OK(ev);
    if (ev->kind == PrefetchEvent::Kind::kEnd) break;
    if (ev->kind != PrefetchEvent::Kind::kStaged) continue;
    EXPECT_EQ(ev->offset % 4, 0u);
    EXPECT_EQ(ev->bytes.size() % 4, 0u);
    std::memcpy(reinterpret_cast<std::byte*>(staged.data()) + ev->offset, ev->bytes.data(), ev->bytes.size());
    ASSERT_ST_OK((*pf)->release(ev->slab));
  }
  ASSERT_ST_OK((*pf)->wait_piece(0));
  EXPECT_EQ(direct, values);
  EXPECT_EQ(staged, std::vector<float>(values.begin() + 3, values.end()));
}

}  // namespace
}  // namespace safetensors
