// src/util/parallel.h's for_each_chunk (the one chunk splitter) and hint_ahead (the one readahead schedule), and
// src/file/read_chunks.h (reads cut by the one, hinted by the other).
#include "file/read_chunks.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "test_util.h"
#include "util/parallel.h"

namespace safetensors::internal {
namespace {

using test::random_bytes;

TEST(ForEachPieceTest, CoversTheRangeInOrderWithPiecesOfAtMostTheLimit) {
  std::vector<std::pair<std::uint64_t, std::uint64_t>> got;
  for_each_chunk(10, 4, [&](std::uint64_t off, std::uint64_t len) { got.emplace_back(off, len); });
  EXPECT_EQ(got, (std::vector<std::pair<std::uint64_t, std::uint64_t>>{{0, 4}, {4, 4}, {8, 2}}));
  got.clear();
  for_each_chunk(8, 4, [&](std::uint64_t off, std::uint64_t len) { got.emplace_back(off, len); });
  EXPECT_EQ(got, (std::vector<std::pair<std::uint64_t, std::uint64_t>>{{0, 4}, {4, 4}}));
  got.clear();
  for_each_chunk(0, 4, [&](std::uint64_t off, std::uint64_t len) { got.emplace_back(off, len); });
  EXPECT_TRUE(got.empty());
  // No overflow near the top of the range.
  got.clear();
  for_each_chunk(UINT64_MAX, UINT64_MAX / 2 + 1,
                 [&](std::uint64_t off, std::uint64_t len) { got.emplace_back(off, len); });
  EXPECT_EQ(got, (std::vector<std::pair<std::uint64_t, std::uint64_t>>{{0, UINT64_MAX / 2 + 1},
                                                                       {UINT64_MAX / 2 + 1, UINT64_MAX / 2}}));
}

TEST(HintAheadTest, HintsEveryPieceOnceAndKeepsTheReadaheadWindowAheadOfTheReader) {
  for (std::size_t count : {0u, 1u, 3u, 4u, 5u, 9u}) {
    std::vector<int> hinted(count, 0);
    for (std::size_t i = 0; i < count; ++i) {
      hint_ahead(i, count, [&](std::size_t k) {
        ASSERT_LT(k, count);
        ++hinted[k];
      });
      // When chunk i is read, it and the kReadaheadChunks - 1 after it (those that exist) have been hinted.
      for (std::size_t k = 0; k < std::min(count, i + kReadaheadChunks); ++k) {
        EXPECT_EQ(hinted[k], 1) << "count " << count << ", chunk " << k << " when chunk " << i << " is taken";
      }
      for (std::size_t k = i + kReadaheadChunks + 1; k < count; ++k) EXPECT_EQ(hinted[k], 0);
    }
    EXPECT_EQ(hinted, std::vector<int>(count, 1)) << "count " << count;
  }
}

TEST(ReadChunksTest, SplitsAtTheReadChunkAndReadsEveryByte) {
  const std::size_t n = 2 * kReadChunk + 123;
  auto bytes = std::make_shared<std::vector<std::byte>>(random_bytes(n + 16, 7));
  auto source = memory_source(*bytes, bytes);
  std::vector<std::byte> dst(n);
  std::vector<ReadChunk> chunks;
  split_read(*source, 16, dst, "t", 0, &chunks);
  ASSERT_EQ(chunks.size(), 3u);
  EXPECT_EQ(chunks[0].source_offset, 16u);
  EXPECT_EQ(chunks[1].source_offset, 16 + kReadChunk);
  EXPECT_EQ(chunks[2].length, 123u);
  EXPECT_EQ(chunks[2].dst, dst.data() + 2 * kReadChunk);
  for (unsigned threads : {0u, 1u, 3u}) {
    std::fill(dst.begin(), dst.end(), std::byte{0});
    ASSERT_ST_OK(read_chunks(chunks, n, threads));
    EXPECT_TRUE(std::equal(dst.begin(), dst.end(), bytes->begin() + 16));
  }
}

TEST(ReadChunksTest, AnErrorNamesTheTensorOrTheDataBuffer) {
  auto bytes = std::make_shared<std::vector<std::byte>>(random_bytes(64, 3));
  auto faulty = std::make_shared<testing::FaultySource>(memory_source(*bytes, bytes, "f.safetensors"));
  faulty->eio_at_offset = 40;
  std::vector<std::byte> dst(32);
  std::vector<ReadChunk> chunks;
  split_read(*faulty, 32, dst, "w", 0, &chunks);
  auto st = read_chunks(chunks, dst.size(), 1);
  EXPECT_ST_ERROR(st, kIo);
  EXPECT_NE(st.error().to_string().find("read of tensor `w`"), std::string::npos) << st.error().to_string();
  chunks.clear();
  split_read(*faulty, 32, dst, {}, 0, &chunks);
  st = read_chunks(chunks, dst.size(), 1);
  EXPECT_ST_ERROR(st, kIo);
  EXPECT_NE(st.error().to_string().find("read of the data buffer"), std::string::npos) << st.error().to_string();
  EXPECT_ST_OK(read_chunks({}, 0, 0));
}

}  // namespace
}  // namespace safetensors::internal
