// The engine (engine.h) in _safetensors_cpp: Prefetcher, PrefetchEvent and the process-wide slab pool.
//
// Threads: a Prefetcher may be shared (every method, close() included, from any thread); a CopyQueue is used
// by one thread at a time (the loader that made it); PrefetchEvent is immutable.
//
// Declarative defs over the C++ API. A Python Prefetcher owns a shared reference to the C++ one: each call
// takes its own reference while it holds the GIL and drops it with the GIL released, so close() from one thread
// never destroys the engine under another thread's next(); the last reference cancels and joins the readers,
// always with the GIL released (readers may be waiting for it in a Python slab allocator). next(), wait_piece(),
// release(), cancel() and close() release the GIL and touch no Python object while it is released. Slabs are
// exposed as an integer address and a length, valid until release(). Errors go through module.cc's translation.
#include "engine_binding.h"

#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/string_view.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <initializer_list>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "common.h"
#include "safetensors/engine.h"
#include "safetensors/file.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace safetensors::python {
namespace {

// Drops `p` with the GIL released when this thread holds it.
void drop(std::shared_ptr<Prefetcher>& p) {
  if (p && p.use_count() == 1 && holds_gil()) {
    without_gil([&] { p.reset(); });
  } else {
    p.reset();
  }
}

class PyPrefetcher {
 public:
  explicit PyPrefetcher(std::shared_ptr<Prefetcher> p) : p_(std::move(p)) {}
  ~PyPrefetcher() { close(); }
  PyPrefetcher(const PyPrefetcher&) = delete;
  PyPrefetcher& operator=(const PyPrefetcher&) = delete;

  // A reference of the caller's own. REQUIRES: the GIL is held (the thread is attached, free-threaded).
  std::shared_ptr<Prefetcher> ref() const {
    std::shared_ptr<Prefetcher> p;
    {
      nb::ft_lock_guard lock(mutex_);
      p = p_;
    }
    if (!p) check(Status(Error::invalid_argument("", "prefetcher closed")));
    return p;
  }

  // Runs fn(prefetcher) with the GIL released.
  template <typename Fn>
  auto call(Fn&& fn) const {
    std::shared_ptr<Prefetcher> p = ref();
    return without_gil([&] {
      auto out = fn(*p);
      p.reset();
      return out;
    });
  }

  void close() {
    std::shared_ptr<Prefetcher> p;
    {
      nb::ft_lock_guard lock(mutex_);
      p = std::move(p_);
    }
    if (!p) return;
    without_gil([&] { p->cancel(); });
    drop(p);
  }

 private:
  // The GIL used to make copying p_ and close()'s move of it atomic; a free-threaded Python has no GIL, so
  // nanobind's ft_mutex does (it compiles to nothing where there is a GIL). Held for the copy or move only.
  mutable nb::ft_mutex mutex_;
  std::shared_ptr<Prefetcher> p_;  // GUARDED_BY(mutex_); null once closed
};

// A CopyQueue (engine.h) over a Python Prefetcher, whose completions are Python calls: add(event, ...) records
// a copy that done(event) polls and wait(event) waits for (event None: complete already). The queue runs with
// the GIL released and takes it for each call; what it holds of Python is dropped with the GIL held.
class PyCopyQueue {
 public:
  PyCopyQueue(std::shared_ptr<Prefetcher> prefetcher, nb::object done, nb::object wait)
      : prefetcher_(std::move(prefetcher)),
        queue_(std::in_place, *prefetcher_),
        calls_(new Calls{std::move(done), std::move(wait)}) {}
  ~PyCopyQueue() { close(); }
  PyCopyQueue(const PyCopyQueue&) = delete;
  PyCopyQueue& operator=(const PyCopyQueue&) = delete;

  // REQUIRES: the GIL is held.
  void add(nb::object event, SlabHandle slab, std::int64_t piece) {
    CopyQueue::Completion completion;
    if (!event.is_none()) {
      auto held = std::shared_ptr<Event>(new Event{std::move(event), calls_});
      completion.done = [held] {
        nb::gil_scoped_acquire gil;
        return nb::cast<bool>(held->calls->done(held->event));
      };
      completion.wait = [held] {
        nb::gil_scoped_acquire gil;
        held->calls->wait(held->event);
      };
    }
    queue().add(slab, std::move(completion), piece < 0 ? CopyQueue::kNoPiece : static_cast<std::size_t>(piece));
  }

  std::pair<PrefetchEvent, std::vector<std::size_t>> next() {
    std::vector<std::size_t> landed;
    PrefetchEvent ev = check(without_gil([&] { return queue().next(&landed); }));
    return {ev, std::move(landed)};
  }

  std::vector<std::size_t> finish() {
    std::vector<std::size_t> landed;
    check(without_gil([&] { return queue().finish(&landed); }));
    return landed;
  }

  // Waits for every pending copy (errors ignored) and releases its slab; then every method but close() raises.
  void close() {
    if (!queue_) return;
    without_gil([&] { queue_.reset(); });
    drop(prefetcher_);
  }

 private:
  // The Python callables, released with the GIL whichever thread drops the last reference.
  struct Calls {
    nb::object done, wait;
    ~Calls() {
      nb::gil_scoped_acquire gil;
      done.reset();
      wait.reset();
    }
  };
  struct Event {
    nb::object event;
    std::shared_ptr<Calls> calls;
    ~Event() {
      nb::gil_scoped_acquire gil;
      event.reset();
    }
  };

  CopyQueue& queue() {
    if (!queue_) check(Status(Error::invalid_argument("", "copy queue closed")));
    return *queue_;
  }

  std::shared_ptr<Prefetcher> prefetcher_;  // outlives queue_ (declared first, reset after it)
  std::optional<CopyQueue> queue_;
  std::shared_ptr<Calls> calls_;
};

const char* kind_name(PrefetchEvent::Kind k) {
  switch (k) {
    case PrefetchEvent::Kind::kStaged: return "staged";
    case PrefetchEvent::Kind::kDirect: return "direct";
    case PrefetchEvent::Kind::kEnd: return "end";
    case PrefetchEvent::Kind::kTimeout: return "timeout";
  }
  return "unknown";
}

// Python callables as slab allocator. They run on reader threads, which take the GIL for them; the callables
// are dropped with the GIL held, whichever thread frees the last slab they made.
struct PyAllocator {
  nb::object alloc;
  nb::object free;
  ~PyAllocator() {
    nb::gil_scoped_acquire gil;
    alloc.reset();
    free.reset();
  }
};

SlabAllocator to_allocator(std::optional<nb::object> alloc, std::optional<nb::object> free) {
  if (!alloc && !free) return {};
  if (!alloc || !free) check(Status(Error::invalid_argument("<slab pool>", "give both alloc and free, or neither")));
  auto cb = std::shared_ptr<PyAllocator>(new PyAllocator{std::move(*alloc), std::move(*free)});
  SlabAllocator a;
  a.alloc = [cb](std::size_t size) -> void* {
    nb::gil_scoped_acquire gil;
    try {
      return reinterpret_cast<void*>(nb::cast<std::uintptr_t>(cb->alloc(size)));
    } catch (nb::python_error& e) {
      e.discard_as_unraisable("safetensors slab allocator");
    } catch (const std::exception&) {
    }
    return nullptr;  // the prefetch fails with an I/O error (ENOMEM)
  };
  a.free = [cb](void* p, std::size_t size) {
    nb::gil_scoped_acquire gil;
    try {
      cb->free(reinterpret_cast<std::uintptr_t>(p), size);
    } catch (nb::python_error& e) {
      e.discard_as_unraisable("safetensors slab allocator");
    } catch (const std::exception&) {
    }
  };
  return a;
}

// Stats as the binding hands them out: a dict[str, int] of named counters.
// A duration in whole nanoseconds, the unit of the counters Python gets (`slab_wait_ns`, `started_ns`, ...).
std::uint64_t nanoseconds(std::chrono::nanoseconds d) { return static_cast<std::uint64_t>(d.count()); }

nb::dict counters(std::initializer_list<std::pair<const char*, std::uint64_t>> named) {
  nb::dict d;
  for (const auto& [name, value] : named) d[name] = value;
  return d;
}

nb::dict pool_stats() {
  const SlabPoolStats s = SlabPool::global().stats();
  return counters({{"capacity", s.capacity},
                   {"slab_bytes", s.slab_bytes},
                   {"wait_ns", nanoseconds(s.wait)},
                   {"allocated_bytes", s.allocated_bytes},
                   {"peak_bytes", s.peak_bytes},
                   {"slabs_in_use", s.slabs_in_use},
                   {"slabs_free", s.slabs_free},
                   {"users", s.users},
                   {"custom_allocator", s.custom_allocator},
                   {"allocations", s.allocations},
                   {"frees", s.frees},
                   {"allocator_changes", s.allocator_changes}});
}

using PyPiece = std::tuple<std::string, std::uint64_t, std::uint64_t, std::optional<std::uintptr_t>>;

}  // namespace

void bind_engine(nb::module_& m) {
  // The engine's tuning defaults (engine.h states each once), for the Python side and the signatures below.
  m.attr("DEFAULT_READER_THREADS") = kDefaultReaderThreads;
  m.attr("DEFAULT_CHUNK_BYTES") = kDefaultChunkBytes;
  m.attr("DEFAULT_STAGING_BYTES") = SlabPool::kDefaultCapacity;
  m.attr("DEFAULT_SLAB_BYTES") = SlabPool::kDefaultSlabBytes;
  m.attr("PREFETCH_MAX_THREADS") = PrefetchOptions::kMaxThreads;
  const std::string prefetcher_init =
      "def __init__(self, file: safetensors._safetensors_cpp.File, plan: list[tuple[str, int, int, int | None]], "
      "threads: int = " +
      std::to_string(kDefaultReaderThreads) + ", chunk_bytes: int = " + std::to_string(kDefaultChunkBytes) +
      ", merge_gap: int = 0, max_slabs: int = 0) -> None";

  m.def(
      "tensor_piece",
      [](const File& f, std::string_view name) {
        const Piece p = check(tensor_piece(f, *check(f.info(name))));
        return std::pair(p.begin, p.end);
      },
      "file"_a, "name"_a, "The data-buffer range [begin, end) of a whole tensor.");
  m.def(
      "row_piece",
      [](const File& f, std::string_view name, std::uint64_t r0, std::uint64_t r1) {
        const Piece p = check(row_piece(f, *check(f.info(name)), r0, r1));
        return std::pair(p.begin, p.end);
      },
      "file"_a, "name"_a, "r0"_a, "r1"_a,
      "The data-buffer range [begin, end) of rows [r0, r1) of a tensor's first dimension (checked: 0-d, range, "
      "sub-byte alignment).");

  nb::class_<PrefetchEvent>(m, "PrefetchEvent", "What Prefetcher.next() returns.")
      .def_prop_ro(
          "kind", [](const PrefetchEvent& e) { return kind_name(e.kind); },
          "'staged' (bytes in a slab), 'direct' (a piece complete), 'end' or 'timeout'.")
      .def_ro("piece", &PrefetchEvent::piece, "The piece's position in the plan.")
      .def_ro("offset", &PrefetchEvent::offset, "staged: where the bytes lie in the piece.")
      .def_prop_ro(
          "address", [](const PrefetchEvent& e) { return reinterpret_cast<std::uintptr_t>(e.bytes.data()); },
          "staged: the bytes' address in the slab (valid until release(slab)).")
      .def_prop_ro("size", [](const PrefetchEvent& e) { return e.bytes.size(); })
      .def_ro("slab", &PrefetchEvent::slab, "staged: the handle to release (0: none).")
      .def_prop_ro(
          "slab_address", [](const PrefetchEvent& e) { return reinterpret_cast<std::uintptr_t>(e.slab_data); },
          "staged: the slab allocation's start (what the pool's alloc returned); address - slab_address is the "
          "bytes' offset in it.")
      .def_ro("piece_done", &PrefetchEvent::piece_done, "The piece's last chunk (always true for direct).");

  nb::class_<PyPrefetcher>(m, "Prefetcher",
                           "A plan of data-buffer ranges read in the background (the C++ engine). Each plan item is "
                           "(tensor name, begin, end, dst): dst an address of end - begin writable bytes (direct) or "
                           "None (staged: bytes come through slabs of the process-wide pool). May be shared by "
                           "threads: close() from one makes the others' calls raise.")
      .def(
          "__init__",
          [](PyPrefetcher* self, const File& f, const std::vector<PyPiece>& plan, unsigned threads,
             std::uint64_t chunk_bytes, std::uint64_t merge_gap, std::size_t max_slabs) {
            std::vector<Piece> pieces;
            pieces.reserve(plan.size());
            for (const auto& [name, begin, end, dst] : plan) {
              Piece p;
              p.begin = begin;
              p.end = end;
              p.tensor = name;
              // The named tensor's dtype gives the swap width (see Piece::swap_bytes): a big-endian host gets
              // native values in dst and in the slabs.
              if (const TensorInfo* t = f.find(name)) p.swap_bytes = dtype_swap_bytes(t->dtype);
              if (dst) {
                p.delivery = Delivery::kDirect;
                // The size is checked by start(): end < begin is refused there.
                p.dst = std::span<std::byte>(reinterpret_cast<std::byte*>(*dst), end >= begin ? end - begin : 0);
              }
              pieces.push_back(p);
            }
            PrefetchOptions o;
            o.threads = threads;
            o.chunk_bytes = chunk_bytes;
            o.merge_gap = merge_gap;
            o.max_slabs = max_slabs;
            Result<std::unique_ptr<Prefetcher>> started =
                without_gil([&] { return Prefetcher::start(f, std::move(pieces), o); });
            new (self) PyPrefetcher(std::shared_ptr<Prefetcher>(check(std::move(started))));
          },
          "file"_a, "plan"_a, "threads"_a = kDefaultReaderThreads, "chunk_bytes"_a = kDefaultChunkBytes,
          "merge_gap"_a = 0, "max_slabs"_a = 0, nb::sig(prefetcher_init.c_str()))
      .def(
          "next",
          [](const PyPrefetcher& self, std::optional<double> timeout) {
            return check(self.call([&](Prefetcher& p) {
              if (!timeout) return p.next();
              const auto ns = std::chrono::nanoseconds(static_cast<std::int64_t>(std::max(0.0, *timeout) * 1e9));
              return p.next_for(ns);
            }));
          },
          "timeout"_a = nb::none(),
          "Waits (the GIL released) for the next event; raises the readers' error (naming file and tensor).")
      .def(
          "release",
          [](const PyPrefetcher& self, std::uint64_t slab) {
            check(self.call([&](Prefetcher& p) { return p.release(slab); }));
          },
          "slab"_a, "Returns a staged event's slab to the pool, once nothing reads it any more.")
      .def(
          "wait_piece",
          [](const PyPrefetcher& self, std::size_t i) {
            check(self.call([&](Prefetcher& p) { return p.wait_piece(i); }));
          },
          "piece"_a, "Waits (the GIL released) until direct piece `piece` is complete.")
      .def(
          "piece_done", [](const PyPrefetcher& self, std::size_t i) { return self.ref()->piece_done(i); }, "piece"_a)
      .def(
          "cancel",
          [](const PyPrefetcher& self) {
            self.call([](Prefetcher& p) {
              p.cancel();
              return 0;
            });
          },
          "Stops the readers and wakes every waiter; lent slabs stay valid until released or close().")
      .def("close", &PyPrefetcher::close,
           "Cancels, joins the readers and returns every slab. Then every method but close() raises.")
      .def(
          "__enter__", [](nb::handle self) { return self; }, nb::sig("def __enter__(self) -> Prefetcher"))
      .def(
          "__exit__", [](PyPrefetcher& self, nb::handle, nb::handle, nb::handle) { self.close(); }, nb::arg().none(),
          nb::arg().none(), nb::arg().none())
      .def("__len__", [](const PyPrefetcher& self) { return self.ref()->plan().size(); })
      .def(
          "stats",
          [](const PyPrefetcher& self) {
            const PrefetchStats s = self.ref()->stats();
            return counters({{"bytes_read", s.bytes_read},
                             {"reads", s.reads},
                             {"bytes_staged", s.bytes_staged},
                             {"bytes_direct", s.bytes_direct},
                             {"chunks", s.chunks},
                             {"slab_wait_ns", nanoseconds(s.slab_wait)},
                             {"events_lent", s.events_lent},
                             {"started_ns", nanoseconds(s.started.time_since_epoch())},
                             {"last_read_end_ns", nanoseconds(s.last_read_end.time_since_epoch())}});
          },
          nb::sig("def stats(self) -> dict[str, int]"),
          "Counters: bytes read, bytes staged/direct, reads, chunks, nanoseconds readers waited for slabs, ...");

  nb::class_<PyCopyQueue>(
      m, "CopyQueue",
      "The engine's slab rule for copies that complete later than they are issued: each "
      "staged event's slab goes back to the Prefetcher once the copy out of it completed. One thread "
      "at a time (external synchronization).")
      .def(
          "__init__",
          [](PyCopyQueue* self, const PyPrefetcher& prefetcher, nb::object done, nb::object wait) {
            new (self) PyCopyQueue(prefetcher.ref(), std::move(done), std::move(wait));
          },
          "prefetcher"_a, "done"_a, "wait"_a,
          nb::sig("def __init__(self, prefetcher: Prefetcher, done: collections.abc.Callable[[typing.Any], bool], "
                  "wait: collections.abc.Callable[[typing.Any], None]) -> None"),
          "done(event) polls a copy's event, wait(event) waits for it; both run on the thread calling next() or "
          "finish().")
      .def("add", &PyCopyQueue::add, "event"_a.none(), "slab"_a, "piece"_a = -1,
           nb::sig("def add(self, event: typing.Any | None, slab: int, piece: int = -1) -> None"),
           "Records a copy out of `slab` issued after every earlier one; event None: complete already. `piece`: "
           "the piece it completes (the event's piece where piece_done), else -1.")
      .def("next", &PyCopyQueue::next,
           "Retires completed copies, then waits (the GIL released) for the next event: (event, pieces whose "
           "last copy completed). With copies pending it waits briefly, then for the oldest copy ('timeout').")
      .def("finish", &PyCopyQueue::finish, "Waits for every pending copy: the pieces they completed.")
      .def("close", &PyCopyQueue::close,
           "Waits for every pending copy (errors ignored) and releases its slab. Then every method but close() "
           "raises.");

  m.def(
      "slab_pool_set_capacity", [](std::uint64_t bytes) { check(SlabPool::global().set_capacity(bytes)); }, "bytes"_a,
      "The most bytes the process-wide slab pool allocates at once (default DEFAULT_STAGING_BYTES).");
  m.def(
      "slab_pool_set_slab_bytes", [](std::uint64_t bytes) { check(SlabPool::global().set_slab_bytes(bytes)); },
      "bytes"_a, "The size of each slab (a multiple of 4096; default DEFAULT_SLAB_BYTES).");
  m.def(
      "slab_pool_set_allocator",
      [](std::optional<nb::object> alloc, std::optional<nb::object> free) {
        SlabAllocator a = to_allocator(std::move(alloc), std::move(free));
        // Idle slabs of the old allocator are freed now, through it.
        check(without_gil([&] { return SlabPool::global().set_allocator(std::move(a)); }));
      },
      "alloc"_a = nb::none(), "free"_a = nb::none(),
      nb::sig("def slab_pool_set_allocator(alloc: collections.abc.Callable[[int], int] | None = None, "
              "free: collections.abc.Callable[[int, int], None] | None = None) -> None"),
      "Slab memory from alloc(size) -> address (0 on failure), returned by free(address, size); both None: the "
      "default. They run on reader threads (taking the GIL).");
  m.def(
      "slab_pool_trim", [] { without_gil([] { SlabPool::global().trim(); }); }, "Frees every idle slab now.");
  m.def(
      "slab_pool_reset_peak", [] { SlabPool::global().reset_peak(); },
      "Restarts the pool's peak_bytes counter from the bytes allocated now.");
  m.def("slab_pool_stats", &pool_stats, nb::sig("def slab_pool_stats() -> dict[str, int]"),
        "Counters of the process-wide slab pool (bytes allocated now and at peak, nanoseconds readers waited for "
        "room in it, slabs in use, ...).");
}

}  // namespace safetensors::python
