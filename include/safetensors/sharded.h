// Sharded checkpoints: one model split over several safetensors files.
//
// A sharded checkpoint is a directory holding `model-00001-of-00003.safetensors` ... and an index,
// `model.safetensors.index.json`, the layout transformers and huggingface_hub write:
//
//   {"metadata": {"total_size": 123456}, "weight_map": {"lm_head.weight": "model-00003-of-00003.safetensors", ...}}
//
// ShardedFile opens such a checkpoint (or any explicit list of files) and presents its tensors as one File
// would: tensors(), keys(), find(), info(), view(), read_into(), read_slice(), read_many(). save_sharded()
// writes one.
//
//   auto ckpt = safetensors::ShardedFile::open_index("model.safetensors.index.json");
//   if (!ckpt.ok()) { std::cerr << ckpt.error().to_string() << "\n"; return 1; }
//   auto info = ckpt->info("lm_head.weight");                  // Result<const TensorInfo*>
//   std::vector<std::byte> buf((*info)->nbytes());
//   auto st = ckpt->read_into(**info, buf);
//
// Thread safety: ShardedFile is safe for concurrent use (see the class). plan_shards() and save_sharded() only
// read the caller's data; concurrent saves into one directory with one prefix need external synchronization.
#ifndef SAFETENSORS_SHARDED_H_
#define SAFETENSORS_SHARDED_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "safetensors/error.h"
#include "safetensors/export.h"
#include "safetensors/file.h"
#include "safetensors/slice.h"
#include "safetensors/writer.h"

namespace safetensors {

// A parsed and validated index file (`model.safetensors.index.json`): which shard holds each tensor. This is
// the one implementation of the index rules; ShardedFile::open_index() is built on it, and it is public so a
// tool can open and check the shards one at a time (reporting every failing shard, not just the first).
//
// Thread safety: immutable once made; safe for concurrent use by multiple threads.
struct SAFETENSORS_EXPORT ShardIndex {
  // Reads and parses the index at `path`, a local path or a URL (open_source()); an index larger than
  // `max_bytes` (options.max_header_bytes) is refused.
  // Errors: kNotFound (no such file), kIo, and those of parse() (context: `path`, a URL without its query).
  static Result<ShardIndex> read(const std::string& path, std::uint64_t max_bytes = kDefaultMaxHeaderBytes);
  static Result<ShardIndex> read(const std::string& path, const OpenOptions& options);
  // Parses index text; `path` names it in errors and locates the shards.
  // Errors: kInvalidArgument (context: `path`) when the text is not valid JSON, is not an object, has a
  // duplicate key (at any level), has no `weight_map` object, maps a tensor to something other than a string,
  // names a shard by an empty, absolute or `..`-containing path, or has a `metadata` that is neither an object
  // nor null. Keys other than `weight_map` and `metadata` are ignored, as transformers ignores them.
  static Result<ShardIndex> parse(const std::string& path, std::string_view text);

  // The index path as given (a URL keeps its query: shards are resolved against it).
  std::string path;
  // `weight_map` in index order: (tensor name, shard name).
  std::vector<std::pair<std::string, std::string>> weight_map;
  // As ShardedFile::index_metadata() and total_size().
  std::optional<Metadata> metadata;
  std::optional<std::uint64_t> total_size;
  // The `metadata` object as compact JSON text (values keep their JSON types), nullopt as for `metadata`.
  std::optional<std::string> metadata_json;
  // The distinct shard names, sorted by byte order, and for each weight_map entry its shard's position here.
  std::vector<std::string> shard_names;
  std::vector<std::uint32_t> shard_of;

  // Shard `s`'s path: its name resolved relative to the index's directory. REQUIRES: s < shard_names.size().
  std::string shard_path(std::size_t s) const;
  // The tensor names the index assigns to shard `s`, sorted by byte order.
  std::vector<std::string_view> assigned(std::size_t s) const;
  // The tensors of `shard` (the opened file of shard `s`) the index assigns to it, in file order; tensors the
  // index does not assign to it are left out. This is the one "a shard holds what the index assigns" check.
  // Errors: kTensorNotFound when the shard lacks an assigned tensor (context: the shard's path; tensor: the
  // first missing name in byte order); kInvalidArgument when s >= shard_names.size().
  Result<std::vector<const TensorInfo*>> select(const File& shard, std::size_t s) const;
};

// The tensors of several safetensors files ("shards") seen as one set of uniquely named tensors.
//
// Opened from an index (open_index), only the tensors the index's `weight_map` assigns to a shard are
// visible, each through the shard the index names; other tensors a shard holds are ignored, as are keys of
// the index other than `weight_map` and `metadata`. Opened from a list of files (open_files), every tensor of
// every file is visible, and a name held by two files is an error.
//
// Every shard is opened and validated completely (File::open) before open_index()/open_files() return, so
// afterwards reads fail only on I/O errors. Errors name the file they concern -- the index, or the shard --
// and the tensor, where there is one.
//
// Thread safety: a ShardedFile is immutable after it is opened; it is safe for concurrent use by multiple
// threads. Copying one is cheap and shares the underlying state.
//
// Lifetime: the TensorInfo objects (and the names and shapes they view) belong to the ShardedFile; they are
// valid while any copy of it is alive. Views returned by view() keep their shard's mapping alive on their own.
class SAFETENSORS_EXPORT ShardedFile {
 public:
  // Opens the index at `index_path` and every shard it names; shard names are resolved relative to the
  // index's directory. options apply to every shard; an index larger than options.max_header_bytes is
  // refused.
  // Errors:
  //   kNotFound          the index, or a shard it names, does not exist (context: that file).
  //   kIo                any other failure to read the index or a shard.
  //   kInvalidArgument   the index is not valid JSON, has a duplicate key (at any level), has no
  //                      `weight_map` object, maps a tensor to something other than a string, names a shard by
  //                      an empty, absolute or `..`-containing path, or has a `metadata` that is neither an
  //                      object nor null (context: the index).
  //   kTensorNotFound    a shard lacks a tensor the index assigns to it (context: the shard; tensor: the name).
  //   every header kind of Error::Kind, for a shard that fails validation (context: the shard).
  static Result<ShardedFile> open_index(const std::string& index_path, const OpenOptions& options = {});

  // Opens every file in `paths` (in that order) and makes all their tensors visible.
  // Errors: those of File::open (context: the file); kInvalidArgument when two files hold a tensor of the
  // same name (context: the later file; the text names the tensor and the earlier file).
  static Result<ShardedFile> open_files(std::span<const std::string> paths, const OpenOptions& options = {});

  // The index path, or "" when opened with open_files().
  const std::string& index_path() const;
  // The shards: for open_index() the distinct files the weight_map names, sorted by name (byte order); for
  // open_files() the files in the order given.
  const std::vector<File>& shards() const;
  // The index's `metadata` object, in index order: a string value as the string itself, any other value as
  // its compact JSON text (so `"total_size": 1024` gives {"total_size", "1024"}). nullopt when the index has
  // none (or it is null), and always for open_files().
  const std::optional<Metadata>& index_metadata() const;
  // `metadata.total_size` of the index when it is a non-negative integer, else nullopt.
  std::optional<std::uint64_t> total_size() const;

  // The visible tensors: shard by shard (in shards() order), and in file order within a shard.
  const std::vector<TensorInfo>& tensors() const;
  // Visible tensor names sorted by byte order.
  std::vector<std::string_view> keys() const;

  // The visible tensor named `name`, or nullptr.
  const TensorInfo* find(std::string_view name) const;
  // The visible tensor named `name`. Errors: kTensorNotFound (context: the index, or "<shards>").
  Result<const TensorInfo*> info(std::string_view name) const;

  // Which shard holds `tensor`: an index into shards(), and that File.
  // REQUIRES: `tensor` is an element of tensors() (asserted in debug builds; in release builds shard_of()
  // then returns shards().size() and file_of() the first shard, or undefined behaviour when there is none).
  std::size_t shard_of(const TensorInfo& tensor) const;
  const File& file_of(const TensorInfo& tensor) const;

  // As File::view(), File::read_into(), File::plan_slice() and File::read_slice(), on the tensor's shard.
  // Errors are those of File (with the shard as context), plus kInvalidArgument when a TensorInfo is not an
  // element of tensors().
  Result<TensorView> view(std::string_view name) const;
  Result<TensorView> view(const TensorInfo& t) const {
    return on_shard(t, [&](const File& f) { return f.view(t); });
  }
  Status read_into(std::string_view name, std::span<std::byte> dst) const;
  Status read_into(const TensorInfo& t, std::span<std::byte> dst) const {
    return on_shard(t, [&](const File& f) { return f.read_into(t, dst); });
  }
  Result<SlicePlan> plan_slice(const TensorInfo& t, std::span<const SliceIndex> indices) const {
    return on_shard(t, [&](const File& f) { return f.plan_slice(t, indices); });
  }
  Status read_slice(const TensorInfo& t, const SlicePlan& plan, std::span<std::byte> dst) const {
    return on_shard(t, [&](const File& f) { return f.read_slice(t, plan, dst); });
  }

  // As File::read_many(), for tensors of any shards: reads of different shards proceed in parallel. Errors:
  // kInvalidArgument (a request whose tensor is not an element of tensors(), or whose dst.size() !=
  // tensor->nbytes()), kIo.
  Status read_many(std::span<const ReadRequest> requests, unsigned threads = 0) const;

 private:
  struct State;
  explicit ShardedFile(std::shared_ptr<const State> state) : state_(std::move(state)) {}
  // Position of `tensor` in tensors(), or tensors().size() when it is not an element.
  std::size_t position_of(const TensorInfo& tensor) const;
  // The shard that holds `tensor`. Errors: kInvalidArgument when `tensor` is not an element of tensors().
  Result<const File*> shard_holding(const TensorInfo& tensor) const;
  // op(the File of `tensor`'s shard): the one place the per-tensor reads above find their shard.
  template <class Op>
  auto on_shard(const TensorInfo& tensor, Op op) const -> decltype(op(std::declval<const File&>())) {
    Result<const File*> shard = shard_holding(tensor);
    if (!shard.ok()) return std::move(shard).error();
    return op(**shard);
  }
  std::shared_ptr<const State> state_;
};

// How save_sharded() splits and names a checkpoint.
struct ShardingOptions {
  // The most tensor bytes one shard may hold, counted as transformers counts them: the sum of its tensors'
  // data sizes, headers not included. The split is huggingface_hub's (what save_pretrained writes): tensors
  // in input order fill the open shard, closed when the next would overflow it; a tensor larger than the
  // limit becomes a shard of its own when it is met, and the open shard stays open.
  std::uint64_t max_shard_bytes = 5'000'000'000;
  // Shards are named `<prefix>-00001-of-00003.safetensors` and the index `<prefix>.safetensors.index.json`.
  // REQUIRES: not empty and free of '/' and NUL (else kInvalidArgument).
  std::string prefix = "model";
  // Written as the `__metadata__` of every shard (transformers writes {"format": "pt"}); nullopt omits it.
  std::optional<Metadata> shard_metadata = std::nullopt;
  // Applies to every shard and to the index.
  WriteOptions write = {};
};

// Where each tensor goes. Pure: computed from names, sizes and options only.
struct ShardPlan {
  struct Shard {
    // File name inside the checkpoint directory, e.g. "model-00001-of-00003.safetensors".
    std::string file_name;
    // Indices into the tensors the plan was made from, in input order.
    std::vector<std::size_t> inputs;
    // Sum of the inputs' data sizes.
    std::uint64_t bytes = 0;
  };
  std::vector<Shard> shards;
  // "<prefix>.safetensors.index.json".
  std::string index_file_name;
  // Sum of every tensor's data size: the index's metadata.total_size.
  std::uint64_t total_size = 0;
  // The index file's exact content: `{"metadata": {"total_size": N}, "weight_map": {...}}` with sorted keys,
  // a 2-space indent, ASCII-only escapes and a final newline, as Python's json.dumps(indent=2,
  // sort_keys=True) + "\n" writes it in transformers.
  std::string index_json;
};

// The file name of shard `i` (1-based) of `n`: `<prefix>-00001-of-00003.safetensors` (each number at least five
// digits, zero-padded), as plan_shards() names shards and transformers and huggingface_hub name them.
SAFETENSORS_EXPORT std::string shard_file_name(std::string_view prefix, std::size_t i, std::size_t n);
// Whether `name` is shard_file_name(prefix, i, n) for some 1 <= i <= n: the one test for "a shard file of
// this checkpoint", e.g. to find the shards an earlier save left in a directory.
SAFETENSORS_EXPORT bool is_shard_file_name(std::string_view prefix, std::string_view name);

// Splits `tensors` greedily in input order: a tensor joins the current shard unless that would take the
// shard over options.max_shard_bytes, in which case it starts the next one. No tensors give no shards and an
// index with an empty weight_map, as huggingface_hub's split_torch_state_dict_into_shards({}) gives no files
// (is_sharded=False); a caller that wants a file for an empty model writes one unsharded file, as
// save_pretrained does.
// Errors: kInvalidArgument (a bad prefix, duplicate tensor names, a name that is not valid UTF-8),
// kValidationOverflow (total_size overflows 64 bits).
SAFETENSORS_EXPORT Result<ShardPlan> plan_shards(std::span<const TensorData> tensors,
                                                 const ShardingOptions& options = {});

// Writes plan.index_json to `directory`/plan.index_file_name atomically: a reader sees the old index or the
// new one, never part of one. An existing index's permission bits are kept; a new one gets 0666 minus the
// umask (the process umask is never changed). With options.fsync the data and then the directory are synced,
// so the new index survives a power loss. Errors: kNotFound (no such directory), kIo.
SAFETENSORS_EXPORT Status write_index(const std::string& directory, const ShardPlan& plan,
                                      const WriteOptions& options = {});

// Plans the split, validates every shard's layout (WritePlan::make) before any file is written, writes each
// shard atomically with FileWriter, then writes the index, atomically too, into `directory`. A crash or an
// error leaves every file either old or new; the index is published last, so once it names the new shards
// they are all complete. Shard files of an earlier save that the new index does not name are left alone.
// Returns the plan that was written.
// Errors: those of plan_shards() and WritePlan::make() (before anything is written); kNotFound (no such
// directory); kIo.
SAFETENSORS_EXPORT Result<ShardPlan> save_sharded(const std::string& directory, std::span<const TensorData> tensors,
                                                  const ShardingOptions& options = {});

}  // namespace safetensors

#endif  // SAFETENSORS_SHARDED_H_
