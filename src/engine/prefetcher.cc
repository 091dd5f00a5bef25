// Prefetcher (engine.h): reader threads that run a plan's chunks (chunk_plan.h) into slabs of a SlabPool
// (slab_pool.h) or straight into the caller's memory, and the event queue one consumer takes them from.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "engine/chunk_plan.h"
#include "engine/slab_pool.h"
#include "file/read_chunks.h"
#include "safetensors/engine.h"
#include "util/mutex.h"
#include "util/parallel.h"
#include "util/quote.h"

namespace safetensors {
namespace {

using internal::Chunk;
using internal::Lease;
using internal::MutexLock;
using internal::Segment;
using internal::SlabPoolAccess;

// A slab lent to this prefetcher and the events whose bytes it holds.
struct Slot {
  Lease lease;
  // Events in the slab not yet released (queued or lent), and of those, lent to the consumer.
  std::size_t refs = 0;
  std::size_t lent = 0;
  // Bumped when the slot is emptied, so a stale handle is refused.
  std::uint32_t generation = 0;
};

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
  // The source's ReadHints::alignment where a slab has room for it (0: none): a staged chunk lies in its slab
  // at an address congruent to its file offset modulo this, so a direct source reads straight into the slab.
  std::uint64_t slab_align = 0;

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
    // Room for the chunk wherever slab_pad puts it.
    const std::uint64_t need = chunk.hi - chunk.lo + (slab_align == 0 ? 0 : slab_align - 1);
    auto lease = SlabPoolAccess::acquire(*pool, need, stop, file.path(), &slab_wait_ns);
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

  // Where chunk `chunk`'s bytes go in the slab starting at `slab` (see slab_align).
  std::uint64_t slab_pad(const Chunk& chunk, const std::byte* slab) const {
    if (slab_align == 0) return 0;
    return (data_offset + chunk.lo - reinterpret_cast<std::uintptr_t>(slab)) & (slab_align - 1);
  }

  void land_staged(const Chunk& chunk, Lease lease, std::uint64_t pad) EXCLUDES(mu) {
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
    const std::byte* start = lease.data();
    const std::byte* base = start + pad;
    slot.lease = std::move(lease);
    slot.refs = chunk.segments;
    slot.lent = 0;
    for (std::size_t k = chunk.first_segment; k < chunk.first_segment + chunk.segments; ++k) {
      const Segment& seg = segments[k];
      const bool last = (remaining[seg.piece] -= seg.length) == 0;
      if (last) --pieces_left;
      ready.push_back({PrefetchEvent::Kind::kStaged, seg.piece, seg.piece_offset,
                       std::span<const std::byte>(base + seg.chunk_offset, seg.length), handle, start, last});
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
        internal::swap_segments(plan, segments, chunk, chunk.dst);
        bytes_direct.fetch_add(length, std::memory_order_relaxed);
        count_read(length);
        land_direct(chunk);
      } else {
        Lease lease;
        if (!take_slab(chunk, &lease)) return;
        const std::uint64_t pad = slab_pad(chunk, lease.data());
        std::byte* const at = lease.data() + pad;
        Status st = read_exact(*source, data_offset + chunk.lo, std::span<std::byte>(at, length), what_of(chunk));
        if (!st.ok()) {
          {
            MutexLock lock(&mu);
            --held;
            quota_cv.notify_one();
          }
          lease.reset();
          return fail(chunk, std::move(st).error());
        }
        internal::swap_segments(plan, segments, chunk, at);
        bytes_staged.fetch_add(length, std::memory_order_relaxed);
        count_read(length);
        land_staged(chunk, std::move(lease), pad);
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

  const std::uint64_t align = impl->source->read_hints().alignment;
  const std::uint64_t slab_bytes = pool->slab_bytes();
  if (align > 1 && align <= slab_bytes / 2) impl->slab_align = align;
  const std::uint64_t staged_max = std::min(options.chunk_bytes, slab_bytes - impl->slab_align);
  internal::ChunkPlan chunks =
      internal::plan_chunks(pieces, staged_max, options.chunk_bytes, options.merge_gap, impl->data_offset);
  impl->chunks = std::move(chunks.chunks);
  impl->segments = std::move(chunks.segments);

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

  const unsigned threads =
      static_cast<unsigned>(std::min<std::size_t>({options.threads == 0 ? kDefaultReaderThreads : options.threads,
                                                   PrefetchOptions::kMaxThreads, impl->chunks.size()}));
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
  // The impl keeps plain nanosecond counts, which atomics hold; the stats give them their types.
  using Clock = std::chrono::steady_clock;
  s.slab_wait = std::chrono::nanoseconds(m.slab_wait_ns.load(std::memory_order_relaxed));
  s.started = Clock::time_point(std::chrono::nanoseconds(m.started_ns.load(std::memory_order_relaxed)));
  s.last_read_end = Clock::time_point(std::chrono::nanoseconds(m.last_read_end_ns.load(std::memory_order_relaxed)));
  MutexLock lock(&m.mu);
  s.events_lent = m.events_lent;
  return s;
}

}  // namespace safetensors
