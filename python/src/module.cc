// _safetensors_cpp: the one thin binding between Python and the C++ library.
//
// Declarative defs over the C++ API. Ownership is stated once: zero-copy memory is exposed only through
// `Buffer`, whose Python object holds a shared_ptr to the Source, so a mapping lives exactly as long as the
// last Python object (tensor, array, memoryview) that uses it. Every read and write releases the GIL and
// touches no Python object while it is released. Errors are translated in one place (translate_error).
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/string_view.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <new>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "safetensors/dtype.h"
#include "safetensors/error.h"
#include "safetensors/file.h"
#include "safetensors/slice.h"
#include "safetensors/source.h"
#include "safetensors/writer.h"
#include "common.h"

#include "engine_binding.h"
#include "sharded_binding.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace safetensors::python {
namespace {

// ---------------------------------------------------------------------------------------------------------
// Errors

struct TranslatedError {
  Error error;
  Op op;
};

PyObject* g_safetensor_error = nullptr;  // safetensors.SafetensorError
PyObject* g_slice_error = nullptr;       // safetensors.SafetensorSliceError(SafetensorError, IndexError, ValueError)
PyObject* g_io_error = nullptr;          // safetensors.SafetensorIOError(SafetensorError, OSError)

// Raises `type` with the whole of `text`: a NUL inside a tensor name or dtype must not cut the message (and
// its variant token) short, and bytes that are not UTF-8 (a path) become backslash escapes instead of
// turning the error into a UnicodeDecodeError.
void set_error(PyObject* type, const std::string& text) {
  PyObject* message = PyUnicode_DecodeUTF8(text.data(), static_cast<Py_ssize_t>(text.size()), "backslashreplace");
  if (message == nullptr) return;
  PyErr_SetObject(type, message);
  Py_DECREF(message);
}

// Raises SafetensorIOError: str() is the whole text (prefix + to_string()), and errno, strerror and filename
// are set as OSError's. They are also kept in the instance dict, which BaseException.__reduce__ pickles and
// __setstate__ writes back through OSError's attributes, so a pickled error keeps them.
void set_io_error(const Error& e, const std::string& text) {
  try {
    auto decode = [](const std::string& bytes) {
      return nb::steal(PyUnicode_DecodeUTF8(bytes.data(), static_cast<Py_ssize_t>(bytes.size()), "backslashreplace"));
    };
    nb::object exc = nb::handle(g_io_error)(decode(text));
    // A file that changed size under us has no errno of its own: it is reported as EIO, its text the detail.
    const int err = e.sys_errno() != 0 ? e.sys_errno() : EIO;
    nb::object strerror = e.sys_errno() != 0 ? nb::module_::import_("os").attr("strerror")(err) : decode(e.detail());
    nb::object filename = e.context().empty() || e.context().front() == '<'
                              ? nb::none()
                              : nb::steal(PyUnicode_DecodeFSDefaultAndSize(
                                    e.context().data(), static_cast<Py_ssize_t>(e.context().size())));
    if (!filename.is_valid() || !strerror.is_valid()) throw nb::python_error();
    nb::dict state = nb::borrow<nb::dict>(exc.attr("__dict__"));
    for (auto [name, value] : {std::pair<const char*, nb::object>{"errno", nb::int_(err)},
                               {"strerror", strerror},
                               {"filename", filename}}) {
      exc.attr(name) = value;
      state[name] = value;
    }
    PyErr_SetObject(g_io_error, exc.ptr());
  } catch (nb::python_error& pe) {
    pe.restore();
  }
}

void translate_error(const std::exception_ptr& p, void*) {
  try {
    std::rethrow_exception(p);
  } catch (const TranslatedError& t) {
    const Error& e = t.error;
    const char* prefix = t.op == Op::kOpenFile    ? "Error while deserializing header: "
                         : t.op == Op::kOpenBytes ? "Error while deserializing: "
                         : t.op == Op::kSerialize ? "Error while serializing: "
                                                  : "";
    switch (e.kind()) {
      case Error::Kind::kNotFound:
        if (t.op == Op::kSerialize) {
          // A save into a missing directory: an I/O error, as the reference reports it.
          Error io = Error::io(e.context(), e.detail(), e.sys_errno());
          set_io_error(io, prefix + io.to_string());
          return;
        }
        set_error(PyExc_FileNotFoundError, e.message());
        return;
      case Error::Kind::kIo:
        set_io_error(e, prefix + e.to_string());
        return;
      case Error::Kind::kInvalidSlice:
        set_error(g_slice_error, e.to_string());
        return;
      case Error::Kind::kTensorNotFound:
      case Error::Kind::kInvalidArgument:
        set_error(g_safetensor_error, e.to_string());
        return;
      default:
        set_error(g_safetensor_error, prefix + e.to_string());
        return;
    }
  }
}

// ---------------------------------------------------------------------------------------------------------
// Buffer: a buffer-protocol view of memory kept alive by a shared owner.

struct Buffer {
  std::shared_ptr<const void> owner;
  const std::byte* data = nullptr;
  std::size_t size = 0;
  bool writable = false;
};

int buffer_getbuffer(PyObject* self, Py_buffer* view, int flags) {
  Buffer* b = nb::inst_ptr<Buffer>(self);
  // The memory is only written by the caller through a private copy-on-write mapping, never into the file.
  return PyBuffer_FillInfo(view, self, const_cast<std::byte*>(b->data), static_cast<Py_ssize_t>(b->size),
                           b->writable ? 0 : 1, flags);
}

void buffer_releasebuffer(PyObject*, Py_buffer*) {}

PyType_Slot buffer_slots[] = {
    {Py_bf_getbuffer, reinterpret_cast<void*>(buffer_getbuffer)},
    {Py_bf_releasebuffer, reinterpret_cast<void*>(buffer_releasebuffer)},
    {0, nullptr},
};

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
// DLPack: zero-copy tensors built by the consumer (torch) in one step, shape included. The legacy,
// unversioned ABI (capsule name "dltensor"), which every torch release reads.

struct DLDevice {
  std::int32_t device_type;  // 1 = CPU
  std::int32_t device_id;
};
struct DLDataType {
  std::uint8_t code;
  std::uint8_t bits;
  std::uint16_t lanes;
};
struct DLTensor {
  void* data;
  DLDevice device;
  std::int32_t ndim;
  DLDataType dtype;
  std::int64_t* shape;
  std::int64_t* strides;  // null: compact row-major
  std::uint64_t byte_offset;
};
struct DLManagedTensor {
  DLTensor dl_tensor;
  void* manager_ctx;
  void (*deleter)(DLManagedTensor*);
};

// Owns one exported view: the mapping stays alive until the consumer calls the deleter (from any thread;
// releasing a shared_ptr needs no GIL).
struct ExportedView {
  DLManagedTensor managed{};
  std::shared_ptr<const void> owner;
  std::vector<std::int64_t> shape;
};

// DLPack type of a dtype (from the dtype table), or lanes == 0 where the legacy ABI has none.
DLDataType dlpack_type(Dtype d) {
  const DtypeInfo& row = dtype_info(d);
  if (row.dlpack_code == kNoDlpack) return {0, 0, 0};  // float8/6/4: built through frombuffer + view instead
  return {row.dlpack_code, static_cast<std::uint8_t>(row.bits), 1};
}

void capsule_destructor(PyObject* capsule) {
  // A capsule still named "dltensor" was never consumed: its view is ours to free.
  if (PyCapsule_IsValid(capsule, "dltensor")) {
    auto* managed = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule, "dltensor"));
    managed->deleter(managed);
  }
}

// A "dltensor" capsule over `data` (t's bytes, kept alive by `owner`). REQUIRES: dlpack_type(t.dtype) exists.
nb::object export_view(const TensorInfo& t, const std::byte* data, std::shared_ptr<const void> owner) {
  auto view = std::make_unique<ExportedView>();
  view->owner = std::move(owner);
  view->shape.assign(t.shape.begin(), t.shape.end());
  DLTensor& dl = view->managed.dl_tensor;
  dl.data = const_cast<std::byte*>(data);
  dl.device = {1, 0};
  dl.ndim = static_cast<std::int32_t>(view->shape.size());
  dl.dtype = dlpack_type(t.dtype);
  dl.shape = view->shape.data();
  dl.strides = nullptr;
  dl.byte_offset = 0;
  view->managed.manager_ctx = view.get();
  view->managed.deleter = [](DLManagedTensor* m) { delete static_cast<ExportedView*>(m->manager_ctx); };
  PyObject* capsule = PyCapsule_New(&view->managed, "dltensor", capsule_destructor);
  if (capsule == nullptr) throw nb::python_error();
  view.release();  // owned by the capsule, then by the consumer
  return nb::steal(capsule);
}

// A capsule viewing `t` in the file's writable mapping, or None (no mapping, read-only, or no DLPack type).
nb::object export_mapped(const File& f, const TensorInfo& t) {
  if (!f.source()->writable() || dlpack_type(t.dtype).lanes == 0) return nb::none();
  return export_view(t, f.source()->data() + f.data_offset() + t.begin, f.source());
}

// Fresh, 64-byte aligned memory of `n` bytes (at least 1) that shared_ptrs free.
std::shared_ptr<std::byte> owned_buffer(std::uint64_t n) {
  // Small buffers come straight from malloc (16-byte aligned, enough for every element type; aligned_alloc
  // fragments the heap with many tiny tensors); larger ones start on a cache line.
  constexpr std::size_t kAlign = 64;
  constexpr std::uint64_t kSmall = 4096;
  const std::size_t size = static_cast<std::size_t>((std::max<std::uint64_t>(n, 1) + kAlign - 1) / kAlign * kAlign);
  void* p = n <= kSmall ? std::malloc(size) : std::aligned_alloc(kAlign, size);
  if (p == nullptr) throw std::bad_alloc();
  return std::shared_ptr<std::byte>(static_cast<std::byte*>(p), [](std::byte* q) { std::free(q); });
}

// ---------------------------------------------------------------------------------------------------------
// Conversions

// A Python str of UTF-8 `s` (validated when the header was parsed). ASCII, the common case for tensor names,
// is copied straight into a compact string without decoding.
nb::str make_str(std::string_view s) {
  bool ascii = true;
  for (char c : s) ascii &= static_cast<unsigned char>(c) < 0x80;
  if (!ascii) return nb::str(s.data(), s.size());
  PyObject* out = PyUnicode_New(static_cast<Py_ssize_t>(s.size()), 127);
  if (out == nullptr) throw nb::python_error();
  std::memcpy(PyUnicode_1BYTE_DATA(out), s.data(), s.size());
  return nb::steal<nb::str>(out);
}

// A list of n items from make_item(i), filled in place.
template <typename MakeItem>
nb::list make_list(std::size_t n, MakeItem&& make_item) {
  PyObject* out = PyList_New(static_cast<Py_ssize_t>(n));
  if (out == nullptr) throw nb::python_error();
  nb::list list = nb::steal<nb::list>(out);
  for (std::size_t i = 0; i < n; ++i) {
    PyList_SET_ITEM(out, static_cast<Py_ssize_t>(i), make_item(i).release().ptr());
  }
  return list;
}

const char* backend_name(Backend b) {
  switch (b) {
    case Backend::kMmap: return "mmap";
    case Backend::kPread: return "pread";
    case Backend::kMemory: return "memory";
  }
  return "unknown";
}

nb::tuple shape_tuple(std::span<const std::uint64_t> shape) {
  nb::object t = nb::steal(PyTuple_New(static_cast<Py_ssize_t>(shape.size())));
  for (std::size_t i = 0; i < shape.size(); ++i) {
    PyTuple_SET_ITEM(t.ptr(), static_cast<Py_ssize_t>(i), PyLong_FromUnsignedLongLong(shape[i]));
  }
  return nb::borrow<nb::tuple>(t);
}

// Index expressions arrive as tuples: (0, i) integer, (1, start, stop, step) range, (2,) ellipsis.
using PyIndex = std::tuple<int, std::optional<std::int64_t>, std::optional<std::int64_t>, std::optional<std::int64_t>>;

std::vector<SliceIndex> to_indices(const std::vector<PyIndex>& spec) {
  std::vector<SliceIndex> out;
  out.reserve(spec.size());
  for (const auto& [kind, a, b, c] : spec) {
    if (kind == 0) {
      out.push_back(SliceIndex::at(a.value_or(0)));
    } else if (kind == 1) {
      out.push_back(SliceIndex::range(a, b, c));
    } else {
      out.push_back(SliceIndex::ellipsis());
    }
  }
  return out;
}

}  // namespace

// -- common.h ---------------------------------------------------------------------------------------------

void raise_error(Error e, Op op) { throw TranslatedError{std::move(e), op}; }

Backend parse_backend(const std::string& name) {
  if (name == "mmap") return Backend::kMmap;
  if (name == "pread") return Backend::kPread;
  raise_error(Error::invalid_argument("", "backend \"" + name + "\" is invalid (expected one of: \"mmap\", \"pread\")"));
}

nb::tuple info_tuple(const TensorInfo& t) {
  return nb::make_tuple(nb::str(dtype_code(t.dtype).data(), dtype_code(t.dtype).size()), shape_tuple(t.shape),
                        t.begin, t.end);
}

std::vector<TensorData> to_tensor_data(const std::vector<PyTensorSpec>& specs) {
  std::vector<TensorData> out;
  out.reserve(specs.size());
  for (const auto& [name, code, shape, ptr, len] : specs) {
    auto dt = dtype_from_code(code);
    if (!dt) raise_error(Error::invalid_argument("", "unknown dtype code \"" + code + "\""));
    out.push_back({name, *dt, shape, std::span<const std::byte>(reinterpret_cast<const std::byte*>(ptr), len)});
  }
  return out;
}

std::optional<Metadata> to_metadata(const PyMetadata& md) {
  if (!md) return std::nullopt;
  return Metadata(md->begin(), md->end());
}

}  // namespace safetensors::python

using namespace safetensors;
using namespace safetensors::python;

NB_MODULE(_safetensors_cpp, m) {
  m.doc() = "Native core of the safetensors package (C++ library binding).";
  // Frameworks routinely keep tensors (and so our Buffers) alive past interpreter teardown, which nanobind
  // would report as leaks on every exit. The leak check is opt-in (tests turn it on and assert silence).
  nb::set_leak_warnings(std::getenv("SAFETENSORS_LEAK_WARNINGS") != nullptr);

  g_safetensor_error =
      PyErr_NewExceptionWithDoc("safetensors.SafetensorError", "Custom Python Exception for Safetensor errors.",
                                PyExc_Exception, nullptr);
  m.attr("SafetensorError") = nb::handle(g_safetensor_error);
  {
    nb::object bases = nb::make_tuple(nb::handle(g_safetensor_error), nb::handle(PyExc_IndexError),
                                      nb::handle(PyExc_ValueError));
    g_slice_error = PyErr_NewExceptionWithDoc(
        "safetensors.SafetensorSliceError",
        "An index expression that does not fit the tensor. Also an IndexError and a ValueError, like numpy's.",
        bases.ptr(), nullptr);
    m.attr("SafetensorSliceError") = nb::handle(g_slice_error);
  }
  {
    // str() is the message alone (OSError's would print "[Errno N] strerror: filename"), and pickling goes
    // through BaseException's (message,) + instance dict, which carries errno/strerror/filename.
    nb::object base = nb::borrow(PyExc_BaseException);
    nb::dict ns;
    ns["__str__"] = base.attr("__str__");
    ns["__reduce__"] = base.attr("__reduce__");
    nb::object bases = nb::make_tuple(nb::handle(g_safetensor_error), nb::handle(PyExc_OSError));
    g_io_error = PyErr_NewExceptionWithDoc(
        "safetensors.SafetensorIOError",
        "An operating-system failure while reading or writing a file. Also an OSError: errno, strerror and "
        "filename are set.",
        bases.ptr(), ns.ptr());
    if (g_io_error == nullptr) throw nb::python_error();
    m.attr("SafetensorIOError") = nb::handle(g_io_error);
  }
  nb::register_exception_translator(translate_error);

  nb::class_<Buffer>(m, "Buffer", nb::type_slots(buffer_slots),
                     "Buffer-protocol view of file or memory bytes; keeps them alive while referenced.")
      .def_prop_ro("nbytes", [](const Buffer& b) { return b.size; })
      .def_prop_ro("writable", [](const Buffer& b) { return b.writable; });

  nb::class_<SlicePlan>(m, "SlicePlan", "A planned index expression over one tensor.")
      .def_prop_ro("shape", [](const SlicePlan& p) { return shape_tuple(p.shape()); },
                   nb::sig("def shape(self) -> tuple[int, ...]"))
      .def_prop_ro("nbytes", &SlicePlan::nbytes)
      .def_prop_ro("is_whole", &SlicePlan::is_whole);

  nb::class_<File>(m, "File", "An open, validated safetensors file (or in-memory bytes).")
      .def(
          "__init__",
          [](File* self, const std::string& path, const std::string& backend, std::uint64_t max_header_bytes) {
            OpenOptions options{parse_backend(backend), max_header_bytes};
            Result<File> f = [&] {
              nb::gil_scoped_release release;
              return File::open(path, options);
            }();
            new (self) File(check(std::move(f), Op::kOpenFile));
          },
          "path"_a, "backend"_a = "mmap", "max_header_bytes"_a = kDefaultMaxHeaderBytes)
      .def_static(
          "from_buffer",
          [](nb::handle data, std::uint64_t max_header_bytes) {
            std::span<const std::byte> bytes;
            auto owner = pin_buffer(data, &bytes);
            OpenOptions options{Backend::kMemory, max_header_bytes};
            return check(File::open(memory_source(bytes, std::move(owner)), options), Op::kOpenBytes);
          },
          "data"_a, "max_header_bytes"_a = kDefaultMaxHeaderBytes,
          nb::sig("def from_buffer(data: bytes | bytearray | memoryview, max_header_bytes: int = 100000000) -> File"),
          "Validates a bytes-like object in place; the object is kept alive by the File and its views.")
      .def_prop_ro("path", &File::path)
      .def_prop_ro("backend", [](const File& f) { return backend_name(f.backend()); })
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
          "shape",
          [](const File& f, std::string_view name) {
            const TensorInfo* t = check(f.info(name));
            nb::list out;
            for (std::uint64_t d : t->shape) out.append(d);
            return out;
          },
          "name"_a, nb::sig("def shape(self, name: str) -> list[int]"), "A tensor's shape, as a new list.")
      .def(
          "dtype",
          [](const File& f, std::string_view name) {
            const std::string_view code = dtype_code(check(f.info(name))->dtype);
            return nb::str(code.data(), code.size());
          },
          "name"_a, "A tensor's dtype code, e.g. \"F32\".")
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
          [](const File& f) -> std::optional<Buffer> {
            const std::byte* base = f.source()->data();
            if (base == nullptr) return std::nullopt;
            Buffer b;
            b.data = base + f.data_offset();
            b.size = static_cast<std::size_t>(f.size() - f.data_offset());
            b.owner = f.source();
            b.writable = f.source()->writable();
            return b;
          },
          "The data buffer (everything after the header) as a Buffer, or None on the pread backend.")
      .def(
          "dlpack",
          [](const File& f, std::string_view name) { return export_mapped(f, *check(f.info(name))); },
          "name"_a, nb::sig("def dlpack(self, name: str) -> object | None"),
          "A DLPack capsule viewing a tensor in the writable mapping (zero-copy, keeps it alive), or None "
          "(pread backend, read-only mapping, or a dtype DLPack cannot describe).")
      .def(
          "dlpack_all",
          [](const File& f) {
            const auto& ts = f.tensors();
            return make_list(ts.size(), [&](std::size_t i) {
              return nb::make_tuple(make_str(ts[i].name), export_mapped(f, ts[i]));
            });
          },
          nb::sig("def dlpack_all(self) -> list[tuple[str, object | None]]"),
          "[(name, DLPack capsule or None)] for every tensor, in file order (see dlpack).")
      .def(
          "read_owned_all",
          [](const File& f, unsigned threads) {
            // Every tensor DLPack can describe is read into memory of its own (in parallel, GIL released)
            // and handed out as a capsule that frees it; the rest come back as None.
            std::vector<std::shared_ptr<std::byte>> buffers(f.tensors().size());
            std::vector<ReadRequest> reqs;
            for (std::size_t i = 0; i < f.tensors().size(); ++i) {
              const TensorInfo& t = f.tensors()[i];
              if (dlpack_type(t.dtype).lanes == 0) continue;
              buffers[i] = owned_buffer(t.nbytes());
              const std::span<std::byte> dst(buffers[i].get(), static_cast<std::size_t>(t.nbytes()));
              advise_fresh_destination(dst);
              if (!dst.empty()) reqs.push_back({&t, dst});
            }
            {
              nb::gil_scoped_release release;
              check(f.read_many(reqs, threads));
            }
            return make_list(f.tensors().size(), [&](std::size_t i) {
              const TensorInfo& t = f.tensors()[i];
              nb::object capsule = buffers[i] ? export_view(t, buffers[i].get(), buffers[i]) : nb::none();
              return nb::make_tuple(make_str(t.name), capsule);
            });
          },
          "threads"_a = 0, nb::sig("def read_owned_all(self, threads: int = 0) -> list[tuple[str, object | None]]"),
          "[(name, DLPack capsule or None)] for every tensor in file order: each read into new memory the "
          "capsule owns (None for dtypes DLPack cannot describe). Reads in parallel with the GIL released.")
      .def(
          "read_owned",
          [](const File& f, std::string_view name) -> nb::object {
            const TensorInfo* t = check(f.info(name));
            if (dlpack_type(t->dtype).lanes == 0) return nb::none();
            std::shared_ptr<std::byte> buffer = owned_buffer(t->nbytes());
            {
              nb::gil_scoped_release release;
              const std::span<std::byte> dst(buffer.get(), static_cast<std::size_t>(t->nbytes()));
              advise_fresh_destination(dst);
              check(f.read_into(*t, dst));
            }
            return export_view(*t, buffer.get(), buffer);
          },
          "name"_a, nb::sig("def read_owned(self, name: str) -> object | None"),
          "A tensor read into new memory of its own, as a DLPack capsule that frees it, or None (a dtype DLPack "
          "cannot describe). Releases the GIL while reading.")
      .def(
          "read_bytes",
          [](const File& f, std::string_view name) {
            const TensorInfo* t = check(f.info(name));
            const auto size = static_cast<Py_ssize_t>(t->nbytes());  // the file was validated: it fits
            nb::object out = nb::steal(PyByteArray_FromStringAndSize(nullptr, size));
            if (!out.is_valid()) throw nb::python_error();
            const std::span<std::byte> dst(reinterpret_cast<std::byte*>(PyByteArray_AS_STRING(out.ptr())),
                                           static_cast<std::size_t>(size));
            {
              nb::gil_scoped_release release;
              check(f.read_into(*t, dst));
            }
            return out;
          },
          "name"_a, nb::sig("def read_bytes(self, name: str) -> bytearray"),
          "A tensor's bytes, read into a new bytearray. Releases the GIL while reading.")
      .def(
          "read_into",
          [](const File& f, std::string_view name, std::uintptr_t ptr, std::uint64_t nbytes, bool fresh) {
            if (fresh) advise_fresh_destination(dest(ptr, nbytes));
            check(f.read_into(name, dest(ptr, nbytes)));
          },
          "name"_a, "ptr"_a, "nbytes"_a, "fresh"_a = false, nb::call_guard<nb::gil_scoped_release>(),
          "Reads a tensor's bytes to the address ptr (nbytes must equal its size). fresh=True: the destination "
          "is a new allocation the caller owns (advise_fresh_destination: kept on 4 KiB pages). Releases the GIL.")
      .def(
          "read_many",
          [](const File& f, const std::vector<std::tuple<std::string, std::uintptr_t, std::uint64_t>>& items,
             unsigned threads, bool fresh) {
            std::vector<ReadRequest> reqs;
            reqs.reserve(items.size());
            for (const auto& [name, ptr, nbytes] : items) {
              reqs.push_back({check(f.info(name)), dest(ptr, nbytes)});
              if (fresh) advise_fresh_destination(reqs.back().dst);
            }
            check(f.read_many(reqs, threads));
          },
          "items"_a, "threads"_a = 0, "fresh"_a = false, nb::call_guard<nb::gil_scoped_release>(),
          "Reads [(name, ptr, nbytes)] with a pool of threads (fresh: as in read_into). Releases the GIL.")
      .def(
          "read_range",
          [](const File& f, std::uint64_t offset, std::uintptr_t ptr, std::uint64_t nbytes, unsigned threads) {
            check(f.read_range(offset, dest(ptr, nbytes), threads));
          },
          "offset"_a, "ptr"_a, "nbytes"_a, "threads"_a = 0, nb::call_guard<nb::gil_scoped_release>(),
          "Reads data-buffer bytes [offset, offset + nbytes) to the address ptr, with a pool of threads. "
          "Releases the GIL.")
      .def(
          "plan_slice",
          [](const File& f, std::string_view name, const std::vector<PyIndex>& spec) {
            const TensorInfo* t = check(f.info(name));
            return check(f.plan_slice(*t, to_indices(spec)));
          },
          "name"_a, "spec"_a)
      .def(
          "read_slice",
          [](const File& f, std::string_view name, const SlicePlan& plan, std::uintptr_t ptr) {
            const TensorInfo* t = check(f.info(name));
            check(f.read_slice(*t, plan, dest(ptr, plan.nbytes())));
          },
          "name"_a, "plan"_a, "ptr"_a, nb::call_guard<nb::gil_scoped_release>(),
          "Reads the planned slice to the address ptr (plan.nbytes bytes). Releases the GIL.");

  m.def(
      "serialize",
      [](const std::vector<PyTensorSpec>& specs,
         const std::optional<std::vector<std::pair<std::string, std::string>>>& metadata) {
        std::vector<TensorData> tensors = to_tensor_data(specs);
        WritePlan plan = check(WritePlan::make(tensors, to_metadata(metadata)), Op::kSerialize);
        nb::object out = nb::steal(PyBytes_FromStringAndSize(nullptr, static_cast<Py_ssize_t>(plan.total_size())));
        if (!out.is_valid()) throw nb::python_error();
        std::span<std::byte> dst(reinterpret_cast<std::byte*>(PyBytes_AsString(out.ptr())),
                                 static_cast<std::size_t>(plan.total_size()));
        Status st;
        {
          nb::gil_scoped_release release;
          st = serialize_into(plan, tensors, dst);
        }
        check(std::move(st), Op::kSerialize);
        return nb::borrow<nb::bytes>(out);
      },
      "tensors"_a, "metadata"_a = nb::none(),
      "Serializes [(name, dtype code, shape, data_ptr, data_len)] to bytes. Releases the GIL while copying.");

  m.def(
      "serialize_file",
      [](const std::vector<PyTensorSpec>& specs, const std::string& path,
         const std::optional<std::vector<std::pair<std::string, std::string>>>& metadata, bool fsync) {
        std::vector<TensorData> tensors = to_tensor_data(specs);
        std::optional<Metadata> md = to_metadata(metadata);
        Status st;
        {
          nb::gil_scoped_release release;
          st = save_file(path, tensors, md, WriteOptions{.fsync = fsync});
        }
        check(std::move(st), Op::kSerialize);
      },
      "tensors"_a, "path"_a, "metadata"_a = nb::none(), "fsync"_a = false,
      "Writes [(name, dtype code, shape, data_ptr, data_len)] to path atomically. Releases the GIL.");

  m.def(
      "dtype_table",
      []() {
        nb::list out;
        for (const DtypeInfo& row : kDtypeTable) {
          static constexpr const char* kKinds[] = {"bool", "signed", "unsigned", "float", "complex"};
          out.append(nb::make_tuple(nb::str(row.code.data(), row.code.size()), row.bits,
                                    kKinds[static_cast<int>(row.kind)], row.swap_bytes,
                                    row.dlpack_code == kNoDlpack ? nb::object(nb::none()) : nb::object(nb::int_(row.dlpack_code)),
                                    row.torch_pack, nb::str(row.torch_name.data(), row.torch_name.size()),
                                    nb::str(row.numpy_name.data(), row.numpy_name.size())));
        }
        return out;
      },
      nb::sig("def dtype_table() -> list[tuple[str, int, str, int, int | None, int, str, str]]"),
      "[(code, bits, kind, swap bytes, DLPack code or None, torch pack, torch name, numpy name)] in rank "
      "order: the one dtype table (include/safetensors/dtype.h). kind is bool/signed/unsigned/float/complex.");

  m.def("live_mappings", &testing::live_mappings, "Number of file mappings alive in this process (for tests).");
  m.attr("DEFAULT_MAX_HEADER_BYTES") = kDefaultMaxHeaderBytes;
  bind_engine(m);
  bind_sharded(m);
}
