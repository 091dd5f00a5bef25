// CopyQueue (engine.h): a staged slab goes back to the pool only after the copy out of it completed. Copies
// here are memcpys whose "device event" completes when the test says so, so a slab released too early would
// be refilled under a copy that has not run yet.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <vector>

#include "safetensors/engine.h"
#include "test_util.h"

namespace safetensors {
namespace {

using Kind = PrefetchEvent::Kind;
constexpr std::uint64_t kSlab = 4 * 4096;

// `count` U8 tensors of one slab each, in memory.
struct Slabs {
  std::vector<std::vector<std::byte>> data;
  File file;
};

Slabs make_file(int count) {
  std::vector<std::vector<std::byte>> data;
  std::vector<TensorData> ts;
  for (int i = 0; i < count; ++i) {
    data.push_back(test::random_bytes(kSlab, 40 + i));
    ts.push_back({"t" + std::to_string(i), Dtype::kU8, {kSlab}, data.back()});
  }
  auto bytes = serialize(ts);
  EXPECT_TRUE(bytes.ok());
  auto owner = std::make_shared<std::vector<std::byte>>(std::move(*bytes));
  auto f = File::open(memory_source(*owner, owner));
  EXPECT_TRUE(f.ok());
  return {std::move(data), std::move(f).value()};
}

std::vector<Piece> whole(const File& f) {
  std::vector<Piece> plan;
  for (const auto& t : f.tensors()) plan.push_back(*tensor_piece(f, t));
  return plan;
}

// A copy that runs only when its event is waited for or found complete: until then the slab's bytes are
// still needed, and a slab recycled early shows up as wrong bytes in `dst`.
struct DeferredCopy {
  const std::byte* src;
  std::byte* dst;
  std::size_t size;
  bool ran = false;
  void run() {
    if (!ran) std::memcpy(dst, src, size);
    ran = true;
  }
};

TEST(CopyQueueTest, SlabsGoBackOnlyAfterTheirCopiesCompletedThroughAPoolOfTwo) {
  Slabs m = make_file(6);
  SlabPool pool(2 * kSlab, kSlab);
  auto pf = Prefetcher::start(m.file, whole(m.file), {.threads = 2, .pool = &pool});
  ASSERT_ST_OK(pf);
  std::vector<std::vector<std::byte>> out(6, std::vector<std::byte>(kSlab));
  std::vector<std::size_t> landed;
  int waits = 0, copies_issued = 0;
  {
    CopyQueue copies(**pf);
    for (;;) {
      auto ev = copies.next(&landed);
      ASSERT_ST_OK(ev);
      if (ev->kind == Kind::kEnd) break;
      if (ev->kind == Kind::kTimeout) continue;
      ASSERT_EQ(ev->kind, Kind::kStaged);
      ++copies_issued;
      // The copy is only queued: nothing polls it complete, so each slab comes back through wait() alone.
      auto copy = std::make_shared<DeferredCopy>(
          DeferredCopy{ev->bytes.data(), out[ev->piece].data() + ev->offset, ev->bytes.size()});
      copies.add(ev->slab, {[] { return false; }, [copy, &waits] { copy->run(), ++waits; }},
                 ev->piece_done ? ev->piece : CopyQueue::kNoPiece);
    }
    ASSERT_ST_OK(copies.finish(&landed));
    EXPECT_TRUE(copies.empty());
  }
  for (int i = 0; i < 6; ++i) EXPECT_EQ(out[i], m.data[i]) << "tensor " << i;
  std::sort(landed.begin(), landed.end());  // two readers: pieces land in any order, each once
  EXPECT_EQ(landed, (std::vector<std::size_t>{0, 1, 2, 3, 4, 5}));
  EXPECT_EQ(waits, copies_issued);  // every copy ran before its slab went back
  EXPECT_LE(pool.stats().peak_bytes, 2 * kSlab);
  EXPECT_EQ((*pf)->stats().events_lent, 0u);
}

TEST(CopyQueueTest, RetireStopsAtTheFirstCopyNotCompleteAndReportsPiecesInOrder) {
  Slabs m = make_file(3);
  auto pf = Prefetcher::start(m.file, whole(m.file), {.threads = 1});
  ASSERT_ST_OK(pf);
  CopyQueue copies(**pf);
  std::vector<bool> complete = {false, true, true};
  for (std::size_t k = 0; k < 3; ++k) {
    auto ev = (*pf)->next();
    ASSERT_ST_OK(ev);
    const std::size_t i = ev->piece;
    copies.add(ev->slab, {[&complete, k] { return static_cast<bool>(complete[k]); }, [] {}}, i);
  }
  std::vector<std::size_t> landed;
  ASSERT_ST_OK(copies.retire(false, &landed));
  EXPECT_TRUE(landed.empty());  // the oldest copy holds back the later ones (one stream completes in order)
  EXPECT_EQ((*pf)->stats().events_lent, 3u);
  complete[0] = true;
  ASSERT_ST_OK(copies.retire(false, &landed));
  EXPECT_EQ(landed.size(), 3u);
  EXPECT_EQ((*pf)->stats().events_lent, 0u);
}

TEST(CopyQueueTest, DestructionWaitsForEveryPendingCopyAndReturnsItsSlabEvenWhenAWaitThrows) {
  Slabs m = make_file(2);
  auto pf = Prefetcher::start(m.file, whole(m.file), {.threads = 1});
  ASSERT_ST_OK(pf);
  int waited = 0;
  {
    CopyQueue copies(**pf);
    for (int k = 0; k < 2; ++k) {
      auto ev = (*pf)->next();
      ASSERT_ST_OK(ev);
      copies.add(ev->slab, {[] { return false; },
                            [&waited, k] {
                              ++waited;
                              if (k == 0) throw std::runtime_error("device lost");
                            }});
    }
    EXPECT_EQ((*pf)->stats().events_lent, 2u);
  }
  EXPECT_EQ(waited, 2);
  EXPECT_EQ((*pf)->stats().events_lent, 0u);
}

TEST(CopyQueueTest, CompletionsThatAreEmptyRetireAtOnce) {
  Slabs m = make_file(1);
  auto pf = Prefetcher::start(m.file, whole(m.file), {.threads = 1});
  ASSERT_ST_OK(pf);
  CopyQueue copies(**pf);
  std::vector<std::size_t> landed;
  auto ev = copies.next(&landed);
  ASSERT_ST_OK(ev);
  copies.add(ev->slab, {}, ev->piece);  // a blocking copy: complete when add() is called
  auto end = copies.next(&landed);
  ASSERT_ST_OK(end);
  EXPECT_EQ(end->kind, Kind::kEnd);
  EXPECT_EQ(landed, std::vector<std::size_t>{0});
  EXPECT_TRUE(copies.empty());
}

}  // namespace
}  // namespace safetensors
