#include "safetensors/sharded.h"

#include <simdjson.h>

#include <algorithm>
#include <atomic>
#include <cassert>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <functional>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <unordered_set>

#include "atomic_file.h"
#include "checked.h"
#include "parallel.h"
#include "name_index.h"
#include "posix.h"

namespace safetensors {

struct ShardedFile::State {
  std::string index_path;
  // The context of lookups that fail: the index, or "<shards>".
  std::string context;
  std::vector<File> shards;
  std::optional<Metadata> metadata;
  std::optional<std::uint64_t> total_size;
  // Copies of the shards' entries; names and shapes view memory owned by `shards`.
  std::vector<TensorInfo> tensors;
  std::vector<std::uint32_t> shard_of;  // parallel to `tensors`
  internal::NameIndex index;            // name -> position in `tensors`
};

namespace {

// read_many splits work into pieces of at most this many bytes (as File::read_many does).
constexpr std::uint64_t kReadChunk = 8u << 20;

std::string quote(std::string_view s) { return "`" + std::string(s) + "`"; }

std::string dirname_of(const std::string& path) {
  const auto slash = path.rfind('/');
  if (slash == std::string::npos) return "";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

std::string join_path(const std::string& dir, std::string_view name) {
  if (dir.empty()) return std::string(name);
  if (dir.back() == '/') return dir + std::string(name);
  return dir + "/" + std::string(name);
}

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
  SAFETENSORS_ASSIGN_OR_RETURN(auto source, open_file_source(path, Backend::kPread));
  const std::uint64_t size = source->size();
  if (size > max_bytes || size > SIZE_MAX - simdjson::SIMDJSON_PADDING) {
    return Error::invalid_argument(path, "the index is " + std::to_string(size) + " bytes, above the limit of " +
                                             std::to_string(max_bytes));
  }
  std::string text(static_cast<std::size_t>(size), '\0');
  SAFETENSORS_RETURN_IF_ERROR(
      read_exact(*source, 0, std::span<std::byte>(reinterpret_cast<std::byte*>(text.data()), text.size()),
                 "read of the index"));
  return parse(path, text);
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
  if (dup != out.weight_map.size()) return bad("duplicate key " + quote(out.weight_map[dup].first) + " in `weight_map`");

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

std::string ShardIndex::shard_path(std::size_t s) const { return join_path(dirname_of(path), shard_names[s]); }

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
    return Error::invalid_argument(path, "shard " + std::to_string(s) + " of an index naming " +
                                             std::to_string(shard_names.size()));
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

// ---------------------------------------------------------------------------------------------------------
// Opening

Result<ShardedFile> ShardedFile::open_index(const std::string& index_path, const OpenOptions& options) {
  SAFETENSORS_ASSIGN_OR_RETURN(ShardIndex index, ShardIndex::read(index_path, options.max_header_bytes));
  auto state = std::make_shared<State>();
  state->index_path = index_path;
  state->context = index_path;
  state->metadata = std::move(index.metadata);
  state->total_size = index.total_size;
  state->shards.reserve(index.shard_names.size());
  for (std::size_t s = 0; s < index.shard_names.size(); ++s) {
    SAFETENSORS_ASSIGN_OR_RETURN(File shard, File::open(index.shard_path(s), options));
    SAFETENSORS_ASSIGN_OR_RETURN(std::vector<const TensorInfo*> selected, index.select(shard, s));
    for (const TensorInfo* t : selected) {
      state->tensors.push_back(*t);
      state->shard_of.push_back(static_cast<std::uint32_t>(s));
    }
    state->shards.push_back(std::move(shard));
  }
  // Names are unique: weight_map keys were checked for duplicates.
  state->index.build(state->tensors.size(), [&](std::size_t i) { return state->tensors[i].name; });
  return ShardedFile(std::move(state));
}

Result<ShardedFile> ShardedFile::open_files(std::span<const std::string> paths, const OpenOptions& options) {
  auto state = std::make_shared<State>();
  state->context = "<shards>";
  state->shards.reserve(paths.size());
  for (std::size_t s = 0; s < paths.size(); ++s) {
    SAFETENSORS_ASSIGN_OR_RETURN(File shard, File::open(paths[s], options));
    for (const TensorInfo& t : shard.tensors()) {
      state->tensors.push_back(t);
      state->shard_of.push_back(static_cast<std::uint32_t>(s));
    }
    state->shards.push_back(std::move(shard));
  }
  const auto& tensors = state->tensors;
  const std::size_t dup = state->index.build(tensors.size(), [&](std::size_t i) { return tensors[i].name; });
  if (dup != tensors.size()) {
    std::size_t first = 0;
    while (tensors[first].name != tensors[dup].name) ++first;
    return Error::invalid_argument(state->shards[state->shard_of[dup]].path(),
                                   "tensor " + quote(tensors[dup].name) + " is also in \"" +
                                       state->shards[state->shard_of[first]].path() +
                                       "\"; a tensor name may appear in only one shard");
  }
  return ShardedFile(std::move(state));
}

// ---------------------------------------------------------------------------------------------------------
// Lookups

const std::string& ShardedFile::index_path() const { return state_->index_path; }
const std::vector<File>& ShardedFile::shards() const { return state_->shards; }
const std::optional<Metadata>& ShardedFile::index_metadata() const { return state_->metadata; }
std::optional<std::uint64_t> ShardedFile::total_size() const { return state_->total_size; }
const std::vector<TensorInfo>& ShardedFile::tensors() const { return state_->tensors; }

std::vector<std::string_view> ShardedFile::keys() const {
  std::vector<std::string_view> keys;
  keys.reserve(tensors().size());
  for (const TensorInfo& t : tensors()) keys.emplace_back(t.name);
  std::sort(keys.begin(), keys.end());
  return keys;
}

const TensorInfo* ShardedFile::find(std::string_view name) const {
  const auto& all = state_->tensors;
  const std::int64_t i = state_->index.find(name, [&](std::size_t k) { return all[k].name; });
  return i < 0 ? nullptr : &all[static_cast<std::size_t>(i)];
}

Result<const TensorInfo*> ShardedFile::info(std::string_view name) const {
  const TensorInfo* t = find(name);
  if (t == nullptr) return Error::tensor_not_found(state_->context, name);
  return t;
}

std::size_t ShardedFile::position_of(const TensorInfo& tensor) const {
  const auto& all = state_->tensors;
  // std::less gives a total order even on pointers into different arrays.
  std::less<const TensorInfo*> before;
  if (all.empty() || before(&tensor, all.data()) || !before(&tensor, all.data() + all.size())) return all.size();
  return static_cast<std::size_t>(&tensor - all.data());
}

std::size_t ShardedFile::shard_of(const TensorInfo& tensor) const {
  const std::size_t i = position_of(tensor);
  assert(i < state_->tensors.size() && "TensorInfo does not belong to this ShardedFile");
  return i < state_->tensors.size() ? state_->shard_of[i] : state_->shards.size();
}

const File& ShardedFile::file_of(const TensorInfo& tensor) const {
  const std::size_t s = shard_of(tensor);
  return state_->shards[s < state_->shards.size() ? s : 0];
}

// ---------------------------------------------------------------------------------------------------------
// Reads

namespace {

Error foreign_tensor(const std::string& context, const TensorInfo& tensor) {
  return Error::invalid_argument(context, "tensor " + quote(tensor.name) + " is not an entry of this sharded file");
}

}  // namespace

Result<TensorView> ShardedFile::view(std::string_view name) const {
  SAFETENSORS_ASSIGN_OR_RETURN(const TensorInfo* t, info(name));
  return view(*t);
}

Result<TensorView> ShardedFile::view(const TensorInfo& tensor) const {
  const std::size_t i = position_of(tensor);
  if (i == state_->tensors.size()) return foreign_tensor(state_->context, tensor);
  return state_->shards[state_->shard_of[i]].view(tensor);
}

Status ShardedFile::read_into(std::string_view name, std::span<std::byte> dst) const {
  SAFETENSORS_ASSIGN_OR_RETURN(const TensorInfo* t, info(name));
  return read_into(*t, dst);
}

Status ShardedFile::read_into(const TensorInfo& tensor, std::span<std::byte> dst) const {
  const std::size_t i = position_of(tensor);
  if (i == state_->tensors.size()) return foreign_tensor(state_->context, tensor);
  return state_->shards[state_->shard_of[i]].read_into(tensor, dst);
}

Result<SlicePlan> ShardedFile::plan_slice(const TensorInfo& tensor, std::span<const SliceIndex> indices) const {
  const std::size_t i = position_of(tensor);
  if (i == state_->tensors.size()) return foreign_tensor(state_->context, tensor);
  return state_->shards[state_->shard_of[i]].plan_slice(tensor, indices);
}

Status ShardedFile::read_slice(const TensorInfo& tensor, const SlicePlan& plan, std::span<std::byte> dst) const {
  const std::size_t i = position_of(tensor);
  if (i == state_->tensors.size()) return foreign_tensor(state_->context, tensor);
  return state_->shards[state_->shard_of[i]].read_slice(tensor, plan, dst);
}

Status ShardedFile::read_many(std::span<const ReadRequest> requests, unsigned threads) const {
  struct Piece {
    const Source* source;
    std::uint64_t offset;
    std::byte* dst;
    std::uint64_t length;
    std::string_view tensor;
  };
  std::vector<Piece> pieces;
  std::uint64_t total = 0;
  for (const ReadRequest& r : requests) {
    const std::size_t i = r.tensor == nullptr ? state_->tensors.size() : position_of(*r.tensor);
    if (i == state_->tensors.size()) {
      return Error::invalid_argument(state_->context, "read_many: a request names a tensor that is not an entry "
                                                      "of this sharded file");
    }
    const File& shard = state_->shards[state_->shard_of[i]];
    if (r.dst.size() != r.tensor->nbytes()) {
      return Error::invalid_argument(shard.path(), "read_many: tensor " + quote(r.tensor->name) + " has " +
                                                       std::to_string(r.tensor->nbytes()) +
                                                       " bytes but the destination holds " +
                                                       std::to_string(r.dst.size()));
    }
    // File::open() validated that the tensor lies inside the shard, so this sum cannot overflow.
    const std::uint64_t start = shard.data_offset() + r.tensor->begin;
    for (std::uint64_t off = 0; off < r.dst.size(); off += kReadChunk) {
      const std::uint64_t len = std::min<std::uint64_t>(kReadChunk, r.dst.size() - off);
      pieces.push_back({shard.source().get(), start + off, r.dst.data() + off, len, r.tensor->name});
    }
    total += r.dst.size();
  }
  if (pieces.empty()) return ok_status();
  // Pieces are taken in request order, so threads that start together read different tensors -- and, for
  // requests spread over shards, different files.
  if (threads == 0) threads = internal::default_threads(total, kReadChunk);
  return internal::run_parallel(pieces.size(), threads, [&](std::size_t k) {
    const Piece& p = pieces[k];
    return read_exact(*p.source, p.offset, std::span<std::byte>(p.dst, p.length),
                      "read of tensor `" + std::string(p.tensor) + "`");
  });
}

// ---------------------------------------------------------------------------------------------------------
// Writing

namespace {

// Appends `s` as a JSON string the way Python's json.dumps(ensure_ascii=True) writes it: `"` and `\`
// escaped, \n \r \t \b \f short, every other character outside 0x20..0x7e as \uXXXX (lowercase hex; UTF-16
// surrogate pairs above U+FFFF). REQUIRES: s is valid UTF-8.
void append_python_json_string(std::string* out, std::string_view s) {
  static constexpr char kHex[] = "0123456789abcdef";
  auto u16 = [&](std::uint32_t unit) {
    out->append("\\u");
    for (int shift = 12; shift >= 0; shift -= 4) out->push_back(kHex[(unit >> shift) & 0xf]);
  };
  out->push_back('"');
  for (std::size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) {
      switch (c) {
        case '"': out->append("\\\""); break;
        case '\\': out->append("\\\\"); break;
        case '\n': out->append("\\n"); break;
        case '\r': out->append("\\r"); break;
        case '\t': out->append("\\t"); break;
        case '\b': out->append("\\b"); break;
        case '\f': out->append("\\f"); break;
        default:
          if (c < 0x20 || c == 0x7f) {
            u16(c);
          } else {
            out->push_back(static_cast<char>(c));
          }
      }
      ++i;
      continue;
    }
    const int len = c >= 0xf0 ? 4 : c >= 0xe0 ? 3 : 2;
    std::uint32_t cp = c & (len == 4 ? 0x07 : len == 3 ? 0x0f : 0x1f);
    for (int k = 1; k < len; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3f);
    i += static_cast<std::size_t>(len);
    if (cp >= 0x10000) {
      cp -= 0x10000;
      u16(0xd800 + (cp >> 10));
      u16(0xdc00 + (cp & 0x3ff));
    } else {
      u16(cp);
    }
  }
  out->push_back('"');
}

std::string shard_file_name(const std::string& prefix, std::size_t i, std::size_t n) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "-%05zu-of-%05zu.safetensors", i, n);
  return prefix + buf;
}

// Writes `bytes` as the file at `path`, atomically (crash ordering: AtomicFile::publish); with `durable`
// the new file survives a power loss. The target's permission bits are kept; a new file gets 0666 minus the
// umask.
Status write_file_atomically(const std::string& path, std::string_view bytes, bool durable) {
  SAFETENSORS_ASSIGN_OR_RETURN(auto file, internal::AtomicFile::create(path));
  SAFETENSORS_RETURN_IF_ERROR(internal::pwrite_full(
      file.fd(), file.name(), 0, std::span<const std::byte>(reinterpret_cast<const std::byte*>(bytes.data()), bytes.size())));
  return file.publish(durable);
}

}  // namespace

Result<ShardPlan> plan_shards(std::span<const TensorData> tensors, const ShardingOptions& options) {
  const std::string_view context = "<plan>";
  if (options.prefix.empty() || options.prefix.find_first_of(std::string_view("/\0", 2)) != std::string::npos) {
    return Error::invalid_argument(context, "shard prefix " + quote(options.prefix) +
                                                " must be a non-empty file name without '/' or NUL");
  }
  std::vector<std::size_t> by_name(tensors.size());
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    by_name[i] = i;
    if (!simdjson::validate_utf8(tensors[i].name.data(), tensors[i].name.size())) {
      return Error::invalid_argument(context, "tensor name " + quote(tensors[i].name) + " is not valid UTF-8");
    }
  }
  // Byte order of UTF-8 is code point order, which is how Python's sort_keys orders the weight_map.
  std::sort(by_name.begin(), by_name.end(), [&](std::size_t a, std::size_t b) { return tensors[a].name < tensors[b].name; });
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
      append_python_json_string(&json, tensors[by_name[k]].name);
      json += ": ";
      append_python_json_string(&json, plan.shards[shard_of[by_name[k]]].file_name);
      json += k + 1 < by_name.size() ? ",\n" : "\n";
    }
    json += "  }";
  }
  json += "\n}\n";
  return plan;
}

Status write_index(const std::string& directory, const ShardPlan& plan, const WriteOptions& options) {
  return write_file_atomically(join_path(directory, plan.index_file_name), plan.index_json, options.fsync);
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
    SAFETENSORS_ASSIGN_OR_RETURN(
        FileWriter writer, FileWriter::create(join_path(directory, plan.shards[s].file_name), std::move(layouts[s]),
                                              options.write));
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
  SAFETENSORS_RETURN_IF_ERROR(
      write_file_atomically(join_path(directory, plan.index_file_name), plan.index_json, options.write.fsync));
  return plan;
}

}  // namespace safetensors
