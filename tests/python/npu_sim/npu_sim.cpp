// A simulated Ascend NPU for tests: a PrivateUse1 backend whose "device memory" is host memory that is
// allocated, counted and freed per simulated device, separately from every CPU allocation.
//
// What it registers (at load time, before Python renames PrivateUse1 to "npu"):
//   - an allocator for PrivateUse1: page-aligned mapped host blocks, filled with 0xCB (device memory is never
//     zeroed), each recorded in a registry under the device that was current when it was allocated, and
//     closed to the host (PROT_NONE) except while this backend's own kernels copy or fill it;
//   - a device guard (current device per thread, like CUDA/ACL; device count set by npu_sim::configure),
//     with no-op streams and events;
//   - PrivateUse1 hooks: availability, device-from-pointer, and a host-pinned allocator (pin_memory());
//   - kernels: empty / empty_strided (allocate on the requested device), _copy_from (every direction,
//     counted), fill_/zero_, resize_, set_ and the aten view ops that have no composite kernel; every other
//     aten op falls back to the CPU kernel (at::native::cpu_fallback: inputs copied to the CPU, outputs and
//     mutated inputs copied back), and is counted by name;
//   - npu_sim::* ops that Python uses for configuration and bookkeeping.
// Nothing here is fast or asynchronous: a non_blocking copy is a synchronous memcpy.

#include <ATen/EmptyTensor.h>
#include <ATen/core/Tensor.h>
#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <ATen/native/CPUFallback.h>
#include <ATen/ops/_reshape_alias_cpu_dispatch.h>
#include <ATen/ops/as_strided_cpu_dispatch.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/set_cpu_dispatch.h>
#include <ATen/ops/unfold_cpu_dispatch.h>
#include <ATen/ops/view_as_complex_cpu_dispatch.h>
#include <ATen/ops/view_as_real_cpu_dispatch.h>
#include <ATen/ops/view_cpu_dispatch.h>
#include <c10/core/Allocator.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/library.h>

#include <array>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <map>
#include <sys/mman.h>
#include <unistd.h>
#include <mutex>
#include <iterator>
#include <string>
#include <vector>

namespace npu_sim {
namespace {

constexpr c10::DeviceType kNpu = c10::DeviceType::PrivateUse1;
constexpr int kMaxDevices = 16;
constexpr size_t kPinnedAlignment = 512;
constexpr unsigned char kPoison = 0xCB;
constexpr int kPinnedSlot = kMaxDevices;  // registry slot of host-pinned blocks

std::atomic<int> g_device_count{0};  // 0 until configure(); the guard then rejects every index
thread_local c10::DeviceIndex t_current_device = 0;

void check_index(c10::DeviceIndex index) {
  const int count = g_device_count.load();
  TORCH_CHECK(index >= 0 && index < count, "npu_sim: invalid device ordinal ", static_cast<int>(index),
              ": the simulated backend has ", count, " npu device(s)");
}

// Every live block of simulated device memory (slots 0..15) and of pinned host memory (slot 16).
//
// Device blocks are mapped pages that the host may not touch (PROT_NONE), as the host cannot touch real device
// memory: only this backend's kernels open them (HostAccess) while they copy or fill. So code that reads or
// writes an npu tensor through its data_ptr() from the host crashes here, as it would on an NPU. Protection is
// on unless configure() turns it off; a block whose protection fails (too many mappings) stays accessible.
struct Counters {
  int64_t live_bytes = 0;
  int64_t live_blocks = 0;
  int64_t total_blocks = 0;
  int64_t total_bytes = 0;
};

std::atomic<bool> g_protect{true};
const size_t kPageSize = static_cast<size_t>(sysconf(_SC_PAGESIZE));

class Registry {
 public:
  void add(void* ptr, size_t size, size_t mapped, int slot, bool is_protected) {
    std::lock_guard<std::mutex> lock(mu_);
    blocks_[reinterpret_cast<uintptr_t>(ptr)] = Block{size, mapped, slot, 0, is_protected};
    Counters& c = counters_[slot];
    c.live_bytes += static_cast<int64_t>(size);
    c.live_blocks += 1;
    c.total_blocks += 1;
    c.total_bytes += static_cast<int64_t>(size);
  }

  // Forgets the block; returns its mapped size (0 for a heap block).
  size_t remove(void* ptr) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = blocks_.find(reinterpret_cast<uintptr_t>(ptr));
    TORCH_INTERNAL_ASSERT(it != blocks_.end(), "npu_sim: freeing a pointer it did not allocate");
    Counters& c = counters_[it->second.slot];
    c.live_bytes -= static_cast<int64_t>(it->second.size);
    c.live_blocks -= 1;
    const size_t mapped = it->second.mapped;
    blocks_.erase(it);
    return mapped;
  }

  // The slot of the block containing `ptr` (one past the end does not count), or -1.
  int slot_of(const void* ptr) const {
    std::lock_guard<std::mutex> lock(mu_);
    const Block* block = find(ptr);
    return block == nullptr ? -1 : block->slot;
  }

  // Opens the protected device block containing `ptr` to the host; returns its base, or nullptr when there is
  // nothing to open (host memory, or an unprotected block). Nested and concurrent openings are counted.
  void* open(const void* ptr) {
    std::lock_guard<std::mutex> lock(mu_);
    Block* block = find(ptr);
    if (block == nullptr || !block->is_protected) return nullptr;
    void* base = reinterpret_cast<void*>(base_of(ptr));
    TORCH_CHECK(block->open > 0 || mprotect(base, block->mapped, PROT_READ | PROT_WRITE) == 0,
                "npu_sim: mprotect failed");
    ++block->open;
    return base;
  }

  void close(void* base) noexcept {
    std::lock_guard<std::mutex> lock(mu_);
    Block* block = find(base);
    if (block != nullptr && --block->open == 0) mprotect(base, block->mapped, PROT_NONE);
  }

  Counters counters(int slot) const {
    std::lock_guard<std::mutex> lock(mu_);
    return counters_[slot];
  }

 private:
  struct Block {
    size_t size;
    size_t mapped;  // mmap length of a device block, 0 for a heap (pinned) block
    int slot;
    int open;       // HostAccess windows now open on a protected block
    bool is_protected;
  };

  uintptr_t base_of(const void* ptr) const { return std::prev(blocks_.upper_bound(reinterpret_cast<uintptr_t>(ptr)))->first; }

  Block* find(const void* ptr) const {
    const auto address = reinterpret_cast<uintptr_t>(ptr);
    auto it = blocks_.upper_bound(address);
    if (it == blocks_.begin()) return nullptr;
    --it;
    return address < it->first + it->second.size ? const_cast<Block*>(&it->second) : nullptr;
  }

  mutable std::mutex mu_;
  std::map<uintptr_t, Block> blocks_;
  std::array<Counters, kMaxDevices + 1> counters_{};
};

Registry& registry() {
  static Registry* instance = new Registry();  // never destroyed: tensors may outlive static destruction
  return *instance;
}

// Lets this backend's own kernels touch the device block holding `ptr` for the scope's lifetime.
class HostAccess {
 public:
  explicit HostAccess(const void* ptr) : base_(ptr == nullptr ? nullptr : registry().open(ptr)) {}
  ~HostAccess() {
    if (base_ != nullptr) registry().close(base_);
  }
  HostAccess(const HostAccess&) = delete;
  HostAccess& operator=(const HostAccess&) = delete;

 private:
  void* base_;
};

void* allocate_device_block(size_t size, int slot) {
  const size_t mapped = (size + kPageSize - 1) / kPageSize * kPageSize;
  void* ptr = mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  TORCH_CHECK(ptr != MAP_FAILED, "npu_sim: out of memory allocating ", size, " bytes on npu:", slot);
  std::memset(ptr, kPoison, size);
  const bool is_protected = g_protect.load() && mprotect(ptr, mapped, PROT_NONE) == 0;
  registry().add(ptr, size, mapped, slot, is_protected);
  return ptr;
}

void free_device_block(void* ptr) {
  const size_t mapped = registry().remove(ptr);
  munmap(ptr, mapped);
}

void* allocate_pinned_block(size_t size) {
  void* ptr = nullptr;
  TORCH_CHECK(posix_memalign(&ptr, kPinnedAlignment, size) == 0 && ptr != nullptr, "npu_sim: out of memory allocating ",
              size, " pinned bytes");
  registry().add(ptr, size, 0, kPinnedSlot, false);
  return ptr;
}

void free_pinned_block(void* ptr) {
  registry().remove(ptr);
  std::free(ptr);
}

// Device memory: the block goes to the current device of the calling thread (kernels set it with a guard).
struct DeviceAllocator final : c10::Allocator {
  c10::DataPtr allocate(size_t size) override {
    const c10::DeviceIndex index = t_current_device;
    check_index(index);
    const c10::Device device(kNpu, index);
    if (size == 0) return {nullptr, nullptr, &free_nothing, device};
    void* ptr = allocate_device_block(size, index);
    return {ptr, ptr, &free_device_block, device};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &free_device_block; }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    const HostAccess dest_access(dest);
    const HostAccess src_access(src);
    std::memcpy(dest, src, count);
  }

  static void free_nothing(void*) {}
};

// Host-pinned memory: CPU tensors, but recorded so that isPinnedPtr can answer.
struct PinnedAllocator final : c10::Allocator {
  c10::DataPtr allocate(size_t size) override {
    const c10::Device device(c10::DeviceType::CPU);
    if (size == 0) return {nullptr, nullptr, &DeviceAllocator::free_nothing, device};
    void* ptr = allocate_pinned_block(size);
    return {ptr, ptr, &free_pinned_block, device};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &free_pinned_block; }
  void copy_data(void* dest, const void* src, std::size_t count) const override { std::memcpy(dest, src, count); }
};

DeviceAllocator g_device_allocator;
PinnedAllocator g_pinned_allocator;
REGISTER_ALLOCATOR(kNpu, &g_device_allocator);

std::atomic<int64_t> g_stream_ids{0};

struct GuardImpl final : c10::impl::DeviceGuardImplInterface {
  c10::DeviceType type() const override { return kNpu; }
  c10::Device exchangeDevice(c10::Device device) const override {
    const c10::Device previous = getDevice();
    if (device.index() != previous.index()) setDevice(device);
    return previous;
  }
  c10::Device getDevice() const override { return c10::Device(kNpu, t_current_device); }
  void setDevice(c10::Device device) const override {
    TORCH_CHECK(device.type() == kNpu, "npu_sim: expected an npu device, got ", device);
    if (device.index() < 0) return;  // "npu" without an index: stay on the current device
    check_index(device.index());
    t_current_device = device.index();
  }
  void uncheckedSetDevice(c10::Device device) const noexcept override {
    if (device.index() >= 0 && device.index() < g_device_count.load()) t_current_device = device.index();
  }
  c10::Stream getStream(c10::Device device) const override { return c10::Stream(c10::Stream::DEFAULT, device); }
  c10::Stream getDefaultStream(c10::Device device) const override {
    return c10::Stream(c10::Stream::DEFAULT, device);
  }
  c10::Stream getNewStream(c10::Device device, int /*priority*/) const override {
    return c10::Stream(c10::Stream::UNSAFE, device, ++g_stream_ids);
  }
  c10::Stream getStreamFromGlobalPool(c10::Device device, bool /*high_priority*/) const override {
    return c10::Stream(c10::Stream::DEFAULT, device);
  }
  c10::Stream exchangeStream(c10::Stream stream) const override {
    return c10::Stream(c10::Stream::DEFAULT, stream.device());
  }
  c10::DeviceIndex deviceCount() const noexcept override {
    return static_cast<c10::DeviceIndex>(g_device_count.load());
  }
  // Everything is synchronous, so events and streams are always complete.
  void record(void** /*event*/, const c10::Stream& /*stream*/, const c10::DeviceIndex /*device_index*/,
              const c10::EventFlag /*flag*/) const override {}
  void block(void* /*event*/, const c10::Stream& /*stream*/) const override {}
  bool queryEvent(void* /*event*/) const override { return true; }
  void destroyEvent(void* /*event*/, const c10::DeviceIndex /*device_index*/) const noexcept override {}
  bool queryStream(const c10::Stream& /*stream*/) const override { return true; }
  void synchronizeStream(const c10::Stream& /*stream*/) const override {}
  void synchronizeEvent(void* /*event*/) const override {}
  void synchronizeDevice(const c10::DeviceIndex /*device_index*/) const override {}
  void recordDataPtrOnStream(const c10::DataPtr& /*data_ptr*/, const c10::Stream& /*stream*/) const override {}
};

C10_REGISTER_GUARD_IMPL(PrivateUse1, GuardImpl);

// Reallocates a device storage on its own device, keeping the bytes that fit.
void resize_storage_bytes(c10::StorageImpl* impl, size_t new_size) {
  TORCH_CHECK(impl->resizable(), "npu_sim: trying to resize a storage that is not resizable");
  const c10::DeviceGuard guard(impl->device());
  c10::DataPtr data = g_device_allocator.allocate(new_size);
  const size_t keep = std::min(new_size, impl->nbytes());
  if (keep > 0) g_device_allocator.copy_data(data.get(), impl->data(), keep);
  impl->set_data_ptr_noswap(std::move(data));
  impl->set_nbytes(new_size);
}

struct Hooks final : at::PrivateUse1HooksInterface {
  bool isBuilt() const override { return true; }
  bool isAvailable() const override { return g_device_count.load() > 0; }
  bool hasPrimaryContext(c10::DeviceIndex index) const override {
    return index >= 0 && index < g_device_count.load();
  }
  c10::DeviceIndex deviceCount() const override { return static_cast<c10::DeviceIndex>(g_device_count.load()); }
  void setCurrentDevice(c10::DeviceIndex index) const override {
    check_index(index);
    t_current_device = index;
  }
  c10::DeviceIndex getCurrentDevice() const override { return t_current_device; }
  c10::DeviceIndex exchangeDevice(c10::DeviceIndex index) const override {
    const c10::DeviceIndex previous = t_current_device;
    setCurrentDevice(index);
    return previous;
  }
  c10::DeviceIndex maybeExchangeDevice(c10::DeviceIndex index) const override { return exchangeDevice(index); }
  at::Device getDeviceFromPtr(void* data) const override {
    const int slot = registry().slot_of(data);
    TORCH_CHECK(slot >= 0 && slot < kMaxDevices, "npu_sim: pointer ", data, " is not simulated npu memory");
    return at::Device(kNpu, static_cast<c10::DeviceIndex>(slot));
  }
  bool isPinnedPtr(const void* data) const override { return registry().slot_of(data) == kPinnedSlot; }
  at::Allocator* getPinnedMemoryAllocator() const override { return &g_pinned_allocator; }
  void resizePrivateUse1Bytes(const c10::Storage& storage, size_t new_size) const override {
    resize_storage_bytes(storage.unsafeGetStorageImpl(), new_size);
  }
};

const bool g_hooks_registered = [] {
  at::RegisterPrivateUse1HooksInterface(new Hooks());  // lives for the process, as torch expects
  return true;
}();

// ---- bookkeeping of copies by direction, and of ops that ran through the CPU fallback ----
// Copies made by the fallback (moving an op's inputs to the CPU and its outputs back) are counted apart, so
// that the h2d/d2h/d2d counters show exactly the copies the code under test asked for.
enum Direction { kHostToDevice = 0, kDeviceToHost = 1, kDeviceToDevice = 2, kByFallback = 3 };
std::array<std::atomic<int64_t>, 4> g_copy_count{};
std::array<std::atomic<int64_t>, 4> g_copy_bytes{};
std::atomic<int64_t> g_non_blocking_copies{0};
thread_local int t_fallback_depth = 0;
std::mutex g_fallback_mu;
std::map<std::string, int64_t> g_fallback_ops;

// ---- kernels ----
constexpr c10::DispatchKeySet kNpuKeys(c10::DispatchKey::PrivateUse1);

at::Tensor empty_memory_format(at::IntArrayRef size, std::optional<at::ScalarType> dtype,
                               std::optional<at::Layout> layout, std::optional<at::Device> device,
                               std::optional<bool> pin_memory, std::optional<at::MemoryFormat> memory_format) {
  const at::Device target = c10::device_or_default(device);
  TORCH_CHECK(target.type() == kNpu, "npu_sim: empty() called for device ", target);
  TORCH_CHECK(c10::layout_or_default(layout) == at::Layout::Strided, "npu_sim: only strided tensors are supported");
  TORCH_CHECK(!c10::pinned_memory_or_default(pin_memory), "Only dense CPU tensors can be pinned");
  const c10::DeviceGuard guard(target);
  return at::detail::empty_generic(size, &g_device_allocator, kNpuKeys, c10::dtype_or_default(dtype),
                                   memory_format);
}

at::Tensor empty_strided(at::IntArrayRef size, at::IntArrayRef stride, std::optional<at::ScalarType> dtype,
                         std::optional<at::Layout> layout, std::optional<at::Device> device,
                         std::optional<bool> pin_memory) {
  const at::Device target = c10::device_or_default(device);
  TORCH_CHECK(target.type() == kNpu, "npu_sim: empty_strided() called for device ", target);
  TORCH_CHECK(c10::layout_or_default(layout) == at::Layout::Strided, "npu_sim: only strided tensors are supported");
  TORCH_CHECK(!c10::pinned_memory_or_default(pin_memory), "Only dense CPU tensors can be pinned");
  const c10::DeviceGuard guard(target);
  return at::detail::empty_strided_generic(size, stride, &g_device_allocator, kNpuKeys,
                                           c10::dtype_or_default(dtype));
}

// An integer type of the same width, so that a same-dtype copy moves bits, whatever the dtype
// (float8/float4 and other "bits" dtypes have no arithmetic on CPU).
std::optional<at::ScalarType> same_width_integer(int64_t itemsize) {
  switch (itemsize) {
    case 1: return at::kByte;
    case 2: return at::kShort;
    case 4: return at::kInt;
    case 8: return at::kLong;
    default: return std::nullopt;
  }
}

// A CPU tensor over the same bytes (no copy, no ownership) with the same sizes and strides.
at::Tensor host_alias(const at::Tensor& t, at::ScalarType dtype) {
  if (t.device().is_cpu() && dtype == t.scalar_type()) return t;
  at::Tensor alias = at::from_blob(t.data_ptr(), t.sizes(), t.strides(),
                                   at::TensorOptions().dtype(dtype).device(c10::DeviceType::CPU));
  alias._set_conj(t.is_conj());
  alias._set_neg(t.is_neg());
  return alias;
}

at::Tensor copy_from(const at::Tensor& src, const at::Tensor& dst, bool non_blocking) {
  const bool from_npu = src.device().type() == kNpu;
  const bool to_npu = dst.device().type() == kNpu;
  TORCH_CHECK((from_npu || src.device().is_cpu()) && (to_npu || dst.device().is_cpu()) && (from_npu || to_npu),
              "npu_sim: cannot copy from ", src.device(), " to ", dst.device());
  const Direction direction = t_fallback_depth > 0 ? kByFallback
                              : from_npu           ? (to_npu ? kDeviceToDevice : kDeviceToHost)
                                                   : kHostToDevice;
  if (dst.numel() > 0) {
    at::ScalarType src_type = src.scalar_type();
    at::ScalarType dst_type = dst.scalar_type();
    if (src_type == dst_type && !src.is_conj() && !src.is_neg()) {
      if (auto bits = same_width_integer(static_cast<int64_t>(src.element_size()))) src_type = dst_type = *bits;
    }
    const HostAccess dst_access(dst.data_ptr());
    const HostAccess src_access(src.data_ptr());
    host_alias(dst, dst_type).copy_(host_alias(src, src_type));
  }
  g_copy_count[direction] += 1;
  g_copy_bytes[direction] += static_cast<int64_t>(dst.numel()) * static_cast<int64_t>(dst.element_size());
  if (non_blocking && t_fallback_depth == 0) g_non_blocking_copies += 1;
  return dst;
}

at::Tensor& fill_scalar(at::Tensor& self, const at::Scalar& value) {
  if (self.numel() > 0) {
    const HostAccess access(self.data_ptr());
    host_alias(self, self.scalar_type()).fill_(value);
  }
  return self;
}

at::Tensor& zero(at::Tensor& self) { return fill_scalar(self, 0); }

const at::Tensor& resize_(const at::Tensor& self, at::IntArrayRef size,
                          std::optional<at::MemoryFormat> memory_format) {
  c10::TensorImpl* impl = self.unsafeGetTensorImpl();
  if (self.sizes() != size) impl->set_sizes_contiguous(size);
  if (impl->numel() > 0) {
    const size_t needed = at::detail::computeStorageNbytesContiguous(size, self.dtype().itemsize(),
                                                                     static_cast<size_t>(self.storage_offset()));
    if (needed > self.storage().nbytes()) resize_storage_bytes(self.storage().unsafeGetStorageImpl(), needed);
  }
  if (memory_format.has_value()) {
    TORCH_CHECK(*memory_format != at::MemoryFormat::Preserve, "npu_sim: unsupported memory format ", *memory_format);
    self.unsafeGetTensorImpl()->empty_tensor_restride(*memory_format);
  }
  return self;
}

at::Tensor copy_from_and_resize(const at::Tensor& src, const at::Tensor& dst) {
  if (dst.numel() == 0) resize_(dst, src.sizes(), std::nullopt);
  return copy_from(src, dst, false);
}

at::Tensor& set_storage(at::Tensor& self, at::Storage source) {
  const int64_t size = static_cast<int64_t>(source.nbytes() / self.dtype().itemsize());
  return at::cpu::set_(self, std::move(source), 0, {size}, {});
}

at::Tensor& set_empty(at::Tensor& self) {
  const c10::DeviceGuard guard(self.device());
  c10::Storage storage(c10::Storage::use_byte_size_t(), 0, &g_device_allocator, /*resizable=*/true);
  return at::cpu::set_(self, std::move(storage), 0, {0}, {});
}

at::Tensor& set_tensor(at::Tensor& self, const at::Tensor& source) {
  return at::cpu::set_(self, source.storage(), source.storage_offset(), source.sizes(), source.strides());
}

struct FallbackScope {
  FallbackScope() { ++t_fallback_depth; }
  ~FallbackScope() { --t_fallback_depth; }
};

void fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  {
    const c10::OperatorName& name = op.operator_name();
    std::lock_guard<std::mutex> lock(g_fallback_mu);
    g_fallback_ops[name.overload_name.empty() ? name.name : name.name + "." + name.overload_name] += 1;
  }
  const FallbackScope scope;
  at::native::cpu_fallback(op, stack);
}

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("empty.memory_format", empty_memory_format);
  m.impl("empty_strided", empty_strided);
  m.impl("_copy_from", copy_from);
  m.impl("_copy_from_and_resize", copy_from_and_resize);
  m.impl("resize_", resize_);
  m.impl("fill_.Scalar", fill_scalar);
  m.impl("zero_", zero);
  m.impl("set_", set_empty);
  m.impl("set_.source_Tensor", set_tensor);
  m.impl("set_.source_Storage", set_storage);
  m.impl("set_.source_Storage_storage_offset",
         static_cast<at::Tensor& (*)(at::Tensor&, at::Storage, int64_t, at::IntArrayRef, at::IntArrayRef)>(
             &at::cpu::set_));
  m.impl("as_strided",
         static_cast<at::Tensor (*)(const at::Tensor&, at::IntArrayRef, at::IntArrayRef, std::optional<int64_t>)>(
             &at::cpu::as_strided));
  m.impl("view", static_cast<at::Tensor (*)(const at::Tensor&, at::IntArrayRef)>(&at::cpu::view));
  m.impl("_reshape_alias",
         static_cast<at::Tensor (*)(const at::Tensor&, at::IntArrayRef, at::IntArrayRef)>(&at::cpu::_reshape_alias));
  m.impl("unfold", &at::cpu::unfold);
  m.impl("view_as_real", &at::cpu::view_as_real);
  m.impl("view_as_complex", &at::cpu::view_as_complex);
}

TORCH_LIBRARY_IMPL(_, PrivateUse1, m) { m.fallback(torch::CppFunction::makeFromBoxedFunction<&fallback>()); }

// ---- the npu_sim ops Python uses ----
void configure(int64_t num_devices, bool protect_device_memory) {
  g_protect = protect_device_memory;
  TORCH_CHECK(num_devices >= 1 && num_devices <= kMaxDevices, "npu_sim: num_devices must be in [1, ", kMaxDevices,
              "], got ", num_devices);
  g_device_count = static_cast<int>(num_devices);
}

int64_t device_count() { return g_device_count.load(); }
int64_t current_device() { return t_current_device; }
void set_device(int64_t index) {
  TORCH_CHECK(index >= 0 && index < kMaxDevices, "npu_sim: invalid device ordinal ", index);
  check_index(static_cast<c10::DeviceIndex>(index));
  t_current_device = static_cast<c10::DeviceIndex>(index);
}

// The simulated device holding the byte at t.data_ptr(), -2 for pinned host memory, -1 for anything else
// (ordinary CPU memory, or a tensor without bytes).
int64_t device_of(const at::Tensor& t) {
  if (!t.defined() || !t.has_storage() || t.storage().data() == nullptr) return -1;
  const void* ptr = static_cast<const char*>(t.storage().data()) + t.storage_offset() * t.element_size();
  const int slot = registry().slot_of(ptr);
  if (slot == kPinnedSlot) return -2;
  return slot;
}

// [live_bytes, live_blocks, total_blocks, total_bytes] of a device; index -1 means pinned host memory.
std::vector<int64_t> memory_stats(int64_t index) {
  TORCH_CHECK(index >= -1 && index < kMaxDevices, "npu_sim: invalid device ordinal ", index);
  const Counters c = registry().counters(index == -1 ? kPinnedSlot : static_cast<int>(index));
  return {c.live_bytes, c.live_blocks, c.total_blocks, c.total_bytes};
}

// [h2d count, h2d bytes, d2h count, d2h bytes, d2d count, d2d bytes, fallback count, fallback bytes,
//  non_blocking count]
std::vector<int64_t> copy_stats() {
  std::vector<int64_t> out;
  for (int d = 0; d < 4; ++d) {
    out.push_back(g_copy_count[d].load());
    out.push_back(g_copy_bytes[d].load());
  }
  out.push_back(g_non_blocking_copies.load());
  return out;
}

void reset_copy_stats() {
  for (int d = 0; d < 4; ++d) {
    g_copy_count[d] = 0;
    g_copy_bytes[d] = 0;
  }
  g_non_blocking_copies = 0;
  std::lock_guard<std::mutex> lock(g_fallback_mu);
  g_fallback_ops.clear();
}

// "name=count" for every aten op that ran through the CPU fallback since the last reset, ';'-separated.
std::string fallback_ops() {
  std::lock_guard<std::mutex> lock(g_fallback_mu);
  std::string out;
  for (const auto& [name, count] : g_fallback_ops) {
    if (!out.empty()) out += ';';
    out += name + "=" + std::to_string(count);
  }
  return out;
}

TORCH_LIBRARY(npu_sim, m) {
  m.def("configure(int num_devices, bool protect_device_memory) -> ()", configure);
  m.def("device_count() -> int", device_count);
  m.def("current_device() -> int", current_device);
  m.def("set_device(int index) -> ()", set_device);
  m.def("device_of(Tensor t) -> int", device_of);
  m.def("memory_stats(int index) -> int[]", memory_stats);
  m.def("copy_stats() -> int[]", copy_stats);
  m.def("reset_copy_stats() -> ()", reset_copy_stats);
  m.def("fallback_ops() -> str", fallback_ops);
}

}  // namespace
}  // namespace npu_sim
