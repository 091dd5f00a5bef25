// Engine: a plan of byte ranges of one File, read in the background by a pool of threads and handed to one
// consumer, either straight into the caller's memory or through host slabs of one bounded, process-wide pool.
//
//   std::vector<safetensors::Piece> plan;
//   for (const auto& t : file.tensors()) plan.push_back(*safetensors::tensor_piece(file, t));  // staged
//   auto p = safetensors::Prefetcher::start(file, std::move(plan));
//   for (;;) {
//     auto ev = (*p)->next();                       // blocks; an Error names the file and the tensor
//     if (!ev.ok() || ev->kind == safetensors::PrefetchEvent::Kind::kEnd) break;
//     copy_async(device_dst(ev->piece) + ev->offset, ev->bytes);   // e.g. a non-blocking device copy
//     ...once that copy completed: (*p)->release(ev->slab);
//   }
//
// A Piece is a byte range [begin, end) of the File's data buffer: a whole tensor (tensor_piece) or rows
// [r0, r1) of its first dimension (row_piece). Bytes no piece needs are never read. Each piece is delivered one
// of two ways:
//   - kDirect: the caller gives the destination up front; reader threads write the bytes straight into it
//     (no slab, no copy) and next() reports the piece once all of it landed (CPU loads).
//   - kStaged: the bytes are read into slabs of a SlabPool and next() hands them out chunk by chunk; the
//     consumer copies each chunk out (an accelerator load issues an async device copy) and returns the slab
//     with release() once nothing reads it any more. A slab is never reused before its release.
// Pieces are read in chunks: staged pieces that are adjacent in the file (or closer than merge_gap) share one
// read and one slab; a long range is split at page-aligned file offsets into reads of at most chunk_bytes
// (staged: at most the pool's slab size). Reads are positional (Source::pread_into) on every backend, so a
// file that shrank gives kIo, never SIGBUS. Where the source reads directly (ReadHints::alignment), a staged
// chunk lies in its slab at an address congruent to its file offset modulo that alignment (the slab keeps room
// for the shift), so the reads land in the slab without a bounce.
//
// A consumer whose copies out of a slab complete later than they are issued (non-blocking device copies) feeds
// each copy's completion to a CopyQueue, which releases the slab once that copy completed: the one
// implementation of "a slab goes back only after the copies out of it completed".
//
// Thread safety: a SlabPool is safe for concurrent use by multiple threads. A Prefetcher's methods are safe to
// call from multiple threads; next() is meant for one consumer thread, and cancel() may come from any thread
// at any time, also while others block in next() or wait_piece(). A CopyQueue needs external synchronization.
//
// Ownership and lifetimes: a Prefetcher holds its own copy of the File (the file stays open while it runs)
// and of the plan's tensor names. Direct destinations are the caller's: they must stay valid until the piece
// was reported done, or until the Prefetcher is destroyed. A staged event's bytes lie in a slab lent to the
// consumer: valid until release(event.slab) or the Prefetcher's destruction, whichever comes first. Every
// Prefetcher must be destroyed before the SlabPool it uses (the global pool is never destroyed).
#ifndef SAFETENSORS_ENGINE_H_
#define SAFETENSORS_ENGINE_H_

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "safetensors/error.h"
#include "safetensors/export.h"
#include "safetensors/file.h"

namespace safetensors {

namespace internal {
struct SlabPoolAccess;
}

// The engine's tuning defaults are each stated once, here: these two, and SlabPool::kDefaultCapacity and
// kDefaultSlabBytes. PrefetchOptions and SlabPool default to them, the C API (c.h) and libtorch::LoadOptions
// use them, and the Python binding exports them (_safetensors_cpp.DEFAULT_*), where safe_open.prefetch, the
// loading engine (_engine.py) and the binding's own signatures read them.
// Reader threads per prefetch.
inline constexpr unsigned kDefaultReaderThreads = 8;
// The largest single read of a prefetch.
inline constexpr std::uint64_t kDefaultChunkBytes = std::uint64_t{8} << 20;

// How a piece reaches its consumer (see the top of this file).
enum class Delivery : std::uint8_t { kStaged, kDirect };

// One range of a plan.
struct Piece {
  // Data-buffer offsets (as TensorInfo::begin/end): [begin, end), begin <= end.
  std::uint64_t begin = 0;
  std::uint64_t end = 0;
  // The tensor the bytes belong to, named in errors. Copied by Prefetcher::start().
  std::string_view tensor;
  Delivery delivery = Delivery::kStaged;
  // kDirect only: where the bytes go, exactly end - begin bytes. Ignored for kStaged.
  std::span<std::byte> dst;
  // dtype_swap_bytes of the tensor's dtype (tensor_piece and row_piece set it; 0: bytes without a dtype).
  // Reads split the piece only at whole units of it, and on a big-endian host its bytes are swapped to native
  // values before they are delivered (in the destination, or in the slab), so every consumer sees values.
  // Pieces that overlap must agree on it and on the unit boundaries (pieces of one tensor do).
  std::uint8_t swap_bytes = 0;

  std::uint64_t size() const { return end - begin; }
};

// The piece holding all of `tensor` (delivery kStaged; set delivery and dst for a direct load).
// REQUIRES: tensor is one of file.tensors(). Errors: kInvalidArgument (the tensor lies outside this file).
SAFETENSORS_EXPORT Result<Piece> tensor_piece(const File& file, const TensorInfo& tensor);

// The piece holding rows [r0, r1) of the tensor's first dimension (delivery kStaged). Packed sub-byte dtypes
// count rows of the logical shape, and both row boundaries must fall on a byte boundary.
// REQUIRES: tensor is one of file.tensors(). Errors: kInvalidSlice (a 0-d tensor, or not
// r0 <= r1 <= shape[0]), kMisalignedSlice (a sub-byte row boundary inside a byte), kValidationOverflow,
// kInvalidArgument (the tensor lies outside this file).
SAFETENSORS_EXPORT Result<Piece> row_piece(const File& file, const TensorInfo& tensor, std::uint64_t r0,
                                           std::uint64_t r1);

// Where slab memory comes from: a pair of callbacks, so that Python can hand in torch's pinned (page-locked)
// allocator. alloc returns nullptr on failure (a prefetch then fails with kIo, ENOMEM); free receives the
// pointer and the size alloc was called with. Both may be called from any thread, never with a pool lock held.
struct SlabAllocator {
  std::function<void*(std::size_t size)> alloc;
  std::function<void(void* p, std::size_t size)> free;
};

struct SlabPoolStats {
  // The settings: the most bytes allocated at once, and the size of each slab.
  std::uint64_t capacity = 0;
  std::uint64_t slab_bytes = 0;
  // Total time readers waited for room in the pool (every prefetcher's readers added up, since construction):
  // what a larger capacity would have saved. Waits for a prefetcher's own max_slabs are not counted here (see
  // PrefetchStats::slab_wait).
  std::chrono::nanoseconds wait{0};
  // Bytes allocated now (slabs in use + free slabs + allocations in progress); never above capacity.
  std::uint64_t allocated_bytes = 0;
  // The most allocated_bytes ever was (since construction or reset_peak()).
  std::uint64_t peak_bytes = 0;
  // Slabs lent to prefetchers: being read into, queued for a consumer, or held by one.
  std::uint64_t slabs_in_use = 0;
  // Slabs allocated and idle.
  std::uint64_t slabs_free = 0;
  // Prefetchers attached now.
  std::uint64_t users = 0;
  // Whether slabs now come from a set_allocator() allocator rather than the default one.
  bool custom_allocator = false;
  // Calls made to the allocator, in total.
  std::uint64_t allocations = 0;
  std::uint64_t frees = 0;
  // set_allocator() calls that succeeded, in total: a caller that installed an allocator knows it is still
  // the pool's while this is the value it saw right after installing it.
  std::uint64_t allocator_changes = 0;
};

// A bounded pool of equally sized host slabs, shared by every Prefetcher that uses it: never more than
// capacity() bytes are allocated at once; a reader that finds no free slab and no room waits (cancellably)
// until a consumer releases one. Slabs are allocated lazily and kept for reuse; idle memory is returned when
// the last attached Prefetcher goes (unless set_release_when_idle(false)) and on trim().
//
// Thread safety: safe for concurrent use by multiple threads.
class SAFETENSORS_EXPORT SlabPool {
 public:
  // The cap on host staging memory, and the size of each slab (see kDefaultReaderThreads).
  static constexpr std::uint64_t kDefaultCapacity = std::uint64_t{256} << 20;
  static constexpr std::uint64_t kDefaultSlabBytes = std::uint64_t{8} << 20;
  // Slab sizes are whole pages of this size.
  static constexpr std::uint64_t kPageBytes = 4096;

  // A pool with the default allocator (page-aligned std::aligned_alloc). Errors of the sizes are as in
  // set_slab_bytes()/set_capacity(); invalid sizes fall back to the defaults.
  explicit SlabPool(std::uint64_t capacity = kDefaultCapacity, std::uint64_t slab_bytes = kDefaultSlabBytes);
  // Frees the free slabs. REQUIRES: no Prefetcher uses this pool.
  ~SlabPool();
  SlabPool(const SlabPool&) = delete;
  SlabPool& operator=(const SlabPool&) = delete;

  // The process-wide pool (created on first use, never destroyed: slabs may come from an allocator that is
  // gone at exit).
  static SlabPool& global();

  // At most `bytes` allocated at once. Lowering it frees free slabs now and slabs in use as they come back.
  // Errors: kInvalidArgument when bytes < slab_bytes().
  Status set_capacity(std::uint64_t bytes);
  std::uint64_t capacity() const;
  // The size of each slab, and so the largest staged chunk of prefetchers started afterwards. Free slabs of
  // another size are freed now, slabs in use when they come back. Errors: kInvalidArgument unless
  // 0 < bytes <= capacity() and bytes is a multiple of kPageBytes.
  Status set_slab_bytes(std::uint64_t bytes);
  std::uint64_t slab_bytes() const;
  // Slabs allocated from now on come from `allocator` (both callbacks empty: the default). Free slabs are
  // freed now; slabs in use are freed with the allocator that made them when they come back.
  // Errors: kInvalidArgument when exactly one callback is empty.
  Status set_allocator(SlabAllocator allocator);
  // Whether free slabs are freed when the last attached Prefetcher is destroyed (default true).
  void set_release_when_idle(bool release);
  // Frees every free slab now.
  void trim();

  SlabPoolStats stats() const;
  // Restarts peak_bytes from allocated_bytes.
  void reset_peak();

 private:
  friend struct internal::SlabPoolAccess;
  struct State;
  std::unique_ptr<State> state_;
};

// A slab lent to a consumer by PrefetchEvent; 0 is no slab.
using SlabHandle = std::uint64_t;

struct PrefetchOptions {
  // The most reader threads one prefetcher runs: a larger count is accepted and runs this many.
  static constexpr unsigned kMaxThreads = 64;
  // Reader threads (0 = kDefaultReaderThreads). At most kMaxThreads run, fewer when the plan has fewer chunks.
  unsigned threads = kDefaultReaderThreads;
  // The largest single read; staged chunks are also at most the pool's slab size. REQUIRES: > 0.
  std::uint64_t chunk_bytes = kDefaultChunkBytes;
  // Staged pieces at most this many bytes apart are read as one chunk, the gap included. 0: only adjacent
  // pieces are merged, and no byte outside the plan is read.
  std::uint64_t merge_gap = 0;
  // The most slabs this prefetcher holds at once (reading, queued or lent), so one plan cannot take the
  // whole pool from other prefetchers; 0 = 2 * threads.
  std::size_t max_slabs = 0;
  // The pool staged pieces use; nullptr = SlabPool::global().
  SlabPool* pool = nullptr;
};

// What next() returns.
struct PrefetchEvent {
  enum class Kind : std::uint8_t {
    // A chunk of a staged piece landed in a slab: bytes are the piece's bytes [offset, offset + bytes.size()).
    kStaged,
    // A direct piece is complete in its destination.
    kDirect,
    // Every piece was delivered (and every later next() says so again).
    kEnd,
    // next_for() timed out.
    kTimeout,
  };
  Kind kind = Kind::kEnd;
  // kStaged, kDirect: the piece's position in the plan.
  std::size_t piece = 0;
  // kStaged: where bytes lie in the piece.
  std::uint64_t offset = 0;
  // kStaged: the bytes, in a slab. Empty for a zero-size piece.
  std::span<const std::byte> bytes;
  // kStaged: pass to release() once nothing reads bytes any more (0 for a zero-size piece: no slab).
  SlabHandle slab = 0;
  // kStaged: the start of the slab's allocation (what SlabAllocator::alloc returned), so that a consumer that
  // wraps each allocation once (a pinned torch tensor) finds bytes at bytes.data() - slab_data in it.
  const std::byte* slab_data = nullptr;
  // kStaged: this is the piece's last chunk to be handed out (chunks of a piece may come in any order).
  // kDirect: always true.
  bool piece_done = false;
};

struct PrefetchStats {
  // The read phase, on std::chrono::steady_clock (CLOCK_MONOTONIC on Linux): when start() started the readers,
  // and when the last read that succeeded so far ended (the clock's epoch before the first). For benchmarks
  // that relate device copies to the reads (slab waits lie inside the phase; see slab_wait).
  std::chrono::steady_clock::time_point started{};
  std::chrono::steady_clock::time_point last_read_end{};
  // Bytes read from the file (merged gaps included), and how many reads that took.
  std::uint64_t bytes_read = 0;
  std::uint64_t reads = 0;
  // Bytes read into slabs / straight into direct destinations.
  std::uint64_t bytes_staged = 0;
  std::uint64_t bytes_direct = 0;
  // Chunks in the plan (each one read).
  std::uint64_t chunks = 0;
  // Total time reader threads waited for a slab (the per-prefetcher limit or the pool).
  std::chrono::nanoseconds slab_wait{0};
  // Staged events handed out by next() and not yet released.
  std::uint64_t events_lent = 0;
};

// A running prefetch of one plan over one File. Created by start(); readers run until every chunk was read,
// the first error, cancel() or destruction.
//
// Errors from the readers (short read, EIO, a truncated file, a slab the allocator refused) stop the prefetch
// and are returned by every later next() and wait_piece() of a piece not yet done, as an Error naming the file
// and the tensor. Events queued but not handed out are dropped and their slabs returned.
//
// Thread safety: see the top of this file.
class SAFETENSORS_EXPORT Prefetcher {
 public:
  // Validates the plan, then starts the readers and returns at once. Zero-size pieces are reported by next()
  // without any read. Errors (nothing is started): kInvalidArgument for a piece outside the data buffer, with
  // end < begin, a direct piece whose dst.size() differs from its size, chunk_bytes == 0, or more than 64
  // threads.
  static Result<std::unique_ptr<Prefetcher>> start(File file, std::vector<Piece> plan,
                                                   const PrefetchOptions& options = {});

  // cancel(), joins the readers and returns every slab to the pool, lent ones included.
  // REQUIRES: the consumer no longer reads any lent slab (its device copies from them completed).
  ~Prefetcher();
  Prefetcher(const Prefetcher&) = delete;
  Prefetcher& operator=(const Prefetcher&) = delete;

  // Blocks until the next event: a staged chunk landed, a direct piece completed, or the end. Events come in
  // the order they landed. Errors: the readers' first error (kIo and others, see above); kInvalidArgument once
  // cancel() was called.
  Result<PrefetchEvent> next();
  // As next(), returning a kTimeout event when nothing came within `timeout`.
  Result<PrefetchEvent> next_for(std::chrono::nanoseconds timeout);

  // Returns the slab behind a staged event to the pool. A slab holding several events' bytes returns once
  // each of them was released. Valid after cancel() and after an error. release(0) does nothing.
  // Errors: kInvalidArgument for a handle that is not lent (never was, or released already).
  Status release(SlabHandle slab);

  // Blocks until direct piece `i` is complete in its destination (also before its event was taken from
  // next()). Errors: kInvalidArgument (i out of range, a staged piece, or cancelled before the piece was
  // done); the readers' error when the prefetch failed before the piece was done.
  Status wait_piece(std::size_t i);
  // True once piece i is complete: in its destination (direct) or handed out by next() in full (staged).
  bool piece_done(std::size_t i) const;

  // Stops the readers, wakes every waiter (in next(), wait_piece() and on the pool), drops queued events and
  // returns their slabs. Lent slabs stay lent until release() or destruction. Idempotent; any thread.
  void cancel();

  // The plan as given (tensor names now view the Prefetcher's copies).
  const std::vector<Piece>& plan() const;
  PrefetchStats stats() const;

 private:
  struct Impl;
  explicit Prefetcher(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// The consumer's half of the slab rule: a staged slab goes back to the Prefetcher only after every copy out of
// it completed. The consumer issues a copy out of each staged event and add()s that copy's Completion; the
// queue releases the event's slab once that copy and every copy added before it completed (copies on one
// stream complete in the order they were issued), and reports the pieces whose last copy completed.
//
//   safetensors::CopyQueue copies(*prefetcher);    // declared after the Prefetcher: destroyed first
//   std::vector<std::size_t> landed;                 // pieces whose bytes are all on the device
//   for (;;) {
//     auto ev = copies.next(&landed);               // retires completed copies while it waits
//     if (!ev.ok()) return ev.error();              // ~CopyQueue waits for the copies in flight
//     if (ev->kind == PrefetchEvent::Kind::kEnd) break;
//     if (ev->kind == PrefetchEvent::Kind::kTimeout) continue;
//     copy_async(...);
//     copies.add(ev->slab, {[=] { return event.query(); }, [=] { event.synchronize(); }}, ev->piece);
//   }
//   auto st = copies.finish(&landed);
//
// Thread safety: external synchronization (one consumer thread); completions run on that thread.
// Ownership: the Prefetcher must outlive the queue. The destructor waits for every pending copy (ignoring
// their errors) and releases its slab, so that no slab is reused while a device may still read it, also on
// the way out of an error.
class SAFETENSORS_EXPORT CopyQueue {
 public:
  // How the consumer learns that a copy completed: done() polls, wait() blocks until it did (a device event's
  // query and synchronize). Both empty: the copy completed already (a blocking copy, or none). Either may
  // throw; the exception propagates out of retire(), next() or finish() and the copy stays pending.
  struct Completion {
    std::function<bool()> done;
    std::function<void()> wait;
  };
  // add()'s piece for a copy that does not complete a piece.
  static constexpr std::size_t kNoPiece = static_cast<std::size_t>(-1);
  // How long next() waits for the readers while copies are pending, before it waits for the oldest copy.
  static constexpr std::chrono::milliseconds kPoll{20};

  explicit CopyQueue(Prefetcher& prefetcher) : prefetcher_(prefetcher) {}
  ~CopyQueue();
  CopyQueue(const CopyQueue&) = delete;
  CopyQueue& operator=(const CopyQueue&) = delete;

  // Records a copy out of `slab` (a staged event's; 0: none) issued after every copy added before. `piece`:
  // the piece this copy completes (a staged event with piece_done), else kNoPiece.
  void add(SlabHandle slab, Completion completion, std::size_t piece = kNoPiece);
  // Releases the slabs of the copies that completed, oldest first, stopping at the first that has not; with
  // `wait`, waits for the oldest copy first. Appends the pieces those copies completed to *landed.
  // Errors: those of Prefetcher::release().
  Status retire(bool wait, std::vector<std::size_t>* landed);
  // Retires the copies that completed, then waits for the Prefetcher's next event. While copies are pending
  // it waits at most kPoll; then it waits for the oldest copy (once every slab is lent to a copy, the readers
  // wait for one) and returns a kTimeout event. Errors: the Prefetcher's, and those of retire().
  Result<PrefetchEvent> next(std::vector<std::size_t>* landed);
  // Waits for every pending copy, retiring each.
  Status finish(std::vector<std::size_t>* landed);
  bool empty() const { return pending_.empty(); }

 private:
  struct Pending {
    SlabHandle slab;
    Completion completion;
    std::size_t piece;
  };
  Prefetcher& prefetcher_;
  std::deque<Pending> pending_;
};

}  // namespace safetensors

#endif  // SAFETENSORS_ENGINE_H_
