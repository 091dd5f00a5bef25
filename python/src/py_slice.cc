#include "py_slice.h"

#include <string_view>

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

int slice_traverse(PyObject* self, visitproc visit, void* arg) {
  Py_VISIT(as_slice(self)->file);
  Py_VISIT(as_slice(self)->reader);
  Py_VISIT(Py_TYPE(self));  // a heap type's instances own a reference to it
  return 0;
}

int slice_clear(PyObject* self) {
  Py_CLEAR(as_slice(self)->file);
  Py_CLEAR(as_slice(self)->reader);
  return 0;
}

void slice_dealloc(PyObject* self) {
  PyTypeObject* type = Py_TYPE(self);
  PyObject_GC_UnTrack(self);
  slice_clear(self);
  reinterpret_cast<freefunc>(PyType_GetSlot(type, Py_tp_free))(self);
  Py_DECREF(type);
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

}  // namespace

void bind_py_slice(nb::module_& m) {
  static PyType_Slot slots[] = {
      {Py_tp_doc, const_cast<char*>("A tensor not read yet: get_shape(), get_dtype(), len() and [index] with numpy "
                                    "semantics (read through safe_open's reader).")},
      {Py_tp_new, reinterpret_cast<void*>(slice_new)},
      {Py_tp_dealloc, reinterpret_cast<void*>(slice_dealloc)},
      {Py_tp_traverse, reinterpret_cast<void*>(slice_traverse)},
      {Py_tp_clear, reinterpret_cast<void*>(slice_clear)},
      {Py_tp_methods, kMethods},
      {Py_mp_length, reinterpret_cast<void*>(slice_length)},
      {Py_mp_subscript, reinterpret_cast<void*>(slice_getitem)},
      {0, nullptr},
  };
  static PyType_Spec spec = {"safetensors._safetensors_cpp.PySafeSlice", sizeof(SliceObject), 0,
                             Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC, slots};
  g_slice_item = PyUnicode_InternFromString("slice_item");
  if (g_slice_item == nullptr) throw nb::python_error();
  nb::object type = nb::steal(PyType_FromSpec(&spec));
  if (!type.is_valid()) throw nb::python_error();
  g_type = reinterpret_cast<PyTypeObject*>(type.ptr());
  m.attr("PySafeSlice") = type;
}

nb::object make_py_slice(nb::handle file, nb::handle reader, const TensorInfo* tensor) {
  PyObject* self = PyType_GenericAlloc(g_type, 0);  // zeroed, tracked by the GC, owning a reference to the type
  if (self == nullptr) throw nb::python_error();
  as_slice(self)->file = nb::borrow(file).release().ptr();
  as_slice(self)->reader = nb::borrow(reader).release().ptr();
  as_slice(self)->tensor = tensor;
  return nb::steal(self);
}

}  // namespace safetensors::python
