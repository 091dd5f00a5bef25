// Array export: the one way tensor bytes leave the binding without a copy.
//
// Every exported array is an `nb::ndarray` over bytes that a Python object owns: the open File for views of its
// mapping (its state holds the Source, so the mapping lives exactly as long as the last array, tensor or
// memoryview that uses it), or the bytearray an owned read filled. nanobind releases the owner from any thread,
// taking the GIL. Views come from File::view; nothing here computes an address.
#ifndef SAFETENSORS_PYTHON_EXPORT_H_
#define SAFETENSORS_PYTHON_EXPORT_H_

#include <nanobind/nanobind.h>

#include <cstddef>
#include <cstdint>
#include <span>

#include "safetensors/file.h"

namespace safetensors::python {

// How an exported array reaches Python.
enum class Form {
  // A "dltensor" capsule (the legacy DLPack ABI every torch release reads), typed as the tensor (dtype and
  // shape) where the dtype table has a DLPack code, else the tensor's bytes as a 1-d uint8 array, which the
  // adapter reinterprets (float8, float6, float4).
  kDlpack,
  // A memoryview of the bytes (1-d, format "B"): numpy and the frameworks built on it give it a dtype.
  kBuffer,
};

// The bytes of `view`, shaped as `t` (see Form), kept alive by the Python object `owner`, which owns them (or
// holds view.owner). Read-only unless view.writable.
nanobind::object export_array(const TensorInfo& t, const TensorView& view, nanobind::handle owner, Form form);

// New memory of `nbytes` bytes for a read of the file's bytes at `offset` to fill, marked with
// advise_fresh_destination; `*dst` receives its bytes. A bytearray (its own owner, and the buffer export
// itself), or where `alignment` is set (a direct source's ReadHints::alignment) and the tensor is large enough
// (kCongruentMinBytes), memory at an address congruent to `offset` modulo `alignment`, owned by a capsule, so
// that the read lands in it without a bounce (a bytearray's bytes lie 16 bytes into a page: never congruent).
// REQUIRES: the GIL.
nanobind::object owned_bytes(std::uint64_t nbytes, std::span<std::byte>* dst, std::uint64_t offset = 0,
                             std::uint64_t alignment = 0);
// Tensors below this size get a bytearray whatever the alignment: congruent memory costs up to an alignment
// of padding each.
inline constexpr std::uint64_t kCongruentMinBytes = std::uint64_t{64} << 10;

// An owned_bytes() owner as a buffer (memoryview-compatible) export of `view`: the bytearray itself, or a
// memoryview kept alive by the capsule.
nanobind::object as_buffer(const TensorInfo& t, const TensorView& view, nanobind::handle owner);

}  // namespace safetensors::python

#endif  // SAFETENSORS_PYTHON_EXPORT_H_
