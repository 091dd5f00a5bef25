// ShardedFile: the tensors of several files seen as one set, opened from an index (through ShardIndex) or a
// list of files.
#include "safetensors/sharded.h"

#include <algorithm>
#include <cassert>
#include <functional>

#include "file/read_chunks.h"
#include "format/name_index.h"
#include "util/quote.h"

namespace safetensors {

using internal::quote;

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

// ---------------------------------------------------------------------------------------------------------
// Opening

Result<ShardedFile> ShardedFile::open_index(const std::string& index_path, const OpenOptions& options) {
  SAFETENSORS_ASSIGN_OR_RETURN(ShardIndex index, ShardIndex::read(index_path, options));
  auto state = std::make_shared<State>();
  state->index_path = index_path;
  // Errors name a URL without its query (a SAS token lives there).
  state->context = is_remote_location(index_path) ? redact_url(index_path) : index_path;
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

Result<const File*> ShardedFile::shard_holding(const TensorInfo& tensor) const {
  const std::size_t i = position_of(tensor);
  if (i == state_->tensors.size()) {
    return Error::invalid_argument(state_->context,
                                   "tensor " + quote(tensor.name) + " is not an entry of this sharded file");
  }
  return &state_->shards[state_->shard_of[i]];
}

Result<TensorView> ShardedFile::view(std::string_view name) const {
  SAFETENSORS_ASSIGN_OR_RETURN(const TensorInfo* t, info(name));
  return view(*t);
}

Status ShardedFile::read_into(std::string_view name, std::span<std::byte> dst) const {
  SAFETENSORS_ASSIGN_OR_RETURN(const TensorInfo* t, info(name));
  return read_into(*t, dst);
}

Status ShardedFile::read_many(std::span<const ReadRequest> requests, unsigned threads) const {
  std::vector<internal::ReadChunk> chunks;
  std::uint64_t total = 0;
  for (const ReadRequest& r : requests) {
    const std::size_t i = r.tensor == nullptr ? state_->tensors.size() : position_of(*r.tensor);
    if (i == state_->tensors.size()) {
      return Error::invalid_argument(state_->context,
                                     "read_many: a request names a tensor that is not an entry "
                                     "of this sharded file");
    }
    const File& shard = state_->shards[state_->shard_of[i]];
    if (r.dst.size() != r.tensor->nbytes()) {
      return Error::invalid_argument(
          shard.path(), "read_many: tensor " + quote(r.tensor->name) + " has " + std::to_string(r.tensor->nbytes()) +
                            " bytes but the destination holds " + std::to_string(r.dst.size()));
    }
    // File::open() validated that the tensor lies inside the shard, so this sum cannot overflow.
    internal::split_read(*shard.source(), shard.data_offset() + r.tensor->begin, r.dst, r.tensor->name,
                         host_swap_bytes(r.tensor->dtype), &chunks);
    total += r.dst.size();
  }
  // Chunks are taken in request order, so threads that start together read different tensors -- and, for
  // requests spread over shards, different files.
  return internal::read_chunks(chunks, total, threads);
}

}  // namespace safetensors
