// File: an open, fully validated safetensors file. Start here.
//
//   auto file = safetensors::File::open("model.safetensors");
//   if (!file.ok()) { std::cerr << file.error().to_string() << "\n"; return 1; }
//   for (const auto& t : file->tensors()) { ... t.name, t.dtype, t.shape, t.nbytes() ... }
//   std::vector<std::byte> buf(info->nbytes());
//   auto st = file->read_into("weight", buf);
//
// open() reads the 8-byte length and the JSON header, and validates them completely (COMPAT.md section 2)
// before returning: every tensor lies inside the file, tensors tile the data buffer exactly, and every size
// fits in 64 bits. Nothing proportional to a size declared in the file is allocated before that size has been
// checked against the file's real size. After open() succeeds, reads fail only on I/O errors, including a
// file that shrank after it was opened: every read (read_into, read_many, read_range, read_slice) is a
// positional read on every backend, so these come back as kIo naming the file and the tensor, never as
// SIGBUS. Only the bytes of a zero-copy view() are unprotected (see view()).
//
// Destination memory: reads fill a destination 512 KiB at a time, and where a step's pages are not there yet
// (memory never touched, as a new allocation is) they are faulted in first with one MADV_POPULATE_WRITE: a
// read into new memory costs one page fault per 4 KiB otherwise, taken mid-copy wherever the destination is
// not congruent with the file offset modulo the page size. Memory already resident costs one mincore per step.
//
// Thread safety: a File is immutable after open(); it is safe for concurrent use by multiple threads (reads are
// positional and share no cursor). Copying a File is cheap and shares the underlying state.
//
// Lifetime: views returned by view() keep the mapping (or memory buffer) alive on their own; they stay valid
// after every File referring to it is destroyed.
#ifndef SAFETENSORS_FILE_H_
#define SAFETENSORS_FILE_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "safetensors/dtype.h"
#include "safetensors/error.h"
#include "safetensors/export.h"
#include "safetensors/remote.h"
#include "safetensors/slice.h"
#include "safetensors/source.h"

namespace safetensors {

// The format's default cap on the header length, on read and on write.
inline constexpr std::uint64_t kDefaultMaxHeaderBytes = 100'000'000;

// `__metadata__`: string keys to string values, in the order the header lists them.
using Metadata = std::vector<std::pair<std::string, std::string>>;

struct OpenOptions {
  // How a local file is read (a remote or memory source decides for itself).
  Backend backend = Backend::kMmap;
  // Headers longer than this fail with kHeaderTooLarge.
  std::uint64_t max_header_bytes = kDefaultMaxHeaderBytes;
  // For http://, https:// and s3:// locations (remote.h).
  RemoteOptions remote{};
};

// The one factory of Sources from a location: a remote source for an http://, https:// or s3:// URL
// (open_remote_source with options.remote), else the local file (open_file_source with options.backend).
// Errors: those of the factory it calls.
SAFETENSORS_EXPORT Result<std::shared_ptr<const Source>> open_source(const std::string& location,
                                                                     const OpenOptions& options = {});

// One tensor's entry in the header. The name and shape view memory owned by the File they came from: they are
// valid while any copy of that File is alive.
struct TensorInfo {
  std::string_view name;
  Dtype dtype = Dtype::kU8;
  std::span<const std::uint64_t> shape;
  // data_offsets: [begin, end) relative to the start of the data buffer.
  std::uint64_t begin = 0;
  std::uint64_t end = 0;

  std::uint64_t nbytes() const { return end - begin; }
  // Product of shape (1 for a scalar). Validated by File::open() not to overflow.
  std::uint64_t numel() const;
};

// A tensor's bytes in memory that is kept alive by `owner`. The bytes are the file's: little-endian. Where
// host_must_swap(dtype) (a multi-byte dtype on a big-endian host) they are not native values; copy them and
// swap_to_native() the copy, or use read_into(), which does both.
struct TensorView {
  std::span<const std::byte> bytes;
  std::shared_ptr<const void> owner;
  // True when the bytes lie in a private copy-on-write mapping and may be written through const_cast without
  // touching the file.
  bool writable = false;
};

// A destination for File::read_many(): the tensor's whole bytes into `dst` (dst.size() == nbytes()).
struct ReadRequest {
  const TensorInfo* tensor;
  std::span<std::byte> dst;
};

class SAFETENSORS_EXPORT File {
 public:
  // Opens and validates the file at `path`, a local path or a URL (open_source()). Errors: kNotFound, kIo,
  // and every header kind of Error::Kind (kHeaderTooSmall ... kMetadataIncompleteBuffer), each with the
  // path (a URL without its query) as context.
  static Result<File> open(const std::string& path, const OpenOptions& options = {});
  // Validates the bytes of `source` (options.backend is ignored; the source decides). Same errors as above.
  static Result<File> open(std::shared_ptr<const Source> source, const OpenOptions& options = {});

  // This file read through another backend, for a load that reads differently from this handle (a device
  // load or a prefetch from a handle that maps the file): a File over Source::reopen(backend) -- the same open
  // file, not the path again, which may name another file by now -- that shares this File's header, so its
  // TensorInfos are this File's. Where the source has no other way to be read (memory, remote), this File.
  // Errors: those of Source::reopen() (kIo).
  Result<File> with_backend(Backend backend) const;

  // The path, "<memory>", or the URL without its query string.
  const std::string& path() const;
  // How tensors are delivered, from what the source can do: kMmap when it gives zero-copy views of a
  // mapping, kMemory for a caller's buffer, kDirect for positional reads past the page cache (ReadHints::uncached:
  // kDirect, or kAuto where it chose that, until a filesystem refuses it),
  // kPread for other positional reads (a file not mapped -- kMmap may have fallen back -- or a remote object).
  ReadPath backend() const;
  const std::shared_ptr<const Source>& source() const;

  // 8 + the header length: where the data buffer starts.
  std::uint64_t data_offset() const;
  // The header length N from the first 8 bytes.
  std::uint64_t header_length() const;
  // Total file size.
  std::uint64_t size() const;

  // All tensors in file order (by data_offsets; ties in header order).
  const std::vector<TensorInfo>& tensors() const;
  // Tensor names sorted by byte order.
  std::vector<std::string_view> keys() const;
  // `__metadata__`, or nullopt when absent or null.
  const std::optional<Metadata>& metadata() const;

  // The tensor named `name`, or nullptr.
  const TensorInfo* find(std::string_view name) const;
  // The tensor named `name`. Errors: kTensorNotFound.
  Result<const TensorInfo*> info(std::string_view name) const;

  // Zero-copy view of a tensor's bytes, as the file holds them (little-endian; see TensorView). Errors:
  // kTensorNotFound; kInvalidArgument on the pread backend, which has no mapping (use read_into()). On the mmap backend
  // the bytes are the mapping itself: touching a page the file no longer backs (it shrank, or fails with EIO
  // underneath) raises SIGBUS, which no error can report; use read_into() where that matters.
  Result<TensorView> view(std::string_view name) const;
  Result<TensorView> view(const TensorInfo& tensor) const;

  // Copies a tensor's values into dst, native-endian (read_many and read_slice too: on a big-endian host the
  // bytes are swapped in dst after they were read). REQUIRES: dst.size() == nbytes() (else kInvalidArgument).
  // Errors: kTensorNotFound, kInvalidArgument, kIo.
  Status read_into(std::string_view name, std::span<std::byte> dst) const;
  Status read_into(const TensorInfo& tensor, std::span<std::byte> dst) const;

  // Plans `indices` over the tensor (see SlicePlan::make) -- for sizing the destination -- with this file
  // and the tensor named in errors.
  Result<SlicePlan> plan_slice(const TensorInfo& tensor, std::span<const SliceIndex> indices) const;
  // Copies the bytes the plan selects into dst, reading only runs the plan names (close runs of a file are
  // coalesced into one read). REQUIRES: plan was made for `tensor`; dst.size() == plan.nbytes().
  Status read_slice(const TensorInfo& tensor, const SlicePlan& plan, std::span<std::byte> dst) const;

  // Reads many tensors into caller buffers, using up to `threads` threads (0 = a default based on the
  // hardware and the total size). Large tensors are split so the threads share the work. Returns the first
  // error met; on error the contents of all destinations are unspecified.
  // REQUIRES: each request's tensor belongs to this File and dst.size() == tensor->nbytes().
  Status read_many(std::span<const ReadRequest> requests, unsigned threads = 0) const;

  // Copies bytes [offset, offset + dst.size()) of the data buffer (offsets as in data_offsets) into dst, with
  // up to `threads` threads (0 = by size and hardware). Consecutive tensors are adjacent in the data buffer,
  // so one call can fill a staging buffer with many of them. The bytes are the file's: a range has no dtype,
  // so nothing is swapped (a big-endian caller applies swap_to_native to each tensor's part). Errors:
  // kInvalidArgument (range outside the data buffer), kIo.
  Status read_range(std::uint64_t offset, std::span<std::byte> dst, unsigned threads = 0) const;

 private:
  struct State;
  explicit File(std::shared_ptr<const State> state) : state_(std::move(state)) {}
  std::shared_ptr<const State> state_;
};

// A hint that `dst` is freshly allocated memory about to be filled by a read: keeps its 2 MiB-aligned interior
// on 4 KiB pages (MADV_NOHUGEPAGE; Linux with THP, a no-op elsewhere), whose first-touch cost is the same every
// time, where a transparent huge page can stall its fault for milliseconds (the measured reason is at the
// definition, src/file/file.cc). Never fails. The caller must own the whole allocation `dst` lies in: the advice
// applies to the pages, not to the bytes.
SAFETENSORS_EXPORT void advise_fresh_destination(std::span<std::byte> dst);

}  // namespace safetensors

#endif  // SAFETENSORS_FILE_H_
