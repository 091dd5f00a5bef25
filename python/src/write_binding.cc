// serialize and serialize_file (write_binding.h): a WritePlan over the caller's tensor memory, written with the
// GIL released. plan_file and pwrite_box serve writers that put the pieces of one file together from several
// processes (safetensors.distributed.save_state_dict): the layout alone, and one piece written at its offsets.
#include "write_binding.h"

#include <unistd.h>

#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "common.h"
#include "safetensors/dtype.h"
#include "safetensors/writer.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace safetensors::python {
namespace {

// (name, dtype code, header shape): a tensor whose layout is planned without its bytes.
using PyTensorDesc = std::tuple<std::string, std::string, std::vector<std::uint64_t>>;

// Writes all of `bytes` at `offset` of `fd`, retrying short writes and EINTR. Errors: kIo naming `what`.
Status pwrite_all(int fd, std::span<const std::byte> bytes, std::uint64_t offset, const std::string& what) {
  while (!bytes.empty()) {
    const ssize_t n = ::pwrite(fd, bytes.data(), bytes.size(), static_cast<off_t>(offset));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Error::io(what, "write", errno);
    if (n == 0) return Error::io(what, "write: no progress");
    bytes = bytes.subspan(static_cast<std::size_t>(n));
    offset += static_cast<std::uint64_t>(n);
  }
  return {};
}

// The byte runs of a box of a C-contiguous tensor, in order: the box's rows where it cuts an inner dimension.
// `shape` and `box` are in elements of `item` bytes; the local buffer is the box laid out C-contiguously, so
// the runs follow one another in it. Calls emit(file_offset, local_offset, size) for each run.
template <typename Emit>
Status for_each_run(const std::vector<std::uint64_t>& shape,
                    const std::vector<std::pair<std::uint64_t, std::uint64_t>>& box, std::uint64_t item, Emit&& emit) {
  const std::size_t ndim = shape.size();
  // Every product below is bounded by the tensor's byte size, which the caller's plan (WritePlan::make) checked
  // for overflow; the box lies inside the shape (checked here).
  std::vector<std::uint64_t> stride(ndim + 1, item);  // stride[d]: bytes per index of dimension d
  for (std::size_t d = ndim; d-- > 0;) {
    if (box[d].first > box[d].second || box[d].second > shape[d])
      return Error::invalid_argument("pwrite_box", "box outside the tensor's shape");
    stride[d] = stride[d + 1] * shape[d];
  }
  for (std::size_t d = 0; d < ndim; ++d)
    if (box[d].first == box[d].second) return {};
  // Dimensions after `cut` are whole in the box: each run spans them, from box[cut].first to box[cut].second.
  std::size_t cut = 0;
  for (std::size_t d = ndim; d-- > 0;) {
    if (box[d].first != 0 || box[d].second != shape[d]) {
      cut = d;
      break;
    }
  }
  const std::uint64_t run = ndim == 0 ? item : (box[cut].second - box[cut].first) * stride[cut + 1];
  std::vector<std::uint64_t> index(cut, 0);  // the position in the box's outer dimensions [0, cut)
  std::uint64_t local = 0;
  for (;;) {
    std::uint64_t at = ndim == 0 ? 0 : box[cut].first * stride[cut + 1];
    for (std::size_t d = 0; d < cut; ++d) at += (box[d].first + index[d]) * stride[d + 1];
    Status s = emit(at, local, run);
    if (!s.ok()) return s;
    local += run;
    std::size_t d = cut;
    while (d > 0 && ++index[d - 1] == box[d - 1].second - box[d - 1].first) index[--d] = 0;
    if (d == 0) return {};
  }
}

}  // namespace

void bind_write(nb::module_& m) {
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
        check(without_gil([&] { return serialize_into(plan, tensors, dst); }), Op::kSerialize);
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
        check(without_gil([&] { return save_file(path, tensors, md, WriteOptions{.fsync = fsync}); }), Op::kSerialize);
      },
      "tensors"_a, "path"_a, "metadata"_a = nb::none(), "fsync"_a = false,
      "Writes [(name, dtype code, shape, data_ptr, data_len)] to path atomically. Releases the GIL.");

  m.def(
      "plan_file",
      [](const std::vector<PyTensorDesc>& descs, const PyMetadata& metadata) {
        // The plan reads only names, dtypes, shapes and data sizes: each span has the size the tensor needs
        // and is never read, so it points at one byte of its own whatever its length.
        static const std::byte kNowhere{};
        std::vector<TensorData> tensors;
        tensors.reserve(descs.size());
        for (const auto& [name, code, shape] : descs) {
          const std::optional<Dtype> dtype = dtype_from_code(code);
          if (!dtype) raise_error(Error::invalid_argument(name, "unknown dtype " + code), Op::kSerialize);
          std::uint64_t bits = dtype_bits(*dtype);
          for (std::uint64_t d : shape) {
            if (__builtin_mul_overflow(bits, d, &bits)) raise_error(Error::validation_overflow("<plan>", name));
          }
          tensors.push_back({name, *dtype, shape, std::span<const std::byte>(&kNowhere, bits / 8)});
        }
        WritePlan plan = check(WritePlan::make(tensors, to_metadata(metadata)), Op::kSerialize);
        nb::list entries;
        for (const WritePlan::Entry& e : plan.entries())
          entries.append(nb::make_tuple(tensors[e.input].name, e.begin, e.end));
        return nb::make_tuple(nb::bytes(plan.prefix().data(), plan.prefix().size()), entries);
      },
      "tensors"_a, "metadata"_a = nb::none(),
      nb::sig("def plan_file(tensors: Sequence[tuple[str, str, Sequence[int]]], metadata: Sequence[tuple[str, str]] "
              "| None = None) -> tuple[bytes, list[tuple[str, int, int]]]"),
      "The layout serialize would give [(name, dtype code, shape)]: (the file's first bytes -- length, header, "
      "padding --, [(name, begin, end)] in file order, offsets relative to the data buffer).");

  m.def(
      "pwrite_box",
      [](int fd, std::uint64_t offset, const std::vector<std::uint64_t>& shape,
         const std::vector<std::pair<std::uint64_t, std::uint64_t>>& box, std::uint64_t item, std::uintptr_t ptr,
         std::uint64_t nbytes, const std::string& what) {
        if (box.size() != shape.size() || item == 0)
          raise_error(Error::invalid_argument("pwrite_box", "box and shape differ in rank"));
        std::uint64_t need = item;
        for (const auto& [start, stop] : box) need *= stop >= start ? stop - start : 0;
        if (need != nbytes) raise_error(Error::invalid_argument("pwrite_box", "buffer size is not the box's"));
        const std::byte* base = reinterpret_cast<const std::byte*>(ptr);
        check(without_gil([&] {
          return for_each_run(shape, box, item, [&](std::uint64_t at, std::uint64_t local, std::uint64_t size) {
            return pwrite_all(fd, std::span<const std::byte>(base + local, static_cast<std::size_t>(size)), offset + at,
                              what);
          });
        }));
      },
      "fd"_a, "offset"_a, "shape"_a, "box"_a, "item"_a, "ptr"_a, "nbytes"_a, "what"_a,
      "Writes the box [(start, stop)] of a C-contiguous tensor of shape (in elements of item bytes) whose "
      "bytes start at offset of fd, from nbytes at ptr (the box, C-contiguous): one positional write per run "
      "the box makes in the file (one for a box of whole rows). Bytes as they are (no byte swapping). "
      "Raises SafetensorIOError naming what. Releases the GIL.");
}

}  // namespace safetensors::python
