// Writing sharded checkpoints: the split, the shard file names, the index text, and the saves.
#include "safetensors/sharded.h"

#include <simdjson.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "format/json_writer.h"
#include "io/atomic_file.h"
#include "util/checked.h"
#include "util/path.h"
#include "util/quote.h"

namespace safetensors {

using internal::join_path;
using internal::quote;

std::string shard_file_name(std::string_view prefix, std::size_t i, std::size_t n) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "-%05zu-of-%05zu.safetensors", i, n);
  return std::string(prefix) + buf;
}

bool is_shard_file_name(std::string_view prefix, std::string_view name) {
  // The name shard_file_name(prefix, i, n) gives for some 1 <= i <= n: parse the two numbers, then require
  // that name is exactly that spelling (no sign, the zero padding and no more).
  if (name.size() <= prefix.size() || name.substr(0, prefix.size()) != prefix) return false;
  std::string_view rest = name.substr(prefix.size());
  auto number = [&rest](std::size_t* out) {
    std::size_t digits = 0;
    std::size_t value = 0;
    while (digits < rest.size() && rest[digits] >= '0' && rest[digits] <= '9') {
      // More than 19 digits cannot be a number shard_file_name wrote, and must not overflow.
      if (++digits > 19) return false;
      value = value * 10 + static_cast<std::size_t>(rest[digits - 1] - '0');
    }
    rest.remove_prefix(digits);
    *out = value;
    return digits > 0;
  };
  auto literal = [&rest](std::string_view text) {
    if (rest.substr(0, text.size()) != text) return false;
    rest.remove_prefix(text.size());
    return true;
  };
  std::size_t i = 0, n = 0;
  if (!literal("-") || !number(&i) || !literal("-of-") || !number(&n) || rest != ".safetensors") return false;
  return i >= 1 && i <= n && name == shard_file_name(prefix, i, n);
}

Result<ShardPlan> plan_shards(std::span<const TensorData> tensors, const ShardingOptions& options) {
  const std::string_view context = "<plan>";
  if (options.prefix.empty() || options.prefix.find_first_of(std::string_view("/\0", 2)) != std::string::npos) {
    return Error::invalid_argument(
        context, "shard prefix " + quote(options.prefix) + " must be a non-empty file name without '/' or NUL");
  }
  std::vector<std::size_t> by_name(tensors.size());
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    by_name[i] = i;
    if (!simdjson::validate_utf8(tensors[i].name.data(), tensors[i].name.size())) {
      return Error::invalid_argument(context, "tensor name " + quote(tensors[i].name) + " is not valid UTF-8");
    }
  }
  // Byte order of UTF-8 is code point order, which is how Python's sort_keys orders the weight_map.
  std::sort(by_name.begin(), by_name.end(),
            [&](std::size_t a, std::size_t b) { return tensors[a].name < tensors[b].name; });
  for (std::size_t k = 1; k < by_name.size(); ++k) {
    if (tensors[by_name[k]].name == tensors[by_name[k - 1]].name) {
      return Error::invalid_argument(context, "duplicate tensor name " + quote(tensors[by_name[k]].name));
    }
  }

  // The split huggingface_hub's split_torch_state_dict_into_shards makes (so files match save_pretrained's):
  // tensors in order fill the open shard, which is closed when the next tensor would overflow it; a tensor
  // larger than the limit is a shard of its own at once, while the open shard stays open.
  ShardPlan plan;
  plan.index_file_name = options.prefix + ".safetensors.index.json";
  ShardPlan::Shard open;
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const std::uint64_t size = tensors[i].data.size();
    auto total = internal::checked_add(plan.total_size, size);
    if (!total) return Error::validation_overflow(context, tensors[i].name);
    plan.total_size = *total;
    if (size > options.max_shard_bytes) {
      plan.shards.push_back({.file_name = {}, .inputs = {i}, .bytes = size});
      continue;
    }
    // open.bytes + size <= total_size, which fits.
    if (!open.inputs.empty() && open.bytes + size > options.max_shard_bytes) {
      plan.shards.push_back(std::move(open));
      open = {};
    }
    open.inputs.push_back(i);
    open.bytes += size;
  }
  if (!open.inputs.empty()) plan.shards.push_back(std::move(open));
  std::vector<std::size_t> shard_of(tensors.size());
  for (std::size_t s = 0; s < plan.shards.size(); ++s) {
    for (std::size_t i : plan.shards[s].inputs) shard_of[i] = s;
  }
  for (std::size_t s = 0; s < plan.shards.size(); ++s) {
    plan.shards[s].file_name = shard_file_name(options.prefix, s + 1, plan.shards.size());
  }

  std::string& json = plan.index_json;
  json = "{\n  \"metadata\": {\n    \"total_size\": " + std::to_string(plan.total_size) + "\n  },\n  \"weight_map\": ";
  if (tensors.empty()) {
    json += "{}";
  } else {
    json += "{\n";
    for (std::size_t k = 0; k < by_name.size(); ++k) {
      json += "    ";
      internal::append_json_string(&json, tensors[by_name[k]].name, internal::JsonEscape::kAscii);
      json += ": ";
      internal::append_json_string(&json, plan.shards[shard_of[by_name[k]]].file_name, internal::JsonEscape::kAscii);
      json += k + 1 < by_name.size() ? ",\n" : "\n";
    }
    json += "  }";
  }
  json += "\n}\n";
  return plan;
}

Status write_index(const std::string& directory, const ShardPlan& plan, const WriteOptions& options) {
  return internal::write_file_atomically(join_path(directory, plan.index_file_name), plan.index_json, options.fsync);
}

Result<ShardPlan> save_sharded(const std::string& directory, std::span<const TensorData> tensors,
                               const ShardingOptions& options) {
  SAFETENSORS_ASSIGN_OR_RETURN(ShardPlan plan, plan_shards(tensors, options));
  // Every shard's layout is planned (and so validated) before the first byte is written.
  std::vector<WritePlan> layouts;
  std::vector<std::vector<TensorData>> members(plan.shards.size());
  layouts.reserve(plan.shards.size());
  for (std::size_t s = 0; s < plan.shards.size(); ++s) {
    members[s].reserve(plan.shards[s].inputs.size());
    for (std::size_t i : plan.shards[s].inputs) members[s].push_back(tensors[i]);
    SAFETENSORS_ASSIGN_OR_RETURN(WritePlan layout,
                                 WritePlan::make(members[s], options.shard_metadata, options.write.max_header_bytes));
    layouts.push_back(std::move(layout));
  }
  for (std::size_t s = 0; s < plan.shards.size(); ++s) {
    SAFETENSORS_ASSIGN_OR_RETURN(FileWriter writer, FileWriter::create(join_path(directory, plan.shards[s].file_name),
                                                                       std::move(layouts[s]), options.write));
    for (std::size_t k = 0; k < members[s].size(); ++k) {
      Status st = writer.write(k, members[s][k].data);
      if (!st.ok()) {
        writer.abandon();
        return std::move(st).error();
      }
    }
    SAFETENSORS_RETURN_IF_ERROR(writer.finish());
  }
  // The index goes last: while it still names the old shards a reader sees the old checkpoint (or, where a
  // shard name was reused, a clear kTensorNotFound), never a new index naming a shard not yet written.
  SAFETENSORS_RETURN_IF_ERROR(write_index(directory, plan, options.write));
  return plan;
}

}  // namespace safetensors
