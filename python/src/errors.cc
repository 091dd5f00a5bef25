// Error translation: the one path from a safetensors::Error to a Python exception (common.h's raise_error),
// and the exception types it raises.
#include <nanobind/nanobind.h>

#include <cerrno>
#include <exception>
#include <map>
#include <string>
#include <unordered_map>
#include <utility>

#include "common.h"
#include "safetensors/error.h"

namespace nb = nanobind;

namespace safetensors::python {
namespace {

struct TranslatedError {
  Error error;
  Op op;
};

PyObject* g_safetensor_error = nullptr;  // safetensors.SafetensorError
PyObject* g_slice_error = nullptr;       // safetensors.SafetensorSliceError(SafetensorError, IndexError, ValueError)
PyObject* g_io_error = nullptr;          // safetensors.SafetensorIOError(SafetensorError, OSError)
// errno -> safetensors.Safetensor<X>(SafetensorIOError, X), where X is the OSError subclass Python itself picks
// for that errno (PermissionError for EACCES and EPERM, FileNotFoundError for ENOENT, ...): one class per X,
// made once by register_errors. An errno Python maps to OSError itself is absent: SafetensorIOError.
std::unordered_map<int, PyObject*>* g_io_error_by_errno = nullptr;

PyObject* io_error_type(int err) {
  const auto it = g_io_error_by_errno->find(err);
  return it == g_io_error_by_errno->end() ? g_io_error : it->second;
}

// Raises `type` with the whole of `text`: a NUL inside a tensor name or dtype must not cut the message (and
// its variant token) short, and bytes that are not UTF-8 (a path) become backslash escapes instead of
// turning the error into a UnicodeDecodeError.
void set_error(PyObject* type, const std::string& text) {
  PyObject* message = PyUnicode_DecodeUTF8(text.data(), static_cast<Py_ssize_t>(text.size()), "backslashreplace");
  if (message == nullptr) return;
  PyErr_SetObject(type, message);
  Py_DECREF(message);
}

// Raises SafetensorIOError, or its subclass for the errno (io_error_type): str() is the whole `text`, and
// errno, strerror and filename are set as OSError's. They are also kept in the instance dict, which
// BaseException.__reduce__ pickles and __setstate__ writes back through OSError's attributes, so a pickled
// error keeps them.
void set_io_error(const Error& e, const std::string& text) {
  try {
    auto decode = [](const std::string& bytes) {
      return nb::steal(PyUnicode_DecodeUTF8(bytes.data(), static_cast<Py_ssize_t>(bytes.size()), "backslashreplace"));
    };
    // A file that changed size under us has no errno of its own: it is reported as EIO, its text the detail.
    const int err = e.sys_errno() != 0 ? e.sys_errno() : EIO;
    PyObject* type = io_error_type(err);
    nb::object exc = nb::handle(type)(decode(text));
    nb::object strerror = e.sys_errno() != 0 ? nb::module_::import_("os").attr("strerror")(err) : decode(e.detail());
    nb::object filename = e.context().empty() || e.context().front() == '<'
                              ? nb::none()
                              : nb::steal(PyUnicode_DecodeFSDefaultAndSize(
                                    e.context().data(), static_cast<Py_ssize_t>(e.context().size())));
    if (!filename.is_valid() || !strerror.is_valid()) throw nb::python_error();
    nb::dict state = nb::borrow<nb::dict>(exc.attr("__dict__"));
    for (auto [name, value] :
         {std::pair<const char*, nb::object>{"errno", nb::int_(err)}, {"strerror", strerror}, {"filename", filename}}) {
      exc.attr(name) = value;
      state[name] = value;
    }
    PyErr_SetObject(type, exc.ptr());
  } catch (nb::python_error& pe) {
    pe.restore();
  }
}

void translate_error(const std::exception_ptr& p, void*) {
  try {
    std::rethrow_exception(p);
  } catch (const TranslatedError& t) {
    set_python_error(t.error, t.op);
  }
}

}  // namespace

void set_python_error(const Error& e, Op op) {
  const char* prefix = op == Op::kOpenFile    ? "Error while deserializing header: "
                       : op == Op::kOpenBytes ? "Error while deserializing: "
                       : op == Op::kSerialize ? "Error while serializing: "
                                              : "";
  switch (e.kind()) {
    case Error::Kind::kNotFound:
      if (op == Op::kSerialize) {
        // A save into a missing directory: an I/O error, as the reference reports it.
        Error io = Error::io(e.context(), e.detail(), e.sys_errno());
        set_io_error(io, prefix + io.to_string());
        return;
      }
      // The reference's FileNotFoundError and its exact text, as the FileNotFoundError subclass of
      // SafetensorIOError (errno ENOENT, filename set).
      set_io_error(e, e.message());
      return;
    case Error::Kind::kIo: set_io_error(e, prefix + e.to_string()); return;
    case Error::Kind::kInvalidSlice: set_error(g_slice_error, e.to_string()); return;
    case Error::Kind::kTensorNotFound:
    case Error::Kind::kInvalidArgument: set_error(g_safetensor_error, e.to_string()); return;
    default: set_error(g_safetensor_error, prefix + e.to_string()); return;
  }
}

void set_python_message(Error::Kind kind, const std::string& text) {
  set_error(kind == Error::Kind::kInvalidSlice ? g_slice_error : g_safetensor_error, text);
}

void raise_error(Error e, Op op) { throw TranslatedError{std::move(e), op}; }

void raise_message(Error::Kind kind, const std::string& text) {
  set_python_message(kind, text);
  throw nb::python_error();
}

void register_errors(nb::module_& m) {
  g_safetensor_error = PyErr_NewExceptionWithDoc(
      "safetensors.SafetensorError", "Custom Python Exception for Safetensor errors.", PyExc_Exception, nullptr);
  m.attr("SafetensorError") = nb::handle(g_safetensor_error);
  {
    nb::object bases =
        nb::make_tuple(nb::handle(g_safetensor_error), nb::handle(PyExc_IndexError), nb::handle(PyExc_ValueError));
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
  {
    // One subclass per OSError subclass that Python picks by errno (OSError(errno, ...) builds it), named
    // "Safetensor" + its name in `safetensors` (where __module__ points, so that pickles load) and in `m`.
    // They inherit SafetensorIOError's __str__ and __reduce__, which comes first in their MRO.
    g_io_error_by_errno = new std::unordered_map<int, PyObject*>();  // kept for the process, as the types are
    std::map<PyObject*, PyObject*> by_builtin;
    nb::dict codes = nb::borrow<nb::dict>(nb::module_::import_("errno").attr("errorcode"));
    for (nb::handle code : codes.keys()) {
      nb::object probe = nb::handle(PyExc_OSError)(code, "");
      PyObject* builtin = reinterpret_cast<PyObject*>(Py_TYPE(probe.ptr()));
      if (builtin == PyExc_OSError) continue;
      PyObject*& ours = by_builtin[builtin];
      if (ours == nullptr) {
        const std::string builtin_name = nb::str(nb::handle(builtin).attr("__name__")).c_str();
        const std::string name = "Safetensor" + builtin_name;
        const std::string doc = "A SafetensorIOError whose errno Python reports as " + builtin_name + ".";
        nb::object bases = nb::make_tuple(nb::handle(g_io_error), nb::handle(builtin));
        ours = PyErr_NewExceptionWithDoc(("safetensors." + name).c_str(), doc.c_str(), bases.ptr(), nullptr);
        if (ours == nullptr) throw nb::python_error();
        m.attr(name.c_str()) = nb::handle(ours);
      }
      (*g_io_error_by_errno)[nb::cast<int>(code)] = ours;
    }
  }
  nb::register_exception_translator(translate_error);
}

}  // namespace safetensors::python
