#include "safetensors/engine.h"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <deque>
#include <memory>
#include <new>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "checked.h"
#include "mutex.h"
#include "parallel.h"
#include "quote.h"
#include "read_pieces.h"

namespace safetensors {
namespace {

constexpr std::uint64_t kPage = SlabPool::kPageBytes;
constexpr unsigned kDefaultThreads = 8;

std::uint64_t round_up_to_page(std::uint64_t n) { return (n + kPage - 1) / kPage * kPage; }

// Slab memory, freed by the allocator that made it.
struct SlabDeleter {
  std::shared_ptr<const SlabAllocator> allocator;
  std::size_t size = 0;
  void operator()(std::byte* p) const { allocator->free(p, size); }
};
using SlabMemory = std::unique_ptr<std::byte, SlabDeleter>;

std::shared_ptr<const SlabAllocator> default_allocator() {
  static const std::shared_ptr<const SlabAllocator> allocator = std::make_shared<const SlabAllocator>(SlabAllocator{
      // Sizes are whole pages (round_up_to_page), as aligned_alloc requires.
      [](std::size_t size) -> void* { return std::aligned_alloc(kPage, size); },
      [](void* p, std::size_t) { std::free(p); },
  });
  return allocator;
}

// Storage for an object that is constructed once and never destroyed.
template <typename T>
class NoDestructor {
 public:
  NoDestructor() { ::new (static_cast<void*>(storage_)) T(); }
  T& get() { return *std::launder(reinterpret_cast<T*>(storage_)); }

 private:
  alignas(T) unsigned char storage_[sizeof(T)];
};

}  // namespace

// ---------------------------------------------------------------------------------------------------------
// SlabPool

struct SlabPool::State {
  internal::Mutex mu;
  // Signalled when a slab comes back, room appears, or a prefetcher is cancelled.
  internal::CondVar cv{&mu};
  std::uint64_t capacity GUARDED_BY(mu) = kDefaultCapacity;
  std::uint64_t slab_bytes GUARDED_BY(mu) = kDefaultSlabBytes;
  std::uint64_t allocated GUARDED_BY(mu) = 0;
  std::uint64_t peak GUARDED_BY(mu) = 0;
  std::uint64_t in_use GUARDED_BY(mu) = 0;
  std::uint64_t allocations GUARDED_BY(mu) = 0;
  std::uint64_t frees GUARDED_BY(mu) = 0;
  std::uint64_t users GUARDED_BY(mu) = 0;
  std::uint64_t allocator_changes GUARDED_BY(mu) = 0;
  bool custom_allocator GUARDED_BY(mu) = false;
  bool release_when_idle GUARDED_BY(mu) = true;
  std::shared_ptr<const SlabAllocator> allocator GUARDED_BY(mu) = default_allocator();
  std::vector<SlabMemory> free_list GUARDED_BY(mu);

  // Moves every free slab for which `doomed_if` holds into *out (freed by the caller after unlocking).
  template <typename Pred>
  void take_free(std::vector<SlabMemory>* out, Pred doomed_if) REQUIRES(mu) {
    auto keep =
        std::stable_partition(free_list.begin(), free_list.end(), [&](const SlabMemory& m) { return !doomed_if(m); });
    for (auto it = keep; it != free_list.end(); ++it) {
      allocated -= it->get_deleter().size;
      ++frees;
      out->push_back(std::move(*it));
    }
    free_list.erase(keep, free_list.end());
  }
};

namespace internal {

// A slab lent by a pool; returns it on destruction. Move-only.
class Lease {
 public:
  Lease() = default;
  Lease(SlabPool* pool, SlabMemory memory) : pool_(pool), memory_(std::move(memory)) {}
  Lease(Lease&& other) noexcept : pool_(other.pool_), memory_(std::move(other.memory_)) {}
  Lease& operator=(Lease&& other) noexcept {
    if (this != &other) {
      reset();
      pool_ = other.pool_;
      memory_ = std::move(other.memory_);
    }
    return *this;
  }
  ~Lease() { reset(); }

  std::byte* data() const { return memory_.get(); }
  explicit operator bool() const { return memory_ != nullptr; }
  void reset();

 private:
  SlabPool* pool_ = nullptr;  // not owned
  SlabMemory memory_;
};

struct SlabPoolAccess {
  static SlabPool::State& state(SlabPool& pool) { return *pool.state_; }

  // A slab of at least `bytes`, waiting while the pool is at capacity. Errors: kInvalidArgument when `stop` was
  // set (the caller stops quietly) or when `bytes` can never fit; kIo (ENOMEM) when the allocator fails.
  static Result<Lease> acquire(SlabPool& pool, std::uint64_t bytes, const std::atomic<bool>& stop,
                               const std::string& context, std::atomic<std::uint64_t>* wait_ns) {
    SlabPool::State& s = state(pool);
    std::vector<SlabMemory> doomed;  // freed after the lock is released
    std::shared_ptr<const SlabAllocator> allocator;
    std::uint64_t size = 0;
    {
      MutexLock lock(&s.mu);
      std::optional<std::chrono::steady_clock::time_point> wait_start;
      auto account_wait = [&] {
        if (wait_start) {
          wait_ns->fetch_add(static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                                            std::chrono::steady_clock::now() - *wait_start)
                                                            .count()),
                             std::memory_order_relaxed);
        }
      };
      for (;;) {
        if (stop.load(std::memory_order_acquire)) {
          account_wait();
          return Error::invalid_argument(context, "the prefetch was cancelled");
        }
        auto fit = std::find_if(s.free_list.begin(), s.free_list.end(),
                                [&](const SlabMemory& m) { return m.get_deleter().size >= bytes; });
        if (fit != s.free_list.end()) {
          SlabMemory m = std::move(*fit);
          s.free_list.erase(fit);
          ++s.in_use;
          account_wait();
          return Lease(&pool, std::move(m));
        }
        size = round_up_to_page(std::max(bytes, s.slab_bytes));
        if (size > s.capacity) {
          return Error::invalid_argument(context, "a staged chunk of " + std::to_string(bytes) +
                                                      " bytes does not fit the slab pool's capacity of " +
                                                      std::to_string(s.capacity) + " bytes");
        }
        if (s.allocated + size <= s.capacity) break;
        if (!s.free_list.empty()) {
          // Free slabs too small for this chunk (left from an earlier slab size) make room.
          s.take_free(&doomed, [](const SlabMemory&) { return true; });
          continue;
        }
        if (!wait_start) wait_start = std::chrono::steady_clock::now();
        s.cv.wait();
      }
      account_wait();
      // Reserved before allocating, so concurrent acquirers never exceed the capacity together.
      s.allocated += size;
      s.peak = std::max(s.peak, s.allocated);
      ++s.allocations;
      ++s.in_use;
      allocator = s.allocator;
    }
    doomed.clear();
    void* p = allocator->alloc(size);
    if (p == nullptr) {
      MutexLock lock(&s.mu);
      s.allocated -= size;
      --s.in_use;
      s.cv.notify_all();
      return Error::io(context, "allocate a " + std::to_string(size) + "-byte staging slab", ENOMEM);
    }
    return Lease(&pool, SlabMemory(static_cast<std::byte*>(p), SlabDeleter{std::move(allocator), size}));
  }

  static void put(SlabPool& pool, SlabMemory memory) {
    SlabPool::State& s = state(pool);
    SlabMemory doomed;
    MutexLock lock(&s.mu);
    --s.in_use;
    const SlabDeleter& d = memory.get_deleter();
    const bool keep = d.size == round_up_to_page(s.slab_bytes) && d.allocator == s.allocator &&
                      s.allocated <= s.capacity && !(s.release_when_idle && s.users == 0);
    if (keep) {
      s.free_list.push_back(std::move(memory));
    } else {
      s.allocated -= d.size;
      ++s.frees;
      doomed = std::move(memory);
    }
    s.cv.notify_all();
    // `doomed` is declared before `lock`, so it is freed after the lock is released.
  }

  static void attach(SlabPool& pool) {
    SlabPool::State& s = state(pool);
    MutexLock lock(&s.mu);
    ++s.users;
  }

  static void detach(SlabPool& pool) {
    SlabPool::State& s = state(pool);
    std::vector<SlabMemory> doomed;
    MutexLock lock(&s.mu);
    --s.users;
    if (s.users == 0 && s.release_when_idle) s.take_free(&doomed, [](const SlabMemory&) { return true; });
  }

  // Wakes the pool's waiters so that they notice a stop flag set before this call.
  static void wake(SlabPool& pool) {
    SlabPool::State& s = state(pool);
    MutexLock lock(&s.mu);
    s.cv.notify_all();
  }
};

void Lease::reset() {
  if (memory_) SlabPoolAccess::put(*pool_, std::move(memory_));
}

}  // namespace internal

using internal::Lease;
using internal::MutexLock;
using internal::SlabPoolAccess;

SlabPool::SlabPool(std::uint64_t capacity, std::uint64_t slab_bytes) : state_(std::make_unique<State>()) {
  State& s = *state_;
  MutexLock lock(&s.mu);
  if (slab_bytes != 0 && slab_bytes % kPage == 0 && capacity >= slab_bytes) {
    s.capacity = capacity;
    s.slab_bytes = slab_bytes;
  }
}

SlabPool::~SlabPool() = default;

SlabPool& SlabPool::global() {
  static NoDestructor<SlabPool> pool;
  return pool.get();
}

Status SlabPool::set_capacity(std::uint64_t bytes) {
  std::vector<SlabMemory> doomed;
  State& s = *state_;
  MutexLock lock(&s.mu);
  if (bytes < s.slab_bytes) {
    return Error::invalid_argument(
        "<slab pool>", "capacity " + std::to_string(bytes) + " is below the slab size " + std::to_string(s.slab_bytes));
  }
  s.capacity = bytes;
  while (s.allocated > s.capacity && !s.free_list.empty()) {
    s.allocated -= s.free_list.back().get_deleter().size;
    ++s.frees;
    doomed.push_back(std::move(s.free_list.back()));
    s.free_list.pop_back();
  }
  s.cv.notify_all();
  return ok_status();
}

std::uint64_t SlabPool::capacity() const {
  MutexLock lock(&state_->mu);
  return state_->capacity;
}

Status SlabPool::set_slab_bytes(std::uint64_t bytes) {
  std::vector<SlabMemory> doomed;
  State& s = *state_;
  MutexLock lock(&s.mu);
  if (bytes == 0 || bytes > s.capacity || bytes % kPage != 0) {
    return Error::invalid_argument("<slab pool>", "slab size " + std::to_string(bytes) +
                                                      " must be a positive multiple of " + std::to_string(kPage) +
                                                      " no larger than the capacity " + std::to_string(s.capacity));
  }
  s.slab_bytes = bytes;
  s.take_free(&doomed, [&](const SlabMemory& m) { return m.get_deleter().size != bytes; });
  s.cv.notify_all();
  return ok_status();
}

std::uint64_t SlabPool::slab_bytes() const {
  MutexLock lock(&state_->mu);
  return state_->slab_bytes;
}

Status SlabPool::set_allocator(SlabAllocator allocator) {
  const bool has_alloc = static_cast<bool>(allocator.alloc), has_free = static_cast<bool>(allocator.free);
  if (has_alloc != has_free) {
    return Error::invalid_argument("<slab pool>", "an allocator needs both alloc and free (or neither)");
  }
  auto shared = has_alloc ? std::make_shared<const SlabAllocator>(std::move(allocator)) : default_allocator();
  std::vector<SlabMemory> doomed;
  MutexLock lock(&state_->mu);
  state_->allocator = std::move(shared);
  state_->allocator_changes += 1;
  state_->custom_allocator = has_alloc;
  state_->take_free(&doomed, [](const SlabMemory&) { return true; });
  return ok_status();
}

void SlabPool::set_release_when_idle(bool release) {
  MutexLock lock(&state_->mu);
  state_->release_when_idle = release;
}

void SlabPool::trim() {
  std::vector<SlabMemory> doomed;
  MutexLock lock(&state_->mu);
  state_->take_free(&doomed, [](const SlabMemory&) { return true; });
}

SlabPoolStats SlabPool::stats() const {
  State& s = *state_;
  MutexLock lock(&s.mu);
  return {s.capacity, s.slab_bytes,        s.allocated,       s.peak,
          s.in_use,   s.free_list.size(),  s.allocations,     s.frees,
          s.users,    s.allocator_changes, s.custom_allocator};
}

void SlabPool::reset_peak() {
  MutexLock lock(&state_->mu);
  state_->peak = state_->allocated;
}

// ---------------------------------------------------------------------------------------------------------
// Pieces

Result<Piece> tensor_piece(const File& file, const TensorInfo& tensor) {
  if (tensor.end < tensor.begin || tensor.end > file.size() - file.data_offset()) {
    return Error::invalid_argument(file.path(), "tensor " + internal::quote(tensor.name) + " is not in this file");
  }
  Piece p;
  p.begin = tensor.begin;
  p.end = tensor.end;
  p.tensor = tensor.name;
  p.swap_bytes = dtype_swap_bytes(tensor.dtype);
  return p;
}

Result<Piece> row_piece(const File& file, const TensorInfo& tensor, std::uint64_t r0, std::uint64_t r1) {
  SAFETENSORS_ASSIGN_OR_RETURN(Piece p, tensor_piece(file, tensor));
  if (tensor.shape.empty()) {
    return Error::invalid_slice(file.path(), tensor.name, "cannot take rows of a 0-d tensor");
  }
  const std::uint64_t rows = tensor.shape[0];
  if (r0 > r1 || r1 > rows) {
    return Error::invalid_slice(file.path(), tensor.name,
                                "rows [" + std::to_string(r0) + ", " + std::to_string(r1) +
                                    ") are out of range for a first dimension of " + std::to_string(rows));
  }
  const auto row_elems = internal::checked_product(tensor.shape.subspan(1));
  const auto row_bits = row_elems ? internal::checked_mul(*row_elems, dtype_bits(tensor.dtype)) : std::nullopt;
  const auto bit0 = row_bits ? internal::checked_mul(r0, *row_bits) : std::nullopt;
  const auto bit1 = row_bits ? internal::checked_mul(r1, *row_bits) : std::nullopt;
  if (!bit0 || !bit1) return Error::validation_overflow(file.path(), tensor.name);
  if (*bit0 % 8 != 0 || *bit1 % 8 != 0) return Error::misaligned_slice(file.path(), tensor.name);
  // bit1 / 8 <= nbytes(), which File::open() checked against the tensor's extent, so the sums cannot overflow.
  p.begin = tensor.begin + *bit0 / 8;
  p.end = tensor.begin + *bit1 / 8;
  if (p.end > tensor.end) return Error::validation_overflow(file.path(), tensor.name);
  return p;
}

// ---------------------------------------------------------------------------------------------------------
// Prefetcher

namespace {

// One positional read: [lo, hi) of the data buffer into a slab (dst == nullptr) or to dst.
struct Chunk {
  std::uint64_t lo = 0;
  std::uint64_t hi = 0;
  std::byte* dst = nullptr;
  std::size_t first_segment = 0;
  std::size_t segments = 0;
};

// The part of one piece that one chunk holds.
struct Segment {
  std::size_t piece = 0;
  std::uint64_t piece_offset = 0;
  std::uint64_t chunk_offset = 0;
  std::uint64_t length = 0;
};

// A slab lent to this prefetcher and the events whose bytes it holds.
struct Slot {
  Lease lease;
  // Events in the slab not yet released (queued or lent), and of those, lent to the consumer.
  std::size_t refs = 0;
  std::size_t lent = 0;
  // Bumped when the slot is emptied, so a stale handle is refused.
  std::uint32_t generation = 0;
};

// Moves a chunk boundary `end` in (pos, hi) to a whole swap unit of the piece it falls inside, if any: down
// where that stays after pos, else up (never past the piece's end or hi). Pieces are sorted by begin; the
// first that contains `end` decides (overlapping pieces agree on their units, see Piece::swap_bytes).
std::uint64_t align_to_units(std::uint64_t pos, std::uint64_t end, std::uint64_t hi, const std::vector<Piece>& plan,
                             const std::vector<std::size_t>& pieces) {
  for (std::size_t i : pieces) {
    const Piece& p = plan[i];
    if (p.begin >= end) break;
    if (p.end <= end || p.swap_bytes <= 1) continue;
    const std::uint64_t into = (end - p.begin) % p.swap_bytes;
    if (into == 0) return end;
    if (end - into > pos) return end - into;
    return std::min({end - into + p.swap_bytes, p.end, hi});  // <= p.end: no overflow
  }
  return end;
}

// Cuts [lo, hi) into chunks of at most `max` bytes; every boundary inside the range is a page boundary of the
// file (where a page fits in `max`), so the reads after a range's first start page-aligned, and then a whole
// swap unit of the piece it cuts (a no-op for the aligned tensors writers produce), so each chunk's part of
// a piece can be swapped on its own.
void split(const std::vector<Piece>& plan, const std::vector<std::size_t>& pieces, std::uint64_t lo, std::uint64_t hi,
           std::uint64_t max, std::uint64_t data_offset, std::byte* dst, std::vector<Chunk>* out) {
  std::uint64_t pos = lo;
  while (pos < hi) {
    std::uint64_t end = hi;
    if (hi - pos > max) {
      end = pos + max;  // < hi: no overflow
      // data_offset + end < data_offset + hi <= the file size: no overflow.
      const std::uint64_t abs = data_offset + end;
      const std::uint64_t aligned = abs - abs % kPage;
      if (aligned > data_offset + pos) end = aligned - data_offset;
      end = align_to_units(pos, end, hi, plan, pieces);
    }
    out->push_back({pos, end, dst == nullptr ? nullptr : dst + (pos - lo), 0, 0});
    pos = end;
  }
}

// A run of pieces read as consecutive chunks.
struct Run {
  std::uint64_t lo = 0;
  std::uint64_t hi = 0;
  std::byte* dst = nullptr;
  std::vector<std::size_t> pieces;
};

// Chunks of every run, and the segments of each chunk (chunk index, segment).
void chunk_runs(const std::vector<Run>& runs, const std::vector<Piece>& plan, std::uint64_t max,
                std::uint64_t data_offset, std::vector<Chunk>* chunks,
                std::vector<std::pair<std::size_t, Segment>>* segments) {
  for (const Run& run : runs) {
    const std::size_t first = chunks->size();
    split(plan, run.pieces, run.lo, run.hi, max, data_offset, run.dst, chunks);
    const auto begin = chunks->begin() + static_cast<std::ptrdiff_t>(first);
    for (std::size_t i : run.pieces) {
      const Piece& p = plan[i];
      // The run's chunks are contiguous and ordered: the first that ends after the piece begins.
      auto c = std::partition_point(begin, chunks->end(), [&](const Chunk& ch) { return ch.hi <= p.begin; });
      for (; c != chunks->end() && c->lo < p.end; ++c) {
        const std::uint64_t from = std::max(c->lo, p.begin), to = std::min(c->hi, p.end);
        segments->push_back(
            {static_cast<std::size_t>(c - chunks->begin()), Segment{i, from - p.begin, from - c->lo, to - from}});
      }
    }
  }
}

}  // namespace

struct Prefetcher::Impl {
  explicit Impl(File f) : file(std::move(f)) {}

  File file;
  std::shared_ptr<const Source> source;
  std::uint64_t data_offset = 0;
  std::vector<std::string> names;
  std::vector<Piece> plan;
  std::vector<Chunk> chunks;
  std::vector<Segment> segments;
  SlabPool* pool = nullptr;
  std::size_t max_slabs = 1;

  std::atomic<std::size_t> next_chunk{0};
  // Readers stop taking chunks: set on the first error and on cancel().
  std::atomic<bool> stop{false};

  std::atomic<std::uint64_t> bytes_read{0}, reads{0}, bytes_staged{0}, bytes_direct{0}, slab_wait_ns{0};
  std::atomic<std::uint64_t> started_ns{0}, last_read_end_ns{0};

  mutable internal::Mutex mu;
  // next() and wait_piece() wait here: an event was queued, a piece completed, an error, cancel().
  internal::CondVar consumer_cv{&mu};
  // Readers wait here for the per-prefetcher slab limit.
  internal::CondVar quota_cv{&mu};
  std::deque<PrefetchEvent> ready GUARDED_BY(mu);
  // Bytes of each piece not landed yet.
  std::vector<std::uint64_t> remaining GUARDED_BY(mu);
  std::vector<char> done GUARDED_BY(mu);
  // Pieces with bytes not landed yet; with `ready` empty and this 0 the stream has ended.
  std::size_t pieces_left GUARDED_BY(mu) = 0;
  std::vector<Slot> slots GUARDED_BY(mu);
  std::vector<std::size_t> free_slots GUARDED_BY(mu);
  // Slabs this prefetcher holds (reading, queued or lent) and staged events lent.
  std::size_t held GUARDED_BY(mu) = 0;
  std::size_t events_lent GUARDED_BY(mu) = 0;
  std::optional<Error> error GUARDED_BY(mu);
  bool cancelled GUARDED_BY(mu) = false;

  // Joined by ~Impl before any member above is destroyed.
  std::vector<std::thread> threads;

  ~Impl() {
    cancel();
    for (std::thread& t : threads) t.join();
    std::vector<Lease> doomed;
    {
      MutexLock lock(&mu);
      for (Slot& s : slots) {
        if (s.lease) doomed.push_back(std::move(s.lease));
      }
    }
    doomed.clear();
    if (pool != nullptr) SlabPoolAccess::detach(*pool);
  }

  Error cancelled_error() const { return Error::invalid_argument(file.path(), "the prefetch was cancelled"); }

  void cancel() EXCLUDES(mu) {
    std::vector<Lease> doomed;
    {
      MutexLock lock(&mu);
      cancelled = true;
      stop.store(true, std::memory_order_release);
      drop_queued(&doomed);
      consumer_cv.notify_all();
      quota_cv.notify_all();
    }
    return_slabs(&doomed);
    if (pool != nullptr) SlabPoolAccess::wake(*pool);
  }

  // Records the first error (naming the chunk's first tensor) and stops the prefetch.
  void fail(const Chunk& chunk, Error e) EXCLUDES(mu) {
    if (e.tensor().empty()) e = e.with_tensor(plan[segments[chunk.first_segment].piece].tensor);
    std::vector<Lease> doomed;
    {
      MutexLock lock(&mu);
      if (!error && !cancelled) error = std::move(e);
      stop.store(true, std::memory_order_release);
      drop_queued(&doomed);
      consumer_cv.notify_all();
      quota_cv.notify_all();
    }
    return_slabs(&doomed);
    SlabPoolAccess::wake(*pool);
  }

  // Drops the events not handed out yet; slabs no longer referenced go to *doomed.
  void drop_queued(std::vector<Lease>* doomed) REQUIRES(mu) {
    for (const PrefetchEvent& ev : ready) {
      if (ev.slab != 0) unref(slot_of(ev.slab), doomed);
    }
    ready.clear();
  }

  static std::size_t slot_of(SlabHandle h) { return static_cast<std::size_t>((h & 0xffffffffu) - 1); }

  // Drops one event's reference to slot i; an emptied slot's slab goes to *doomed, for return_slabs().
  void unref(std::size_t i, std::vector<Lease>* doomed) REQUIRES(mu) {
    Slot& s = slots[i];
    if (--s.refs == 0) {
      doomed->push_back(std::move(s.lease));
      ++s.generation;
      free_slots.push_back(i);
    }
  }

  // Returns the slabs to the pool, then lets readers take as many more: a reader woken by the per-prefetcher
  // limit finds them in the pool instead of allocating beside them.
  void return_slabs(std::vector<Lease>* doomed) EXCLUDES(mu) {
    const std::size_t n = doomed->size();
    doomed->clear();
    if (n == 0) return;
    MutexLock lock(&mu);
    held -= n;
    quota_cv.notify_all();
  }

  // Takes a slab for `chunk` within this prefetcher's limit and the pool's capacity. False when the prefetch
  // stopped (an error is recorded first where one occurred).
  bool take_slab(const Chunk& chunk, Lease* out) EXCLUDES(mu) {
    {
      MutexLock lock(&mu);
      if (held >= max_slabs && !stop.load(std::memory_order_acquire)) {
        const auto start = std::chrono::steady_clock::now();
        while (held >= max_slabs && !stop.load(std::memory_order_acquire)) quota_cv.wait();
        slab_wait_ns.fetch_add(
            static_cast<std::uint64_t>(
                std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start).count()),
            std::memory_order_relaxed);
      }
      if (stop.load(std::memory_order_acquire)) return false;
      ++held;
    }
    auto lease = SlabPoolAccess::acquire(*pool, chunk.hi - chunk.lo, stop, file.path(), &slab_wait_ns);
    if (!lease.ok()) {
      {
        MutexLock lock(&mu);
        --held;
        quota_cv.notify_one();
      }
      if (!stop.load(std::memory_order_acquire)) fail(chunk, std::move(lease).error());
      return false;
    }
    *out = std::move(lease).value();
    return true;
  }

  // On a big-endian host: turns the file's bytes of the chunk's segments, read to `base` (the chunk's first
  // byte), into native values. Segments of overlapping pieces share bytes, which are swapped once: segments
  // come in piece order (by begin), so each swaps only what lies past the previous ones, from a unit boundary.
  void swap_segments(const Chunk& chunk, std::byte* base) const {
    if constexpr (host_is_little_endian()) {
      (void)chunk;
      (void)base;
    } else {
      std::uint64_t swapped_to = 0;
      for (std::size_t k = chunk.first_segment; k < chunk.first_segment + chunk.segments; ++k) {
        const Segment& seg = segments[k];
        const unsigned w = plan[seg.piece].swap_bytes;
        const std::uint64_t end = seg.chunk_offset + seg.length;
        if (w > 1) {
          std::uint64_t from = seg.chunk_offset;
          if (swapped_to > from) from += (swapped_to - from + w - 1) / w * w;
          if (from < end) byteswap_units(std::span<std::byte>(base + from, end - from), w);
        }
        swapped_to = std::max(swapped_to, end);
      }
    }
  }

  void land_direct(const Chunk& chunk) EXCLUDES(mu) {
    MutexLock lock(&mu);
    for (std::size_t k = chunk.first_segment; k < chunk.first_segment + chunk.segments; ++k) {
      const Segment& seg = segments[k];
      if ((remaining[seg.piece] -= seg.length) != 0) continue;
      done[seg.piece] = 1;
      --pieces_left;
      if (!stop.load(std::memory_order_acquire)) {
        ready.push_back({PrefetchEvent::Kind::kDirect, seg.piece, 0, {}, 0, nullptr, true});
      }
    }
    consumer_cv.notify_all();
  }

  void land_staged(const Chunk& chunk, Lease lease) EXCLUDES(mu) {
    Lease doomed;
    MutexLock lock(&mu);
    if (stop.load(std::memory_order_acquire)) {
      doomed = std::move(lease);
      --held;
      quota_cv.notify_one();
      return;
    }
    std::size_t i;
    if (!free_slots.empty()) {
      i = free_slots.back();
      free_slots.pop_back();
    } else {
      i = slots.size();
      slots.emplace_back();
    }
    Slot& slot = slots[i];
    const SlabHandle handle = (static_cast<std::uint64_t>(slot.generation) << 32) | (i + 1);
    const std::byte* base = lease.data();
    slot.lease = std::move(lease);
    slot.refs = chunk.segments;
    slot.lent = 0;
    for (std::size_t k = chunk.first_segment; k < chunk.first_segment + chunk.segments; ++k) {
      const Segment& seg = segments[k];
      const bool last = (remaining[seg.piece] -= seg.length) == 0;
      if (last) --pieces_left;
      ready.push_back({PrefetchEvent::Kind::kStaged, seg.piece, seg.piece_offset,
                       std::span<const std::byte>(base + seg.chunk_offset, seg.length), handle, base, last});
    }
    consumer_cv.notify_all();
  }

  // How a chunk's read names itself in errors: the tensor its bytes belong to, or the first and the last of
  // the tensors a merged chunk spans (fail() puts the first in the error's tensor field).
  std::string what_of(const Chunk& chunk) const {
    const std::string_view first = plan[segments[chunk.first_segment].piece].tensor;
    const std::string_view last = plan[segments[chunk.first_segment + chunk.segments - 1].piece].tensor;
    if (first.empty() && last.empty()) return "read";
    if (first == last) return internal::read_of(first);
    return "read of tensors " + internal::quote(first) + " to " + internal::quote(last);
  }

  // Readahead for a chunk a reader will soon take (internal::hint_ahead).
  void hint(const Chunk& chunk) const { source->prefetch(data_offset + chunk.lo, chunk.hi - chunk.lo); }

  void reader() {
    for (;;) {
      if (stop.load(std::memory_order_acquire)) return;
      const std::size_t c = next_chunk.fetch_add(1, std::memory_order_relaxed);
      if (c >= chunks.size()) return;
      internal::hint_ahead(c, chunks.size(), [&](std::size_t k) { hint(chunks[k]); });
      const Chunk& chunk = chunks[c];
      const std::uint64_t length = chunk.hi - chunk.lo;
      if (chunk.dst != nullptr) {
        Status st =
            read_exact(*source, data_offset + chunk.lo, std::span<std::byte>(chunk.dst, length), what_of(chunk));
        if (!st.ok()) return fail(chunk, std::move(st).error());
        swap_segments(chunk, chunk.dst);
        bytes_direct.fetch_add(length, std::memory_order_relaxed);
        count_read(length);
        land_direct(chunk);
      } else {
        Lease lease;
        if (!take_slab(chunk, &lease)) return;
        Status st =
            read_exact(*source, data_offset + chunk.lo, std::span<std::byte>(lease.data(), length), what_of(chunk));
        if (!st.ok()) {
          {
            MutexLock lock(&mu);
            --held;
            quota_cv.notify_one();
          }
          lease.reset();
          return fail(chunk, std::move(st).error());
        }
        swap_segments(chunk, lease.data());
        bytes_staged.fetch_add(length, std::memory_order_relaxed);
        count_read(length);
        land_staged(chunk, std::move(lease));
      }
    }
  }

  void count_read(std::uint64_t length) {
    bytes_read.fetch_add(length, std::memory_order_relaxed);
    reads.fetch_add(1, std::memory_order_relaxed);
    const std::uint64_t now = steady_ns();
    std::uint64_t seen = last_read_end_ns.load(std::memory_order_relaxed);
    while (now > seen && !last_read_end_ns.compare_exchange_weak(seen, now, std::memory_order_relaxed)) {
    }
  }

  static std::uint64_t steady_ns() {
    return static_cast<std::uint64_t>(
        std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
            .count());
  }

  Result<PrefetchEvent> next(std::optional<std::chrono::steady_clock::time_point> deadline) EXCLUDES(mu) {
    MutexLock lock(&mu);
    for (;;) {
      if (error) return *error;
      if (cancelled) return cancelled_error();
      if (!ready.empty()) {
        PrefetchEvent ev = ready.front();
        ready.pop_front();
        if (ev.slab != 0) {
          ++slots[slot_of(ev.slab)].lent;
          ++events_lent;
        }
        if (ev.kind == PrefetchEvent::Kind::kStaged && ev.piece_done) {
          done[ev.piece] = 1;
          consumer_cv.notify_all();
        }
        return ev;
      }
      if (pieces_left == 0) return PrefetchEvent{};
      if (deadline) {
        if (std::chrono::steady_clock::now() >= *deadline) {
          PrefetchEvent ev;
          ev.kind = PrefetchEvent::Kind::kTimeout;
          return ev;
        }
        consumer_cv.wait_until(*deadline);
      } else {
        consumer_cv.wait();
      }
    }
  }
};

Prefetcher::Prefetcher(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Prefetcher::~Prefetcher() = default;

Result<std::unique_ptr<Prefetcher>> Prefetcher::start(File file, std::vector<Piece> plan,
                                                      const PrefetchOptions& options) {
  const std::string path = file.path();
  if (options.threads > PrefetchOptions::kMaxThreads) {
    return Error::invalid_argument(path, "prefetch threads " + std::to_string(options.threads) + " exceed " +
                                             std::to_string(PrefetchOptions::kMaxThreads));
  }
  if (options.chunk_bytes == 0) return Error::invalid_argument(path, "prefetch chunk_bytes must be positive");
  const std::uint64_t data_size = file.size() - file.data_offset();
  for (std::size_t i = 0; i < plan.size(); ++i) {
    const Piece& p = plan[i];
    const std::string where = "prefetch piece " + std::to_string(i) + " (tensor " + internal::quote(p.tensor) + ")";
    if (p.end < p.begin || p.end > data_size) {
      return Error::invalid_argument(path, where + ": [" + std::to_string(p.begin) + ", " + std::to_string(p.end) +
                                               ") is not a range of the " + std::to_string(data_size) +
                                               "-byte data buffer");
    }
    if (p.delivery == Delivery::kDirect && p.dst.size() != p.size()) {
      return Error::invalid_argument(path, where + " has " + std::to_string(p.size()) +
                                               " bytes but its destination holds " + std::to_string(p.dst.size()));
    }
    if (p.delivery != Delivery::kDirect && p.delivery != Delivery::kStaged) {
      return Error::invalid_argument(path, where + " has an unknown delivery");
    }
  }

  SlabPool* pool = options.pool != nullptr ? options.pool : &SlabPool::global();
  auto impl = std::make_unique<Impl>(std::move(file));
  impl->source = impl->file.source();
  impl->data_offset = impl->file.data_offset();
  // Names are copied first and viewed after, so that no view sees a string the vector moved.
  impl->names.reserve(plan.size());
  for (const Piece& p : plan) impl->names.emplace_back(p.tensor);
  for (std::size_t i = 0; i < plan.size(); ++i) plan[i].tensor = impl->names[i];
  impl->plan = std::move(plan);
  const std::vector<Piece>& pieces = impl->plan;

  // Runs: staged pieces merge when they overlap, touch, or lie within merge_gap; direct pieces when they
  // touch in the file and their destinations touch in memory (one read can fill both).
  std::vector<std::size_t> staged, direct;
  for (std::size_t i = 0; i < pieces.size(); ++i) {
    if (pieces[i].size() == 0) continue;
    (pieces[i].delivery == Delivery::kDirect ? direct : staged).push_back(i);
  }
  auto by_offset = [&](std::size_t a, std::size_t b) {
    return pieces[a].begin != pieces[b].begin ? pieces[a].begin < pieces[b].begin : pieces[a].end < pieces[b].end;
  };
  std::sort(staged.begin(), staged.end(), by_offset);
  std::sort(direct.begin(), direct.end(), by_offset);
  std::vector<Run> staged_runs, direct_runs;
  for (std::size_t i : staged) {
    const Piece& p = pieces[i];
    if (!staged_runs.empty() &&
        (p.begin <= staged_runs.back().hi || p.begin - staged_runs.back().hi <= options.merge_gap)) {
      Run& r = staged_runs.back();
      r.hi = std::max(r.hi, p.end);
      r.pieces.push_back(i);
    } else {
      staged_runs.push_back({p.begin, p.end, nullptr, {i}});
    }
  }
  for (std::size_t i : direct) {
    const Piece& p = pieces[i];
    if (!direct_runs.empty()) {
      Run& r = direct_runs.back();
      if (p.begin == r.hi && p.dst.data() == r.dst + (r.hi - r.lo)) {
        r.hi = p.end;
        r.pieces.push_back(i);
        continue;
      }
    }
    direct_runs.push_back({p.begin, p.end, p.dst.data(), {i}});
  }
  const std::uint64_t staged_max = std::min(options.chunk_bytes, pool->slab_bytes());
  std::vector<Chunk> chunks;
  std::vector<std::pair<std::size_t, Segment>> segs;
  chunk_runs(staged_runs, pieces, staged_max, impl->data_offset, &chunks, &segs);
  chunk_runs(direct_runs, pieces, options.chunk_bytes, impl->data_offset, &chunks, &segs);

  // Chunks in file order (so reads sweep the file forward), each with its segments; chunks that hold no
  // byte of a piece (inside a merged gap) are dropped.
  std::vector<std::size_t> order(chunks.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(),
                   [&](std::size_t a, std::size_t b) { return chunks[a].lo < chunks[b].lo; });
  std::vector<std::size_t> rank(chunks.size());
  for (std::size_t k = 0; k < order.size(); ++k) rank[order[k]] = k;
  std::stable_sort(segs.begin(), segs.end(),
                   [&](const auto& a, const auto& b) { return rank[a.first] < rank[b.first]; });
  std::size_t s = 0;
  for (std::size_t k = 0; k < order.size(); ++k) {
    Chunk c = chunks[order[k]];
    c.first_segment = impl->segments.size();
    while (s < segs.size() && rank[segs[s].first] == k) impl->segments.push_back(segs[s++].second);
    c.segments = impl->segments.size() - c.first_segment;
    if (c.segments != 0) impl->chunks.push_back(c);
  }

  {
    MutexLock lock(&impl->mu);
    impl->remaining.resize(pieces.size());
    impl->done.assign(pieces.size(), 0);
    for (std::size_t i = 0; i < pieces.size(); ++i) {
      impl->remaining[i] = pieces[i].size();
      if (pieces[i].size() != 0) {
        ++impl->pieces_left;
        continue;
      }
      // Zero-size pieces are complete already.
      const bool is_direct = pieces[i].delivery == Delivery::kDirect;
      if (is_direct) impl->done[i] = 1;
      impl->ready.push_back(
          {is_direct ? PrefetchEvent::Kind::kDirect : PrefetchEvent::Kind::kStaged, i, 0, {}, 0, nullptr, true});
    }
  }

  const unsigned threads = static_cast<unsigned>(
      std::min<std::size_t>(options.threads == 0 ? kDefaultThreads : options.threads, impl->chunks.size()));
  impl->max_slabs = options.max_slabs != 0 ? options.max_slabs : std::max<std::size_t>(1, 2 * std::size_t{threads});
  // Set only now: ~Impl detaches from the pool exactly when this attached.
  impl->pool = pool;
  SlabPoolAccess::attach(*pool);
  std::unique_ptr<Prefetcher> out(new Prefetcher(std::move(impl)));
  Impl* p = out->impl_.get();
  p->threads.reserve(threads);
  p->started_ns.store(Impl::steady_ns(), std::memory_order_relaxed);
  for (unsigned t = 0; t < threads; ++t) p->threads.emplace_back([p] { p->reader(); });
  return out;
}

Result<PrefetchEvent> Prefetcher::next() { return impl_->next(std::nullopt); }

Result<PrefetchEvent> Prefetcher::next_for(std::chrono::nanoseconds timeout) {
  return impl_->next(std::chrono::steady_clock::now() +
                     std::chrono::duration_cast<std::chrono::steady_clock::duration>(timeout));
}

Status Prefetcher::release(SlabHandle slab) {
  if (slab == 0) return ok_status();
  Impl& m = *impl_;
  std::vector<Lease> doomed;
  {
    MutexLock lock(&m.mu);
    const std::size_t i = Impl::slot_of(slab);
    if (i >= m.slots.size() || m.slots[i].generation != static_cast<std::uint32_t>(slab >> 32) ||
        m.slots[i].lent == 0) {
      return Error::invalid_argument(m.file.path(), "slab handle " + std::to_string(slab) + " is not lent");
    }
    --m.slots[i].lent;
    --m.events_lent;
    m.unref(i, &doomed);
  }
  m.return_slabs(&doomed);
  return ok_status();
}

Status Prefetcher::wait_piece(std::size_t i) {
  Impl& m = *impl_;
  if (i >= m.plan.size() || m.plan[i].delivery != Delivery::kDirect) {
    return Error::invalid_argument(m.file.path(),
                                   "wait_piece: piece " + std::to_string(i) + " is not a direct piece of the plan");
  }
  MutexLock lock(&m.mu);
  while (!m.done[i] && !m.error && !m.cancelled) m.consumer_cv.wait();
  if (m.done[i]) return ok_status();
  if (m.error) return *m.error;
  return m.cancelled_error();
}

bool Prefetcher::piece_done(std::size_t i) const {
  MutexLock lock(&impl_->mu);
  return i < impl_->done.size() && impl_->done[i];
}

void Prefetcher::cancel() { impl_->cancel(); }

const std::vector<Piece>& Prefetcher::plan() const { return impl_->plan; }

PrefetchStats Prefetcher::stats() const {
  const Impl& m = *impl_;
  PrefetchStats s;
  s.bytes_read = m.bytes_read.load(std::memory_order_relaxed);
  s.reads = m.reads.load(std::memory_order_relaxed);
  s.bytes_staged = m.bytes_staged.load(std::memory_order_relaxed);
  s.bytes_direct = m.bytes_direct.load(std::memory_order_relaxed);
  s.chunks = m.chunks.size();
  s.slab_wait_ns = m.slab_wait_ns.load(std::memory_order_relaxed);
  s.started_ns = m.started_ns.load(std::memory_order_relaxed);
  s.last_read_end_ns = m.last_read_end_ns.load(std::memory_order_relaxed);
  MutexLock lock(&m.mu);
  s.events_lent = m.events_lent;
  return s;
}

}  // namespace safetensors
