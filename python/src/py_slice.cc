#include "py_slice.h"

#include <cstddef>
#include <string_view>

#include <structmember.h>

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
// "slice_item", interned once by bind_py_slice and kept for the process: [index] calls reader.slice_item.
PyObject* g_slice_item = nullptr;

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
    PyList_SET_ITEM(out, static_cast<Py_ssize_t>(i), d);
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

// SliceGetter: safe_open.get_slice itself, one per safe_open (held in its instance dict), so that the
// per-name call is one vectorcall into C instead of a Python method that calls the binding.
struct GetterObject {
  PyObject ob_base;
  vectorcallfunc vectorcall;
  PyObject* file;  // the File (a nanobind instance)
  PyObject* reader;
  bool closed;
};

PyTypeObject* g_getter_type = nullptr;  // set once by bind_py_slice
PyObject* g_name = nullptr;             // "name", interned: the keyword get_slice accepts

GetterObject* as_getter(PyObject* self) { return reinterpret_cast<GetterObject*>(self); }

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

// get_slice(name): the handle on tensor `name`; SafetensorError once the file is closed or when it has no
// such tensor (the reference's texts), TypeError for a name that is not a str.
PyObject* getter_call(PyObject* self, PyObject* const* args, std::size_t nargsf, PyObject* kwnames) {
  // The argument errors are PyO3's, as the reference raises them.
  const Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
  if (nargs > 1) {
    PyErr_Format(PyExc_TypeError, "safe_open.get_slice() takes 1 positional arguments but %zd were given", nargs);
    return nullptr;
  }
  PyObject* name = nargs == 1 ? args[0] : nullptr;
  const Py_ssize_t nkw = kwnames == nullptr ? 0 : PyTuple_GET_SIZE(kwnames);
  for (Py_ssize_t i = 0; i < nkw; ++i) {
    PyObject* key = PyTuple_GET_ITEM(kwnames, i);
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
  GetterObject* g = as_getter(self);
  if (g->closed) {
    set_python_message(Error::Kind::kInvalidArgument, "File is closed");
    return nullptr;
  }
  if (!PyUnicode_Check(name)) {
    PyErr_Format(PyExc_TypeError, "argument 'name': '%s' object is not an instance of 'str'", Py_TYPE(name)->tp_name);
    return nullptr;
  }
  Py_ssize_t size = 0;
  const char* utf8 = PyUnicode_AsUTF8AndSize(name, &size);
  if (utf8 == nullptr) return nullptr;
  Result<const TensorInfo*> tensor =
      nb::inst_ptr<File>(g->file)->info(std::string_view(utf8, static_cast<std::size_t>(size)));
  if (!tensor.ok()) {
    set_python_error(tensor.error());
    return nullptr;
  }
  return new_slice(g->file, g->reader, *tensor);
}

void getter_dealloc(PyObject* self) {
  PyTypeObject* type = Py_TYPE(self);
  Py_CLEAR(as_getter(self)->file);
  Py_CLEAR(as_getter(self)->reader);
  reinterpret_cast<freefunc>(PyType_GetSlot(type, Py_tp_free))(self);
  Py_DECREF(type);
}

// Lets go of the File (and its mapping or descriptor) as the closed safe_open does; handles keep their own.
PyObject* getter_close(PyObject* self, PyObject*) {
  as_getter(self)->closed = true;
  Py_CLEAR(as_getter(self)->file);
  Py_CLEAR(as_getter(self)->reader);
  Py_RETURN_NONE;
}

PyMethodDef kGetterMethods[] = {
    {"close", getter_close, METH_NOARGS,
     "close($self, /)\n--\n\nLets go of the file; from now on every call raises SafetensorError(\"File is "
     "closed\"). Handles already made keep working."},
    {nullptr, nullptr, 0, nullptr},
};

PyMemberDef kGetterMembers[] = {
    {"__vectorcalloffset__", T_PYSSIZET, offsetof(GetterObject, vectorcall), READONLY, nullptr},
    {nullptr, 0, 0, 0, nullptr},
};

}  // namespace

void bind_py_slice(nb::module_& m) {
  static PyType_Slot slots[] = {
      {Py_tp_doc, const_cast<char*>("A tensor not read yet: get_shape(), get_dtype(), len() and [index] with numpy "
                                    "semantics (read through safe_open's reader).")},
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

  static PyType_Slot getter_slots[] = {
      {Py_tp_doc, const_cast<char*>("safe_open.get_slice of one open file: call it with a tensor name.")},
      {Py_tp_new, reinterpret_cast<void*>(slice_new)},
      {Py_tp_dealloc, reinterpret_cast<void*>(getter_dealloc)},
      {Py_tp_call, reinterpret_cast<void*>(PyVectorcall_Call)},
      {Py_tp_methods, kGetterMethods},
      {Py_tp_members, kGetterMembers},
      {0, nullptr},
  };
  static PyType_Spec getter_spec = {"safetensors._safetensors_cpp.SliceGetter", sizeof(GetterObject), 0,
                                    Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_VECTORCALL, getter_slots};
  nb::object getter_type = nb::steal(PyType_FromSpec(&getter_spec));
  if (!getter_type.is_valid()) throw nb::python_error();
  g_getter_type = reinterpret_cast<PyTypeObject*>(getter_type.ptr());
  m.attr("SliceGetter") = getter_type;
}

nb::object make_slice_getter(nb::handle file, nb::handle reader) {
  PyObject* self = PyType_GenericAlloc(g_getter_type, 0);
  if (self == nullptr) throw nb::python_error();
  as_getter(self)->vectorcall = getter_call;
  as_getter(self)->file = nb::borrow(file).release().ptr();
  as_getter(self)->reader = nb::borrow(reader).release().ptr();
  return nb::steal(self);
}

}  // namespace safetensors::python
