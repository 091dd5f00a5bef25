// A simulated Ascend NPU for tests: a PrivateUse1 backend whose "device memory" is host memory that is
// allocated, counted and freed per simulated device, separately from every CPU allocation.
//
// What it registers (at load time, before Python renames PrivateUse1 to "npu"):
//   - an allocator for PrivateUse1: page-aligned mapped host blocks, filled with 0xCB (device memory is never
//     zeroed), each recorded in a registry under the device that was current when it was allocated, and
//     closed to the host (PROT_NONE) except while this backend's own kernels copy or fill it;
//   - a device guard (current device per thread, like CUDA/ACL; device count set by npu_sim::configure),
//     whose streams and events follow each device's copy queue (below);
//   - PrivateUse1 hooks: availability, device-from-pointer, and a host-pinned allocator (pin_memory());
//   - kernels: empty / empty_strided (allocate on the requested device), _copy_from (every direction,
//     counted), fill_/zero_, resize_, set_ and the aten view ops that have no composite kernel; every other
//     aten op falls back to the CPU kernel (at::native::cpu_fallback: inputs copied to the CPU, outputs and
//     mutated inputs copied back), and is counted by name;
//   - npu_sim::* ops that Python uses for configuration and bookkeeping.
//
// Asynchrony, as on a real device with one stream per device: a host-to-device copy asked for non_blocking
// from pinned host memory (outside the CPU fallback) is only enqueued on the destination device's queue. One
// worker thread per device (started on first use) runs the queue in FIFO order, each copy after a delay
// (NPU_SIM_COPY_DELAY_US, set_copy_delay_us; default 2000 us), reading the source bytes when it runs, not when
// it was issued: a loader that overwrites a pinned buffer before the device copied out of it gets the new
// bytes on the device, as it would on an NPU. Every other operation on a device's memory (blocking copies in
// any direction, device-to-host copies, fill_/zero_, resize, the CPU fallback, freeing device memory) first
// waits until that device's queue is drained, so a single stream's ordering holds. Events record the queue's
// position; queryEvent/synchronizeEvent/block and the stream and device synchronizations wait on it. A queue
// can be paused (pause_queue) so that tests decide deterministically what has run; waiting on a paused queue
// is an error rather than a hang. Pageable non_blocking copies stay synchronous, as on CUDA.

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
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <pthread.h>
#include <sys/mman.h>
#include <unistd.h>
#include <mutex>
#include <iterator>
#include <string>
#include <thread>
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

// ---- the per-device copy queues (one simulated stream per device) ----
std::atomic<int64_t> g_copy_delay_us{2000};  // how long each queued copy waits before it runs
std::atomic<bool> g_async_enabled{true};     // false: every copy is synchronous, as before
std::atomic<int64_t> g_async_copies{0};      // queued copies that have run
std::atomic<int64_t> g_async_bytes{0};       // bytes they wrote
std::atomic<int64_t> g_max_queue_depth{0};   // most copies pending on one queue at once (the one running included)
thread_local bool t_is_worker = false;

// The copy timeline, for benchmarks: per queued copy that ran, [device, bytes, issued_ns, started_ns,
// finished_ns] on std::chrono::steady_clock (CLOCK_MONOTONIC, Python's time.monotonic_ns). started is when the
// queue took the copy up (its delay, the simulated transfer, runs from there), finished when its bytes landed.
std::atomic<bool> g_timeline_enabled{false};
std::mutex g_timeline_mu;
std::vector<int64_t> g_timeline;

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// A CPU tensor over the bytes of `t` (no copy, no ownership) with its sizes, strides, conj and neg bits.
at::Tensor alias_of(const at::Tensor& t, at::ScalarType dtype) {
  at::Tensor alias = at::from_blob(t.data_ptr(), t.sizes(), t.strides(),
                                   at::TensorOptions().dtype(dtype).device(c10::DeviceType::CPU));
  alias._set_conj(t.is_conj());
  alias._set_neg(t.is_neg());
  return alias;
}

// A host-to-device copy waiting on a device queue. The aliases were made when the copy was issued (later
// changes to the tensors' metadata do not move it); the storages keep both sides' memory alive until it ran.
struct CopyJob {
  c10::Storage dst_storage;
  c10::Storage src_storage;
  at::Tensor dst;  // alias of the device bytes
  at::Tensor src;  // alias of the pinned host bytes
  int64_t bytes = 0;
  int64_t seq = 0;
  int64_t issued_ns = 0;
};

void run_copy(const CopyJob& job) {
  const HostAccess dst_access(job.dst.data_ptr());
  const at::Tensor& dst = job.dst;
  const at::Tensor& src = job.src;
  const bool plain = dst.scalar_type() == src.scalar_type() && dst.sizes() == src.sizes() && dst.is_contiguous() &&
                     src.is_contiguous() && !dst.is_conj() && !src.is_conj() && !dst.is_neg() && !src.is_neg();
  if (plain) {
    std::memcpy(dst.data_ptr(), src.data_ptr(), static_cast<size_t>(job.bytes));
  } else {
    dst.copy_(src);
  }
}

class CopyQueue {
 public:
  explicit CopyQueue(int index) : index_(index) {}

  // Appends the job; returns its sequence number (1, 2, ...). Starts the worker on first use.
  int64_t enqueue(CopyJob job) {
    std::vector<CopyJob> finished;  // destroyed after the lock is released (may free memory)
    int64_t seq = 0;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!started_) {
        std::thread(&CopyQueue::work, this).detach();
        started_ = true;
      }
      seq = job.seq = ++enqueued_;
      job.issued_ns = now_ns();
      jobs_.push_back(std::move(job));
      const int64_t depth = enqueued_ - completed_;
      int64_t seen = g_max_queue_depth.load();
      while (depth > seen && !g_max_queue_depth.compare_exchange_weak(seen, depth)) {
      }
      finished.swap(finished_);
    }
    work_cv_.notify_one();
    return seq;
  }

  // The sequence number of the last job enqueued (0 before the first): what an event records.
  int64_t position() const {
    std::lock_guard<std::mutex> lock(mu_);
    return enqueued_;
  }

  bool reached(int64_t seq) const {
    std::lock_guard<std::mutex> lock(mu_);
    return completed_ >= seq;
  }

  int64_t pending() const {
    std::lock_guard<std::mutex> lock(mu_);
    return enqueued_ - completed_;
  }

  // Waits until job `seq` (every job enqueued so far when seq < 0) has run, then reports a copy that failed.
  // A paused queue would never get there: that is an error (a quiet wait just returns).
  void wait(int64_t seq, bool quiet) {
    std::vector<CopyJob> finished;
    std::string error;
    {
      std::unique_lock<std::mutex> lock(mu_);
      if (seq < 0) seq = enqueued_;
      done_cv_.wait(lock, [&] { return completed_ >= seq || paused_; });
      if (completed_ < seq) {
        if (quiet) return;
        lock.unlock();
        TORCH_CHECK(false, "npu_sim: waiting for the copy queue of npu:", index_, ", which is paused with ",
                    pending(), " copy(ies) pending: resume_queue(", index_, ") first (waiting would hang)");
      }
      finished.swap(finished_);
      if (!quiet) error.swap(error_);
    }
    finished.clear();
    TORCH_CHECK(error.empty(), "npu_sim: an asynchronous copy on npu:", index_, " failed: ", error);
  }

  // Drops the finished jobs' hold on their memory.
  void collect() {
    std::vector<CopyJob> finished;
    std::lock_guard<std::mutex> lock(mu_);
    finished.swap(finished_);
    // `finished` is destroyed after `lock` (declared first): outside the mutex
  }

  void set_paused(bool paused) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      paused_ = paused;
    }
    work_cv_.notify_all();
    done_cv_.notify_all();  // waiters on a queue now paused give up instead of hanging
  }

 private:
  // The worker: runs the jobs in order. It never drops the last reference to a storage (finished jobs are
  // released by the threads that wait or enqueue), since that may need the GIL or wait on this queue.
  void work() {
    t_is_worker = true;
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      work_cv_.wait(lock, [&] { return !jobs_.empty() && !paused_; });
      CopyJob job = std::move(jobs_.front());
      jobs_.pop_front();
      lock.unlock();
      const int64_t started_ns = now_ns();
      const int64_t delay = g_copy_delay_us.load();
      if (delay > 0) std::this_thread::sleep_for(std::chrono::microseconds(delay));
      std::string error;
      try {
        run_copy(job);
        g_async_copies += 1;
        g_async_bytes += job.bytes;
      } catch (const std::exception& e) {
        error = e.what();
      }
      if (error.empty() && g_timeline_enabled.load()) {
        const int64_t finished_ns = now_ns();
        std::lock_guard<std::mutex> timeline_lock(g_timeline_mu);
        g_timeline.insert(g_timeline.end(), {index_, job.bytes, job.issued_ns, started_ns, finished_ns});
      }
      job.dst = at::Tensor();  // the aliases own nothing
      job.src = at::Tensor();
      lock.lock();
      completed_ = job.seq;
      if (!error.empty() && error_.empty()) error_ = error;
      finished_.push_back(std::move(job));
      done_cv_.notify_all();
    }
  }

  const int index_;
  mutable std::mutex mu_;
  std::condition_variable work_cv_;
  std::condition_variable done_cv_;
  std::deque<CopyJob> jobs_;
  std::vector<CopyJob> finished_;
  std::string error_;
  int64_t enqueued_ = 0;
  int64_t completed_ = 0;
  bool paused_ = false;
  bool started_ = false;
};

std::array<CopyQueue*, kMaxDevices> g_queues = [] {
  std::array<CopyQueue*, kMaxDevices> queues{};
  for (int i = 0; i < kMaxDevices; ++i) queues[i] = new CopyQueue(i);  // never destroyed, like the registry
  return queues;
}();

// A forked child has no worker threads (and maybe a mutex held by one): it starts with fresh, empty queues.
const bool g_atfork_registered = [] {
  pthread_atfork(nullptr, nullptr, [] {
    for (int i = 0; i < kMaxDevices; ++i) g_queues[i] = new CopyQueue(i);
  });
  return true;
}();

CopyQueue& queue(int index) {
  TORCH_CHECK(index >= 0 && index < kMaxDevices, "npu_sim: invalid device ordinal ", index);
  return *g_queues[index];
}

// Waits until every copy queued on device `index` has run.
void drain(int index) { queue(index).wait(-1, false); }

void drain_device_of(const at::Tensor& t) {
  if (t.defined() && t.device().type() == kNpu && t.device().index() >= 0) drain(t.device().index());
}

// For paths that may not throw (freeing memory): skips a paused queue, and the worker never waits on itself.
void drain_quietly(int index) noexcept {
  if (t_is_worker || index < 0 || index >= kMaxDevices) return;
  try {
    queue(index).wait(-1, true);
  } catch (...) {
  }
}

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
  drain_quietly(registry().slot_of(ptr));  // the device is done with everything queued before the free
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
    for (const void* ptr : {static_cast<const void*>(dest), src}) {
      const int slot = registry().slot_of(ptr);
      if (slot >= 0 && slot < kMaxDevices) drain(slot);
    }
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

// What a recorded event points at: a position in a device's copy queue.
struct SimEvent {
  c10::DeviceIndex device = -1;
  int64_t seq = 0;
};

c10::DeviceIndex stream_index(const c10::Stream& stream) {
  const c10::DeviceIndex index = stream.device_index() < 0 ? t_current_device : stream.device_index();
  check_index(index);
  return index;
}

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
  // Every stream of a device is that device's one copy queue. An event records the queue's position (the
  // last copy enqueued so far) and is complete once the queue has run that far.
  void record(void** event, const c10::Stream& stream, const c10::DeviceIndex device_index,
              const c10::EventFlag /*flag*/) const override {
    const c10::DeviceIndex index = stream_index(stream);
    TORCH_CHECK(device_index == -1 || device_index == index, "npu_sim: event device index ",
                static_cast<int>(device_index), " does not match recording stream's device index ",
                static_cast<int>(index));
    auto* sim_event = static_cast<SimEvent*>(*event);
    if (sim_event == nullptr) {
      sim_event = new SimEvent();
      *event = sim_event;
    }
    sim_event->device = index;
    sim_event->seq = queue(index).position();
  }
  // A stream waits for an event: with one queue per device, an event of the same device is already in order;
  // one of another device is waited for here, until its queue has run up to the event.
  void block(void* event, const c10::Stream& stream) const override {
    const auto* sim_event = static_cast<const SimEvent*>(event);
    if (sim_event == nullptr || sim_event->device == stream_index(stream)) return;
    queue(sim_event->device).wait(sim_event->seq, false);
  }
  bool queryEvent(void* event) const override {
    const auto* sim_event = static_cast<const SimEvent*>(event);
    return sim_event == nullptr || queue(sim_event->device).reached(sim_event->seq);
  }
  void destroyEvent(void* event, const c10::DeviceIndex /*device_index*/) const noexcept override {
    delete static_cast<SimEvent*>(event);
  }
  bool queryStream(const c10::Stream& stream) const override { return queue(stream_index(stream)).pending() == 0; }
  void synchronizeStream(const c10::Stream& stream) const override { drain(stream_index(stream)); }
  void synchronizeEvent(void* event) const override {
    const auto* sim_event = static_cast<const SimEvent*>(event);
    if (sim_event != nullptr) queue(sim_event->device).wait(sim_event->seq, false);
  }
  void synchronizeDevice(const c10::DeviceIndex device_index) const override {
    const c10::DeviceIndex index = device_index < 0 ? t_current_device : device_index;
    check_index(index);
    drain(index);
  }
  void recordDataPtrOnStream(const c10::DataPtr& /*data_ptr*/, const c10::Stream& /*stream*/) const override {}
};

C10_REGISTER_GUARD_IMPL(PrivateUse1, GuardImpl);

// Reallocates a device storage on its own device, keeping the bytes that fit.
void resize_storage_bytes(c10::StorageImpl* impl, size_t new_size) {
  TORCH_CHECK(impl->resizable(), "npu_sim: trying to resize a storage that is not resizable");
  const c10::DeviceGuard guard(impl->device());
  drain(impl->device().index());
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
  const int64_t bytes = static_cast<int64_t>(dst.numel()) * static_cast<int64_t>(dst.element_size());
  if (dst.numel() > 0) {
    at::ScalarType src_type = src.scalar_type();
    at::ScalarType dst_type = dst.scalar_type();
    if (src_type == dst_type && !src.is_conj() && !src.is_neg()) {
      if (auto bits = same_width_integer(static_cast<int64_t>(src.element_size()))) src_type = dst_type = *bits;
    }
    // Asynchronous, as on a device: non_blocking, host to device, from pinned memory, asked for by the code
    // (not the CPU fallback). The copy reads the source when the queue runs it.
    if (non_blocking && t_fallback_depth == 0 && direction == kHostToDevice && g_async_enabled.load() &&
        registry().slot_of(src.data_ptr()) == kPinnedSlot) {
      CopyJob job;
      job.dst_storage = dst.storage();
      job.src_storage = src.storage();
      job.dst = alias_of(dst, dst_type);
      job.src = alias_of(src, src_type);
      job.bytes = bytes;
      queue(dst.device().index()).enqueue(std::move(job));
    } else {
      if (from_npu) drain(src.device().index());
      if (to_npu) drain(dst.device().index());
      const HostAccess dst_access(dst.data_ptr());
      const HostAccess src_access(src.data_ptr());
      host_alias(dst, dst_type).copy_(host_alias(src, src_type));
    }
  }
  g_copy_count[direction] += 1;
  g_copy_bytes[direction] += bytes;
  if (non_blocking && t_fallback_depth == 0) g_non_blocking_copies += 1;
  return dst;
}

at::Tensor& fill_scalar(at::Tensor& self, const at::Scalar& value) {
  if (self.numel() > 0) {
    drain_device_of(self);
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
  // The op reads and writes its npu arguments' memory: the copies queued on their devices go first.
  const auto num_arguments = op.schema().arguments().size();
  for (size_t i = stack->size() - std::min(stack->size(), num_arguments); i < stack->size(); ++i) {
    const c10::IValue& value = (*stack)[i];
    if (value.isTensor()) {
      drain_device_of(value.toTensor());
    } else if (value.isTensorList()) {
      for (const at::Tensor& t : value.toTensorVector()) drain_device_of(t);
    } else if (value.isOptionalTensorList()) {
      for (const c10::IValue& item : value.toListRef()) {
        if (item.isTensor()) drain_device_of(item.toTensor());
      }
    }
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
  if (const char* delay = std::getenv("NPU_SIM_COPY_DELAY_US"); delay != nullptr && *delay != '\0') {
    char* end = nullptr;
    const long long value = std::strtoll(delay, &end, 10);
    TORCH_CHECK(*end == '\0' && value >= 0, "npu_sim: NPU_SIM_COPY_DELAY_US must be a count of microseconds >= 0, got '",
                delay, "'");
    g_copy_delay_us = value;
  }
  if (const char* on = std::getenv("NPU_SIM_ASYNC"); on != nullptr && std::string(on) == "0") g_async_enabled = false;
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
  for (int i = 0; i < kMaxDevices; ++i) g_queues[i]->collect();  // copies that ran no longer hold memory
  const Counters c = registry().counters(index == -1 ? kPinnedSlot : static_cast<int>(index));
  return {c.live_bytes, c.live_blocks, c.total_blocks, c.total_bytes};
}

// [h2d count, h2d bytes, d2h count, d2h bytes, d2d count, d2d bytes, fallback count, fallback bytes,
//  non_blocking count, asynchronous copies run, their bytes, the deepest a queue has been]
std::vector<int64_t> copy_stats() {
  std::vector<int64_t> out;
  for (int d = 0; d < 4; ++d) {
    out.push_back(g_copy_count[d].load());
    out.push_back(g_copy_bytes[d].load());
  }
  out.push_back(g_non_blocking_copies.load());
  out.push_back(g_async_copies.load());
  out.push_back(g_async_bytes.load());
  out.push_back(g_max_queue_depth.load());
  return out;
}

void reset_copy_stats() {
  for (int d = 0; d < 4; ++d) {
    g_copy_count[d] = 0;
    g_copy_bytes[d] = 0;
  }
  g_non_blocking_copies = 0;
  g_async_copies = 0;
  g_async_bytes = 0;
  g_max_queue_depth = 0;
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

void check_queue_index(int64_t index) {
  TORCH_CHECK(index >= 0 && index < g_device_count.load(), "npu_sim: invalid device ordinal ", index,
              ": the simulated backend has ", g_device_count.load(), " npu device(s)");
}

// Waits for the copies queued on device `index`, or on every device when index is -1.
void synchronize(int64_t index) {
  if (index == -1) {
    for (int i = 0; i < g_device_count.load(); ++i) drain(i);
    return;
  }
  check_queue_index(index);
  drain(static_cast<int>(index));
}

void set_copy_delay_us(int64_t delay) {
  TORCH_CHECK(delay >= 0, "npu_sim: the copy delay must be >= 0 microseconds, got ", delay);
  g_copy_delay_us = delay;
}
int64_t copy_delay_us() { return g_copy_delay_us.load(); }
void set_async_copies(bool enabled) { g_async_enabled = enabled; }
bool async_copies() { return g_async_enabled.load(); }
void pause_queue(int64_t index) {
  check_queue_index(index);
  queue(static_cast<int>(index)).set_paused(true);
}
void resume_queue(int64_t index) {
  check_queue_index(index);
  queue(static_cast<int>(index)).set_paused(false);
}
int64_t queue_depth(int64_t index) {
  check_queue_index(index);
  return queue(static_cast<int>(index)).pending();
}

// Starts (clearing what was recorded) or stops recording the copy timeline.
void set_copy_timeline(bool enabled) {
  std::lock_guard<std::mutex> lock(g_timeline_mu);
  if (enabled) g_timeline.clear();
  g_timeline_enabled = enabled;
}

std::vector<int64_t> copy_timeline() {
  std::lock_guard<std::mutex> lock(g_timeline_mu);
  return g_timeline;
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
  m.def("synchronize(int index) -> ()", synchronize);
  m.def("set_copy_delay_us(int delay) -> ()", set_copy_delay_us);
  m.def("copy_delay_us() -> int", copy_delay_us);
  m.def("set_async_copies(bool enabled) -> ()", set_async_copies);
  m.def("async_copies() -> bool", async_copies);
  m.def("pause_queue(int index) -> ()", pause_queue);
  m.def("resume_queue(int index) -> ()", resume_queue);
  m.def("queue_depth(int index) -> int", queue_depth);
  m.def("set_copy_timeline(bool enabled) -> ()", set_copy_timeline);
  m.def("copy_timeline() -> int[]", copy_timeline);
}

}  // namespace
}  // namespace npu_sim
