// Open, validate and read every tensor: view, read_into, read_many and read_slice, over a memory source and
// over a testing::FaultySource that hides the mapping (so the positional-read and coalescing paths run), and
// with an injected EIO or short read.
//
// The input is a whole file. Every read of an accepted file must return exactly the bytes the input holds
// at data_offset() + begin; the pread path must agree with the memory path byte for byte; an injected fault
// must surface as kIo exactly where a read touches it.
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

std::span<const std::byte> expected_bytes(const File& f, const TensorInfo& t, std::span<const std::byte> input) {
  return input.subspan(f.data_offset() + t.begin, t.nbytes());
}

// Index expressions every tensor is read through, a few of them chosen by `knob`.
std::vector<std::vector<SliceIndex>> slice_specs(const TensorInfo& t, std::uint8_t knob) {
  std::vector<std::vector<SliceIndex>> specs;
  specs.push_back({});
  if (t.shape.empty()) return specs;
  specs.push_back({SliceIndex::range(std::nullopt, std::nullopt, 2)});
  specs.push_back({SliceIndex::range(std::nullopt, std::nullopt, -1)});
  specs.push_back({SliceIndex::at(t.shape[0] > 0 ? 0 : -1)});
  specs.push_back({SliceIndex::ellipsis(), SliceIndex::range(1, std::nullopt, 3)});
  specs.push_back({SliceIndex::ellipsis(), SliceIndex::range(std::nullopt, std::nullopt, -2)});
  specs.push_back({SliceIndex::range(knob % 5 - 2, std::nullopt, knob % 7 == 3 ? 1 : knob % 7 - 3)});
  return specs;
}

// read_into and read_many of every tensor of `f` return the input's bytes; view() works exactly when the
// source has a mapping, and then points into the input.
void check_whole_reads(const File& f, std::span<const std::byte> input, unsigned threads) {
  const bool mapped = f.source()->data() != nullptr;
  std::vector<std::vector<std::byte>> bufs;
  std::vector<ReadRequest> requests;
  bufs.reserve(f.tensors().size());
  for (const TensorInfo& t : f.tensors()) {
    const auto want = expected_bytes(f, t, input);
    auto v = f.view(t);
    if (mapped) {
      FUZZ_CHECK(v.ok(), v.error().to_string());
      FUZZ_CHECK(v->bytes.data() == want.data() && v->bytes.size() == want.size(),
                 "view of `" + std::string(t.name) + "`");
      FUZZ_CHECK(!v->writable, "a memory source is not writable");
    } else {
      FUZZ_CHECK(!v.ok() && v.error().kind() == Error::Kind::kInvalidArgument, "view without a mapping");
    }
    auto& buf = bufs.emplace_back(t.nbytes());
    auto st = f.read_into(t.name, buf);
    FUZZ_CHECK(st.ok(), st.error().to_string());
    FUZZ_CHECK(same_bytes(buf, native_copy(want, t.dtype)), "read_into of `" + std::string(t.name) + "`");
    std::vector<std::byte> wrong(t.nbytes() + 1);
    auto bad = f.read_into(t, wrong);
    FUZZ_CHECK(!bad.ok() && bad.error().kind() == Error::Kind::kInvalidArgument, "read_into with a wrong size");
    std::fill(buf.begin(), buf.end(), std::byte{0xa5});
    requests.push_back({&t, buf});
  }
  auto st = f.read_many(requests, threads);
  FUZZ_CHECK(st.ok(), st.error().to_string());
  for (std::size_t i = 0; i < requests.size(); ++i) {
    FUZZ_CHECK(same_bytes(bufs[i], native_copy(expected_bytes(f, f.tensors()[i], input), f.tensors()[i].dtype)),
               "read_many");
  }
}

// Slices read from `a` (a mapping) and `b` (positional reads) agree: the same plan or the same error, and
// the same bytes. A whole-tensor plan gives the tensor's bytes.
void check_slices(const File& a, const File& b, std::span<const std::byte> input, std::uint8_t knob) {
  for (std::size_t i = 0; i < a.tensors().size(); ++i) {
    const TensorInfo& ta = a.tensors()[i];
    const TensorInfo& tb = b.tensors()[i];
    for (const auto& spec : slice_specs(ta, knob)) {
      auto pa = a.plan_slice(ta, spec);
      auto pb = b.plan_slice(tb, spec);
      FUZZ_CHECK(pa.ok() == pb.ok(), "plan_slice differs between sources");
      if (!pa.ok()) {
        FUZZ_CHECK(
            pa.error().kind() == Error::Kind::kInvalidSlice || pa.error().kind() == Error::Kind::kMisalignedSlice,
            pa.error().to_string());
        FUZZ_CHECK(pa.error().to_string() == pb.error().to_string(), "plan errors differ");
        continue;
      }
      FUZZ_CHECK(pa->nbytes() == pb->nbytes() && pa->shape() == pb->shape(), "plans differ");
      FUZZ_CHECK(pa->source_end() <= ta.nbytes() && pa->source_begin() <= pa->source_end(), "plan range");
      std::vector<std::byte> da(pa->nbytes()), db(pb->nbytes(), std::byte{0x5a});
      auto sa = a.read_slice(ta, *pa, da);
      FUZZ_CHECK(sa.ok(), sa.error().to_string());
      auto sb = b.read_slice(tb, *pb, db);
      FUZZ_CHECK(sb.ok(), sb.error().to_string());
      FUZZ_CHECK(same_bytes(da, db), "read_slice of `" + std::string(ta.name) + "` differs between sources");
      if (spec.empty()) FUZZ_CHECK(same_bytes(da, native_copy(expected_bytes(a, ta, input), ta.dtype)), "whole slice");
      std::vector<std::byte> wrong(pa->nbytes() + 1);
      auto bad = a.read_slice(ta, *pa, wrong);
      FUZZ_CHECK(!bad.ok() && bad.error().kind() == Error::Kind::kInvalidArgument, "read_slice with a wrong size");
    }
  }
}

// With EIO injected at `eio` (an offset in the data buffer), a read fails with kIo exactly when its range
// contains that offset, and otherwise returns the input's bytes.
void check_eio(const File& f, std::span<const std::byte> input, std::uint64_t eio, std::uint8_t knob) {
  std::vector<std::vector<std::byte>> bufs;
  std::vector<ReadRequest> requests;
  bool any_hit = false;
  bufs.reserve(f.tensors().size());
  for (const TensorInfo& t : f.tensors()) {
    const std::uint64_t lo = f.data_offset() + t.begin;
    const bool hit = eio >= lo && eio < lo + t.nbytes();
    any_hit |= hit;
    auto& buf = bufs.emplace_back(t.nbytes());
    auto st = f.read_into(t, buf);
    if (hit) {
      FUZZ_CHECK(!st.ok() && st.error().kind() == Error::Kind::kIo,
                 "EIO not reported for `" + std::string(t.name) + "`");
      check_error_text(st.error());
    } else {
      FUZZ_CHECK(st.ok(), st.error().to_string());
      FUZZ_CHECK(same_bytes(buf, native_copy(expected_bytes(f, t, input), t.dtype)), "read_into beside an EIO");
    }
    requests.push_back({&t, buf});
    for (const auto& spec : slice_specs(t, knob)) {
      auto plan = f.plan_slice(t, spec);
      if (!plan.ok()) continue;
      std::vector<std::byte> dst(plan->nbytes());
      auto s = f.read_slice(t, *plan, dst);
      FUZZ_CHECK(s.ok() || s.error().kind() == Error::Kind::kIo, s.error().to_string());
      if (!hit) FUZZ_CHECK(s.ok(), "read_slice failed beside an EIO");
    }
  }
  auto st = f.read_many(requests, 1 + knob % 2);
  FUZZ_CHECK(st.ok() != any_hit, "read_many and an EIO");
  if (!st.ok()) FUZZ_CHECK(st.error().kind() == Error::Kind::kIo, st.error().to_string());
}

}  // namespace
}  // namespace safetensors::fuzz

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace safetensors;
  using namespace safetensors::fuzz;
  const auto input = as_bytes(data, size);
  // Knobs come from the last byte: in a valid file it is tensor data, so mutating it keeps the file valid.
  const std::uint8_t knob = size ? data[size - 1] : 0;
  auto mem = memory_source(input, nullptr, "<fuzz>");

  {
    auto short_reads = std::make_shared<testing::FaultySource>(mem);
    short_reads->short_read = true;
    auto f = File::open(short_reads);
    FUZZ_CHECK(!f.ok(), "open succeeded although every read fails");
    FUZZ_CHECK(f.error().kind() == (size < 8 ? Error::Kind::kHeaderTooSmall : Error::Kind::kIo), f.error().to_string());
  }

  auto file = File::open(mem);
  auto pread_source = std::make_shared<testing::FaultySource>(mem);
  pread_source->hide_mapping = true;
  auto pread_file = File::open(pread_source);
  FUZZ_CHECK(file.ok() == pread_file.ok(), "open differs between memory and positional reads");
  if (!file.ok()) {
    FUZZ_CHECK(is_format_error(file.error().kind()), "unexpected kind: " + file.error().to_string());
    FUZZ_CHECK(file.error().to_string() == pread_file.error().to_string(), "open errors differ");
    return 0;
  }
  check_file_invariants(*file, size);
  FUZZ_CHECK(pread_file->tensors().size() == file->tensors().size(), "tensor counts differ");

  check_whole_reads(*file, input, 1 + knob % 3);
  check_whole_reads(*pread_file, input, 1 + (knob >> 2) % 3);
  check_slices(*file, *pread_file, input, knob);

  const std::uint64_t data_size = size - file->data_offset();
  if (data_size > 0) {
    auto faulty = std::make_shared<testing::FaultySource>(mem);
    faulty->hide_mapping = (knob & 1) != 0;
    // An offset in the data buffer, so the header still reads.
    const std::uint64_t eio = file->data_offset() + (static_cast<std::uint64_t>(knob) * 2654435761u + size) % data_size;
    faulty->eio_at_offset = static_cast<std::int64_t>(eio);
    auto f = File::open(faulty);
    FUZZ_CHECK(f.ok(), f.error().to_string());
    check_eio(*f, input, eio, knob);
  }
  return 0;
}
