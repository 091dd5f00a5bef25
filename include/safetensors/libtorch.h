// libtorch adapter: safetensors files to and from torch::Tensor, header-only.
//
//   #include <safetensors/libtorch.h>
//   auto tensors = safetensors::libtorch::load("model.safetensors");          // CPU, zero-copy
//   if (!tensors.ok()) { std::cerr << tensors.error().to_string() << "\n"; return 1; }
//   torch::Tensor w = tensors->at("lm_head.weight");
//   auto st = safetensors::libtorch::save("out.safetensors", *tensors, safetensors::Metadata{{"format", "pt"}});
//
// This header is the one place that maps dtypes between the library and torch (as torch.py is for Python).
// It needs libtorch (torch/types.h) and is not compiled into the library itself: include it from code that
// links torch (find_package(Torch) and target_link_libraries(... safetensors::safetensors torch)).
//
// Loading. On the CPU with the mmap backend, every tensor is a zero-copy view of the file's private
// (copy-on-write) mapping: writable, never writing the file, and keeping the mapping alive for as long as the
// tensor (or any view of its storage) lives -- after the returned map, and the File, are gone. A tensor whose
// bytes are not aligned to its element size (possible in files whose header length is not a multiple of 8)
// is copied instead. With the pread backend (or a mapping that fell back to it) tensors own their memory and
// are read in parallel. For another device the bytes are copied once, from the mapping (or the CPU tensor
// read with pread) to that device. F4 loads as torch.float4_e2m1fn_x2, two values per byte: the last
// dimension is halved, and must be even. Dtypes torch has no type for (F6_E2M3, F6_E3M2) fail with
// kInvalidArgument naming the tensor.
//
// Saving. Each CPU tensor is written straight from its own memory; a tensor on another device is copied to
// the CPU first. Tensors must be contiguous and strided; a non-contiguous tensor fails with kInvalidArgument
// naming it (call .contiguous() first). torch.float4_e2m1fn_x2 is written as F4 with the last dimension
// doubled. Tensors that share memory are each written in full.
//
// Thread safety: the functions are free functions; concurrent calls on distinct data are safe.
// Errors: a torch exception (c10::Error: a device that is not available, a meta tensor to save, ...) is
// turned into a kInvalidArgument Error naming the file; it does not propagate.
#ifndef SAFETENSORS_LIBTORCH_H_
#define SAFETENSORS_LIBTORCH_H_

#include <torch/types.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "safetensors/dtype.h"
#include "safetensors/error.h"
#include "safetensors/file.h"
#include "safetensors/sharded.h"
#include "safetensors/writer.h"

namespace safetensors::libtorch {

using TensorMap = std::unordered_map<std::string, torch::Tensor>;

// The torch dtype for `dtype`, or nullopt (F6_E2M3, F6_E3M2).
inline std::optional<torch::ScalarType> to_torch_dtype(Dtype dtype) {
  switch (dtype) {
    case Dtype::kBool: return torch::kBool;
    case Dtype::kF4: return torch::kFloat4_e2m1fn_x2;
    case Dtype::kF6_E2M3:
    case Dtype::kF6_E3M2: return std::nullopt;
    case Dtype::kU8: return torch::kUInt8;
    case Dtype::kI8: return torch::kInt8;
    case Dtype::kF8_E5M2: return torch::kFloat8_e5m2;
    case Dtype::kF8_E4M3: return torch::kFloat8_e4m3fn;
    case Dtype::kF8_E8M0: return torch::kFloat8_e8m0fnu;
    case Dtype::kF8_E4M3FNUZ: return torch::kFloat8_e4m3fnuz;
    case Dtype::kF8_E5M2FNUZ: return torch::kFloat8_e5m2fnuz;
    case Dtype::kI16: return torch::kInt16;
    case Dtype::kU16: return torch::kUInt16;
    case Dtype::kF16: return torch::kFloat16;
    case Dtype::kBF16: return torch::kBFloat16;
    case Dtype::kI32: return torch::kInt32;
    case Dtype::kU32: return torch::kUInt32;
    case Dtype::kF32: return torch::kFloat32;
    case Dtype::kC64: return torch::kComplexFloat;
    case Dtype::kF64: return torch::kFloat64;
    case Dtype::kI64: return torch::kInt64;
    case Dtype::kU64: return torch::kUInt64;
  }
  return std::nullopt;
}

// The safetensors dtype for a torch dtype, or nullopt (complex128, complex32, quantized and bit types, ...).
inline std::optional<Dtype> from_torch_dtype(torch::ScalarType type) {
  for (const DtypeInfo& row : kDtypeTable) {
    if (to_torch_dtype(row.dtype) == type) return row.dtype;
  }
  return std::nullopt;
}

namespace detail {

inline std::string quoted(std::string_view name) { return "`" + std::string(name) + "`"; }

// The torch sizes of a tensor: its shape, with F4's last dimension halved (two values per byte).
inline Result<std::vector<std::int64_t>> torch_sizes(const File& file, const TensorInfo& t) {
  std::vector<std::int64_t> sizes;
  sizes.reserve(t.shape.size());
  for (std::uint64_t d : t.shape) {
    if (d > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) {
      return Error::invalid_argument(file.path(), "tensor " + quoted(t.name) + " has a dimension above 2^63");
    }
    sizes.push_back(static_cast<std::int64_t>(d));
  }
  if (t.dtype == Dtype::kF4) {
    if (sizes.empty() || sizes.back() % 2 != 0) {
      return Error::invalid_argument(file.path(), "tensor " + quoted(t.name) +
                                                      ": F4 loads as torch.float4_e2m1fn_x2 (two values per "
                                                      "byte), which needs an even last dimension");
    }
    sizes.back() /= 2;
  }
  return sizes;
}

inline Result<torch::ScalarType> torch_dtype_of(const File& file, const TensorInfo& t) {
  const auto type = to_torch_dtype(t.dtype);
  if (!type) {
    return Error::invalid_argument(file.path(), "tensor " + quoted(t.name) + " has dtype " +
                                                    std::string(dtype_code(t.dtype)) + ", which torch has no dtype for");
  }
  return *type;
}

// A CPU tensor over the tensor's bytes in the mapping, kept alive by the tensor; nullopt where no zero-copy
// view is possible (pread backend, read-only memory, misaligned bytes).
inline Result<std::optional<torch::Tensor>> try_view(const File& file, const TensorInfo& t, torch::ScalarType type,
                                                     const std::vector<std::int64_t>& sizes) {
  if (file.source()->data() == nullptr) return std::optional<torch::Tensor>();
  SAFETENSORS_ASSIGN_OR_RETURN(TensorView view, file.view(t));
  const auto address = reinterpret_cast<std::uintptr_t>(view.bytes.data());
  if (!view.writable || address % c10::elementSize(type) != 0) return std::optional<torch::Tensor>();
  // torch writes through the pointer only into this process's copy-on-write pages (view.writable).
  void* data = const_cast<std::byte*>(view.bytes.data());
  return std::optional<torch::Tensor>(
      torch::from_blob(data, sizes, [owner = std::move(view.owner)](void*) mutable { owner.reset(); },
                       torch::TensorOptions().dtype(type)));
}

inline Status to_device(const std::string& path, std::string_view name, torch::Tensor* t, const torch::Device& device) {
  if (t->device() == device) return ok_status();
  try {
    *t = t->to(device);
  } catch (const c10::Error& e) {
    return Error::invalid_argument(path, "cannot move tensor " + quoted(name) + " to " + device.str() + ": " +
                                             e.what_without_backtrace());
  }
  return ok_status();
}

inline Error torch_error(const std::string& path, const c10::Error& e) {
  return Error::invalid_argument(path, std::string("torch: ") + e.what_without_backtrace());
}

inline Result<torch::Tensor> load_tensor(const File& file, const TensorInfo& tensor, const torch::Device& device) {
  SAFETENSORS_ASSIGN_OR_RETURN(torch::ScalarType type, detail::torch_dtype_of(file, tensor));
  SAFETENSORS_ASSIGN_OR_RETURN(std::vector<std::int64_t> sizes, detail::torch_sizes(file, tensor));
  SAFETENSORS_ASSIGN_OR_RETURN(std::optional<torch::Tensor> view, detail::try_view(file, tensor, type, sizes));
  torch::Tensor out;
  if (view) {
    out = std::move(*view);
  } else {
    out = torch::empty(sizes, torch::TensorOptions().dtype(type));
    SAFETENSORS_RETURN_IF_ERROR(
        file.read_into(tensor, std::span<std::byte>(static_cast<std::byte*>(out.data_ptr()), out.nbytes())));
  }
  SAFETENSORS_RETURN_IF_ERROR(detail::to_device(file.path(), tensor.name, &out, device));
  return out;
}

inline const File& shard_for(const File& file, const TensorInfo&) { return file; }
inline const File& shard_for(const ShardedFile& sharded, const TensorInfo& t) { return sharded.file_of(t); }

// Every tensor of a File or a ShardedFile: zero-copy views where possible, one parallel read_many for the rest.
template <typename Tensors>
Result<TensorMap> load_all(const Tensors& files, const torch::Device& device) {
  TensorMap out;
  out.reserve(files.tensors().size());
  std::vector<ReadRequest> reads;
  for (const TensorInfo& t : files.tensors()) {
    const File& file = shard_for(files, t);
    SAFETENSORS_ASSIGN_OR_RETURN(torch::ScalarType type, detail::torch_dtype_of(file, t));
    SAFETENSORS_ASSIGN_OR_RETURN(std::vector<std::int64_t> sizes, detail::torch_sizes(file, t));
    SAFETENSORS_ASSIGN_OR_RETURN(std::optional<torch::Tensor> view, detail::try_view(file, t, type, sizes));
    torch::Tensor& slot = out[std::string(t.name)];
    if (view) {
      slot = std::move(*view);
    } else {
      slot = torch::empty(sizes, torch::TensorOptions().dtype(type));
      reads.push_back({&t, std::span<std::byte>(static_cast<std::byte*>(slot.data_ptr()), slot.nbytes())});
    }
  }
  SAFETENSORS_RETURN_IF_ERROR(files.read_many(reads));
  if (device.is_cpu()) return out;
  for (const TensorInfo& t : files.tensors()) {
    SAFETENSORS_RETURN_IF_ERROR(to_device(shard_for(files, t).path(), t.name, &out[std::string(t.name)], device));
  }
  return out;
}

}  // namespace detail

// One tensor of `file`, on `device`. Errors: kInvalidArgument (a dtype torch lacks, an F4 tensor with an
// odd last dimension, a device torch cannot copy to, any other torch failure), kIo.
inline Result<torch::Tensor> load_tensor(const File& file, const TensorInfo& tensor,
                                         const torch::Device& device = torch::kCPU) {
  try {
    return detail::load_tensor(file, tensor, device);
  } catch (const c10::Error& e) {
    return detail::torch_error(file.path(), e);
  }
}

// Every tensor of `file`, on `device`. Tensors that need a copy on the CPU are read in parallel
// (File::read_many). Errors: those of load_tensor().
inline Result<TensorMap> load(const File& file, const torch::Device& device = torch::kCPU) {
  try {
    return detail::load_all(file, device);
  } catch (const c10::Error& e) {
    return detail::torch_error(file.path(), e);
  }
}

// Opens `path` with `backend` and loads every tensor onto `device`. Errors: those of File::open() and
// load_tensor().
inline Result<TensorMap> load(const std::string& path, const torch::Device& device = torch::kCPU,
                              Backend backend = Backend::kMmap) {
  SAFETENSORS_ASSIGN_OR_RETURN(File file, File::open(path, {.backend = backend}));
  return load(file, device);
}

// Every visible tensor of a sharded checkpoint (ShardedFile::open_index / open_files), on `device`; copies
// from different shards are read in parallel. Errors: those of load_tensor(), each naming its shard.
inline Result<TensorMap> load(const ShardedFile& sharded, const torch::Device& device = torch::kCPU) {
  try {
    return detail::load_all(sharded, device);
  } catch (const c10::Error& e) {
    return detail::torch_error(sharded.index_path().empty() ? std::string("<shards>") : sharded.index_path(), e);
  }
}

namespace detail {

inline Status save(const std::string& path, const TensorMap& tensors, const std::optional<Metadata>& metadata,
                   const WriteOptions& options) {
  std::vector<TensorData> data;
  // CPU copies of tensors from other devices, alive until the write returns.
  std::vector<torch::Tensor> copies;
  data.reserve(tensors.size());
  copies.reserve(tensors.size());
  for (const auto& entry : tensors) {
    // Named references, not structured bindings: clang 14 cannot capture those in the lambda.
    const std::string& name = entry.first;
    const torch::Tensor& original = entry.second;
    auto bad = [&](const std::string& why) {
      return Error::invalid_argument(path, "tensor " + detail::quoted(name) + " " + why);
    };
    if (!original.defined()) return bad("is undefined");
    if (original.layout() != torch::kStrided) return bad("is not a strided (dense) tensor");
    if (!original.is_contiguous()) return bad("is not contiguous; call .contiguous() before saving");
    const auto dtype = from_torch_dtype(original.scalar_type());
    if (!dtype) return bad(std::string("has dtype ") + c10::toString(original.scalar_type()) + ", which safetensors cannot store");
    const torch::Tensor* cpu = &original;
    if (!original.device().is_cpu()) {
      try {
        copies.push_back(original.to(torch::kCPU));
      } catch (const c10::Error& e) {
        return bad(std::string("cannot be copied to the CPU: ") + e.what_without_backtrace());
      }
      cpu = &copies.back();
    }
    TensorData d;
    d.name = name;
    d.dtype = *dtype;
    for (std::int64_t s : cpu->sizes()) d.shape.push_back(static_cast<std::uint64_t>(s));
    if (d.dtype == Dtype::kF4) {
      if (d.shape.empty()) return bad("is a float4_e2m1fn_x2 scalar; F4 needs at least one dimension");
      d.shape.back() *= 2;
    }
    d.data = std::span<const std::byte>(static_cast<const std::byte*>(cpu->data_ptr()), cpu->nbytes());
    data.push_back(std::move(d));
  }
  return save_file(path, data, metadata, options);
}

}  // namespace detail

// Writes `tensors` to `path` atomically (save_file), byte for byte as the reference writes them.
// Errors: kInvalidArgument (an undefined, sparse, non-contiguous or meta tensor, or one whose dtype safetensors
// cannot store; the text names the tensor), the errors of save_file() (kNotFound for a missing directory, kIo).
inline Status save(const std::string& path, const TensorMap& tensors, const std::optional<Metadata>& metadata = {},
                   const WriteOptions& options = {}) {
  try {
    return detail::save(path, tensors, metadata, options);
  } catch (const c10::Error& e) {
    return detail::torch_error(path, e);
  }
}

}  // namespace safetensors::libtorch

#endif  // SAFETENSORS_LIBTORCH_H_
