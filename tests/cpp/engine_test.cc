// The engine (engine.h): plans of whole tensors and row ranges read into direct destinations or through slabs
// of a bounded pool, compared byte for byte with File::read_into; what is read (gaps never), the pool's bound
// with many prefetchers, slab reuse only after release, errors delivered by next(), cancel and destruction.
// Threaded tests carry Thread/Concurrent in their names for the TSan stage.
#include "safetensors/engine.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "test_util.h"

namespace safetensors {
namespace {

using namespace std::chrono_literals;
using test::TempDir;

using Kind = PrefetchEvent::Kind;

// A file of `count` U8/F32/F4 tensors of varied shapes, filled with pseudo-random bytes.
struct Model {
  std::vector<TensorData> tensors;
  std::vector<std::vector<std::byte>> data;
};

Model make_model(std::size_t count, std::uint64_t rows, std::uint64_t row_elems, std::uint32_t seed = 1) {
  Model m;
  m.data.reserve(count);
  for (std::size_t i = 0; i < count; ++i) {
    const Dtype dtype = i % 3 == 0 ? Dtype::kF32 : i % 3 == 1 ? Dtype::kU8 : Dtype::kF4;
    const std::uint64_t r = rows + i % 5;
    const std::uint64_t n = r * row_elems * dtype_bits(dtype) / 8;
    m.data.push_back(test::random_bytes(n, seed + static_cast<std::uint32_t>(i)));
    char name[32];
    std::snprintf(name, sizeof name, "t%06zu", i);
    m.tensors.push_back({name, dtype, {r, row_elems}, m.data.back()});
  }
  return m;
}

File open_model(const TempDir& dir, const Model& m, Backend backend, const char* name = "m.safetensors") {
  const std::string path = dir.file(name);
  EXPECT_TRUE(save_file(path, m.tensors).ok());
  auto f = File::open(path, {.backend = backend});
  EXPECT_TRUE(f.ok()) << f.error().to_string();
  return std::move(f).value();
}

// What a piece delivers: its bytes in the file as native values (swapped on a big-endian host).
std::vector<std::byte> expected_bytes(const File& f, const Piece& p) {
  std::vector<std::byte> out(p.size());
  EXPECT_TRUE(f.read_range(p.begin, out).ok());
  if (!host_is_little_endian()) byteswap_units(out, p.swap_bytes);
  return out;
}

// Drains `pf`: staged chunks are copied into out[piece] and released; returns the first error, or OK at kEnd.
struct Drained {
  std::vector<std::vector<std::byte>> bytes;
  std::vector<int> completions;  // piece_done events seen per piece
};
Status drain(Prefetcher& pf, Drained* d) {
  const auto& plan = pf.plan();
  d->bytes.resize(plan.size());
  d->completions.assign(plan.size(), 0);
  for (std::size_t i = 0; i < plan.size(); ++i) d->bytes[i].resize(plan[i].size());
  for (;;) {
    SAFETENSORS_ASSIGN_OR_RETURN(PrefetchEvent ev, pf.next());
    if (ev.kind == Kind::kEnd) return ok_status();
    if (ev.kind == Kind::kStaged) {
      EXPECT_LE(ev.offset + ev.bytes.size(), plan[ev.piece].size());
      if (!ev.bytes.empty()) {
        EXPECT_NE(ev.slab_data, nullptr);
        EXPECT_GE(ev.bytes.data(), ev.slab_data);
      }
      if (!ev.bytes.empty()) std::memcpy(d->bytes[ev.piece].data() + ev.offset, ev.bytes.data(), ev.bytes.size());
      SAFETENSORS_RETURN_IF_ERROR(pf.release(ev.slab));
    }
    if (ev.piece_done) ++d->completions[ev.piece];
  }
}

std::vector<Piece> whole_plan(const File& f, Delivery delivery, std::vector<std::vector<std::byte>>* dsts) {
  std::vector<Piece> plan;
  for (const TensorInfo& t : f.tensors()) {
    Piece p = tensor_piece(f, t).value();
    p.delivery = delivery;
    if (delivery == Delivery::kDirect) {
      dsts->emplace_back(p.size());
      p.dst = dsts->back();
    }
    plan.push_back(p);
  }
  return plan;
}

// Staged and direct plans compared with read_range/read_into, on every backend.
class EngineBackendTest : public ::testing::TestWithParam<Backend> {};

TEST_P(EngineBackendTest, WholeTensorsMatchReadIntoInBothModes) {
  TempDir dir;
  const Model m = make_model(40, 50, 96);
  const File f = open_model(dir, m, GetParam());
  SlabPool pool(16 * 4096, 4096);
  for (Delivery delivery : {Delivery::kStaged, Delivery::kDirect}) {
    std::vector<std::vector<std::byte>> dsts;
    dsts.reserve(f.tensors().size());
    auto plan = whole_plan(f, delivery, &dsts);
    auto pf = Prefetcher::start(f, plan, {.threads = 4, .pool = &pool});
    ASSERT_ST_OK(pf);
    Drained d;
    ASSERT_ST_OK(drain(**pf, &d));
    for (std::size_t i = 0; i < f.tensors().size(); ++i) {
      std::vector<std::byte> want(f.tensors()[i].nbytes());
      ASSERT_ST_OK(f.read_into(f.tensors()[i], want));
      const auto& got = delivery == Delivery::kDirect ? dsts[i] : d.bytes[i];
      ASSERT_EQ(got, want) << f.tensors()[i].name;
      EXPECT_EQ(d.completions[i], 1);
      EXPECT_TRUE((*pf)->piece_done(i));
    }
    const PrefetchStats s = (*pf)->stats();
    std::uint64_t total = 0;
    for (const auto& t : f.tensors()) total += t.nbytes();
    EXPECT_EQ(s.bytes_read, total);
    EXPECT_EQ(delivery == Delivery::kStaged ? s.bytes_staged : s.bytes_direct, total);
    EXPECT_EQ(s.events_lent, 0u);
    // The read phase: it started, and its last read ended after that (an order, not a duration).
    EXPECT_GT(s.started.time_since_epoch().count(), 0);
    EXPECT_GE(s.last_read_end, s.started);
  }
  EXPECT_LE(pool.stats().peak_bytes, pool.capacity());
}

TEST_P(EngineBackendTest, RowRangesMatchReadInto) {
  TempDir dir;
  const Model m = make_model(12, 40, 64);
  const File f = open_model(dir, m, GetParam());
  SlabPool pool(8 * 4096, 4096);
  for (Delivery delivery : {Delivery::kStaged, Delivery::kDirect}) {
    std::vector<Piece> plan;
    std::vector<std::vector<std::byte>> dsts;
    dsts.reserve(f.tensors().size());
    for (std::size_t i = 0; i < f.tensors().size(); ++i) {
      const TensorInfo& t = f.tensors()[i];
      // F4 rows of 64 elements are 32 bytes: every row boundary is a byte boundary.
      auto p = row_piece(f, t, 3 + i % 4, t.shape[0] - i % 7);
      ASSERT_ST_OK(p);
      p->delivery = delivery;
      if (delivery == Delivery::kDirect) {
        dsts.emplace_back(p->size());
        p->dst = dsts.back();
      }
      plan.push_back(*p);
    }
    auto pf = Prefetcher::start(f, plan, {.threads = 3, .pool = &pool});
    ASSERT_ST_OK(pf);
    Drained d;
    ASSERT_ST_OK(drain(**pf, &d));
    for (std::size_t i = 0; i < plan.size(); ++i) {
      const TensorInfo& t = f.tensors()[i];
      std::vector<std::byte> whole(t.nbytes());
      ASSERT_ST_OK(f.read_into(t, whole));
      const std::uint64_t row = t.nbytes() / t.shape[0];
      const std::uint64_t r0 = 3 + i % 4;
      std::vector<std::byte> want(whole.begin() + static_cast<std::ptrdiff_t>(r0 * row),
                                  whole.begin() + static_cast<std::ptrdiff_t>(r0 * row + plan[i].size()));
      EXPECT_EQ(delivery == Delivery::kDirect ? dsts[i] : d.bytes[i], want) << t.name;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, EngineBackendTest, ::testing::Values(Backend::kMmap, Backend::kPread),
                         [](const auto& info) { return info.param == Backend::kMmap ? "Mmap" : "Pread"; });

TEST(EngineTest, RowPieceChecksItsArguments) {
  const std::uint64_t scalar_data = 0;
  std::vector<TensorData> ts = {
      {"scalar", Dtype::kF32, {}, std::span(reinterpret_cast<const std::byte*>(&scalar_data), 4)},
  };
  std::vector<std::byte> f4b(6);  // 4 rows of 3 F4 values: 12 nibbles, but a row is 1.5 bytes
  ts.push_back({"f4", Dtype::kF4, {4, 3}, f4b});
  auto bytes = serialize(ts);
  ASSERT_ST_OK(bytes);
  auto owner = std::make_shared<std::vector<std::byte>>(std::move(*bytes));
  auto f = File::open(memory_source(*owner, owner));
  ASSERT_ST_OK(f);
  EXPECT_ST_ERROR(row_piece(*f, *f->find("scalar"), 0, 0), kInvalidSlice);
  const TensorInfo& t = *f->find("f4");
  EXPECT_ST_ERROR(row_piece(*f, t, 0, 5), kInvalidSlice);
  EXPECT_ST_ERROR(row_piece(*f, t, 3, 2), kInvalidSlice);
  EXPECT_ST_ERROR(row_piece(*f, t, 1, 2), kMisalignedSlice);  // row 1 starts at nibble 3
  auto p = row_piece(*f, t, 2, 4);                            // nibbles 6..12: bytes 3..6
  ASSERT_ST_OK(p);
  EXPECT_EQ(p->begin, t.begin + 3);
  EXPECT_EQ(p->end, t.begin + 6);
  EXPECT_EQ(p->tensor, "f4");
  auto e = row_piece(*f, t, 0, 5);
  EXPECT_NE(e.error().to_string().find("f4"), std::string::npos);
}

TEST(EngineTest, BytesBetweenPiecesAreNeverRead) {
  TempDir dir;
  const Model m = make_model(6, 400, 64);
  const File plain = open_model(dir, m, Backend::kPread);
  auto faulty = std::make_shared<testing::FaultySource>(plain.source());
  auto f = File::open(faulty);
  ASSERT_ST_OK(f);
  SlabPool pool(8 * 4096, 4096);
  for (Delivery delivery : {Delivery::kStaged, Delivery::kDirect}) {
    std::vector<Piece> plan;
    std::vector<std::vector<std::byte>> dsts;
    dsts.reserve(f->tensors().size());
    std::uint64_t wanted = 0;
    for (std::size_t i = 0; i < f->tensors().size(); i += 2) {  // every other tensor, and of those rows 10..20
      auto p = row_piece(*f, f->tensors()[i], 10, 20);
      ASSERT_ST_OK(p);
      p->delivery = delivery;
      if (delivery == Delivery::kDirect) {
        dsts.emplace_back(p->size());
        p->dst = dsts.back();
      }
      wanted += p->size();
      plan.push_back(*p);
    }
    faulty->bytes_read = 0;
    faulty->reads = 0;
    faulty->bytes_prefetched = 0;
    auto pf = Prefetcher::start(*f, plan, {.threads = 2, .pool = &pool});
    ASSERT_ST_OK(pf);
    Drained d;
    ASSERT_ST_OK(drain(**pf, &d));
    EXPECT_EQ(faulty->bytes_read.load(), wanted);
    EXPECT_EQ(faulty->bytes_prefetched.load(), wanted);  // readahead hints: every chunk, and nothing between
    EXPECT_EQ((*pf)->stats().bytes_read, wanted);
    for (std::size_t k = 0; k < plan.size(); ++k) {
      EXPECT_EQ(delivery == Delivery::kDirect ? dsts[k] : d.bytes[k], expected_bytes(*f, plan[k]));
    }
  }
}

TEST(EngineTest, AdjacentStagedPiecesShareReadsAndPageAlignedChunks) {
  TempDir dir;
  const Model m = make_model(30, 20, 32);  // small tensors, adjacent in the file
  const File plain = open_model(dir, m, Backend::kPread);
  auto faulty = std::make_shared<testing::FaultySource>(plain.source());
  auto f = File::open(faulty);
  ASSERT_ST_OK(f);
  SlabPool pool(4 * 4096, 4096);
  std::vector<std::vector<std::byte>> unused;
  auto plan = whole_plan(*f, Delivery::kStaged, &unused);
  std::uint64_t total = 0;
  for (const Piece& p : plan) total += p.size();
  faulty->reads = 0;
  auto pf = Prefetcher::start(*f, plan, {.threads = 2, .pool = &pool});
  ASSERT_ST_OK(pf);
  Drained d;
  ASSERT_ST_OK(drain(**pf, &d));
  // One run of adjacent tensors: cut at page boundaries of the file into slab-sized reads.
  const std::uint64_t first_page_end = (f->data_offset() / 4096 + 1) * 4096 - f->data_offset();
  const std::uint64_t expected_reads = 1 + (total - std::min(total, first_page_end) + 4095) / 4096;
  EXPECT_EQ(faulty->reads.load(), expected_reads);
  EXPECT_EQ((*pf)->stats().chunks, expected_reads);
  for (std::size_t i = 0; i < plan.size(); ++i) EXPECT_EQ(d.bytes[i], expected_bytes(*f, plan[i]));
}

TEST(EngineTest, ConcurrentPrefetchersNeverTakeThePoolAboveCapacity) {
  TempDir dir;
  const Model m = make_model(24, 300, 64);
  const File f = open_model(dir, m, Backend::kMmap);
  SlabPool pool(6 * 4096, 4096);
  std::atomic<std::uint64_t> live{0}, max_live{0}, allocs{0};
  ASSERT_ST_OK(pool.set_allocator({[&](std::size_t n) -> void* {
                                     const auto now = live.fetch_add(n) + n;
                                     std::uint64_t prev = max_live.load();
                                     while (now > prev && !max_live.compare_exchange_weak(prev, now)) {
                                     }
                                     allocs.fetch_add(1);
                                     return std::aligned_alloc(4096, n);
                                   },
                                   [&](void* p, std::size_t n) {
                                     live.fetch_sub(n);
                                     std::free(p);
                                   }}));
  std::vector<std::vector<std::byte>> want;
  for (const TensorInfo& t : f.tensors()) {
    want.emplace_back(t.nbytes());
    ASSERT_ST_OK(f.read_into(t, want.back()));
  }
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      for (int round = 0; round < 3; ++round) {
        std::vector<std::vector<std::byte>> dsts;
        dsts.reserve(f.tensors().size());
        auto plan = whole_plan(f, (t + round) % 3 == 0 ? Delivery::kDirect : Delivery::kStaged, &dsts);
        auto pf = Prefetcher::start(f, plan, {.threads = 3, .max_slabs = 4, .pool = &pool});
        if (!pf.ok()) {
          ++failures;
          return;
        }
        Drained d;
        if (!drain(**pf, &d).ok()) ++failures;
        for (std::size_t i = 0; i < plan.size(); ++i) {
          const auto& got = plan[i].delivery == Delivery::kDirect ? dsts[i] : d.bytes[i];
          if (got != want[i]) ++failures;
        }
        if (pool.stats().allocated_bytes > pool.capacity()) ++failures;
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(failures.load(), 0);
  const SlabPoolStats s = pool.stats();
  EXPECT_LE(s.peak_bytes, s.capacity);
  EXPECT_LE(max_live.load(), s.capacity);
  EXPECT_GT(allocs.load(), 0u);
  // The last prefetcher gone, idle slabs went back to the allocator.
  EXPECT_EQ(s.allocated_bytes, 0u);
  EXPECT_EQ(live.load(), 0u);
  EXPECT_EQ(s.slabs_in_use, 0u);
  EXPECT_EQ(s.users, 0u);
}

TEST(EngineTest, ThreadsBlockOnHeldSlabsInsteadOfReusingThem) {
  TempDir dir;
  // 10 tensors of exactly 4 pages each, in a pool of 2 slabs of 4 pages: each chunk is one slab.
  std::vector<std::vector<std::byte>> data;
  std::vector<TensorData> ts;
  for (int i = 0; i < 10; ++i) {
    data.push_back(test::random_bytes(4 * 4096, 100 + i));
    ts.push_back({"t" + std::to_string(i), Dtype::kU8, {4 * 4096}, data.back()});
  }
  auto bytes = serialize(ts);
  ASSERT_ST_OK(bytes);
  auto owner = std::make_shared<std::vector<std::byte>>(std::move(*bytes));
  auto f = File::open(memory_source(*owner, owner));
  ASSERT_ST_OK(f);
  SlabPool pool(2 * 4 * 4096, 4 * 4096);
  std::vector<Piece> plan;
  for (const auto& t : f->tensors()) plan.push_back(*tensor_piece(*f, t));
  // merge_gap 0 and adjacent tensors: one run, cut at page boundaries of the file into slab-sized chunks.
  auto pf = Prefetcher::start(*f, plan, {.threads = 4, .pool = &pool});
  ASSERT_ST_OK(pf);
  Prefetcher& p = **pf;

  // Take events until two slabs are lent, holding all of them.
  std::vector<PrefetchEvent> held;
  std::map<SlabHandle, int> slabs;
  while (slabs.size() < 2) {
    auto ev = p.next();
    ASSERT_ST_OK(ev);
    ASSERT_EQ(ev->kind, Kind::kStaged);
    ASSERT_GE(ev->bytes.data(), ev->slab_data);
    ASSERT_LE(ev->bytes.data() + ev->bytes.size(), ev->slab_data + 4 * 4096);
    held.push_back(*ev);
    ++slabs[ev->slab];
  }
  // Drain whatever else lies in those two slabs; then the readers have nowhere to read and must wait.
  for (;;) {
    auto ev = p.next_for(300ms);
    ASSERT_ST_OK(ev);
    if (ev->kind == Kind::kTimeout) break;
    ASSERT_EQ(ev->kind, Kind::kStaged);
    ASSERT_TRUE(slabs.count(ev->slab)) << "a third slab was handed out while two are held in a 2-slab pool";
    held.push_back(*ev);
    ++slabs[ev->slab];
  }
  EXPECT_EQ(pool.stats().slabs_in_use, 2u);
  // The held bytes are still exactly the file's, although the readers ran into the pool meanwhile.
  auto check_held = [&] {
    for (const PrefetchEvent& ev : held) {
      const auto& want = data[ev.piece];
      ASSERT_EQ(0, std::memcmp(ev.bytes.data(), want.data() + ev.offset, ev.bytes.size()))
          << "slab of piece " << ev.piece << " was overwritten before its release";
    }
  };
  check_held();

  // Releasing every event of one slab lets exactly that slab be reused.
  const SlabHandle first = held.front().slab;
  std::vector<PrefetchEvent> still;
  for (const PrefetchEvent& ev : held) {
    if (ev.slab == first) {
      ASSERT_ST_OK(p.release(ev.slab));
    } else {
      still.push_back(ev);
    }
  }
  held = still;
  auto ev = p.next();
  ASSERT_ST_OK(ev);
  ASSERT_EQ(ev->kind, Kind::kStaged);
  held.push_back(*ev);
  check_held();
  // The reader that got the released slab had waited for it (a wait is counted when it ends), for room in the
  // pool: the pool counts that wait too.
  EXPECT_GT(p.stats().slab_wait.count(), 0);
  EXPECT_GT(pool.stats().wait.count(), 0);
  for (const PrefetchEvent& e : held) ASSERT_ST_OK(p.release(e.slab));
  Drained d;
  ASSERT_ST_OK(drain(p, &d));
  EXPECT_LE(pool.stats().peak_bytes, 2u * 4 * 4096);
}

TEST(EngineTest, AWaitForThePrefetchersOwnSlabQuotaIsNotAWaitForThePool) {
  TempDir dir;
  const Model m = make_model(6, 4, 1024);
  const File f = open_model(dir, m, Backend::kPread);
  SlabPool pool(64 * 4096, 4096);  // room for many more slabs than the prefetcher may hold
  auto pf =
      Prefetcher::start(f, whole_plan(f, Delivery::kStaged, nullptr), {.threads = 2, .max_slabs = 1, .pool = &pool});
  ASSERT_ST_OK(pf);
  Prefetcher& p = **pf;
  // Holding the one slab it may have leaves the readers waiting for their quota.
  auto first = p.next();
  ASSERT_ST_OK(first);
  ASSERT_EQ(first->kind, Kind::kStaged);
  auto none = p.next_for(300ms);
  ASSERT_ST_OK(none);
  EXPECT_EQ(none->kind, Kind::kTimeout);
  ASSERT_ST_OK(p.release(first->slab));
  Drained d;
  ASSERT_ST_OK(drain(p, &d));
  EXPECT_GT(p.stats().slab_wait.count(), 0);
  EXPECT_EQ(pool.stats().wait.count(), 0);
}

TEST(EngineTest, ReleaseRefusesHandlesThatAreNotLent) {
  TempDir dir;
  const Model m = make_model(3, 10, 32);
  const File f = open_model(dir, m, Backend::kPread);
  SlabPool pool(4 * 4096, 4096);
  std::vector<std::vector<std::byte>> unused;
  auto pf = Prefetcher::start(f, whole_plan(f, Delivery::kStaged, &unused), {.pool = &pool});
  ASSERT_ST_OK(pf);
  auto ev = (*pf)->next();
  ASSERT_ST_OK(ev);
  ASSERT_EQ(ev->kind, Kind::kStaged);
  EXPECT_ST_ERROR((*pf)->release(12345), kInvalidArgument);
  EXPECT_ST_OK((*pf)->release(0));
  ASSERT_ST_OK((*pf)->release(ev->slab));
  EXPECT_ST_ERROR((*pf)->release(ev->slab), kInvalidArgument);  // released already (a slab of one event)
}

TEST(EngineTest, PlansOutsideTheFileAndBadOptionsAreRefused) {
  TempDir dir;
  const Model m = make_model(2, 10, 32);
  const File f = open_model(dir, m, Backend::kPread);
  const std::uint64_t data_size = f.size() - f.data_offset();
  std::vector<std::byte> buf(8);
  auto piece = [](std::uint64_t b, std::uint64_t e) {
    Piece p;
    p.begin = b;
    p.end = e;
    p.tensor = "x";
    return p;
  };
  Piece short_dst = piece(0, 4);
  short_dst.delivery = Delivery::kDirect;
  short_dst.dst = buf;
  EXPECT_ST_ERROR(Prefetcher::start(f, {piece(data_size - 4, data_size + 4)}), kInvalidArgument);
  EXPECT_ST_ERROR(Prefetcher::start(f, {piece(8, 4)}), kInvalidArgument);
  EXPECT_ST_ERROR(Prefetcher::start(f, {short_dst}), kInvalidArgument);
  EXPECT_ST_ERROR(Prefetcher::start(f, {piece(0, 8)}, {.chunk_bytes = 0}), kInvalidArgument);
  auto pf = Prefetcher::start(f, {piece(0, 8)});
  ASSERT_ST_OK(pf);
  EXPECT_ST_ERROR((*pf)->wait_piece(0), kInvalidArgument);  // a staged piece
  EXPECT_ST_ERROR((*pf)->wait_piece(1), kInvalidArgument);  // out of range
}

// Both modes, on both backends: a file truncated after open fails with kIo naming the file and a tensor.
TEST(EngineTest, ThreadCountsAboveTheMaximumLoadWithTheMaximum) {
  // A caller passing its core count (here far more than kMaxThreads) gets a working load, not an error.
  TempDir dir;
  const Model m = make_model(3, 10, 32);
  const File f = open_model(dir, m, Backend::kPread);
  std::vector<std::vector<std::byte>> dsts;
  dsts.reserve(f.tensors().size());
  auto pf = Prefetcher::start(f, whole_plan(f, Delivery::kDirect, &dsts), {.threads = 100000});
  ASSERT_ST_OK(pf);
  Drained d;
  ASSERT_ST_OK(drain(**pf, &d));
  for (std::size_t i = 0; i < f.tensors().size(); ++i) EXPECT_EQ(dsts[i], expected_bytes(f, (*pf)->plan()[i]));
}

TEST(EngineTest, TruncationMidStreamIsDeliveredByNextInBothModes) {
  for (Backend backend : {Backend::kMmap, Backend::kPread}) {
    for (Delivery delivery : {Delivery::kStaged, Delivery::kDirect}) {
      TempDir dir;
      const Model m = make_model(20, 200, 64);
      const File f = open_model(dir, m, backend);
      const std::string path = f.path();
      ASSERT_EQ(::truncate(path.c_str(), static_cast<off_t>(f.data_offset() + (f.size() - f.data_offset()) / 2)), 0);
      SlabPool pool(4 * 4096, 4096);
      std::vector<std::vector<std::byte>> dsts;
      dsts.reserve(f.tensors().size());
      auto pf = Prefetcher::start(f, whole_plan(f, delivery, &dsts), {.threads = 3, .pool = &pool});
      ASSERT_ST_OK(pf);
      Drained d;
      Status st = drain(**pf, &d);
      ASSERT_FALSE(st.ok());
      EXPECT_EQ(st.error().kind(), Error::Kind::kIo) << st.error().to_string();
      EXPECT_EQ(st.error().context(), path);
      EXPECT_FALSE(st.error().tensor().empty());
      EXPECT_NE(st.error().to_string().find(st.error().tensor()), std::string::npos);
      // Sticky: later calls say the same, and waiting for the last piece does not hang.
      EXPECT_ST_ERROR((*pf)->next(), kIo);
      if (delivery == Delivery::kDirect) {
        EXPECT_ST_ERROR((*pf)->wait_piece(f.tensors().size() - 1), kIo);
      }
      pf->reset();
      EXPECT_EQ(pool.stats().allocated_bytes, 0u);
    }
  }
}

TEST(EngineTest, EioIsDeliveredByNextNamingTheTensorInBothModes) {
  TempDir dir;
  const Model m = make_model(10, 100, 64);
  const File plain = open_model(dir, m, Backend::kPread);
  auto faulty = std::make_shared<testing::FaultySource>(plain.source());
  auto f = File::open(faulty);
  ASSERT_ST_OK(f);
  const TensorInfo& bad = f->tensors()[6];
  faulty->eio_at_offset = static_cast<std::int64_t>(f->data_offset() + bad.begin + 10);
  SlabPool pool(4 * 4096, 4096);
  // One reader takes the chunks in file order, so every piece before the bad one is done when it fails; with
  // two, piece 0 may still be in flight when the other reader reaches piece 6 (seen under qemu).
  for (const unsigned threads : {1u, 2u}) {
    for (Delivery delivery : {Delivery::kStaged, Delivery::kDirect}) {
      SCOPED_TRACE("threads " + std::to_string(threads));
      std::vector<std::vector<std::byte>> dsts;
      dsts.reserve(f->tensors().size());
      auto pf = Prefetcher::start(*f, whole_plan(*f, delivery, &dsts), {.threads = threads, .pool = &pool});
      ASSERT_ST_OK(pf);
      Drained d;
      Status st = drain(**pf, &d);
      ASSERT_FALSE(st.ok());
      EXPECT_EQ(st.error().kind(), Error::Kind::kIo);
      EXPECT_EQ(st.error().sys_errno(), EIO);
      // Direct pieces in separate buffers are read one by one: the error names exactly the tensor.
      if (delivery == Delivery::kDirect) {
        EXPECT_EQ(st.error().tensor(), bad.name);
      }
      EXPECT_NE(st.error().to_string().find("(tensor `"), std::string::npos) << st.error().to_string();
      if (delivery == Delivery::kDirect) {
        if (threads == 1) EXPECT_ST_OK((*pf)->wait_piece(0));  // done before the failure: still fine
        EXPECT_ST_ERROR((*pf)->wait_piece(6), kIo);
      }
    }
  }
}

TEST(EngineTest, AllocatorFailureIsDeliveredAsIo) {
  TempDir dir;
  const Model m = make_model(3, 10, 32);
  const File f = open_model(dir, m, Backend::kPread);
  SlabPool pool(4 * 4096, 4096);
  ASSERT_ST_OK(pool.set_allocator({[](std::size_t) -> void* { return nullptr; }, [](void*, std::size_t) {}}));
  std::vector<std::vector<std::byte>> unused;
  auto pf = Prefetcher::start(f, whole_plan(f, Delivery::kStaged, &unused), {.pool = &pool});
  ASSERT_ST_OK(pf);
  auto ev = (*pf)->next();
  EXPECT_ST_ERROR(ev, kIo);
  EXPECT_EQ(ev.error().sys_errno(), ENOMEM);
  EXPECT_EQ(pool.stats().allocated_bytes, 0u);
}

TEST(EngineTest, CancelFromAnotherThreadWakesReadersBlockedOnThePool) {
  TempDir dir;
  const Model m = make_model(20, 300, 64);
  const File f = open_model(dir, m, Backend::kPread);
  SlabPool pool(2 * 4096, 4096);
  std::vector<std::vector<std::byte>> dsts;
  dsts.reserve(f.tensors().size());
  auto pf = Prefetcher::start(f, whole_plan(f, Delivery::kStaged, &dsts), {.threads = 4, .pool = &pool});
  ASSERT_ST_OK(pf);
  Prefetcher& p = **pf;
  // Hold the events of both slabs: every reader is now blocked on the pool.
  std::vector<PrefetchEvent> held;
  for (;;) {
    auto ev = p.next_for(200ms);
    ASSERT_ST_OK(ev);
    if (ev->kind == Kind::kTimeout) break;
    held.push_back(*ev);
  }
  ASSERT_FALSE(held.empty());
  EXPECT_EQ(pool.stats().slabs_in_use, 2u);
  // A consumer blocked in next() and the cancel from a third thread.
  std::atomic<bool> woke{false};
  std::thread consumer([&] {
    auto ev = p.next();
    EXPECT_ST_ERROR(ev, kInvalidArgument);
    woke = true;
  });
  std::this_thread::sleep_for(50ms);
  std::thread canceller([&] { p.cancel(); });
  canceller.join();
  consumer.join();
  EXPECT_TRUE(woke.load());
  EXPECT_ST_ERROR(p.next(), kInvalidArgument);
  // Lent slabs stay lent until released, also after cancel.
  EXPECT_EQ(pool.stats().slabs_in_use, 2u);
  for (const PrefetchEvent& ev : held) ASSERT_ST_OK(p.release(ev.slab));
  EXPECT_EQ(pool.stats().slabs_in_use, 0u);
  pf->reset();
  EXPECT_EQ(pool.stats().users, 0u);
  EXPECT_EQ(pool.stats().allocated_bytes, 0u);
}

TEST(EngineTest, CancelWakesAThreadInWaitPiece) {
  // Direct pieces behind a staged prefix that blocks on a one-slab pool: the direct piece never completes
  // until cancel() wakes its waiter.
  TempDir dir;
  const Model m = make_model(8, 300, 64);
  const File f = open_model(dir, m, Backend::kPread);
  SlabPool pool(4096, 4096);
  std::vector<Piece> plan;
  std::vector<std::byte> dst(f.tensors().back().nbytes());
  for (std::size_t i = 0; i + 1 < f.tensors().size(); ++i) plan.push_back(*tensor_piece(f, f.tensors()[i]));
  plan.push_back(*tensor_piece(f, f.tensors().back()));
  plan.back().delivery = Delivery::kDirect;
  plan.back().dst = dst;
  auto pf = Prefetcher::start(f, plan, {.threads = 1, .pool = &pool});
  ASSERT_ST_OK(pf);
  std::thread waiter([&] {
    const Status st = (*pf)->wait_piece(plan.size() - 1);
    EXPECT_ST_ERROR(st, kInvalidArgument);
  });
  std::this_thread::sleep_for(100ms);
  (*pf)->cancel();
  waiter.join();
}

TEST(EngineTest, DestructorWithoutDrainingJoinsAndReturnsEverySlab) {
  TempDir dir;
  const Model m = make_model(30, 300, 64);
  const File f = open_model(dir, m, Backend::kMmap);
  SlabPool pool(3 * 4096, 4096);
  for (int held_events : {0, 1, 5}) {
    for (Delivery delivery : {Delivery::kStaged, Delivery::kDirect}) {
      std::vector<std::vector<std::byte>> dsts;
      dsts.reserve(f.tensors().size());
      auto pf = Prefetcher::start(f, whole_plan(f, delivery, &dsts), {.threads = 4, .pool = &pool});
      ASSERT_ST_OK(pf);
      for (int k = 0; k < held_events; ++k) {
        auto ev = (*pf)->next_for(100ms);
        ASSERT_ST_OK(ev);
      }
      pf->reset();
      const SlabPoolStats s = pool.stats();
      EXPECT_EQ(s.slabs_in_use, 0u);
      EXPECT_EQ(s.allocated_bytes, 0u);
      EXPECT_EQ(s.users, 0u);
    }
  }
}

TEST(EngineTest, ZeroSizeEmptyAndOnePiecePlans) {
  std::vector<std::byte> data = test::random_bytes(5000, 3);
  std::vector<TensorData> ts = {{"empty", Dtype::kF32, {0, 4}, {}}, {"w", Dtype::kU8, {50, 100}, data}};
  auto bytes = serialize(ts);
  ASSERT_ST_OK(bytes);
  auto owner = std::make_shared<std::vector<std::byte>>(std::move(*bytes));
  auto f = File::open(memory_source(*owner, owner));
  ASSERT_ST_OK(f);
  SlabPool pool(4 * 4096, 4096);
  // No pieces: the stream ends at once, and keeps saying so.
  auto none = Prefetcher::start(*f, {}, {.pool = &pool});
  ASSERT_ST_OK(none);
  EXPECT_EQ((*none)->next()->kind, Kind::kEnd);
  EXPECT_EQ((*none)->next()->kind, Kind::kEnd);
  // Zero-size pieces: a whole empty tensor and an empty row range, in both modes, with no read.
  std::vector<Piece> plan = {*tensor_piece(*f, *f->find("empty")), *row_piece(*f, *f->find("w"), 7, 7),
                             *tensor_piece(*f, *f->find("empty")), *row_piece(*f, *f->find("w"), 0, 50)};
  plan[2].delivery = Delivery::kDirect;
  plan[3].delivery = Delivery::kDirect;
  std::vector<std::byte> dst(5000);
  plan[3].dst = dst;
  auto pf = Prefetcher::start(*f, plan, {.pool = &pool});
  ASSERT_ST_OK(pf);
  Drained d;
  ASSERT_ST_OK(drain(**pf, &d));
  EXPECT_EQ(d.completions, (std::vector<int>{1, 1, 1, 1}));
  EXPECT_EQ(dst, data);
  EXPECT_EQ((*pf)->stats().bytes_read, 5000u);
  EXPECT_ST_OK((*pf)->wait_piece(2));
  // One piece, staged.
  auto one = Prefetcher::start(*f, {*tensor_piece(*f, *f->find("w"))}, {.pool = &pool});
  ASSERT_ST_OK(one);
  ASSERT_ST_OK(drain(**one, &d));
  EXPECT_EQ(d.bytes[0], data);
}

TEST(EngineTest, TwentyThousandPiecePlansInBothModes) {
  constexpr std::size_t kCount = 20000;
  std::vector<std::vector<std::byte>> data;
  std::vector<TensorData> ts;
  data.reserve(kCount);
  for (std::size_t i = 0; i < kCount; ++i) {
    data.push_back(test::random_bytes(8 + i % 40, static_cast<std::uint32_t>(i)));
    ts.push_back({"layer." + std::to_string(i), Dtype::kU8, {data.back().size()}, data.back()});
  }
  auto bytes = serialize(ts);
  ASSERT_ST_OK(bytes);
  auto owner = std::make_shared<std::vector<std::byte>>(std::move(*bytes));
  auto base = memory_source(*owner, owner);
  auto faulty = std::make_shared<testing::FaultySource>(base);
  auto f = File::open(faulty);
  ASSERT_ST_OK(f);
  SlabPool pool(16 * 4096, 4096);
  // Direct into one buffer laid out like the file: adjacent pieces with adjacent destinations share reads.
  const std::uint64_t data_size = f->size() - f->data_offset();
  std::vector<std::byte> all(data_size);
  std::vector<Piece> plan;
  for (const TensorInfo& t : f->tensors()) {
    Piece p = *tensor_piece(*f, t);
    p.delivery = Delivery::kDirect;
    p.dst = std::span(all).subspan(t.begin, t.nbytes());
    plan.push_back(p);
  }
  faulty->reads = 0;
  auto pf = Prefetcher::start(*f, plan, {.threads = 4, .chunk_bytes = 64 << 10, .pool = &pool});
  ASSERT_ST_OK(pf);
  Drained d;
  ASSERT_ST_OK(drain(**pf, &d));
  EXPECT_LE(faulty->reads.load(), data_size / (64 << 10) + 2);
  for (std::size_t i = 0; i < kCount; ++i) {
    const TensorInfo& t = f->tensors()[i];
    ASSERT_EQ(0, std::memcmp(all.data() + t.begin, owner->data() + f->data_offset() + t.begin, t.nbytes()));
    ASSERT_EQ(d.completions[i], 1);
  }
  // Staged: every piece comes back whole, in 4 KiB slabs.
  std::vector<std::vector<std::byte>> unused;
  auto staged = Prefetcher::start(*f, whole_plan(*f, Delivery::kStaged, &unused), {.threads = 4, .pool = &pool});
  ASSERT_ST_OK(staged);
  ASSERT_ST_OK(drain(**staged, &d));
  for (std::size_t i = 0; i < kCount; ++i) {
    const TensorInfo& t = f->tensors()[i];
    ASSERT_EQ(d.completions[i], 1);
    ASSERT_EQ(0, std::memcmp(d.bytes[i].data(), owner->data() + f->data_offset() + t.begin, t.nbytes()));
  }
}

TEST(EngineTest, SlabPoolSettingsAndIdleRelease) {
  SlabPool pool(8 * 4096, 4096);
  EXPECT_ST_ERROR(pool.set_capacity(100), kInvalidArgument);
  EXPECT_ST_ERROR(pool.set_slab_bytes(4097), kInvalidArgument);
  EXPECT_ST_ERROR(pool.set_slab_bytes(16 * 4096), kInvalidArgument);
  EXPECT_ST_ERROR(pool.set_allocator({[](std::size_t) -> void* { return nullptr; }, {}}), kInvalidArgument);
  ASSERT_ST_OK(pool.set_slab_bytes(2 * 4096));
  EXPECT_EQ(pool.slab_bytes(), 2u * 4096);
  // Who owns the allocator: a refused call changes nothing; each accepted one counts.
  EXPECT_EQ(pool.stats().allocator_changes, 0u);
  EXPECT_FALSE(pool.stats().custom_allocator);
  std::atomic<int> allocs{0}, frees{0};
  ASSERT_ST_OK(pool.set_allocator({[&](std::size_t n) -> void* {
                                     ++allocs;
                                     return std::aligned_alloc(4096, n);
                                   },
                                   [&](void* p, std::size_t) {
                                     ++frees;
                                     std::free(p);
                                   }}));
  EXPECT_EQ(pool.stats().allocator_changes, 1u);
  EXPECT_TRUE(pool.stats().custom_allocator);
  pool.set_release_when_idle(false);
  TempDir dir;
  const Model m = make_model(6, 300, 64);
  const File f = open_model(dir, m, Backend::kPread);
  std::vector<std::vector<std::byte>> unused;
  for (int round = 0; round < 2; ++round) {
    auto pf = Prefetcher::start(f, whole_plan(f, Delivery::kStaged, &unused), {.pool = &pool});
    ASSERT_ST_OK(pf);
    Drained d;
    ASSERT_ST_OK(drain(**pf, &d));
  }
  // Kept for reuse across prefetchers: the second round allocated nothing new beyond the capacity.
  SlabPoolStats s = pool.stats();
  EXPECT_GT(s.slabs_free, 0u);
  EXPECT_LE(static_cast<std::uint64_t>(allocs.load()), s.capacity / s.slab_bytes);
  pool.trim();
  s = pool.stats();
  EXPECT_EQ(s.slabs_free, 0u);
  EXPECT_EQ(s.allocated_bytes, 0u);
  EXPECT_EQ(allocs.load(), frees.load());
  pool.reset_peak();
  EXPECT_EQ(pool.stats().peak_bytes, 0u);
  ASSERT_ST_OK(pool.set_allocator({}));  // back to the default
  EXPECT_EQ(pool.stats().allocator_changes, 2u);
  EXPECT_FALSE(pool.stats().custom_allocator);
}

}  // namespace
}  // namespace safetensors
