// Round trip: when the input opens, its tensors and metadata are written back with the writer
// (WritePlan + serialize_into, and serialize), the result is re-opened, and metadata and every tensor's
// dtype, shape and bytes must be identical (compared by name: the writer sorts tensors). Writing the
// re-opened file again must reproduce the same bytes: the writer's output is canonical.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "fuzz_util.h"
#include "safetensors/file.h"
#include "safetensors/source.h"
#include "safetensors/writer.h"

namespace safetensors::fuzz {
namespace {

// The tensors of `f` as writer input, borrowing their bytes from the mapping.
std::vector<TensorData> tensors_of(const File& f) {
  std::vector<TensorData> out;
  out.reserve(f.tensors().size());
  for (const TensorInfo& t : f.tensors()) {
    auto v = f.view(t);
    FUZZ_CHECK(v.ok(), v.error().to_string());
    out.push_back({std::string(t.name), t.dtype, {t.shape.begin(), t.shape.end()}, v->bytes});
  }
  return out;
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
  const auto tensors = tensors_of(*original);
  const auto& metadata = original->metadata();

  auto plan = WritePlan::make(tensors, metadata);
  if (!plan.ok()) {
    // Only a header that grows past the cap may fail (escapes can lengthen it, padding adds up to 7 bytes).
    FUZZ_CHECK(plan.error().kind() == Error::Kind::kHeaderTooLarge &&
                   original->header_length() + 8 > kDefaultMaxHeaderBytes,
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
    FUZZ_CHECK(std::equal(r->shape.begin(), r->shape.end(), t.shape.begin(), t.shape.end()), "shape of `" + t.name + "`");
    auto v = reopened->view(*r);
    FUZZ_CHECK(v.ok(), v.error().to_string());
    FUZZ_CHECK(same_bytes(v->bytes, t.data), "bytes of `" + t.name + "`");
  }
  // File order is the writer's: dtype rank descending, then name.
  for (std::size_t i = 1; i < reopened->tensors().size(); ++i) {
    const TensorInfo& a = reopened->tensors()[i - 1];
    const TensorInfo& b = reopened->tensors()[i];
    FUZZ_CHECK(dtype_rank(a.dtype) > dtype_rank(b.dtype) || (a.dtype == b.dtype && a.name < b.name),
               "writer order at `" + std::string(b.name) + "`");
  }

  auto canonical = serialize(tensors_of(*reopened), reopened->metadata());
  FUZZ_CHECK(canonical.ok(), canonical.error().to_string());
  FUZZ_CHECK(same_bytes(*canonical, written), "writing the written file again changed its bytes");
  return 0;
}
