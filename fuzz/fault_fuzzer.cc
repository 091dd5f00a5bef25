// Open and read a file through a testing::FaultySource that injects an EIO at a fuzzed offset and makes the
// file seem to end early at another (a file that shrank, or a short read): every read path -- open,
// read_into, read_many, read_slice, read_range -- must return the right bytes or a clean kIo Error, and
// must succeed exactly where the bytes it needs are untouched by the faults.
//
// Input: [0, 4) the EIO offset, [4, 8) the end offset (u32 little-endian; 0xffffffff = no such fault; other
// values are taken modulo the file's size), [8] a knob (threads, slice choice), then the file.
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "fuzz_util.h"
#include "safetensors/file.h"
#include "safetensors/slice.h"
#include "safetensors/source.h"
#include "safetensors/testing.h"

namespace safetensors::fuzz {
namespace {

constexpr std::uint32_t kOff = 0xffffffffu;

std::uint32_t u32_at(const std::uint8_t* p) {
  return static_cast<std::uint32_t>(p[0]) | static_cast<std::uint32_t>(p[1]) << 8 |
         static_cast<std::uint32_t>(p[2]) << 16 | static_cast<std::uint32_t>(p[3]) << 24;
}

// The faults of one run, as file offsets (nullopt: absent).
struct Faults {
  std::optional<std::uint64_t> eio;
  std::optional<std::uint64_t> end;

  // Whether a read of [lo, hi) meets a fault.
  bool hits(std::uint64_t lo, std::uint64_t hi) const {
    if (lo == hi) return false;
    return (eio && *eio >= lo && *eio < hi) || (end && hi > *end);
  }
};

void check_io_error(const Error& e, const std::string& what) {
  FUZZ_CHECK(e.kind() == Error::Kind::kIo, what + ": " + e.to_string());
  check_error_text(e);
}

std::vector<std::vector<SliceIndex>> slice_specs(const TensorInfo& t, std::uint8_t knob) {
  std::vector<std::vector<SliceIndex>> specs;
  specs.push_back({});
  if (t.shape.empty()) return specs;
  specs.push_back({SliceIndex::range(std::nullopt, std::nullopt, 1 + knob % 3)});
  specs.push_back({SliceIndex::ellipsis(), SliceIndex::range(knob % 4, std::nullopt, 1 + knob % 2)});
  specs.push_back({SliceIndex::at(-1)});
  return specs;
}

void run(std::span<const std::byte> input, const Faults& faults, std::uint8_t knob) {
  auto mem = memory_source(input, nullptr, "<fuzz>");
  auto clean = File::open(mem);
  auto faulty = std::make_shared<testing::FaultySource>(mem);
  // Without the mapping every read is a positional Source::read, where the faults are injected (a mapped
  // memory source is copied from directly).
  faulty->hide_mapping = true;
  if (faults.eio) faulty->eio_at_offset = static_cast<std::int64_t>(*faults.eio);
  if (faults.end) faulty->end_at_offset = static_cast<std::int64_t>(*faults.end);
  auto f = File::open(faulty);
  if (!clean.ok()) {
    FUZZ_CHECK(!f.ok(), "open succeeded with faults but not without");
    FUZZ_CHECK(is_format_error(f.error().kind()) || f.error().kind() == Error::Kind::kIo, f.error().to_string());
    return;
  }
  if (faults.hits(0, clean->data_offset())) {
    FUZZ_CHECK(!f.ok(), "open succeeded although a fault lies in the header");
    check_io_error(f.error(), "open");
    return;
  }
  FUZZ_CHECK(f.ok(), "open failed away from the faults: " + f.error().to_string());
  FUZZ_CHECK(f->tensors().size() == clean->tensors().size(), "tensor counts differ");

  const unsigned threads = 1 + knob % 3;
  std::vector<std::vector<std::byte>> bufs(f->tensors().size());
  std::vector<ReadRequest> requests;
  bool any_hit = false;
  for (std::size_t i = 0; i < f->tensors().size(); ++i) {
    const TensorInfo& t = f->tensors()[i];
    const std::uint64_t lo = f->data_offset() + t.begin, hi = lo + t.nbytes();
    const bool hit = faults.hits(lo, hi);
    any_hit |= hit;
    const auto want = input.subspan(lo, t.nbytes());
    bufs[i].assign(t.nbytes(), std::byte{0x5a});
    auto st = f->read_into(t, bufs[i]);
    if (hit) {
      FUZZ_CHECK(!st.ok(), "read_into of `" + std::string(t.name) + "` succeeded through a fault");
      check_io_error(st.error(), "read_into");
      FUZZ_CHECK(st.error().to_string().find("read of tensor `") != std::string::npos, st.error().to_string());
    } else {
      FUZZ_CHECK(st.ok(), "read_into away from the faults: " + st.error().to_string());
      FUZZ_CHECK(same_bytes(bufs[i], native_copy(want, t.dtype)), "read_into of `" + std::string(t.name) + "`");
    }
    requests.push_back({&t, bufs[i]});

    const TensorInfo& ct = clean->tensors()[i];
    for (const auto& spec : slice_specs(t, knob)) {
      auto plan = f->plan_slice(t, spec);
      if (!plan.ok()) continue;
      std::vector<std::byte> got(plan->nbytes()), expected(plan->nbytes());
      FUZZ_CHECK(clean->read_slice(ct, *plan, expected).ok(), "read_slice without faults");
      auto s = f->read_slice(t, *plan, got);
      // Close runs are read together, so a fault in the gap between two wanted runs may fail a slice of a
      // tensor that is hit; one that is not hit must read.
      if (!s.ok()) {
        FUZZ_CHECK(hit, "read_slice failed away from the faults: " + s.error().to_string());
        check_io_error(s.error(), "read_slice");
      } else {
        FUZZ_CHECK(same_bytes(got, expected), "read_slice of `" + std::string(t.name) + "`");
      }
    }
  }
  auto many = f->read_many(requests, threads);
  FUZZ_CHECK(many.ok() != any_hit, "read_many and the faults");
  if (!many.ok()) check_io_error(many.error(), "read_many");
  for (std::size_t i = 0; many.ok() && i < bufs.size(); ++i) {
    const TensorInfo& t = f->tensors()[i];
    FUZZ_CHECK(same_bytes(bufs[i], native_copy(input.subspan(f->data_offset() + t.begin, t.nbytes()), t.dtype)),
               "read_many");
  }

  std::vector<std::byte> all(f->size() - f->data_offset());
  auto range = f->read_range(0, all, threads);
  FUZZ_CHECK(range.ok() != faults.hits(f->data_offset(), f->size()), "read_range and the faults");
  if (range.ok()) {
    FUZZ_CHECK(same_bytes(all, input.subspan(f->data_offset())), "read_range");
  } else {
    check_io_error(range.error(), "read_range");
  }
}

}  // namespace
}  // namespace safetensors::fuzz

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace safetensors::fuzz;
  if (size < 9) return 0;
  const auto input = as_bytes(data + 9, size - 9);
  const std::uint64_t n = input.size();
  Faults faults;
  if (const std::uint32_t e = u32_at(data); e != kOff && n > 0) faults.eio = e % n;
  if (const std::uint32_t e = u32_at(data + 4); e != kOff) faults.end = e % (n + 1);
  run(input, faults, data[8]);
  return 0;
}
