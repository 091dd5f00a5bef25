#include "export.h"

#include "common.h"

#include <nanobind/ndarray.h>

#include <cstdlib>
#include <new>
#include <span>
#include <type_traits>
#include <vector>

#include "safetensors/dtype.h"

namespace nb = nanobind;

namespace safetensors::python {
namespace {

template <typename... Tags>
nb::object make_array(const std::byte* data, std::size_t ndim, const std::size_t* shape, nb::handle owner,
                      nb::dlpack::dtype dtype, bool writable) {
  if (writable) {
    // Written only by the caller: owned memory, or the process's private copy-on-write pages of a mapping.
    return nb::cast(
        nb::ndarray<Tags...>(const_cast<std::byte*>(data), ndim, shape, owner, nullptr, dtype, nb::device::cpu::value));
  }
  return nb::cast(nb::ndarray<nb::ro, Tags...>(data, ndim, shape, owner, nullptr, dtype, nb::device::cpu::value));
}

}  // namespace

nb::object export_array(const TensorInfo& t, const TensorView& view, nb::handle owner, Form form) {
  const DtypeInfo& row = dtype_info(t.dtype);
  const bool typed = form == Form::kDlpack && row.dlpack_code != kNoDlpack;
  const std::size_t nbytes = view.bytes.size();
  const std::size_t* shape = &nbytes;
  std::size_t ndim = 1;
  std::vector<std::size_t> dims;  // a copy only where size_t is another type than TensorInfo's uint64_t
  if (typed) {
    ndim = t.shape.size();
    if constexpr (std::is_same_v<std::size_t, std::uint64_t>) {
      shape = t.shape.data();
    } else {
      dims.assign(t.shape.begin(), t.shape.end());
      shape = dims.data();
    }
  }
  const nb::dlpack::dtype dtype =
      typed ? nb::dlpack::dtype{row.dlpack_code, static_cast<std::uint8_t>(row.bits), 1} : nb::dtype<std::uint8_t>();
  const std::byte* data = view.bytes.data();
  if (form == Form::kBuffer) return make_array<nb::memview>(data, ndim, shape, owner, dtype, view.writable);
  return make_array<>(data, ndim, shape, owner, dtype, view.writable);
}

nb::object owned_bytes(std::uint64_t nbytes, std::span<std::byte>* dst, std::uint64_t offset, std::uint64_t alignment) {
  if (alignment > 1 && nbytes >= kCongruentMinBytes && (alignment & (alignment - 1)) == 0) {
    const std::uint64_t pad = offset & (alignment - 1);
    // The file was validated: nbytes (a tensor's size) fits in memory's address range, with room to spare.
    const std::uint64_t size = (pad + nbytes + alignment - 1) & ~(alignment - 1);
    void* base = std::aligned_alloc(static_cast<std::size_t>(alignment), static_cast<std::size_t>(size));
    if (base == nullptr) throw std::bad_alloc();
    nb::capsule owner(base, [](void* p) noexcept { std::free(p); });
    *dst = std::span<std::byte>(static_cast<std::byte*>(base) + pad, static_cast<std::size_t>(nbytes));
    advise_fresh_destination(*dst);
    return owner;
  }
  // The file was validated: a tensor's size fits in memory's address range.
  nb::object out = nb::steal(PyByteArray_FromStringAndSize(nullptr, static_cast<Py_ssize_t>(nbytes)));
  if (!out.is_valid()) throw nb::python_error();
  *dst =
      std::span<std::byte>(reinterpret_cast<std::byte*>(bytearray_data(out.ptr())), static_cast<std::size_t>(nbytes));
  advise_fresh_destination(*dst);
  return out;
}

nb::object as_buffer(const TensorInfo& t, const TensorView& view, nb::handle owner) {
  if (PyByteArray_Check(owner.ptr())) return nb::borrow(owner);
  return export_array(t, view, owner, Form::kBuffer);
}

}  // namespace safetensors::python
