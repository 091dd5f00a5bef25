// _safetensors_cpp: the one thin binding between Python and the C++ library.
//
// Declarative defs over the C++ API, split by concern: this file holds the definitions, common.cc the argument
// conversions, write_binding.cc saving, errors.cc the translation of every Error into a Python exception, the
// dtype, engine and sharded bindings their parts, and export.cc the one way tensor bytes leave without a copy (an
// nb::ndarray over a File::view or an owned read, whose owner keeps the memory alive). Every read and write
// releases the GIL through without_gil (common.h) and touches no Python object while it is released.
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/string_view.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <array>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "common.h"
#include "export.h"
#include "py_slice.h"
#include "safetensors/dtype.h"
#include "safetensors/error.h"
#include "safetensors/file.h"
#include "safetensors/slice.h"
#include "safetensors/source.h"
#include "safetensors/testing.h"
#include "safetensors/writer.h"

#include "dtype_binding.h"
#include "engine_binding.h"
#include "sharded_binding.h"
#include "write_binding.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace safetensors::python {
namespace {

// A Python bytes-like object pinned for the lifetime of a memory Source. The deleter takes the GIL: the last
// reference may be dropped from a thread that does not hold it.
std::shared_ptr<const void> pin_buffer(nb::handle obj, std::span<const std::byte>* out) {
  auto view = std::make_unique<Py_buffer>();
  if (PyObject_GetBuffer(obj.ptr(), view.get(), PyBUF_SIMPLE) != 0) throw nb::python_error();
  *out = std::span<const std::byte>(static_cast<const std::byte*>(view->buf), static_cast<std::size_t>(view->len));
  return std::shared_ptr<const void>(view.release(), [](const void* p) {
    nb::gil_scoped_acquire gil;
    auto* v = static_cast<Py_buffer*>(const_cast<void*>(p));
    PyBuffer_Release(v);
    delete v;
  });
}

// ---------------------------------------------------------------------------------------------------------
// Conversions

// A Python str of UTF-8 `s` (validated when the header was parsed). ASCII, the common case for tensor names,
// is copied straight into a compact string without decoding.
nb::str make_str(std::string_view s) {
#ifdef Py_LIMITED_API
  return nb::str(s.data(), s.size());  // the abi3 wheel: no direct access to a str's bytes
#else
  // Eight bytes at a time: ASCII when no byte has its top bit set.
  std::uint64_t high = 0;
  std::size_t i = 0;
  for (; i + 8 <= s.size(); i += 8) {
    std::uint64_t w;
    std::memcpy(&w, s.data() + i, 8);
    high |= w;
  }
  for (; i < s.size(); ++i) high |= static_cast<unsigned char>(s[i]);
  if (high & 0x8080808080808080ull) return nb::str(s.data(), s.size());
  PyObject* out = PyUnicode_New(static_cast<Py_ssize_t>(s.size()), 127);
  if (out == nullptr) throw nb::python_error();
  std::memcpy(PyUnicode_1BYTE_DATA(out), s.data(), s.size());
  return nb::steal<nb::str>(out);
#endif
}

// A list of n items from make_item(i), filled in place.
template <typename MakeItem>
nb::list make_list(std::size_t n, MakeItem&& make_item) {
  PyObject* out = PyList_New(static_cast<Py_ssize_t>(n));
  if (out == nullptr) throw nb::python_error();
  nb::list list = nb::steal<nb::list>(out);
  for (std::size_t i = 0; i < n; ++i) {
    list_set(out, static_cast<Py_ssize_t>(i), make_item(i).release().ptr());
  }
  return list;
}

const char* backend_name(ReadPath b) {
  switch (b) {
    case ReadPath::kMmap: return "mmap";
    case ReadPath::kPread: return "pread";
    case ReadPath::kMemory: return "memory";
    case ReadPath::kDirect: return "direct";
  }
  return "unknown";
}

// The zero-copy view of `t`, or nullopt where the file has none: File::view's one failure for a tensor of the
// file is the pread backend's (no mapping).
std::optional<TensorView> mapped_view(const File& f, const TensorInfo& t) {
  Result<TensorView> v = f.view(t);
  if (!v.ok()) return std::nullopt;
  return std::move(v).value();
}

// The whole data buffer as one U8 tensor of the file, for File::view, which takes a tensor's offsets.
TensorInfo data_buffer(const File& f) {
  TensorInfo all;
  all.dtype = Dtype::kU8;
  all.end = f.size() - f.data_offset();
  return all;
}

// The source's ReadHints::alignment: owned memory placed congruent to the file modulo it is read into
// without a bounce (a direct source); 0 elsewhere.
std::uint64_t read_alignment(const File& f) { return f.source()->read_hints().alignment; }

// The tensors `names` selects (every tensor in file order when None).
std::vector<const TensorInfo*> selected(const File& f, const std::optional<std::vector<std::string>>& names) {
  std::vector<const TensorInfo*> out;
  if (!names) {
    out.reserve(f.tensors().size());
    for (const TensorInfo& t : f.tensors()) out.push_back(&t);
    return out;
  }
  out.reserve(names->size());
  for (const std::string& name : *names) out.push_back(check(f.info(name)));
  return out;
}

}  // namespace

}  // namespace safetensors::python

using namespace safetensors;
using namespace safetensors::python;

NB_MODULE(_safetensors_cpp, m) {
  m.doc() = "Native core of the safetensors package (C++ library binding).";
  // Frameworks routinely keep tensors (and so our Buffers) alive past interpreter teardown, which nanobind
  // would report as leaks on every exit. The leak check is opt-in (tests turn it on and assert silence).
  nb::set_leak_warnings(std::getenv("SAFETENSORS_LEAK_WARNINGS") != nullptr);

  register_errors(m);

  nb::class_<SlicePlan>(m, "SlicePlan",
                        "A planned index expression over one tensor. Immutable: may be shared by threads.")
      .def_prop_ro(
          "shape", [](const SlicePlan& p) { return shape_tuple(p.shape()); },
          nb::sig("def shape(self) -> tuple[int, ...]"))
      .def_prop_ro("nbytes", &SlicePlan::nbytes)
      .def_prop_ro("is_whole", &SlicePlan::is_whole)
      .def_prop_ro("run_count", &SlicePlan::run_count,
                   "How many contiguous runs of the tensor's bytes the result is made of (0 when it is empty).")
      .def_prop_ro("source_begin", &SlicePlan::source_begin,
                   "The lowest byte any run reads, from the tensor's first byte; 0 when empty.")
      .def_prop_ro("source_end", &SlicePlan::source_end,
                   "One past the highest byte any run reads, from the tensor's first byte; 0 when empty.")
      .def_prop_ro("first_element", &SlicePlan::first_element,
                   "The result as a strided view of the tensor: the row-major index of its first element.")
      .def_prop_ro(
          "strides",
          [](const SlicePlan& p) {
            nb::object t = nb::steal(PyTuple_New(static_cast<Py_ssize_t>(p.strides().size())));
            for (std::size_t i = 0; i < p.strides().size(); ++i) {
              tuple_set(t.ptr(), static_cast<Py_ssize_t>(i), PyLong_FromLongLong(p.strides()[i]));
            }
            return nb::borrow<nb::tuple>(t);
          },
          nb::sig("def strides(self) -> tuple[int, ...]"),
          "The result as a strided view of the tensor: per axis, the distance in elements between neighbours "
          "(negative where a range walks backwards).");

  bind_py_slice(m);

  nb::class_<File>(m, "File",
                   "An open, validated safetensors file (or in-memory bytes). Safe for concurrent use by "
                   "multiple threads (every method).")
      .def(
          "__init__",
          [](File* self, const std::string& path, nb::handle backend, std::uint64_t max_header_bytes,
             const RemotePairs& remote) {
            // Any object: its str() is named when it is not a backend.
            const OpenOptions options = open_options(nb::str(backend).c_str(), max_header_bytes, remote);
            new (self) File(check(without_gil([&] { return File::open(path, options); }), Op::kOpenFile));
          },
          "path"_a, "backend"_a = "mmap", "max_header_bytes"_a = kDefaultMaxHeaderBytes, "remote"_a = RemotePairs(),
          nb::sig("def __init__(self, path: str, backend: str = 'mmap', max_header_bytes: int = 100000000, "
                  "remote: list[tuple[str, str]] = []) -> None"),
          "Opens a local path or an http(s):// or s3:// URL; remote: (option, value) pairs (RemoteOptions).")
      .def_static(
          "from_buffer",
          [](nb::handle data, std::uint64_t max_header_bytes) {
            std::span<const std::byte> bytes;
            auto owner = pin_buffer(data, &bytes);
            OpenOptions options{.max_header_bytes = max_header_bytes};
            return check(File::open(memory_source(bytes, std::move(owner)), options), Op::kOpenBytes);
          },
          "data"_a, "max_header_bytes"_a = kDefaultMaxHeaderBytes,
          nb::sig("def from_buffer(data: bytes | bytearray | memoryview, max_header_bytes: int = 100000000) -> File"),
          "Validates a bytes-like object in place; the object is kept alive by the File and its views.")
      .def_prop_ro("path", &File::path)
      .def_prop_ro("backend", [](const File& f) { return backend_name(f.backend()); })
      .def_prop_ro(
          "source_kind", [](const File& f) { return std::string(f.source()->kind()); },
          "What the bytes come from: \"mmap\", \"pread\", \"direct\", \"memory\", \"http\" or \"s3\".")
      .def(
          "source_stats",
          [](const File& f) {
            const SourceStats s = f.source()->stats();
            nb::dict d;
            for (const SourceCounter& c : kSourceCounters) d[c.name] = s.*c.field;
            d["residency_probe"] = nb::str(s.residency_probe.data(), s.residency_probe.size());
            return d;
          },
          nb::sig("def source_stats(self) -> dict[str, int | str]"),
          "What the source did so far (source.h, SourceStats): a remote source's requests, body bytes fetched and "
          "retries; a direct source's bytes read with O_DIRECT, bounced, read through the cache, whether O_DIRECT "
          "was refused (1), and for backend auto the bytes cached when it chose and the probe that told "
          "(residency_probe). Zeros elsewhere.")
      .def(
          "with_backend",
          [](const File& f, const std::string& backend) {
            const Backend b = parse_backend(backend);
            return check(without_gil([&] { return f.with_backend(b); }));
          },
          "backend"_a,
          "This file read through another backend: the same open file (not the path again), the same header. "
          "The file itself where its source has no other way (memory, remote).")
      .def_prop_ro("data_offset", &File::data_offset)
      .def_prop_ro("header_length", &File::header_length)
      .def_prop_ro("size", &File::size)
      .def("__len__", [](const File& f) { return f.tensors().size(); })
      .def("__contains__", [](const File& f, std::string_view name) { return f.find(name) != nullptr; })
      .def(
          "keys",
          [](const File& f) {
            std::vector<std::string_view> k = f.keys();
            return make_list(k.size(), [&](std::size_t i) { return make_str(k[i]); });
          },
          nb::sig("def keys(self) -> list[str]"), "Tensor names sorted.")
      .def(
          "offset_keys",
          [](const File& f) {
            return make_list(f.tensors().size(), [&](std::size_t i) { return make_str(f.tensors()[i].name); });
          },
          nb::sig("def offset_keys(self) -> list[str]"), "Tensor names in file (offset) order.")
      .def(
          "metadata",
          [](const File& f) -> nb::object {
            if (!f.metadata()) return nb::none();
            nb::dict d;
            for (const auto& [k, v] : *f.metadata()) d[nb::str(k.data(), k.size())] = nb::str(v.data(), v.size());
            return d;
          },
          nb::sig("def metadata(self) -> dict[str, str] | None"), "`__metadata__` as a dict, or None.")
      .def(
          "info", [](const File& f, std::string_view name) { return info_tuple(*check(f.info(name))); }, "name"_a,
          nb::sig("def info(self, name: str) -> tuple[str, tuple[int, ...], int, int]"),
          "(dtype code, shape, begin, end) of one tensor; begin/end are relative to the data buffer.")
      .def(
          "dtypes",
          [](const File& f) {
            std::array<bool, kDtypeTable.size()> seen{};
            for (const TensorInfo& t : f.tensors()) seen[static_cast<std::size_t>(t.dtype)] = true;
            nb::list out;
            for (const DtypeInfo& row : kDtypeTable) {
              if (seen[static_cast<std::size_t>(row.dtype)]) out.append(nb::str(row.code.data(), row.code.size()));
            }
            return out;
          },
          nb::sig("def dtypes(self) -> list[str]"), "The dtype codes the file's tensors use, each once, in rank order.")
      .def(
          "infos",
          [](const File& f) {
            const auto& ts = f.tensors();
            return make_list(ts.size(),
                             [&](std::size_t i) { return nb::make_tuple(make_str(ts[i].name), info_tuple(ts[i])); });
          },
          nb::sig("def infos(self) -> list[tuple[str, tuple[str, tuple[int, ...], int, int]]]"),
          "[(name, (dtype code, shape, begin, end))] in file order.")
      .def(
          "buffer",
          [](nb::handle_t<File> self) -> nb::object {
            const File& f = *nb::inst_ptr<File>(self);
            const TensorInfo all = data_buffer(f);
            std::optional<TensorView> v = mapped_view(f, all);
            if (!v) return nb::none();
            return export_array(all, *v, self, Form::kBuffer);
          },
          nb::sig("def buffer(self) -> memoryview | None"),
          "The data buffer (everything after the header) as a memoryview that keeps the mapping alive, or None "
          "on the pread backend. Writable where the mapping is (a private copy-on-write mapping).")
      .def(
          "view",
          [](nb::handle_t<File> self, std::string_view name) -> nb::object {
            const File& f = *nb::inst_ptr<File>(self);
            const TensorInfo* t = check(f.info(name));
            std::optional<TensorView> v = mapped_view(f, *t);
            // A multi-byte dtype on a big-endian host: the file's bytes are not its values; the caller reads.
            if (!v || !v->writable || host_must_swap(t->dtype)) return nb::none();
            return export_array(*t, *v, self, Form::kDlpack);
          },
          "name"_a, nb::sig("def view(self, name: str) -> object | None"),
          "A tensor in the file's writable mapping, zero-copy, as a DLPack capsule that keeps the mapping alive "
          "(typed as the tensor where DLPack has its dtype, else its bytes as uint8), or None (pread backend, "
          "read-only mapping).")
      .def(
          "view_all",
          [](nb::handle_t<File> self) {
            const File& f = *nb::inst_ptr<File>(self);
            const auto& ts = f.tensors();
            // One view of the data buffer, cut at each tensor's offsets.
            const std::optional<TensorView> all = mapped_view(f, data_buffer(f));
            const bool exported = all && all->writable;
            return make_list(ts.size(), [&](std::size_t i) {
              nb::object capsule = nb::none();
              if (exported && !host_must_swap(ts[i].dtype)) {
                const TensorView v{all->bytes.subspan(ts[i].begin, ts[i].nbytes()), nullptr, true};
                capsule = export_array(ts[i], v, self, Form::kDlpack);
              }
              return nb::make_tuple(make_str(ts[i].name), capsule);
            });
          },
          nb::sig("def view_all(self) -> list[tuple[str, object | None]]"),
          "[(name, view(name))] for every tensor, in file order.")
      .def(
          "read",
          [](const File& f, std::string_view name, bool dlpack) {
            const TensorInfo* t = check(f.info(name));
            std::span<std::byte> dst;
            nb::object owner = owned_bytes(t->nbytes(), &dst, f.data_offset() + t->begin, read_alignment(f));
            check(without_gil([&] { return f.read_into(*t, dst); }));
            const TensorView view{dst, nullptr, true};
            return dlpack ? export_array(*t, view, owner, Form::kDlpack) : as_buffer(*t, view, owner);
          },
          "name"_a, "dlpack"_a = true, nb::sig("def read(self, name: str, dlpack: bool = True) -> object"),
          "A tensor read into new memory of its own (GIL released): a bytearray, or where the source reads "
          "directly memory placed congruent with the file; exported as a DLPack capsule (typed as in view), or "
          "with dlpack=False as a buffer (the bytearray itself, else a memoryview).")
      .def(
          "destination",
          [](const File& f, std::uint64_t begin, std::uint64_t nbytes) {
            const std::uint64_t data_size = f.size() - f.data_offset();
            if (begin > data_size || nbytes > data_size - begin) {
              raise_error(Error::invalid_argument(f.path(), "destination: [" + std::to_string(begin) + ", +" +
                                                                std::to_string(nbytes) + ") is outside the " +
                                                                std::to_string(data_size) + "-byte data buffer"));
            }
            std::span<std::byte> dst;
            nb::object owner = owned_bytes(nbytes, &dst, f.data_offset() + begin, read_alignment(f));
            TensorInfo bytes;
            bytes.dtype = Dtype::kU8;
            bytes.shape = std::span<const std::uint64_t>(&nbytes, 1);
            return export_array(bytes, TensorView{dst, nullptr, true}, owner, Form::kDlpack);
          },
          "begin"_a, "nbytes"_a, nb::sig("def destination(self, begin: int, nbytes: int) -> object"),
          "New memory for the data-buffer bytes [begin, begin + nbytes) to be read into (a DLPack capsule of "
          "uint8): where the source reads directly, placed so that its reads land in it without a bounce.")
      .def(
          "read_all",
          [](const File& f, const std::optional<std::vector<std::string>>& names, unsigned threads, bool dlpack) {
            const std::vector<const TensorInfo*> ts = selected(f, names);
            std::vector<nb::object> owners(ts.size());
            std::vector<std::span<std::byte>> dsts(ts.size());
            std::vector<ReadRequest> reqs;
            reqs.reserve(ts.size());
            const std::uint64_t alignment = read_alignment(f);
            for (std::size_t i = 0; i < ts.size(); ++i) {
              owners[i] = owned_bytes(ts[i]->nbytes(), &dsts[i], f.data_offset() + ts[i]->begin, alignment);
              if (!dsts[i].empty()) reqs.push_back({ts[i], dsts[i]});
            }
            check(without_gil([&] { return f.read_many(reqs, threads); }));
            return make_list(ts.size(), [&](std::size_t i) {
              const TensorView view{dsts[i], nullptr, true};
              nb::object out =
                  dlpack ? export_array(*ts[i], view, owners[i], Form::kDlpack) : as_buffer(*ts[i], view, owners[i]);
              return nb::make_tuple(make_str(ts[i]->name), std::move(out));
            });
          },
          "names"_a = nb::none(), "threads"_a = 0, "dlpack"_a = true,
          nb::sig("def read_all(self, names: list[str] | None = None, threads: int = 0, dlpack: bool = True) -> "
                  "list[tuple[str, object]]"),
          "[(name, read(name, dlpack))] for the tensors named (every tensor in file order when None), read in "
          "parallel with the GIL released.")
      .def(
          "read_into",
          [](const File& f, std::string_view name, std::uintptr_t ptr, std::uint64_t nbytes, bool fresh) {
            check(without_gil([&] {
              if (fresh) advise_fresh_destination(dest(ptr, nbytes));
              return f.read_into(name, dest(ptr, nbytes));
            }));
          },
          "name"_a, "ptr"_a, "nbytes"_a, "fresh"_a = false,
          "Reads a tensor's bytes to the address ptr (nbytes must equal its size). fresh=True: the destination "
          "is a new allocation the caller owns (advise_fresh_destination: kept on 4 KiB pages). Releases the GIL.")
      .def(
          "read_many",
          [](const File& f, const std::vector<std::tuple<std::string, std::uintptr_t, std::uint64_t>>& items,
             unsigned threads, bool fresh) {
            std::vector<ReadRequest> reqs;
            reqs.reserve(items.size());
            for (const auto& [name, ptr, nbytes] : items) reqs.push_back({check(f.info(name)), dest(ptr, nbytes)});
            check(without_gil([&] {
              if (fresh) {
                for (const ReadRequest& r : reqs) advise_fresh_destination(r.dst);
              }
              return f.read_many(reqs, threads);
            }));
          },
          "items"_a, "threads"_a = 0, "fresh"_a = false,
          "Reads [(name, ptr, nbytes)] with a pool of threads (fresh: as in read_into). Releases the GIL.")
      .def(
          "read_range",
          [](const File& f, std::uint64_t offset, std::uintptr_t ptr, std::uint64_t nbytes, unsigned threads) {
            check(without_gil([&] { return f.read_range(offset, dest(ptr, nbytes), threads); }));
          },
          "offset"_a, "ptr"_a, "nbytes"_a, "threads"_a = 0,
          "Reads data-buffer bytes [offset, offset + nbytes) to the address ptr, with a pool of threads. "
          "Releases the GIL.")
      .def(
          "plan_slice",
          [](const File& f, std::string_view name, nb::sequence spec) {
            const TensorInfo* t = check(f.info(name));
            return check(f.plan_slice(*t, to_indices(spec)));
          },
          "name"_a, "spec"_a,
          nb::sig("def plan_slice(self, name: str, spec: Sequence[int | slice | types.EllipsisType]) -> SlicePlan"),
          "Plans a basic index expression (ints, slices, Ellipsis, one per axis at most) over a tensor.")
      .def(
          "read_slice",
          [](const File& f, std::string_view name, const SlicePlan& plan, std::uintptr_t ptr) {
            const TensorInfo* t = check(f.info(name));
            check(without_gil([&] { return f.read_slice(*t, plan, dest(ptr, plan.nbytes())); }));
          },
          "name"_a, "plan"_a, "ptr"_a,
          "Reads the planned slice to the address ptr (plan.nbytes bytes). Releases the GIL.");

  m.def("is_remote_location", &is_remote_location, "location"_a,
        "True for the http://, https:// and s3:// URLs the library opens as remote sources.");
  bind_write(m);

  bind_dtypes(m);

  m.def("live_mappings", &testing::live_mappings, "Number of file mappings alive in this process (for tests).");
  m.def("set_direct_bounce", &testing::set_direct_bounce, "always"_a.none(),
        "For tests: direct sources opened from now on read everything through bounce memory (True), straight "
        "into aligned destinations where they can (False), or as the device under the file suggests (None).");
  m.attr("DEFAULT_MAX_HEADER_BYTES") = kDefaultMaxHeaderBytes;
  // The layers above the file get a submodule each, as in src/: _safetensors_cpp.engine, _safetensors_cpp.sharded.
  nb::module_ engine = m.def_submodule("engine",
                                       "The loading engine (src/engine/): prefetchers, copy queues and "
                                       "the process-wide slab pool.");
  bind_engine(engine);
  nb::module_ sharded = m.def_submodule("sharded",
                                        "Sharded checkpoints (src/sharded/): the index, a set of shard "
                                        "files read as one, and the shard plan of a save.");
  bind_sharded(sharded);
}
