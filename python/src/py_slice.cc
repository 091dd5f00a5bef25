#include "py_slice.h"

#include <string_view>

#include "common.h"
#include "safetensors/dtype.h"

namespace nb = nanobind;

namespace safetensors::python {
namespace {

struct SliceObject {
  PyObject ob_base;
  PyObject* file;    // the File (a nanobind instance): keeps `tensor` alive
  PyObject* reader;  // the _Reader the handle came from
  const TensorInfo* tensor;
};

PyTypeObject* g_type = nullptr;  // set once by bind_py_slice; the module keeps the type alive
// Interned once by bind_py_slice and kept for the process: [index] calls reader.slice_item, and "name" is the
// keyword get_slice accepts.
PyObject* g_slice_item = nullptr;
PyObject* g_name = nullptr;

SliceObject* as_slice(PyObject* self) { return reinterpret_cast<SliceObject*>(self); }

// Neither type takes part in the cyclic GC: their references (a File, a _Reader) never lead back to a
// handle or a getter, so no cycle can pass through one, and a collection would only cost each allocation.
void slice_dealloc(PyObject* self) {
  PyTypeObject* type = Py_TYPE(self);
  Py_CLEAR(as_slice(self)->file);
  Py_CLEAR(as_slice(self)->reader);
  reinterpret_cast<freefunc>(PyType_GetSlot(type, Py_tp_free))(self);
  Py_DECREF(type);  // a heap type's instances own a reference to it
}

PyObject* slice_new(PyTypeObject*, PyObject*, PyObject*) {
  PyErr_SetString(PyExc_TypeError, "PySafeSlice is created by safe_open.get_slice()");
  return nullptr;
}

PyObject* get_shape(PyObject* self, PyObject*) {
  const auto& shape = as_slice(self)->tensor->shape;
  PyObject* out = PyList_New(static_cast<Py_ssize_t>(shape.size()));
  if (out == nullptr) return nullptr;
  for (std::size_t i = 0; i < shape.size(); ++i) {
    PyObject* d = PyLong_FromUnsignedLongLong(shape[i]);
    if (d == nullptr) {
      Py_DECREF(out);
      return nullptr;
    }
    list_set(out, static_cast<Py_ssize_t>(i), d);
  }
  return out;
}

PyObject* get_dtype(PyObject* self, PyObject*) {
  const std::string_view code = dtype_code(as_slice(self)->tensor->dtype);
  return PyUnicode_FromStringAndSize(code.data(), static_cast<Py_ssize_t>(code.size()));
}

Py_ssize_t slice_length(PyObject* self) {
  const auto& shape = as_slice(self)->tensor->shape;
  if (shape.empty()) {
    PyErr_SetString(PyExc_TypeError, "len() of a 0-d tensor");
    return -1;
  }
  return static_cast<Py_ssize_t>(shape[0]);
}

PyObject* slice_getitem(PyObject* self, PyObject* index) {
  const std::string_view name = as_slice(self)->tensor->name;
  PyObject* key = PyUnicode_FromStringAndSize(name.data(), static_cast<Py_ssize_t>(name.size()));
  if (key == nullptr) return nullptr;
  PyObject* out = PyObject_CallMethodObjArgs(as_slice(self)->reader, g_slice_item, key, index, nullptr);
  Py_DECREF(key);
  return out;
}

PyMethodDef kMethods[] = {
    {"get_shape", get_shape, METH_NOARGS, "get_shape($self, /)\n--\n\nThe tensor's shape, as a new list."},
    {"get_dtype", get_dtype, METH_NOARGS, "get_dtype($self, /)\n--\n\nThe tensor's dtype code, e.g. \"F32\"."},
    {nullptr, nullptr, 0, nullptr},
};

// SafeOpenBase: the native base of safe_open, holding the File and the _Reader its get_slice hands to each
// handle. get_slice is a method of the type (a method descriptor, as the reference's PyO3 method is), so
// that `f.get_slice(name)` is one specialised method lookup and one C call.
struct BaseObject {
  PyObject ob_base;
  // Both NULL before _attach and after _detach. Read and written under the object's critical section
  // (open_refs, swap_refs), or by the collector and dealloc, when no other thread can reach the object.
  PyObject* file;    // the File (a nanobind instance)
  PyObject* reader;  // the _Reader
};

BaseObject* as_base(PyObject* self) { return reinterpret_cast<BaseObject*>(self); }

// The File and the _Reader of an open base, as references of the caller's own; false with the reference's
// SafetensorError "File is closed" set when it is not open (never attached, or detached). The one place that
// decides and words "closed": safe_open's Python methods ask _open().
//
// Threads: _attach and _detach may run on another thread at any moment. Every read and write of the pair is
// inside the object's critical section (nanobind's ft_object_guard: PyCriticalSection on a free-threaded
// Python, nothing where the GIL already makes these few statements atomic), and a call goes on with its own
// references, so a concurrent _detach never frees the File under it: a call that got the pair completes, and
// every call after _detach raises "File is closed". References are dropped outside the critical section (a
// File's destructor unmaps).
bool open_refs(PyObject* self, nb::object* file, nb::object* reader) {
  {
    nb::ft_object_guard guard(self);
    const BaseObject* base = as_base(self);
    if (base->file != nullptr) {
      *file = nb::borrow(base->file);
      *reader = nb::borrow(base->reader);
    }
  }
  if (file->is_valid()) return true;
  set_python_message(Error::Kind::kInvalidArgument, "File is closed");
  return false;
}

// Replaces the pair with (file, reader) (new references, or both null), under the critical section; the old
// pair is released after it.
void swap_refs(PyObject* self, PyObject* file, PyObject* reader) {
  PyObject* old_file;
  PyObject* old_reader;
  {
    nb::ft_object_guard guard(self);
    old_file = as_base(self)->file;
    old_reader = as_base(self)->reader;
    as_base(self)->file = file;
    as_base(self)->reader = reader;
  }
  Py_XDECREF(old_file);
  Py_XDECREF(old_reader);
}

// A new handle on `tensor` of `file`, or NULL with an exception set.
PyObject* new_slice(PyObject* file, PyObject* reader, const TensorInfo* tensor) {
  PyObject* self = PyType_GenericAlloc(g_type, 0);  // zeroed, owning a reference to the type
  if (self == nullptr) return nullptr;
  Py_INCREF(file);
  Py_INCREF(reader);
  as_slice(self)->file = file;
  as_slice(self)->reader = reader;
  as_slice(self)->tensor = tensor;
  return self;
}

// get_slice(name): the handle on tensor `name`; SafetensorError when the file is closed or has no such tensor
// (the reference's texts), and PyO3's argument errors.
PyObject* base_get_slice(PyObject* self, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames) {
  if (nargs > 1) {
    PyErr_Format(PyExc_TypeError, "safe_open.get_slice() takes 1 positional arguments but %zd were given", nargs);
    return nullptr;
  }
  PyObject* name = nargs == 1 ? args[0] : nullptr;
  const Py_ssize_t nkw = kwnames == nullptr ? 0 : tuple_size(kwnames);
  for (Py_ssize_t i = 0; i < nkw; ++i) {
    PyObject* key = tuple_get(kwnames, i);
    if (PyUnicode_Compare(key, g_name) != 0) {
      PyErr_Format(PyExc_TypeError, "safe_open.get_slice() got an unexpected keyword argument '%U'", key);
      return nullptr;
    }
    if (name != nullptr) {
      PyErr_SetString(PyExc_TypeError, "safe_open.get_slice() got multiple values for argument 'name'");
      return nullptr;
    }
    name = args[nargs + i];
  }
  if (name == nullptr) {
    PyErr_SetString(PyExc_TypeError, "safe_open.get_slice() missing 1 required positional argument: 'name'");
    return nullptr;
  }
  nb::object file, reader;
  if (!open_refs(self, &file, &reader)) return nullptr;
  if (!PyUnicode_Check(name)) {
    PyErr_Format(PyExc_TypeError, "argument 'name': '%s' object is not an instance of 'str'", type_name(name).c_str());
    return nullptr;
  }
  Py_ssize_t size = 0;
  const char* utf8 = PyUnicode_AsUTF8AndSize(name, &size);
  if (utf8 == nullptr) return nullptr;
  Result<const TensorInfo*> tensor =
      nb::inst_ptr<File>(file)->info(std::string_view(utf8, static_cast<std::size_t>(size)));
  if (!tensor.ok()) {
    set_python_error(tensor.error());
    return nullptr;
  }
  return new_slice(file.ptr(), reader.ptr(), *tensor);
}

// _attach(file, reader): what get_slice serves from now on. `file` must be an initialised File: get_slice
// reads it as one.
PyObject* base_attach(PyObject* self, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 2 || !nb::isinstance<File>(nb::handle(args[0])) || !nb::inst_ready(nb::handle(args[0]))) {
    PyErr_SetString(PyExc_TypeError, "_attach() takes a File and a reader");
    return nullptr;
  }
  Py_INCREF(args[0]);
  Py_INCREF(args[1]);
  swap_refs(self, args[0], args[1]);
  Py_RETURN_NONE;
}

// _open(): the _Reader of an open base; SafetensorError "File is closed" otherwise.
PyObject* base_open(PyObject* self, PyObject*) {
  nb::object file, reader;
  if (!open_refs(self, &file, &reader)) return nullptr;
  return reader.release().ptr();
}

// The collector's tp_clear, and dealloc's: no other thread uses the object then (the free-threaded collector
// stops the world), so no critical section.
int base_clear(PyObject* self) {
  Py_CLEAR(as_base(self)->file);
  Py_CLEAR(as_base(self)->reader);
  return 0;
}

// _detach(): lets go of the File (its mapping or descriptor), as closing does; get_slice and _open raise
// "File is closed" from now on, and handles and calls already under way keep their own references.
PyObject* base_detach(PyObject* self, PyObject*) {
  swap_refs(self, nullptr, nullptr);
  Py_RETURN_NONE;
}

int base_traverse(PyObject* self, visitproc visit, void* arg) {
  Py_VISIT(as_base(self)->file);
  Py_VISIT(as_base(self)->reader);
  Py_VISIT(Py_TYPE(self));  // a heap type's instances own a reference to it
  return 0;
}

void base_dealloc(PyObject* self) {
  PyTypeObject* type = Py_TYPE(self);
  PyObject_GC_UnTrack(self);
  base_clear(self);
  reinterpret_cast<freefunc>(PyType_GetSlot(type, Py_tp_free))(self);
  Py_DECREF(type);
}

PyMethodDef kBaseMethods[] = {
    {"get_slice", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(base_get_slice)),
     METH_FASTCALL | METH_KEYWORDS,
     "get_slice($self, /, name)\n--\n\nA lazy handle on tensor ``name`` that reads only what an index expression "
     "selects."},
    {"_attach", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(base_attach)), METH_FASTCALL,
     "_attach($self, file, reader, /)\n--\n\nThe File and the _Reader that get_slice serves."},
    {"_open", base_open, METH_NOARGS,
     "_open($self, /)\n--\n\nThe _Reader, while the file is open; SafetensorError \"File is closed\" otherwise."},
    {"_detach", base_detach, METH_NOARGS,
     "_detach($self, /)\n--\n\nLets go of the file: get_slice and _open raise \"File is closed\" from now on."},
    {nullptr, nullptr, 0, nullptr},
};

}  // namespace

void bind_py_slice(nb::module_& m) {
  static PyType_Slot slots[] = {
      {Py_tp_doc,
       const_cast<char*>("A tensor not read yet: get_shape(), get_dtype(), len() and [index] with numpy "
                         "semantics (read through safe_open's reader). Immutable: may be shared by threads.")},
      {Py_tp_new, reinterpret_cast<void*>(slice_new)},
      {Py_tp_dealloc, reinterpret_cast<void*>(slice_dealloc)},
      {Py_tp_methods, kMethods},
      {Py_mp_length, reinterpret_cast<void*>(slice_length)},
      {Py_mp_subscript, reinterpret_cast<void*>(slice_getitem)},
      {0, nullptr},
  };
  static PyType_Spec spec = {"safetensors._safetensors_cpp.PySafeSlice", sizeof(SliceObject), 0, Py_TPFLAGS_DEFAULT,
                             slots};
  g_slice_item = PyUnicode_InternFromString("slice_item");
  g_name = PyUnicode_InternFromString("name");
  if (g_slice_item == nullptr || g_name == nullptr) throw nb::python_error();
  nb::object type = nb::steal(PyType_FromSpec(&spec));
  if (!type.is_valid()) throw nb::python_error();
  g_type = reinterpret_cast<PyTypeObject*>(type.ptr());
  m.attr("PySafeSlice") = type;

  static PyType_Slot base_slots[] = {
      {Py_tp_doc,
       const_cast<char*>("The native part of safe_open: the open file that get_slice serves. Safe for concurrent use "
                         "by multiple threads, _detach included.")},
      {Py_tp_new, reinterpret_cast<void*>(PyType_GenericNew)},
      {Py_tp_dealloc, reinterpret_cast<void*>(base_dealloc)},
      {Py_tp_traverse, reinterpret_cast<void*>(base_traverse)},
      {Py_tp_clear, reinterpret_cast<void*>(base_clear)},
      {Py_tp_methods, kBaseMethods},
      {0, nullptr},
  };
  static PyType_Spec base_spec = {"safetensors._safetensors_cpp.SafeOpenBase", sizeof(BaseObject), 0,
                                  Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC, base_slots};
  nb::object base_type = nb::steal(PyType_FromSpec(&base_spec));
  if (!base_type.is_valid()) throw nb::python_error();
  m.attr("SafeOpenBase") = base_type;
}

}  // namespace safetensors::python
