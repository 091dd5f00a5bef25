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
// links torch (find_package(Torch) and target_link_libraries(... safetensors::safetensors torch)). Being
// header-only (the library never links torch), its length is its API: it is longer than the project's 500
// lines per file for that reason.
//
// Loading. On the CPU with the mmap backend, every tensor is a zero-copy view of the file's private
// (copy-on-write) mapping: writable, never writing the file, and keeping the mapping alive for as long as the
// tensor (or any view of its storage) lives -- after the returned map, and the File, are gone. A tensor whose
// bytes are not aligned to its element size (possible in files whose header length is not a multiple of 8)
// is copied instead, and so is every multi-byte tensor on a big-endian host (read into owned memory and
// swapped to native values; saving swaps back, see writer.h). With the pread backend (or a mapping that fell back to
// it) tensors own their memory and are read in parallel. For another device the bytes stream through the loading engine
// (engine.h): reader threads fill host slabs of a bounded SlabPool, each landed chunk is copied into the tensor's
// device memory, and a slab is recycled only once the device finished copying out of it. Slabs are page-locked where
// torch has a pinned host allocator for the device type (LoadOptions::pinned; CPU-only builds of torch have none, and
// then slabs are pageable): their copies are non-blocking, with an event recorded on the device's current stream after
// each and waited for before the slab goes back; copies from pageable slabs are synchronous. Every copy has completed
// when load() returns, so the tensors are ready on any stream. Host memory is the pool's capacity whatever the model
// size; device memory holds only the tensors. `meta` tensors read nothing. LoadOptions::stage_cpu runs that path for
// the CPU as well (copies out of slabs instead of views and direct reads). Packed dtypes use the dtype table's
// torch_pack: F4 loads as torch.float4_e2m1fn_x2, two values per byte, so the last dimension is divided by 2 and must
// be even. Dtypes torch has no type for (F6_E2M3, F6_E3M2) fail with kInvalidArgument naming the tensor.
//
// Saving. Each CPU tensor is written straight from its own memory; a tensor on another device is copied to
// the CPU first. Tensors must be contiguous and strided; a non-contiguous tensor fails with kInvalidArgument
// naming it (call .contiguous() first). torch.float4_e2m1fn_x2 is written as F4 with the last dimension
// doubled. Tensors that share memory are each written in full.
//
// Thread safety: the functions are free functions; concurrent calls on distinct data are safe (concurrent
// device loads share their slab pool, which is bounded for all of them together).
// Errors: a torch exception (c10::Error: a device that is not available, a meta tensor to save, ...) is
// turned into a kInvalidArgument Error naming the file; it does not propagate.
#ifndef SAFETENSORS_LIBTORCH_H_
#define SAFETENSORS_LIBTORCH_H_

#include <c10/core/DeviceGuard.h>
#include <c10/core/Event.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/types.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <mutex>
#include <new>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "safetensors/dtype.h"
#include "safetensors/engine.h"
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

// How load() moves the bytes of tensors it copies (see "Loading" at the top of this file).
struct LoadOptions {
  // Engine reader threads per file (at most PrefetchOptions::kMaxThreads run; 0 = kDefaultReaderThreads).
  unsigned threads = kDefaultReaderThreads;
  // The pool that stages device loads (and stage_cpu loads); its capacity bounds their host memory, for all
  // concurrent loads using it together. nullptr: for a device, the adapter's pool for its device type --
  // page-locked where this torch has a pinned host allocator for the type and `pinned` is set -- else
  // SlabPool::global() (pageable). A caller's pool is used as it is: a copy out of one of its slabs is
  // non-blocking only where torch counts the slab as page-locked (at::Context::isPinnedPtr).
  SlabPool* pool = nullptr;
  // Whether the adapter's own pool may be page-locked. false: pageable slabs and synchronous copies.
  bool pinned = true;
  // Loads onto the CPU through the staging slabs too, copying out of them, instead of zero-copy views and
  // direct reads: the device path, with host memory beyond the tensors bounded by the pool.
  bool stage_cpu = false;
};

// A SlabAllocator over torch's page-locked host allocator for `type` (at::Context::getPinnedMemoryAllocator:
// CUDA, XPU, or a PrivateUse1 backend that registers one), for a SlabPool that stages device loads; nullopt
// where this torch has none for the type (a CPU-only build asked for CUDA, the CPU, meta). The allocator's
// memory is freed through torch. Safe to call from any thread.
inline std::optional<SlabAllocator> pinned_slab_allocator(c10::DeviceType type) {
  if (type == c10::DeviceType::CPU || type == c10::DeviceType::Meta) return std::nullopt;
  at::Allocator* allocator = nullptr;
  try {
    allocator = at::globalContext().getPinnedMemoryAllocator(type);
  } catch (const c10::Error&) {  // no accelerator library for the type in this build
    return std::nullopt;
  }
  if (allocator == nullptr) return std::nullopt;
  struct Live {
    at::Allocator* allocator = nullptr;
    std::mutex mu;
    std::unordered_map<void*, c10::DataPtr> slabs;  // what torch handed out, by address, until freed
  };
  auto live = std::make_shared<Live>();
  live->allocator = allocator;
  SlabAllocator out;
  out.alloc = [live](std::size_t size) -> void* {
    try {
      c10::DataPtr slab = live->allocator->allocate(size);
      void* address = slab.get();
      if (address == nullptr) return nullptr;
      std::lock_guard<std::mutex> lock(live->mu);
      live->slabs.emplace(address, std::move(slab));
      return address;
    } catch (const std::exception&) {  // out of page-locked memory: the engine reports ENOMEM
      return nullptr;
    }
  };
  out.free = [live](void* address, std::size_t) {
    c10::DataPtr doomed;  // destroyed after the lock is released: freeing may take torch's own locks
    std::lock_guard<std::mutex> lock(live->mu);
    auto it = live->slabs.find(address);
    if (it == live->slabs.end()) return;
    doomed = std::move(it->second);
    live->slabs.erase(it);
  };
  return out;
}

namespace detail {

inline std::string quoted(std::string_view name) { return "`" + std::string(name) + "`"; }

// The torch sizes of a tensor: torch_shape() of its header shape (F4: two values per element).
inline Result<std::vector<std::int64_t>> torch_sizes(const File& file, const TensorInfo& t) {
  Result<std::vector<std::uint64_t>> shape = torch_shape(t.dtype, t.shape);
  if (!shape.ok())
    return Error::invalid_argument(file.path(), "tensor " + quoted(t.name) + ": " + shape.error().detail());
  std::vector<std::int64_t> sizes;
  sizes.reserve(shape->size());
  for (std::uint64_t d : *shape) {
    if (d > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) {
      return Error::invalid_argument(file.path(), "tensor " + quoted(t.name) + " has a dimension above 2^63");
    }
    sizes.push_back(static_cast<std::int64_t>(d));
  }
  return sizes;
}

inline Result<torch::ScalarType> torch_dtype_of(const File& file, const TensorInfo& t) {
  const auto type = to_torch_dtype(t.dtype);
  if (!type) {
    return Error::invalid_argument(file.path(), "tensor " + quoted(t.name) + " has dtype " +
                                                    std::string(dtype_code(t.dtype)) +
                                                    ", which torch has no dtype for");
  }
  return *type;
}

// A CPU tensor over the tensor's bytes in the mapping, kept alive by the tensor; nullopt where no zero-copy
// view is possible (pread backend, read-only memory, misaligned bytes, and a multi-byte dtype on a big-endian
// host: the file's little-endian bytes are not its values there, so read_into() copies and swaps them).
inline Result<std::optional<torch::Tensor>> try_view(const File& file, const TensorInfo& t, torch::ScalarType type,
                                                     const std::vector<std::int64_t>& sizes) {
  if (host_must_swap(t.dtype)) return std::optional<torch::Tensor>();
  Result<TensorView> asked = file.view(t);
  // view() of a tensor of the file fails only where there is no mapping (the pread backend).
  if (!asked.ok()) return std::optional<torch::Tensor>();
  TensorView view = std::move(asked).value();
  const auto address = reinterpret_cast<std::uintptr_t>(view.bytes.data());
  if (!view.writable || address % c10::elementSize(type) != 0) return std::optional<torch::Tensor>();
  // torch writes through the pointer only into this process's copy-on-write pages (view.writable).
  void* data = const_cast<std::byte*>(view.bytes.data());
  return std::optional<torch::Tensor>(torch::from_blob(
      data, sizes, [owner = std::move(view.owner)](void*) mutable { owner.reset(); },
      torch::TensorOptions().dtype(type)));
}

inline Error torch_error(const std::string& path, const c10::Error& e) {
  return Error::invalid_argument(path, std::string("torch: ") + e.what_without_backtrace());
}

inline Error move_error(const std::string& path, std::string_view name, const torch::Device& device,
                        const c10::Error& e) {
  return Error::invalid_argument(
      path, "cannot move tensor " + quoted(name) + " to " + device.str() + ": " + e.what_without_backtrace());
}

// Storage for an object that is never destroyed (the adapter's slab pools: their slabs may come from a torch
// allocator that is gone at exit).
template <typename T>
class NoDestructor {
 public:
  NoDestructor() { new (storage_) T(); }
  T& get() { return *std::launder(reinterpret_cast<T*>(storage_)); }

 private:
  alignas(T) unsigned char storage_[sizeof(T)];
};

// The adapter's staging pool for device loads onto `type`: page-locked slabs from torch where it has a pinned
// allocator for the type, created on first use with the default capacity; SlabPool::global() (pageable)
// where it has none.
inline SlabPool& device_pool(c10::DeviceType type) {
  struct Pools {
    std::mutex mu;
    std::array<std::unique_ptr<SlabPool>, static_cast<std::size_t>(c10::COMPILE_TIME_MAX_DEVICE_TYPES)> by_type;
    std::array<bool, static_cast<std::size_t>(c10::COMPILE_TIME_MAX_DEVICE_TYPES)> probed{};
  };
  static NoDestructor<Pools> pools;
  Pools& p = pools.get();
  const auto i = static_cast<std::size_t>(type);
  if (i >= p.by_type.size()) return SlabPool::global();
  std::lock_guard<std::mutex> lock(p.mu);
  if (!p.probed[i]) {
    p.probed[i] = true;
    if (std::optional<SlabAllocator> pinned = pinned_slab_allocator(type)) {
      auto pool = std::make_unique<SlabPool>();
      if (pool->set_allocator(std::move(*pinned)).ok()) p.by_type[i] = std::move(pool);
    }
  }
  return p.by_type[i] ? *p.by_type[i] : SlabPool::global();
}

// Whether torch counts `p` as page-locked memory for `type` (so that a copy from it may be non-blocking).
inline bool is_page_locked(const void* p, c10::DeviceType type) {
  if (type == c10::DeviceType::CPU || type == c10::DeviceType::Meta) return false;
  try {
    return at::globalContext().isPinnedPtr(p, type);
  } catch (const c10::Error&) {
    return false;
  }
}

// Streams `tensors` (each one of `file`'s) through the engine into new tensors on `device`, stored in *out:
// reader threads fill staging slabs, each landed chunk is copied into the tensor's bytes on the device
// (non-blocking from page-locked slabs, with an event; synchronous otherwise; a memcpy on the CPU), and its
// slab returns to the pool once that copy completed (CopyQueue). Returns once every copy completed.
inline Status stage_into(const File& file, const std::vector<const TensorInfo*>& tensors, const torch::Device& device,
                         const LoadOptions& options, TensorMap* out) {
  // Destination bytes: one flat byte tensor per tensor, which the returned tensor views with its dtype and sizes.
  std::vector<torch::Tensor> dst;
  std::vector<Piece> plan;
  dst.reserve(tensors.size());
  plan.reserve(tensors.size());
  for (const TensorInfo* t : tensors) {
    SAFETENSORS_ASSIGN_OR_RETURN(torch::ScalarType type, torch_dtype_of(file, *t));
    SAFETENSORS_ASSIGN_OR_RETURN(std::vector<std::int64_t> sizes, torch_sizes(file, *t));
    SAFETENSORS_ASSIGN_OR_RETURN(Piece piece, tensor_piece(file, *t));
    // nbytes <= the file's size (validated at open), which fits an int64 (off_t).
    const auto nbytes = static_cast<std::int64_t>(t->nbytes());
    try {
      dst.push_back(torch::empty({nbytes}, torch::TensorOptions().dtype(torch::kUInt8).device(device)));
      (*out)[std::string(t->name)] = dst.back().view(type).view(sizes);
    } catch (const c10::Error& e) {
      return move_error(file.path(), t->name, device, e);
    }
    plan.push_back(piece);
  }
  if (plan.empty()) return ok_status();
  const torch::Device on = dst.front().device();  // with its index (the current device for "cuda")
  const bool to_cpu = on.is_cpu();
  SlabPool* pool = options.pool;
  if (pool == nullptr) pool = options.pinned && !to_cpu ? &device_pool(on.type()) : &SlabPool::global();
  SAFETENSORS_ASSIGN_OR_RETURN(std::unique_ptr<Prefetcher> prefetcher,
                               Prefetcher::start(file, std::move(plan), {.threads = options.threads, .pool = pool}));
  std::optional<c10::DeviceGuard> guard;
  std::optional<c10::Stream> stream;
  if (!to_cpu) {
    guard.emplace(on);
    stream = c10::impl::getDeviceGuardImpl(on.type())->getStream(on);
  }
  std::unordered_map<const std::byte*, bool> page_locked;  // per slab allocation
  // Every slab goes back through `copies` (CopyQueue, engine.h): only once the copy out of it completed.
  // Declared after the Prefetcher, so it waits for the copies in flight first, also on the way out of an error.
  CopyQueue copies(*prefetcher);
  std::vector<std::size_t> landed;  // unused: every tensor is complete when this returns
  for (;;) {
    Result<PrefetchEvent> ev = copies.next(&landed);
    if (!ev.ok()) return std::move(ev).error();  // names the file and the tensor
    if (ev->kind == PrefetchEvent::Kind::kEnd) break;
    if (ev->kind == PrefetchEvent::Kind::kTimeout) continue;
    if (ev->bytes.empty()) continue;  // a zero-size tensor: no slab
    const TensorInfo& t = *tensors[ev->piece];
    // A chunk lies in one piece; offset + size <= the piece's size, an int64 like nbytes above.
    const auto offset = static_cast<std::int64_t>(ev->offset);
    const auto size = static_cast<std::int64_t>(ev->bytes.size());
    if (to_cpu) {
      std::memcpy(static_cast<std::byte*>(dst[ev->piece].data_ptr()) + offset, ev->bytes.data(), ev->bytes.size());
      copies.add(ev->slab, {});  // complete already
      continue;
    }
    auto known = page_locked.find(ev->slab_data);
    if (known == page_locked.end()) {
      known = page_locked.emplace(ev->slab_data, is_page_locked(ev->slab_data, on.type())).first;
    }
    const bool non_blocking = known->second;
    try {
      // torch only reads the source of a copy; the slab stays the engine's.
      const torch::Tensor src = torch::from_blob(const_cast<std::byte*>(ev->bytes.data()), {size},
                                                 torch::TensorOptions().dtype(torch::kUInt8));
      dst[ev->piece].narrow(0, offset, size).copy_(src, non_blocking);
      if (!non_blocking) {
        copies.add(ev->slab, {});  // a blocking copy has read all of its source when copy_ returns
        continue;
      }
      auto done = std::make_shared<c10::Event>(on.type());
      done->record(*stream);
      copies.add(ev->slab, {[done] { return done->query(); }, [done] { done->synchronize(); }});
    } catch (const c10::Error& e) {
      copies.add(ev->slab, {});  // the device does not read the slab of a copy that failed to start
      return move_error(file.path(), t.name, on, e);
    }
  }
  return copies.finish(&landed);
}

inline const File& shard_for(const File& file, const TensorInfo&) { return file; }
inline const File& shard_for(const ShardedFile& sharded, const TensorInfo& t) { return sharded.file_of(t); }

inline Result<torch::Tensor> load_tensor(const File& file, const TensorInfo& tensor, const torch::Device& device,
                                         const LoadOptions& options) {
  SAFETENSORS_ASSIGN_OR_RETURN(torch::ScalarType type, detail::torch_dtype_of(file, tensor));
  SAFETENSORS_ASSIGN_OR_RETURN(std::vector<std::int64_t> sizes, detail::torch_sizes(file, tensor));
  if (device.is_meta()) return torch::empty(sizes, torch::TensorOptions().dtype(type).device(device));
  if (!device.is_cpu() || options.stage_cpu) {
    TensorMap one;
    SAFETENSORS_RETURN_IF_ERROR(stage_into(file, {&tensor}, device, options, &one));
    return std::move(one.begin()->second);
  }
  SAFETENSORS_ASSIGN_OR_RETURN(std::optional<torch::Tensor> view, detail::try_view(file, tensor, type, sizes));
  if (view) return std::move(*view);
  torch::Tensor out = torch::empty(sizes, torch::TensorOptions().dtype(type));
  SAFETENSORS_RETURN_IF_ERROR(
      file.read_into(tensor, std::span<std::byte>(static_cast<std::byte*>(out.data_ptr()), out.nbytes())));
  return out;
}

// Every tensor of a File or a ShardedFile. CPU: zero-copy views where possible, one parallel read_many for the
// rest. Another device (or stage_cpu): the engine, one Prefetcher per file in turn. meta: no I/O.
template <typename Tensors>
Result<TensorMap> load_all(const Tensors& files, const torch::Device& device, const LoadOptions& options) {
  TensorMap out;
  out.reserve(files.tensors().size());
  if (device.is_meta()) {
    for (const TensorInfo& t : files.tensors()) {
      const File& file = shard_for(files, t);
      SAFETENSORS_ASSIGN_OR_RETURN(torch::ScalarType type, detail::torch_dtype_of(file, t));
      SAFETENSORS_ASSIGN_OR_RETURN(std::vector<std::int64_t> sizes, detail::torch_sizes(file, t));
      out[std::string(t.name)] = torch::empty(sizes, torch::TensorOptions().dtype(type).device(device));
    }
    return out;
  }
  if (!device.is_cpu() || options.stage_cpu) {
    // The tensors of each file, in order (a ShardedFile lists them shard by shard).
    std::vector<std::pair<const File*, std::vector<const TensorInfo*>>> by_file;
    for (const TensorInfo& t : files.tensors()) {
      const File* file = &shard_for(files, t);
      if (by_file.empty() || by_file.back().first != file) by_file.emplace_back(file, std::vector<const TensorInfo*>());
      by_file.back().second.push_back(&t);
    }
    for (const auto& [file, tensors] : by_file) {
      SAFETENSORS_RETURN_IF_ERROR(stage_into(*file, tensors, device, options, &out));
    }
    return out;
  }
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
  return out;
}

}  // namespace detail

// One tensor of `file`, on `device` (another device: through the engine, see LoadOptions). Errors:
// kInvalidArgument (a dtype torch lacks, an F4 tensor with an odd last dimension, a device torch cannot copy
// to, any other torch failure), kIo (a short read of a file that shrank, naming the file and the tensor).
inline Result<torch::Tensor> load_tensor(const File& file, const TensorInfo& tensor,
                                         const torch::Device& device = torch::kCPU, const LoadOptions& options = {}) {
  try {
    return detail::load_tensor(file, tensor, device, options);
  } catch (const c10::Error& e) {
    return detail::torch_error(file.path(), e);
  }
}

// Every tensor of `file`, on `device`. Tensors that need a copy on the CPU are read in parallel
// (File::read_many); loads onto another device stream through the engine's reader threads and staging slabs.
// Errors: those of load_tensor().
inline Result<TensorMap> load(const File& file, const torch::Device& device = torch::kCPU,
                              const LoadOptions& options = {}) {
  try {
    return detail::load_all(file, device, options);
  } catch (const c10::Error& e) {
    return detail::torch_error(file.path(), e);
  }
}

// Opens `path` with `backend` and loads every tensor onto `device`. Without a backend: kMmap for the CPU (zero-copy
// views) and meta, kAuto for every other device (direct reads of a file the page cache does not hold, source.h).
// Errors: those of File::open() and load_tensor().
inline Result<TensorMap> load(const std::string& path, const torch::Device& device = torch::kCPU,
                              std::optional<Backend> backend = std::nullopt, const LoadOptions& options = {}) {
  const Backend chosen = backend ? *backend : device.is_cpu() || device.is_meta() ? Backend::kMmap : Backend::kAuto;
  SAFETENSORS_ASSIGN_OR_RETURN(File file, File::open(path, {.backend = chosen}));
  return load(file, device, options);
}

// Every visible tensor of a sharded checkpoint (ShardedFile::open_index / open_files), on `device`; CPU
// copies from different shards are read in parallel, device loads stream one shard after another. Errors: those of
// load_tensor(), each naming its shard.
inline Result<TensorMap> load(const ShardedFile& sharded, const torch::Device& device = torch::kCPU,
                              const LoadOptions& options = {}) {
  try {
    return detail::load_all(sharded, device, options);
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
    if (!dtype)
      return bad(std::string("has dtype ") + c10::toString(original.scalar_type()) +
                 ", which safetensors cannot store");
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
    std::vector<std::uint64_t> sizes;
    for (std::int64_t s : cpu->sizes()) sizes.push_back(static_cast<std::uint64_t>(s));
    // The header holds logical values: header_shape() of torch's sizes (F4's last dimension doubled).
    Result<std::vector<std::uint64_t>> shape = header_shape(d.dtype, sizes);
    if (!shape.ok()) {
      return Error::invalid_argument(path, "tensor " + detail::quoted(name) + ": " + shape.error().detail());
    }
    d.shape = std::move(shape).value();
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
