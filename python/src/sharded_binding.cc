// Sharded checkpoints (sharded.h) in _safetensors_cpp: ShardIndex, ShardedFile, ShardPlan, plan_shards,
// shard_file_name, is_shard_file_name, write_index and save_sharded.
//
// Declarative defs over the C++ API, which holds every index rule (parse, validation, the split, file names,
// the index text, the atomic write); Python adds only argument conversion. Every call that touches the disk
// releases the GIL and touches no Python object while it is released. Shards come back as the module's File
// objects (a File is a cheap shared handle, so they stay valid on their own). Errors go through module.cc's
// translation.
#include "sharded_binding.h"

#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/string_view.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <cstdlib>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "common.h"
#include "safetensors/dtype.h"
#include "safetensors/file.h"
#include "safetensors/sharded.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace safetensors::python {
namespace {

nb::str str(std::string_view s) { return nb::str(s.data(), s.size()); }

nb::object metadata_dict(const std::optional<Metadata>& md) {
  if (!md) return nb::none();
  nb::dict d;
  for (const auto& [k, v] : *md) d[str(k)] = str(v);
  return d;
}

ShardingOptions sharding_options(std::uint64_t max_shard_bytes, const std::string& prefix, const PyMetadata& metadata,
                                 bool fsync) {
  ShardingOptions o;
  o.max_shard_bytes = max_shard_bytes;
  o.prefix = prefix;
  o.shard_metadata = to_metadata(metadata);
  o.write.fsync = fsync;
  return o;
}

}  // namespace

void bind_sharded(nb::module_& m) {
  nb::class_<ShardIndex>(m, "ShardIndex",
                         "A parsed, validated index file (model.safetensors.index.json): which shard holds each "
                         "tensor. Every index rule lives here (and in ShardedFile.open_index, built on it). Immutable: "
                         "may be shared by threads.")
      .def_static(
          "read",
          [](const std::string& path, std::uint64_t max_bytes, const RemotePairs& remote) {
            const OpenOptions options = open_options("pread", max_bytes, remote);
            return check(without_gil([&] { return ShardIndex::read(path, options); }));
          },
          "path"_a, "max_bytes"_a = kDefaultMaxHeaderBytes, "remote"_a = RemotePairs(),
          "Reads and validates the index at path (a local path or a URL). Releases the GIL.")
      .def_static(
          "parse", [](const std::string& path, std::string_view text) { return check(ShardIndex::parse(path, text)); },
          "path"_a, "text"_a, "Validates index text; path names it in errors and locates the shards.")
      .def_ro("path", &ShardIndex::path)
      .def_prop_ro(
          "metadata", [](const ShardIndex& i) { return metadata_dict(i.metadata); },
          nb::sig("def metadata(self) -> dict[str, str] | None"),
          "The index's metadata (non-string values as compact JSON text), or None.")
      .def_ro("total_size", &ShardIndex::total_size)
      .def_ro("metadata_json", &ShardIndex::metadata_json, "The metadata object as compact JSON text, or None.")
      .def_ro("shard_names", &ShardIndex::shard_names, "Distinct shard names, sorted.")
      .def_prop_ro(
          "weight_map",
          [](const ShardIndex& i) {
            nb::dict d;
            for (const auto& [tensor, shard] : i.weight_map) d[str(tensor)] = str(shard);
            return d;
          },
          nb::sig("def weight_map(self) -> dict[str, str]"), "{tensor: shard name}, in index order.")
      .def(
          "shard_path",
          [](const ShardIndex& i, std::size_t s) {
            if (s >= i.shard_names.size())
              raise_error(Error::invalid_argument(i.path, "no shard " + std::to_string(s)));
            return i.shard_path(s);
          },
          "s"_a, "Shard s's path, relative to the index's directory.")
      .def(
          "assigned",
          [](const ShardIndex& i, std::size_t s) {
            if (s >= i.shard_names.size())
              raise_error(Error::invalid_argument(i.path, "no shard " + std::to_string(s)));
            std::vector<std::string_view> names = i.assigned(s);
            return std::vector<std::string>(names.begin(), names.end());
          },
          "s"_a, "The tensor names the index assigns to shard s, sorted.")
      .def(
          "select",
          [](const ShardIndex& i, const File& shard, std::size_t s) {
            return without_gil([&] {
              std::vector<const TensorInfo*> selected = check(i.select(shard, s));
              std::vector<std::string> names;
              names.reserve(selected.size());
              for (const TensorInfo* t : selected) names.emplace_back(t->name);
              return names;
            });
          },
          "shard"_a, "s"_a,
          "Names of the tensors of shard (the opened file of shard s) the index assigns to it, in file order. "
          "Raises SafetensorError (TensorNotFound, naming the shard) when it lacks one: the one check that a "
          "shard holds what the index assigns.");

  nb::class_<ShardedFile>(m, "ShardedFile",
                          "Several safetensors files seen as one set of tensors: an index's shards (only the "
                          "tensors it assigns to each) or a list of files. Safe for concurrent use by multiple "
                          "threads, as File is.")
      .def_static(
          "open_index",
          [](const std::string& path, const std::string& backend, std::uint64_t max_header_bytes,
             const RemotePairs& remote) {
            const OpenOptions options = open_options(backend, max_header_bytes, remote);
            return check(without_gil([&] { return ShardedFile::open_index(path, options); }));
          },
          "path"_a, "backend"_a = "mmap", "max_header_bytes"_a = kDefaultMaxHeaderBytes, "remote"_a = RemotePairs(),
          "Opens an index and validates it and every shard it names. Releases the GIL.")
      .def_static(
          "open_files",
          [](const std::vector<std::string>& paths, const std::string& backend, std::uint64_t max_header_bytes,
             const RemotePairs& remote) {
            const OpenOptions options = open_options(backend, max_header_bytes, remote);
            return check(without_gil([&] { return ShardedFile::open_files(paths, options); }));
          },
          "paths"_a, "backend"_a = "mmap", "max_header_bytes"_a = kDefaultMaxHeaderBytes, "remote"_a = RemotePairs(),
          "Opens every file; a tensor name in two files is an error. Releases the GIL.")
      .def_prop_ro("index_path", &ShardedFile::index_path, "The index path, or '' for open_files().")
      .def_prop_ro(
          "index_metadata", [](const ShardedFile& f) { return metadata_dict(f.index_metadata()); },
          nb::sig("def index_metadata(self) -> dict[str, str] | None"))
      .def_prop_ro("total_size", &ShardedFile::total_size)
      .def_prop_ro(
          "shards", [](const ShardedFile& f) { return std::vector<File>(f.shards()); },
          nb::sig("def shards(self) -> list[safetensors._safetensors_cpp.File]"),
          "The shard files: an index's sorted by name, else in the order given.")
      .def("__len__", [](const ShardedFile& f) { return f.tensors().size(); })
      .def("__contains__", [](const ShardedFile& f, std::string_view name) { return f.find(name) != nullptr; })
      .def(
          "keys",
          [](const ShardedFile& f) {
            std::vector<std::string_view> k = f.keys();
            return std::vector<std::string>(k.begin(), k.end());
          },
          "Visible tensor names, sorted.")
      .def(
          "infos",
          [](const ShardedFile& f) {
            nb::list out;
            for (const TensorInfo& t : f.tensors()) out.append(nb::make_tuple(str(t.name), info_tuple(t)));
            return out;
          },
          nb::sig("def infos(self) -> list[tuple[str, tuple[str, tuple[int, ...], int, int]]]"),
          "[(name, (dtype code, shape, begin, end))], shard by shard, in file order within a shard.")
      .def(
          "info", [](const ShardedFile& f, std::string_view name) { return info_tuple(*check(f.info(name))); },
          "name"_a, nb::sig("def info(self, name: str) -> tuple[str, tuple[int, ...], int, int]"))
      .def(
          "shard_of", [](const ShardedFile& f, std::string_view name) { return f.shard_of(*check(f.info(name))); },
          "name"_a, "Position in shards of the file holding the tensor.")
      .def(
          "read_into",
          [](const ShardedFile& f, std::string_view name, std::uintptr_t ptr, std::uint64_t nbytes) {
            check(without_gil([&] { return f.read_into(name, dest(ptr, nbytes)); }));
          },
          "name"_a, "ptr"_a, "nbytes"_a,
          "Reads a tensor's bytes to the address ptr (nbytes must equal its size). Releases the GIL.")
      .def(
          "read_many",
          [](const ShardedFile& f, const std::vector<std::tuple<std::string, std::uintptr_t, std::uint64_t>>& items,
             unsigned threads) {
            std::vector<ReadRequest> reqs;
            reqs.reserve(items.size());
            for (const auto& [name, ptr, nbytes] : items) reqs.push_back({check(f.info(name)), dest(ptr, nbytes)});
            check(without_gil([&] { return f.read_many(reqs, threads); }));
          },
          "items"_a, "threads"_a = 0,
          "Reads [(name, ptr, nbytes)] from any shards with a pool of threads. Releases the GIL.");

  nb::class_<ShardPlan>(
      m, "ShardPlan",
      "Where each tensor goes: shard file names, members, the index text. Immutable: may be shared by threads.")
      .def_prop_ro(
          "shards",
          [](const ShardPlan& p) {
            nb::list out;
            for (const ShardPlan::Shard& s : p.shards)
              out.append(nb::make_tuple(s.file_name, nb::cast(s.inputs), s.bytes));
            return out;
          },
          nb::sig("def shards(self) -> list[tuple[str, list[int], int]]"),
          "[(file name, indices of the input tensors, data bytes)] in shard order.")
      .def_ro("index_file_name", &ShardPlan::index_file_name)
      .def_ro("total_size", &ShardPlan::total_size)
      .def_ro("index_json", &ShardPlan::index_json, "The index text, as transformers writes it.");

  m.def(
      "plan_shards",
      [](const std::vector<std::pair<std::string, std::uint64_t>>& sizes, std::uint64_t max_shard_bytes,
         const std::string& prefix) {
        // The plan reads only names and data sizes: each entry is a U8 vector whose span is never read, so it
        // points at one byte of its own whatever its length.
        static const std::byte kNowhere{};
        std::vector<TensorData> tensors;
        tensors.reserve(sizes.size());
        for (const auto& [name, nbytes] : sizes) {
          tensors.push_back({name, Dtype::kU8, {nbytes}, std::span<const std::byte>(&kNowhere, nbytes)});
        }
        return check(plan_shards(tensors, sharding_options(max_shard_bytes, prefix, std::nullopt, false)));
      },
      "sizes"_a, "max_shard_bytes"_a, "prefix"_a = "model",
      "Splits [(name, nbytes)] as huggingface_hub does; names the shards and writes the index text (nothing is "
      "written to disk). No tensors give no shards.");

  m.def("shard_file_name", &shard_file_name, "prefix"_a, "i"_a, "n"_a,
        "The file name of shard i (1-based) of n: '<prefix>-00001-of-00003.safetensors', as plan_shards names them.");
  m.def("is_shard_file_name", &is_shard_file_name, "prefix"_a, "name"_a,
        "Whether name is shard_file_name(prefix, i, n) for some 1 <= i <= n.");

  m.def(
      "write_index",
      [](const std::string& directory, const ShardPlan& plan, bool fsync) {
        check(without_gil([&] { return write_index(directory, plan, WriteOptions{.fsync = fsync}); }));
      },
      "directory"_a, "plan"_a, "fsync"_a = false,
      "Writes plan.index_json to directory/plan.index_file_name atomically, keeping an existing index's mode "
      "bits; fsync=True syncs the file and the directory. Releases the GIL.");

  m.def(
      "save_sharded",
      [](const std::string& directory, const std::vector<PyTensorSpec>& specs, std::uint64_t max_shard_bytes,
         const std::string& prefix, const std::optional<std::vector<std::pair<std::string, std::string>>>& metadata,
         bool fsync) {
        std::vector<TensorData> tensors = to_tensor_data(specs);
        ShardingOptions options = sharding_options(max_shard_bytes, prefix, metadata, fsync);
        return check(without_gil([&] { return save_sharded(directory, tensors, options); }));
      },
      "directory"_a, "tensors"_a, "max_shard_bytes"_a, "prefix"_a = "model", "metadata"_a = nb::none(),
      "fsync"_a = false,
      "Plans, writes every shard atomically, then the index: [(name, dtype code, shape, data_ptr, data_len)]. "
      "Returns the plan. Releases the GIL.");
}

}  // namespace safetensors::python
