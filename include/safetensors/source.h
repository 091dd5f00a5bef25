// Source: where a file's bytes come from.
//
// A Source is a fixed-size, read-only sequence of bytes with positional reads, modelled on LevelDB's
// RandomAccessFile. Several implementations exist and no layer above this one knows which it has: layers above
// ask what a source can do (data(): zero-copy views; data_is_memory(); read_hints(): how it likes to be read),
// never what it is. kind() is a label for people and statistics, not a policy.
//   - mmap:   a private (copy-on-write) mapping of a file, exposed whole by data() for zero-copy views.
//             read() still uses pread(2) on the file's descriptor: a mapped page of a file that shrank or
//             fails with EIO underneath (NFS, FUSE) raises SIGBUS when touched, a positional read returns
//             an error, so every read the library makes for a caller is a positional read. The Source
//             keeps the descriptor open for that as long as it (and so any view of it) lives.
//   - pread:  positional reads with pread(2) into the caller's buffer; no mapping, no shared file position.
//   - direct: positional reads with O_DIRECT, past the page cache, at the file's direct-I/O alignment
//             (statx STATX_DIOALIGN, else 4096): straight into the caller's buffer where the buffer's address
//             is congruent to the file offset modulo that alignment (read_hints().alignment), through
//             aligned bounce memory otherwise (the unaligned head and tail of a range always). A
//             filesystem that refuses O_DIRECT makes it read through the page cache instead, never fail
//             (stats().direct_refused; kind() then says "pread").
//   - memory: a caller's buffer, kept alive by an owner the caller supplies. read() returns views into it.
//   - remote: an object behind an http(s):// or s3:// URL, read with HTTP range requests (remote.h).
// open_file_source() opens regular files only, and picks mmap, pread or direct (kAuto: direct or pread from
// how much of the file is in the page cache); if mapping fails (address-space limits, empty files) it falls
// back to pread. open_source() (file.h) picks a file or a remote source from a location.
//
// Thread safety: a Source is immutable after construction (but for its statistics and a direct source's
// one-way switch to the page cache); all methods are const and safe for concurrent use by multiple threads.
//
// Lifetime: Sources are held by std::shared_ptr. A view into a mapping stays valid while any shared_ptr to
// its Source is alive; File::view() hands out aliasing shared_ptrs so views outlive the File that made them.
#ifndef SAFETENSORS_SOURCE_H_
#define SAFETENSORS_SOURCE_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "safetensors/error.h"
#include "safetensors/export.h"

namespace safetensors {

// How a local file is to be read: OpenOptions::backend, open_file_source(), Source::reopen(). A remote or
// memory source ignores the request: what it can do decides, and File::backend() reports the outcome as a
// ReadPath. The values are the C API's SAFETENSORS_BACKEND_* (2 is ReadPath::kMemory, which no request names).
enum class Backend {
  // Map the file (private, copy-on-write). Views are zero-copy.
  kMmap = 0,
  // Read with pread(2), through the page cache. Tensors are always copied into caller memory.
  kPread = 1,
  // Read with O_DIRECT, past the page cache (see "direct" above); the page cache where the filesystem
  // refuses it. Tensors are always copied into caller memory.
  kDirect = 3,
  // kDirect or kPread, chosen when the file is opened from how much of it the page cache holds (cachestat(2),
  // else mincore(2) or preadv2(RWF_NOWAIT) probes): a file of at least kAutoDirectMinBytes of which less than
  // a third is cached is read directly, any other through the cache. File::backend() reports the choice.
  kAuto = 4,
};

// How an open File's tensors are delivered (File::backend()), from what its source can do: the Backend asked
// for once kAuto has chosen and any fallback is taken, or kMemory for a caller's buffer. The values are the C
// API's SAFETENSORS_BACKEND_*.
enum class ReadPath {
  // Zero-copy views of a mapping.
  kMmap = 0,
  // Positional reads through the page cache (a file not mapped, or a remote object).
  kPread = 1,
  // A caller-supplied buffer (memory_source()).
  kMemory = 2,
  // Positional reads past the page cache.
  kDirect = 3,
};

// kAuto reads smaller files through the page cache whatever is cached: for them the cache costs little, and
// the next process finds them there.
inline constexpr std::uint64_t kAutoDirectMinBytes = std::uint64_t{64} << 20;

// How a Source likes to be read, for the layers that cut reads up (File::read_many, read_slice, the engine).
struct ReadHints {
  // Concurrent reads worth issuing; 0: as the hardware and the size suggest (a local file).
  unsigned parallelism = 0;
  // Separate reads closer than this many bytes are worth merging into one (reading the gap costs less than
  // a second request); 0: only the library's default for slices.
  std::uint64_t merge_gap = 0;
  // Reads into memory whose address is congruent to the file offset modulo this many bytes (a power of two)
  // cost no copy, and reads cut at multiples of it in the file need no bounce for their edges (a direct
  // source); 0: every address is as good.
  std::uint64_t alignment = 0;
  // Reads bypass the page cache: what they read is not cached for the next reader (a direct source).
  bool uncached = false;
};

// What a Source has done so far, for sources that count (remote and direct ones); all zero elsewhere. Every
// counter is a std::uint64_t field listed once more, by name, in kSourceCounters below: the binding and the C API
// (safetensors_file_source_counter) read them from that list, so a new counter is a field and a row here.
struct SourceStats {
  // Remote: requests sent (each retry counts), bytes received in their bodies, and retries among them.
  std::uint64_t requests = 0;
  std::uint64_t bytes_fetched = 0;
  std::uint64_t retries = 0;
  // Direct (a local file opened with kDirect or kAuto): bytes transferred with O_DIRECT (whole aligned
  // blocks, so a little more than was asked for), and of the bytes asked for, those copied out of bounce
  // memory (their destination was not aligned, or they were a range's unaligned edge).
  std::uint64_t direct_bytes = 0;
  std::uint64_t bounced_bytes = 0;
  // Bytes read through the page cache by such a source: all of them where kAuto chose the cache or the
  // filesystem refused O_DIRECT.
  std::uint64_t cached_bytes = 0;
  // 1 where the filesystem refused O_DIRECT (at open, or on the first read): this source reads through the page
  // cache instead (tmpfs before Linux 6.6, some FUSE filesystems).
  std::uint64_t direct_refused = 0;
  // kAuto: the file's bytes the page cache held when the choice was made.
  std::uint64_t resident_bytes = 0;
  // kAuto: how resident_bytes was measured: "cachestat", "mincore" or "nowait" (sampled with
  // preadv2(RWF_NOWAIT)); "" where nothing could tell (then the cache is used) or the file was too small to ask
  // (size < kAutoDirectMinBytes). A label (static storage), not a counter.
  std::string_view residency_probe = {};
};

// Every counter of SourceStats by the name the binding and the C API give it.
struct SourceCounter {
  const char* name;
  std::uint64_t SourceStats::*field;
};
inline constexpr SourceCounter kSourceCounters[] = {
    {"requests", &SourceStats::requests},
    {"bytes_fetched", &SourceStats::bytes_fetched},
    {"retries", &SourceStats::retries},
    {"direct_bytes", &SourceStats::direct_bytes},
    {"bounced_bytes", &SourceStats::bounced_bytes},
    {"cached_bytes", &SourceStats::cached_bytes},
    {"direct_refused", &SourceStats::direct_refused},
    {"resident_bytes", &SourceStats::resident_bytes},
};
// A field added without its row fails here.
static_assert(sizeof(SourceStats) == std::size(kSourceCounters) * sizeof(std::uint64_t) + sizeof(std::string_view),
              "every SourceStats counter has a row in kSourceCounters");

class SAFETENSORS_EXPORT Source {
 public:
  Source() = default;
  Source(const Source&) = delete;
  Source& operator=(const Source&) = delete;
  virtual ~Source();

  // The path, "<memory>", or a URL without its query string or credentials: the context of every error this
  // Source reports. Never holds a secret.
  virtual const std::string& name() const = 0;
  // Size in bytes, fixed when the Source was created.
  virtual std::uint64_t size() const = 0;
  // A label: "mmap", "pread", "direct", "memory", "http", "s3" (a NUL-terminated literal: static storage). For
  // people and statistics only. A direct source says "pread" while it reads through the page cache.
  virtual std::string_view kind() const = 0;

  // Reads exactly dst.size() bytes starting at `offset`. On success the returned span holds them: either a
  // view into a memory Source's buffer (then dst is untouched) or dst itself after the bytes were copied
  // there (files, mapped or not). `what` names the read in errors, e.g. "read of tensor `w`".
  // Errors: kInvalidArgument if [offset, offset + dst.size()) is not inside [0, size()); kIo for an operating
  // system failure or when the file ended early (it shrank after it was opened). Never a signal.
  Result<std::span<const std::byte>> read(std::uint64_t offset, std::span<std::byte> dst,
                                          std::string_view what = "read") const;

  // Copies exactly dst.size() bytes starting at `offset` into dst (read_exact()): a positional read of the
  // file, never a copy out of a mapping, as every read() of a file is. Errors: as read().
  Status pread_into(std::uint64_t offset, std::span<std::byte> dst) const;

  // The whole content as addressable memory, or nullptr (pread). Valid while this Source is alive. For a
  // mapping this is the one unprotected path: touching a page the file no longer backs raises SIGBUS.
  virtual const std::byte* data() const { return nullptr; }
  // True when data() may be written through: a private copy-on-write mapping whose writes never reach the
  // file. Memory sources and read-only mappings return false.
  virtual bool writable() const { return false; }
  // True when data() is ordinary memory (a caller's buffer) that may be copied from directly. A mapping's
  // data() can raise SIGBUS, so the library reads a mapped file with positional reads instead.
  virtual bool data_is_memory() const { return false; }
  // A hint that [offset, offset + length) will be read soon (readahead). Never fails.
  virtual void prefetch(std::uint64_t /*offset*/, std::uint64_t /*length*/) const {}
  virtual ReadHints read_hints() const { return {}; }
  virtual SourceStats stats() const { return {}; }
  // This source's bytes read through `backend` instead: a new Source over the same open file (not its path
  // again, which may name another file by now), of the same size(); nullptr where this source has no other way
  // to be read (memory, remote: what they can do decides). Errors: kIo (the file could not be opened again).
  virtual Result<std::shared_ptr<const Source>> reopen(Backend backend) const;

 private:
  // read() after its range check: [offset, offset + dst.size()) lies inside [0, size()).
  virtual Result<std::span<const std::byte>> read_checked(std::uint64_t offset, std::span<std::byte> dst,
                                                          std::string_view what) const = 0;
};

// Reads exactly dst.size() bytes at `offset` into dst (copying from a view when the Source returns one).
// `what` as in Source::read().
SAFETENSORS_EXPORT Status read_exact(const Source& source, std::uint64_t offset, std::span<std::byte> dst,
                                     std::string_view what = "read");

// Opens `path` with the requested backend (kMmap, kPread, kDirect or kAuto). kMmap falls back to kPread when the
// file cannot be mapped; kDirect to reads through the page cache where the filesystem refuses O_DIRECT (see
// SourceStats::direct_refused); kAuto resolves as its comment says. Only regular files are opened: the file is
// opened without blocking (a FIFO with no writer does not hang) and a FIFO, socket, device or directory is
// refused with kIo, "not a regular file (a FIFO)".
// Errors: kNotFound (ENOENT), kIo (anything else, e.g. EACCES).
SAFETENSORS_EXPORT Result<std::shared_ptr<const Source>> open_file_source(const std::string& path, Backend backend);

// A Source over [bytes.data(), bytes.data() + bytes.size()). `owner` keeps that memory alive for as long as
// the Source (and every view of it) lives; pass nullptr when the caller guarantees the lifetime itself.
SAFETENSORS_EXPORT std::shared_ptr<const Source> memory_source(std::span<const std::byte> bytes,
                                                               std::shared_ptr<const void> owner,
                                                               std::string name = "<memory>");

}  // namespace safetensors

#endif  // SAFETENSORS_SOURCE_H_
