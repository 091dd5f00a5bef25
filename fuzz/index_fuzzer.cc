// Index parsing: ShardIndex::parse on arbitrary text (the `model.safetensors.index.json` of a sharded
// checkpoint), the parser open_index() and the Python CLI both use.
//
// A failure must be kInvalidArgument naming the index. A success must hold the index rules: shard names
// distinct, sorted and inside the index's directory, every weight_map entry's shard consistent, tensor names
// unique, assigned() partitioning the weight_map. And the writer must agree with the parser: the index text
// plan_shards() writes for the parsed tensor names parses back to the same names, each assigned to the shard
// the plan put it in.
#include <cstdint>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "fuzz_util.h"
#include "safetensors/sharded.h"

namespace safetensors::fuzz {
namespace {

constexpr const char* kPath = "<fuzz>/model.safetensors.index.json";

bool inside_directory(std::string_view name) {
  if (name.empty() || name.front() == '/') return false;
  std::size_t start = 0;
  while (start <= name.size()) {
    std::size_t end = name.find('/', start);
    if (end == std::string_view::npos) end = name.size();
    if (name.substr(start, end - start) == "..") return false;
    start = end + 1;
  }
  return true;
}

void check_index(const ShardIndex& index) {
  FUZZ_CHECK(index.path == kPath, "path");
  FUZZ_CHECK(index.shard_of.size() == index.weight_map.size(), "shard_of is not parallel to weight_map");
  for (std::size_t s = 0; s < index.shard_names.size(); ++s) {
    FUZZ_CHECK(inside_directory(index.shard_names[s]), "unsafe shard name `" + index.shard_names[s] + "`");
    FUZZ_CHECK(s == 0 || index.shard_names[s - 1] < index.shard_names[s], "shard names not sorted and distinct");
    FUZZ_CHECK(index.shard_path(s) == "<fuzz>/" + index.shard_names[s], "shard_path");
  }
  std::set<std::string_view> names;
  std::size_t assigned = 0;
  for (std::size_t i = 0; i < index.weight_map.size(); ++i) {
    const auto& [tensor, shard] = index.weight_map[i];
    FUZZ_CHECK(names.insert(tensor).second, "duplicate tensor `" + tensor + "` accepted");
    FUZZ_CHECK(index.shard_of[i] < index.shard_names.size() && index.shard_names[index.shard_of[i]] == shard,
               "shard_of of `" + tensor + "`");
  }
  for (std::size_t s = 0; s < index.shard_names.size(); ++s) {
    const std::vector<std::string_view> a = index.assigned(s);
    FUZZ_CHECK(!a.empty(), "a shard with no tensors");
    assigned += a.size();
  }
  FUZZ_CHECK(assigned == index.weight_map.size(), "assigned() does not partition weight_map");
  FUZZ_CHECK(index.metadata.has_value() == index.metadata_json.has_value(), "metadata and metadata_json disagree");
  FUZZ_CHECK(!index.total_size || index.metadata, "total_size without metadata");
}

// The writer's text for these names parses back to them, each in its planned shard.
void check_round_trip(const ShardIndex& index) {
  static const std::byte kNowhere{};
  std::vector<TensorData> tensors;
  tensors.reserve(index.weight_map.size());
  for (std::size_t i = 0; i < index.weight_map.size(); ++i) {
    // Sizes 1..3 make several shards of at most 4 bytes; the data is never read.
    const std::uint64_t size = 1 + i % 3;
    tensors.push_back({index.weight_map[i].first, Dtype::kU8, {size}, std::span<const std::byte>(&kNowhere, size)});
  }
  auto plan = plan_shards(tensors, {.max_shard_bytes = 4});
  FUZZ_CHECK(plan.ok(), "plan_shards refused parsed names: " + plan.error().to_string());
  auto again = ShardIndex::parse(kPath, plan->index_json);
  FUZZ_CHECK(again.ok(), "the written index does not parse: " + again.error().to_string());
  FUZZ_CHECK(again->weight_map.size() == tensors.size(), "round trip lost tensors");
  FUZZ_CHECK(again->total_size == plan->total_size, "round trip total_size");
  std::vector<std::string> shard_of_input(tensors.size());
  for (const ShardPlan::Shard& s : plan->shards) {
    for (std::size_t i : s.inputs) shard_of_input[i] = s.file_name;
  }
  std::vector<std::pair<std::string, std::string>> expected;
  for (std::size_t i = 0; i < tensors.size(); ++i) expected.emplace_back(index.weight_map[i].first, shard_of_input[i]);
  std::sort(expected.begin(), expected.end());
  // The written weight_map is sorted by name (sort_keys), so it must equal the sorted expectation.
  FUZZ_CHECK(again->weight_map == expected, "round trip changed names or shards");
}

}  // namespace
}  // namespace safetensors::fuzz

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace safetensors;
  using namespace safetensors::fuzz;
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  auto index = ShardIndex::parse(kPath, text);
  if (!index.ok()) {
    FUZZ_CHECK(index.error().kind() == Error::Kind::kInvalidArgument, "unexpected kind: " + index.error().to_string());
    FUZZ_CHECK(index.error().context() == kPath, "the error does not name the index");
    return 0;
  }
  check_index(*index);
  check_round_trip(*index);
  return 0;
}
