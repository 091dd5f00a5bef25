// The slicer: numpy semantics checked against hand-verified numpy results, and against a brute-force
// element-by-element reference over random shapes and index expressions, on both read paths.
#include "safetensors/slice.h"

#include <random>

#include "safetensors/writer.h"
#include "test_util.h"

namespace safetensors {
namespace {

using Shape = std::vector<std::uint64_t>;
using S = SliceIndex;

Result<SlicePlan> plan(Shape shape, std::vector<SliceIndex> ix, Dtype dt = Dtype::kU8) {
  return SlicePlan::make(dt, shape, ix, "ctx", "t");
}

// Positions a range selects on an axis of `len`, by enumeration (Python's range(len)[start:stop:step]).
std::vector<std::int64_t> positions(const SliceIndex& s, std::int64_t len) {
  const std::int64_t step = s.step.value_or(1);
  std::vector<std::int64_t> out;
  auto clamp = [](std::int64_t v, std::int64_t lo, std::int64_t hi) { return std::max(lo, std::min(v, hi)); };
  if (step > 0) {
    std::int64_t start = s.start ? (*s.start < 0 ? *s.start + len : *s.start) : 0;
    std::int64_t stop = s.stop ? (*s.stop < 0 ? *s.stop + len : *s.stop) : len;
    start = clamp(start, 0, len);
    stop = clamp(stop, 0, len);
    for (std::int64_t p = start; p < stop; p += step) out.push_back(p);
  } else {
    std::int64_t start = s.start ? (*s.start < 0 ? *s.start + len : *s.start) : len - 1;
    std::int64_t stop = s.stop ? (*s.stop < 0 ? *s.stop + len : *s.stop) : -1;
    start = clamp(start, -1, len - 1);
    stop = clamp(stop, -1, len - 1);
    for (std::int64_t p = start; p > stop; p += step) out.push_back(p);
  }
  return out;
}

// Brute force: the selected positions of every axis, then every result element copied one at a time.
std::vector<std::byte> reference_slice(const std::vector<std::byte>& data, const Shape& shape,
                                       const std::vector<SliceIndex>& ix, std::size_t elem, Shape* out_shape) {
  std::vector<SliceIndex> full;
  std::size_t explicit_axes = 0;
  for (const auto& s : ix) explicit_axes += s.kind != SliceIndex::Kind::kEllipsis;
  for (const auto& s : ix) {
    if (s.kind == SliceIndex::Kind::kEllipsis) {
      for (std::size_t i = 0; i < shape.size() - explicit_axes; ++i) full.push_back(S::all());
    } else {
      full.push_back(s);
    }
  }
  while (full.size() < shape.size()) full.push_back(S::all());
  std::vector<std::vector<std::int64_t>> pos(shape.size());
  out_shape->clear();
  for (std::size_t d = 0; d < shape.size(); ++d) {
    const auto len = static_cast<std::int64_t>(shape[d]);
    if (full[d].kind == SliceIndex::Kind::kIndex) {
      pos[d] = {full[d].index < 0 ? full[d].index + len : full[d].index};
    } else {
      pos[d] = positions(full[d], len);
      out_shape->push_back(pos[d].size());
    }
  }
  std::vector<std::byte> out;
  std::vector<std::size_t> it(shape.size(), 0);
  for (const auto& p : pos) {
    if (p.empty()) return out;
  }
  for (;;) {
    std::uint64_t flat = 0;
    for (std::size_t d = 0; d < shape.size(); ++d) flat = flat * shape[d] + static_cast<std::uint64_t>(pos[d][it[d]]);
    out.insert(out.end(), data.begin() + flat * elem, data.begin() + (flat + 1) * elem);
    std::size_t d = shape.size();
    while (d > 0) {
      --d;
      if (++it[d] < pos[d].size()) break;
      it[d] = 0;
      if (d == 0) return out;
    }
    if (shape.empty()) return out;
  }
}

// The elements a strided view (first element, strides in elements) of `data` shows, in result order.
std::vector<std::byte> strided_gather(const std::vector<std::byte>& data, std::size_t elem, const Shape& shape,
                                      std::uint64_t first, const std::vector<std::int64_t>& strides) {
  std::vector<std::byte> out;
  std::uint64_t numel = 1;
  for (auto d : shape) numel *= d;
  std::vector<std::uint64_t> it(shape.size(), 0);
  for (std::uint64_t n = 0; n < numel; ++n) {
    std::int64_t at = static_cast<std::int64_t>(first);
    for (std::size_t d = 0; d < shape.size(); ++d) at += static_cast<std::int64_t>(it[d]) * strides[d];
    const auto byte = static_cast<std::ptrdiff_t>(static_cast<std::size_t>(at) * elem);
    out.insert(out.end(), data.begin() + byte, data.begin() + byte + static_cast<std::ptrdiff_t>(elem));
    for (std::size_t d = shape.size(); d-- > 0;) {
      if (++it[d] < shape[d]) break;
      it[d] = 0;
    }
  }
  return out;
}

TEST(SliceTest, NumpySemanticsOnKnownCases) {
  struct Case {
    Shape shape;
    std::vector<SliceIndex> ix;
    Shape expected;
  };
  // Expected shapes from numpy: np.empty(shape)[ix].shape.
  const std::vector<Case> cases = {
      {{10}, {S::range(2, 5)}, {3}},
      {{10}, {S::range(-3, std::nullopt)}, {3}},
      {{10}, {S::range(std::nullopt, std::nullopt, -1)}, {10}},
      {{10}, {S::range(8, 2, -2)}, {3}},
      {{10}, {S::range(-100, 100)}, {10}},
      {{10}, {S::range(100, -100, -1)}, {10}},
      {{10}, {S::range(5, 5)}, {0}},
      {{10}, {S::range(7, 3)}, {0}},
      {{4, 5, 6}, {S::at(1)}, {5, 6}},
      {{4, 5, 6}, {S::at(-1), S::range(1, 3)}, {2, 6}},
      {{4, 5, 6}, {S::ellipsis(), S::at(2)}, {4, 5}},
      {{4, 5, 6}, {S::at(0), S::ellipsis(), S::range(std::nullopt, std::nullopt, 2)}, {5, 3}},
      {{4, 5, 6}, {S::ellipsis()}, {4, 5, 6}},
      {{4, 5, 6}, {S::at(1), S::at(2), S::at(3)}, {}},
      {{}, {}, {}},
      {{}, {S::ellipsis()}, {}},
      {{0, 3}, {S::range(0, 5)}, {0, 3}},
  };
  for (const Case& c : cases) {
    auto p = plan(c.shape, c.ix);
    ASSERT_ST_OK(p);
    EXPECT_EQ(p->shape(), c.expected);
  }
}

TEST(SliceTest, StridesAsNumpyViews) {
  struct Case {
    Shape shape;
    std::vector<SliceIndex> ix;
    std::uint64_t first;
    std::vector<std::int64_t> strides;
  };
  // From numpy: v = np.empty(shape)[ix]; first = (v.ctypes.data - base) // 8, strides = v.strides // 8 (a
  // length-0 or -1 axis keeps its row-major stride here, whatever numpy shows).
  const std::vector<Case> cases = {
      {{4, 6}, {S::all(), S::range(3, 6)}, 3, {6, 1}},
      {{4, 6}, {S::range(1, 4, 2), S::range(std::nullopt, std::nullopt, 3)}, 6, {12, 3}},
      {{4, 6}, {S::at(-1)}, 18, {1}},
      {{4, 6}, {S::range(std::nullopt, std::nullopt, -1), S::at(2)}, 20, {-6}},
      {{2, 3, 5}, {S::ellipsis(), S::range(4, 0, -2)}, 4, {15, 5, -2}},
      {{2, 3, 5}, {S::at(1), S::range(2, 3, -1)}, 15, {5, 1}},  // an empty range
      {{2, 3, 5}, {S::at(1), S::at(2), S::at(3)}, 28, {}},
      {{4, 6}, {S::range(3, 2, -1)}, 18, {6, 1}},  // one position: the step is never taken
  };
  for (const Case& c : cases) {
    auto p = plan(c.shape, c.ix, Dtype::kF64);
    ASSERT_ST_OK(p);
    EXPECT_EQ(p->first_element(), c.first);
    EXPECT_EQ(p->strides(), c.strides);
  }
}

TEST(SliceTest, ErrorsLikeNumpy) {
  auto e = plan({3}, {S::at(3)});
  EXPECT_ST_ERROR(e, kInvalidSlice);
  EXPECT_EQ(e.error().detail(), "index 3 is out of bounds for axis 0 with size 3");
  EXPECT_EQ(e.error().tensor(), "t");
  EXPECT_ST_ERROR(plan({3}, {S::at(-4)}), kInvalidSlice);
  EXPECT_ST_ERROR(plan({3}, {S::range(0, 3, 0)}), kInvalidSlice);
  EXPECT_ST_ERROR(plan({3}, {S::ellipsis(), S::ellipsis()}), kInvalidSlice);
  auto many = plan({3}, {S::at(0), S::at(0)});
  EXPECT_ST_ERROR(many, kInvalidSlice);
  EXPECT_EQ(many.error().detail(), "too many indices for tensor: tensor is 1-dimensional, but 2 were indexed");
  EXPECT_ST_ERROR(plan({}, {S::at(0)}), kInvalidSlice);
  // Extreme bounds do not overflow.
  auto big = plan({5}, {S::range(INT64_MIN, INT64_MAX, INT64_MAX)});
  ASSERT_ST_OK(big);
  EXPECT_EQ(big->shape(), Shape{1});
  auto rev = plan({5}, {S::range(INT64_MAX, INT64_MIN, INT64_MIN)});
  ASSERT_ST_OK(rev);
  EXPECT_EQ(rev->shape(), Shape{1});
}

TEST(SliceTest, RunsAreAsLongAsTheLayoutAllows) {
  auto rows = plan({8, 16}, {S::range(2, 5)}, Dtype::kF32);
  ASSERT_ST_OK(rows);
  EXPECT_EQ(rows->run_count(), 1u);
  EXPECT_EQ(rows->run_length(), 3u * 16 * 4);
  EXPECT_EQ(rows->source_begin(), 2u * 16 * 4);
  auto cols = plan({8, 16}, {S::all(), S::range(4, 8)}, Dtype::kF32);
  ASSERT_ST_OK(cols);
  EXPECT_EQ(cols->run_count(), 8u);
  EXPECT_EQ(cols->run_length(), 16u);
  auto whole = plan({8, 16}, {S::ellipsis()}, Dtype::kF32);
  ASSERT_ST_OK(whole);
  EXPECT_TRUE(whole->is_whole());
  EXPECT_EQ(whole->nbytes(), 8u * 16 * 4);
}

TEST(SliceTest, SubByteDtypesSliceOnByteBoundariesOnly) {
  // F4: two elements per byte.
  auto ok = plan({4, 6}, {S::range(1, 3), S::range(2, 6)}, Dtype::kF4);
  ASSERT_ST_OK(ok);
  EXPECT_EQ(ok->nbytes(), 4u);
  EXPECT_ST_ERROR(plan({4, 6}, {S::all(), S::range(1, 3)}, Dtype::kF4), kMisalignedSlice);
  EXPECT_ST_ERROR(plan({4, 6}, {S::all(), S::range(0, 3)}, Dtype::kF4), kMisalignedSlice);
  EXPECT_ST_ERROR(plan({4, 6}, {S::at(0), S::at(1)}, Dtype::kF4), kMisalignedSlice);
  // Reversed whole rows of F4: runs of 3 bytes each.
  auto rev = plan({4, 6}, {S::range(std::nullopt, std::nullopt, -1)}, Dtype::kF4);
  ASSERT_ST_OK(rev);
  EXPECT_EQ(rev->run_count(), 4u);
  EXPECT_EQ(rev->run_length(), 3u);
  // F6: four elements per three bytes.
  ASSERT_ST_OK(plan({3, 8}, {S::all(), S::range(4, 8)}, Dtype::kF6_E2M3));
  EXPECT_ST_ERROR(plan({3, 8}, {S::all(), S::range(2, 6)}, Dtype::kF6_E2M3), kMisalignedSlice);
}

SliceIndex random_index(std::mt19937& rng, std::int64_t len) {
  std::uniform_int_distribution<int> kind(0, 9);
  const int k = kind(rng);
  auto val = [&](std::int64_t spread) { return std::uniform_int_distribution<std::int64_t>(-spread, spread)(rng); };
  if (k == 0 && len > 0) return S::at(std::uniform_int_distribution<std::int64_t>(-len, len - 1)(rng));
  if (k == 1) return S::all();
  std::optional<std::int64_t> start, stop, step;
  if (rng() % 3) start = val(len + 2);
  if (rng() % 3) stop = val(len + 2);
  if (rng() % 2) {
    step = val(4);
    if (*step == 0) step = -1;
  }
  return S::range(start, stop, step);
}

// The slicer against the brute-force reference, through File::read_slice on the memory path and on the
// coalescing pread path.
TEST(SliceTest, MatchesBruteForceOnRandomShapesAndIndices) {
  std::mt19937 rng(12345);
  const Dtype dtypes[] = {Dtype::kU8, Dtype::kI16, Dtype::kF32, Dtype::kF64};
  int checked = 0;
  for (int trial = 0; trial < 3000; ++trial) {
    const Dtype dt = dtypes[trial % 4];
    const std::size_t elem = dtype_bits(dt) / 8;
    Shape shape(rng() % 5);
    for (auto& d : shape) d = rng() % 7;
    std::uint64_t numel = 1;
    for (auto d : shape) numel *= d;
    std::vector<std::byte> data = test::random_bytes(numel * elem, trial);
    std::vector<SliceIndex> ix;
    const std::size_t n_ix = shape.empty() ? 0 : rng() % (shape.size() + 1);
    bool ellipsis = false;
    for (std::size_t i = 0; i < n_ix; ++i) {
      if (!ellipsis && rng() % 6 == 0) {
        ix.push_back(S::ellipsis());
        ellipsis = true;
      }
      ix.push_back(random_index(rng, 0));  // placeholder, fixed below once the axis is known
    }
    // Give each explicit index the length of the axis it lands on.
    std::size_t explicit_axes = 0;
    for (const auto& s : ix) explicit_axes += s.kind != SliceIndex::Kind::kEllipsis;
    std::size_t axis = 0;
    for (auto& s : ix) {
      if (s.kind == SliceIndex::Kind::kEllipsis) {
        axis += shape.size() - explicit_axes;
        continue;
      }
      s = random_index(rng, static_cast<std::int64_t>(shape[axis]));
      ++axis;
    }
    SCOPED_TRACE("trial " + std::to_string(trial));

    {
      auto p = plan(shape, ix, dt);
      ASSERT_ST_OK(p);
      Shape expected_shape;
      EXPECT_EQ(strided_gather(data, elem, p->shape(), p->first_element(), p->strides()),
                reference_slice(data, shape, ix, elem, &expected_shape));
    }
    std::vector<TensorData> td = {{"t", dt, shape, data}};
    auto mem = test::serialized_source(td);
    ASSERT_ST_OK(mem);
    for (auto source : {*mem, std::shared_ptr<const Source>(test::without_mapping(*mem))}) {
      auto f = File::open(source);
      ASSERT_ST_OK(f);
      const TensorInfo& info = f->tensors()[0];
      auto p = f->plan_slice(info, ix);
      ASSERT_ST_OK(p);
      Shape expected_shape;
      auto expected = reference_slice(data, shape, ix, elem, &expected_shape);
      EXPECT_EQ(p->shape(), expected_shape);
      ASSERT_EQ(p->nbytes(), expected.size());
      std::vector<std::byte> got(p->nbytes());
      ASSERT_ST_OK(f->read_slice(info, *p, got));
      EXPECT_EQ(got, expected);
      ++checked;
    }
  }
  EXPECT_EQ(checked, 6000);
}

TEST(SliceTest, ReadsOnlyTheBytesItNeeds) {
  // 256 rows of 64 KiB: rows far apart are read separately, so bytes read equal bytes returned.
  const std::uint64_t rows = 256, cols = 65536;
  std::vector<std::byte> data = test::random_bytes(rows * cols, 3);
  std::vector<TensorData> td = {{"w", Dtype::kU8, {rows, cols}, data}};
  auto mem = test::serialized_source(td);
  ASSERT_ST_OK(mem);
  auto faulty = test::without_mapping(*mem);
  auto f = File::open(faulty);
  ASSERT_ST_OK(f);
  const TensorInfo& info = f->tensors()[0];

  std::vector<SliceIndex> every_tenth_row = {S::range(0, std::nullopt, 10), S::range(1000, 3000)};
  auto p = f->plan_slice(info, every_tenth_row);
  ASSERT_ST_OK(p);
  faulty->bytes_read = 0;
  std::vector<std::byte> got(p->nbytes());
  ASSERT_ST_OK(f->read_slice(info, *p, got));
  EXPECT_EQ(faulty->bytes_read.load(), p->nbytes());

  std::vector<SliceIndex> block = {S::range(10, 12)};
  auto q = f->plan_slice(info, block);
  ASSERT_ST_OK(q);
  faulty->bytes_read = 0;
  faulty->reads = 0;
  std::vector<std::byte> got2(q->nbytes());
  ASSERT_ST_OK(f->read_slice(info, *q, got2));
  EXPECT_EQ(faulty->bytes_read.load(), 2 * cols);
  EXPECT_EQ(faulty->reads.load(), 1u);
  EXPECT_TRUE(std::equal(got2.begin(), got2.end(), data.begin() + 10 * cols));

  // Many small close runs (a narrow column band) are coalesced: far fewer reads than runs.
  std::vector<SliceIndex> band = {S::all(), S::range(0, 4)};
  std::vector<TensorData> narrow = {{"n", Dtype::kU8, {4096, 64}, std::span(data).first(4096 * 64)}};
  auto nb = test::serialized_source(narrow);
  ASSERT_ST_OK(nb);
  auto faulty2 = test::without_mapping(*nb);
  auto g = File::open(faulty2);
  ASSERT_ST_OK(g);
  auto r = g->plan_slice(g->tensors()[0], band);
  ASSERT_ST_OK(r);
  EXPECT_EQ(r->run_count(), 4096u);
  faulty2->reads = 0;
  std::vector<std::byte> got3(r->nbytes());
  ASSERT_ST_OK(g->read_slice(g->tensors()[0], *r, got3));
  EXPECT_LE(faulty2->reads.load(), 4u);
  for (std::size_t i = 0; i < 4096; ++i) {
    ASSERT_TRUE(std::equal(got3.begin() + i * 4, got3.begin() + i * 4 + 4, data.begin() + i * 64));
  }
}

}  // namespace
}  // namespace safetensors

namespace safetensors {
namespace {

// for_each_run(first, count) visits exactly the runs the whole walk visits at those positions.
TEST(SliceTest, RangesOfRunsMatchTheWholeWalk) {
  std::mt19937 rng(99);
  for (int trial = 0; trial < 500; ++trial) {
    Shape shape(1 + rng() % 4);
    for (auto& d : shape) d = 1 + rng() % 6;
    std::vector<SliceIndex> ix;
    for (std::size_t a = 0; a < shape.size(); ++a) ix.push_back(random_index(rng, static_cast<std::int64_t>(shape[a])));
    auto p = plan(shape, ix, Dtype::kI16);
    ASSERT_ST_OK(p);
    std::vector<SliceRun> all;
    p->for_each_run([&](const SliceRun& r) {
      all.push_back(r);
      return true;
    });
    ASSERT_EQ(all.size(), p->run_count());
    if (all.empty()) continue;
    const std::uint64_t first = rng() % all.size();
    const std::uint64_t count = rng() % (all.size() - first + 1);
    std::uint64_t k = first;
    p->for_each_run(first, count, [&](const SliceRun& r) {
      EXPECT_EQ(r.source_offset, all[k].source_offset) << trial;
      EXPECT_EQ(r.dest_offset, all[k].dest_offset) << trial;
      ++k;
      return true;
    });
    EXPECT_EQ(k, first + count);
  }
}

// Slices large enough to be read by several threads (a strided walk with more runs than a piece holds, a
// narrow column band, a block of rows longer than one read chunk) give the same bytes as the sequential
// walk, through the mapping and through positional reads.
TEST(SliceTest, ParallelReadsOfLargeSlicesMatchTheSequentialWalk) {
  const std::uint64_t rows = 8192, cols = 4096;
  std::vector<std::byte> data = test::random_bytes(rows * cols, 21);
  std::vector<TensorData> td = {{"t", Dtype::kU8, {rows, cols}, data}};
  auto mem = test::serialized_source(td);
  ASSERT_ST_OK(mem);
  const std::vector<std::vector<SliceIndex>> specs = {
      {S::range(std::nullopt, std::nullopt, -1), S::range(1, std::nullopt, 2)},
      {S::all(), S::range(512, 1024)},
      {S::range(100, 8000)},
  };
  for (const bool mapped : {true, false}) {
    auto f = File::open(mapped ? *mem : test::without_mapping(*mem));
    ASSERT_ST_OK(f);
    const TensorInfo& info = f->tensors()[0];
    for (std::size_t k = 0; k < specs.size(); ++k) {
      SCOPED_TRACE(::testing::Message() << "mapped=" << mapped << " spec " << k);
      auto p = f->plan_slice(info, specs[k]);
      ASSERT_ST_OK(p);
      std::vector<std::byte> got(p->nbytes()), expected(p->nbytes());
      ASSERT_ST_OK(f->read_slice(info, *p, got));
      p->for_each_run([&](const SliceRun& r) {
        std::memcpy(expected.data() + r.dest_offset, data.data() + r.source_offset, r.length);
        return true;
      });
      EXPECT_EQ(got, expected);
    }
  }
  auto f = File::open(*mem);
  ASSERT_ST_OK(f);
  auto strided = f->plan_slice(f->tensors()[0], specs[0]);
  ASSERT_ST_OK(strided);
  EXPECT_GT(strided->run_count(), 8u << 20);  // more runs than one piece holds
  auto block = f->plan_slice(f->tensors()[0], specs[2]);
  ASSERT_ST_OK(block);
  EXPECT_EQ(block->run_count(), 1u);
  EXPECT_GT(block->run_length(), 8u << 20);  // longer than one read chunk
}

}  // namespace
}  // namespace safetensors
