// Round trip: when the input opens, its tensors and metadata are written back with the writer
// (WritePlan + serialize_into, and serialize), the result is re-opened, and metadata and every tensor's
// dtype, shape and bytes must be identical (compared by name: the writer sorts tensors). Writing the
// re-opened file again must reproduce the same bytes: the writer's output is canonical. For one input in
// eight (file system calls are slow) the file is also written with FileWriter, in parts, in an order the
// input picks, and must come out identical; an unfinished write must leave the previous file alone.
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "fuzz_util.h"
#include "safetensors/file.h"
#include "safetensors/source.h"
#include "safetensors/writer.h"

namespace safetensors::fuzz {
namespace {

// The tensors of `f` as writer input, borrowing their bytes from the mapping.
// The file's tensors as the writer takes them: native values (copies in *values, swapped from the file's
// little-endian bytes on a big-endian host).
std::vector<TensorData> tensors_of(const File& f, std::vector<std::vector<std::byte>>* values) {
  std::vector<TensorData> out;
  out.reserve(f.tensors().size());
  values->clear();
  values->reserve(f.tensors().size());
  for (const TensorInfo& t : f.tensors()) {
    auto v = f.view(t);
    FUZZ_CHECK(v.ok(), v.error().to_string());
    values->push_back(native_copy(v->bytes, t.dtype));
    out.push_back({std::string(t.name), t.dtype, {t.shape.begin(), t.shape.end()}, values->back()});
  }
  return out;
}

// A private directory for the written files, removed at exit.
struct ScratchDir {
  ScratchDir() : path(std::filesystem::temp_directory_path() / ("st_fuzz_roundtrip_" + std::to_string(::getpid()))) {
    std::filesystem::create_directories(path);
  }
  ~ScratchDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  std::filesystem::path path;
};

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void check_file_writer(const WritePlan& plan, const std::vector<TensorData>& tensors,
                       std::span<const std::byte> expected, std::uint8_t knob) {
  static ScratchDir dir;
  const std::string path = (dir.path / "out.safetensors").string();
  const std::string previous = "the previous file";
  std::ofstream(path, std::ios::binary | std::ios::trunc) << previous;

  const auto first_nonempty =
      std::find_if(tensors.begin(), tensors.end(), [](const TensorData& t) { return !t.data.empty(); });
  if (first_nonempty != tensors.end() && (knob & 1)) {
    auto w = FileWriter::create(path, plan);
    FUZZ_CHECK(w.ok(), w.error().to_string());
    for (std::size_t i = 0; i < tensors.size(); ++i) {
      if (&tensors[i] == &*first_nonempty) continue;
      auto st = w->write(i, tensors[i].data);
      FUZZ_CHECK(st.ok(), st.error().to_string());
    }
    auto st = w->finish();
    FUZZ_CHECK(!st.ok() && st.error().kind() == Error::Kind::kInvalidArgument, "finish with a tensor missing");
    FUZZ_CHECK(read_file(path) == previous, "an unfinished write replaced the file");
  }

  auto w = FileWriter::create(path, plan);
  FUZZ_CHECK(w.ok(), w.error().to_string());
  std::vector<std::size_t> order(tensors.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  if (knob & 2) std::reverse(order.begin(), order.end());
  const std::size_t part = 1 + knob % 13;
  for (std::size_t i : order) {
    const auto& data = tensors[i].data;
    // Parts hold whole elements (FileWriter::write_part): the part size rounded up to the swap unit.
    const std::size_t unit = std::max<std::size_t>(1, dtype_swap_bytes(tensors[i].dtype));
    const std::size_t whole = (part + unit - 1) / unit * unit;
    std::vector<std::uint64_t> offsets;
    for (std::uint64_t off = 0; off < data.size(); off += whole) offsets.push_back(off);
    if (knob & 4) std::reverse(offsets.begin(), offsets.end());
    for (std::uint64_t off : offsets) {
      const std::size_t n = std::min<std::uint64_t>(whole, data.size() - off);
      auto st = w->write_part(i, off, data.subspan(off, n));
      FUZZ_CHECK(st.ok(), st.error().to_string());
    }
  }
  auto st = w->finish();
  FUZZ_CHECK(st.ok(), st.error().to_string());
  const std::string got = read_file(path);
  FUZZ_CHECK(
      same_bytes(std::span<const std::byte>(reinterpret_cast<const std::byte*>(got.data()), got.size()), expected),
      "FileWriter wrote different bytes than serialize_into");
}

Result<File> open_owned(std::vector<std::byte> bytes) {
  auto owner = std::make_shared<std::vector<std::byte>>(std::move(bytes));
  return File::open(memory_source(*owner, owner, "<roundtrip>"));
}

}  // namespace
}  // namespace safetensors::fuzz

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace safetensors;
  using namespace safetensors::fuzz;
  auto original = File::open(memory_source(as_bytes(data, size), nullptr, "<fuzz>"));
  if (!original.ok()) {
    FUZZ_CHECK(is_format_error(original.error().kind()), "unexpected kind: " + original.error().to_string());
    return 0;
  }
  std::vector<std::vector<std::byte>> original_values, reopened_values;
  const auto tensors = tensors_of(*original, &original_values);
  const auto& metadata = original->metadata();

  auto plan = WritePlan::make(tensors, metadata);
  if (!plan.ok()) {
    // Only a header that grows past the cap may fail (escapes can lengthen it, padding adds up to 7 bytes).
    FUZZ_CHECK(
        plan.error().kind() == Error::Kind::kHeaderTooLarge && original->header_length() + 8 > kDefaultMaxHeaderBytes,
        "writer refused what the reader accepted: " + plan.error().to_string());
    return 0;
  }
  FUZZ_CHECK(plan->data_offset() % 8 == 0, "header not padded to 8");
  FUZZ_CHECK(plan->total_size() - plan->data_offset() == size - original->data_offset(), "data size changed");
  std::vector<std::byte> written(plan->total_size());
  auto st = serialize_into(*plan, tensors, written);
  FUZZ_CHECK(st.ok(), st.error().to_string());
  auto again = serialize(tensors, metadata);
  FUZZ_CHECK(again.ok(), again.error().to_string());
  FUZZ_CHECK(same_bytes(*again, written), "serialize and serialize_into disagree");

  auto reopened = open_owned(written);
  FUZZ_CHECK(reopened.ok(), "the writer's output does not open: " + reopened.error().to_string());
  check_file_invariants(*reopened, written.size());
  FUZZ_CHECK(reopened->metadata() == metadata, "metadata changed in the round trip");
  FUZZ_CHECK(reopened->tensors().size() == tensors.size(), "tensor count changed");
  for (const TensorData& t : tensors) {
    const TensorInfo* r = reopened->find(t.name);
    FUZZ_CHECK(r != nullptr, "tensor `" + t.name + "` lost");
    FUZZ_CHECK(r->dtype == t.dtype, "dtype of `" + t.name + "`");
    FUZZ_CHECK(std::equal(r->shape.begin(), r->shape.end(), t.shape.begin(), t.shape.end()),
               "shape of `" + t.name + "`");
    auto v = reopened->view(*r);
    FUZZ_CHECK(v.ok(), v.error().to_string());
    FUZZ_CHECK(same_bytes(native_copy(v->bytes, t.dtype), t.data), "bytes of `" + t.name + "`");
  }
  // File order is the writer's: dtype rank descending, then name.
  for (std::size_t i = 1; i < reopened->tensors().size(); ++i) {
    const TensorInfo& a = reopened->tensors()[i - 1];
    const TensorInfo& b = reopened->tensors()[i];
    FUZZ_CHECK(dtype_rank(a.dtype) > dtype_rank(b.dtype) || (a.dtype == b.dtype && a.name < b.name),
               "writer order at `" + std::string(b.name) + "`");
  }

  const std::uint8_t knob = size ? data[size - 1] : 0;
  if ((knob >> 3) % 8 == 0) check_file_writer(*plan, tensors, written, knob);

  auto canonical = serialize(tensors_of(*reopened, &reopened_values), reopened->metadata());
  FUZZ_CHECK(canonical.ok(), canonical.error().to_string());
  FUZZ_CHECK(same_bytes(*canonical, written), "writing the written file again changed its bytes");
  return 0;
}
