// ShardIndex: the one parse and validation of an index file, and the one "a shard holds what the index
// assigns" check.
#include "safetensors/sharded.h"

#include <simdjson.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>

#include "format/name_index.h"
#include "util/path.h"
#include "util/quote.h"

namespace safetensors {

using internal::quote;
namespace {

// A shard name must stay inside the index's directory: a hostile index must not make us open arbitrary
// files elsewhere.
bool is_safe_shard_name(std::string_view name) {
  if (name.empty() || name.front() == '/' || name.find('\0') != std::string_view::npos) return false;
  std::size_t start = 0;
  while (start <= name.size()) {
    std::size_t end = name.find('/', start);
    if (end == std::string_view::npos) end = name.size();
    if (name.substr(start, end - start) == "..") return false;
    start = end + 1;
  }
  return true;
}

}  // namespace

Result<ShardIndex> ShardIndex::read(const std::string& path, std::uint64_t max_bytes) {
  OpenOptions options;
  options.max_header_bytes = max_bytes;
  return read(path, options);
}

Result<ShardIndex> ShardIndex::read(const std::string& path, const OpenOptions& options) {
  OpenOptions pread = options;
  pread.backend = Backend::kPread;
  SAFETENSORS_ASSIGN_OR_RETURN(auto source, open_source(path, pread));
  const std::uint64_t size = source->size();
  const std::uint64_t max_bytes = options.max_header_bytes;
  if (size > max_bytes || size > SIZE_MAX - simdjson::SIMDJSON_PADDING) {
    return Error::invalid_argument(source->name(), "the index is " + std::to_string(size) +
                                                       " bytes, above the limit of " + std::to_string(max_bytes));
  }
  std::string text(static_cast<std::size_t>(size), '\0');
  SAFETENSORS_RETURN_IF_ERROR(read_exact(
      *source, 0, std::span<std::byte>(reinterpret_cast<std::byte*>(text.data()), text.size()), "read of the index"));
  // Errors name the index as its source does (a URL without its query); shards resolve against the location.
  SAFETENSORS_ASSIGN_OR_RETURN(ShardIndex index, parse(source->name(), text));
  index.path = path;
  return index;
}

Result<ShardIndex> ShardIndex::parse(const std::string& path, std::string_view text) {
  auto bad = [&](const std::string& detail) { return Error::invalid_argument(path, "invalid index: " + detail); };
  simdjson::dom::parser parser;
  simdjson::dom::element root;
  // simdjson reads up to SIMDJSON_PADDING bytes past the end; padded_string makes that copy.
  const simdjson::padded_string padded(text.data(), text.size());
  if (auto err = parser.parse(padded).get(root)) return bad(simdjson::error_message(err));
  simdjson::dom::object top;
  if (root.get_object().get(top) != simdjson::SUCCESS) return bad("the index must be a JSON object");

  ShardIndex out;
  out.path = path;
  std::unordered_set<std::string_view> top_keys;
  bool have_weight_map = false;
  for (auto kv : top) {
    if (!top_keys.insert(kv.key).second) return bad("duplicate key " + quote(kv.key));
    if (kv.key == "weight_map") {
      simdjson::dom::object wm;
      if (kv.value.get_object().get(wm) != simdjson::SUCCESS) return bad("`weight_map` must be an object");
      have_weight_map = true;
      out.weight_map.reserve(wm.size());
      for (auto entry : wm) {
        std::string_view file;
        if (entry.value.get_string().get(file) != simdjson::SUCCESS) {
          return bad("`weight_map` value for tensor " + quote(entry.key) + " must be a string (a file name)");
        }
        if (!is_safe_shard_name(file)) {
          return bad("`weight_map` assigns tensor " + quote(entry.key) + " to " + quote(file) +
                     ", which is not a relative path inside the index's directory");
        }
        out.weight_map.emplace_back(std::string(entry.key), std::string(file));
      }
    } else if (kv.key == "metadata") {
      if (kv.value.is_null()) continue;
      simdjson::dom::object md;
      if (kv.value.get_object().get(md) != simdjson::SUCCESS) return bad("`metadata` must be an object");
      Metadata entries;
      std::unordered_set<std::string_view> md_keys;
      for (auto m : md) {
        if (!md_keys.insert(m.key).second) return bad("duplicate key " + quote(m.key) + " in `metadata`");
        std::string_view s;
        if (m.value.get_string().get(s) == simdjson::SUCCESS) {
          entries.emplace_back(std::string(m.key), std::string(s));
        } else {
          entries.emplace_back(std::string(m.key), simdjson::minify(m.value));
        }
        std::uint64_t n;
        if (m.key == "total_size" && m.value.get_uint64().get(n) == simdjson::SUCCESS) {
          out.total_size = n;
        }
      }
      out.metadata = std::move(entries);
      out.metadata_json = simdjson::minify(kv.value);
    }
    // Any other key is ignored, as transformers ignores it.
  }
  if (!have_weight_map) return bad("missing `weight_map`");
  // Duplicates inside weight_map: the DOM keeps every occurrence, so they are found here.
  internal::NameIndex names;
  const std::size_t dup =
      names.build(out.weight_map.size(), [&](std::size_t i) -> std::string_view { return out.weight_map[i].first; });
  if (dup != out.weight_map.size()) {
    return bad("duplicate key " + quote(out.weight_map[dup].first) + " in `weight_map`");
  }

  {
    std::unordered_set<std::string_view> seen;
    for (const auto& entry : out.weight_map) {
      if (seen.insert(entry.second).second) out.shard_names.push_back(entry.second);
    }
    std::sort(out.shard_names.begin(), out.shard_names.end());
  }
  std::unordered_map<std::string_view, std::uint32_t> shard_number;
  for (std::size_t i = 0; i < out.shard_names.size(); ++i) {
    shard_number.emplace(out.shard_names[i], static_cast<std::uint32_t>(i));
  }
  out.shard_of.reserve(out.weight_map.size());
  for (const auto& entry : out.weight_map) out.shard_of.push_back(shard_number.at(entry.second));
  return out;
}

std::string ShardIndex::shard_path(std::size_t s) const { return resolve_location(path, shard_names[s]); }

std::vector<std::string_view> ShardIndex::assigned(std::size_t s) const {
  std::vector<std::string_view> names;
  for (std::size_t i = 0; i < weight_map.size(); ++i) {
    if (shard_of[i] == s) names.emplace_back(weight_map[i].first);
  }
  std::sort(names.begin(), names.end());
  return names;
}

Result<std::vector<const TensorInfo*>> ShardIndex::select(const File& shard, std::size_t s) const {
  if (s >= shard_names.size()) {
    return Error::invalid_argument(
        path, "shard " + std::to_string(s) + " of an index naming " + std::to_string(shard_names.size()));
  }
  std::vector<std::string_view> wanted = assigned(s);
  for (std::string_view name : wanted) {
    if (shard.find(name) == nullptr) return Error::tensor_not_found(shard.path(), name);
  }
  std::vector<const TensorInfo*> out;
  out.reserve(wanted.size());
  for (const TensorInfo& t : shard.tensors()) {
    if (std::binary_search(wanted.begin(), wanted.end(), std::string_view(t.name))) out.push_back(&t);
  }
  return out;
}

}  // namespace safetensors
