// Writing safetensors files: a pure plan, then a streaming, atomic publish.
//
// WritePlan::make() decides the whole layout without touching any data: tensors sorted by dtype rank
// (highest first) then by name, offsets assigned cumulatively, the compact header JSON (metadata first,
// keys in the order dtype, shape, data_offsets) padded with spaces to a multiple of 8. The same inputs give
// byte-identical output to the reference implementation.
//
// The data is then streamed from each tensor's own memory -- never gathered into one buffer -- either into
// a caller's buffer (serialize_into) or into a file (FileWriter / save_file). A file is written to an
// anonymous file (O_TMPFILE) in the target's directory -- a named temporary file where the filesystem has
// no O_TMPFILE -- and linked or renamed over the target only when complete, so a failed or interrupted
// save leaves the previous file untouched (and, with O_TMPFILE, nothing else behind, but for a crash between
// the final link and rename: see AtomicFile::publish), and readers that have the old file mapped keep seeing
// the old bytes.
//
// Thread safety: WritePlan is immutable and safe to share. FileWriter requires external synchronization,
// except that write() and write_part() of distinct byte ranges may run concurrently (positional writes).
#ifndef SAFETENSORS_WRITER_H_
#define SAFETENSORS_WRITER_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "safetensors/dtype.h"
#include "safetensors/error.h"
#include "safetensors/export.h"
#include "safetensors/file.h"

namespace safetensors {
namespace internal {
class AtomicFile;
}  // namespace internal

// A tensor to be written: its description and (for the convenience functions) its bytes. The bytes are
// borrowed; they must stay alive and unchanged until the write returns. They are native values: on a
// big-endian host the writer swaps multi-byte dtypes to the format's little-endian order on the way out
// (through its own bounded scratch memory, or into serialize_into's buffer), never in the caller's memory.
struct TensorData {
  std::string name;
  Dtype dtype = Dtype::kU8;
  std::vector<std::uint64_t> shape;
  std::span<const std::byte> data;
};

struct WriteOptions {
  // fsync the file before the rename and the directory after it, so the new file survives a power loss.
  bool fsync = false;
  // Headers longer than this fail with kHeaderTooLarge.
  std::uint64_t max_header_bytes = kDefaultMaxHeaderBytes;
};

class SAFETENSORS_EXPORT WritePlan {
 public:
  // One tensor's place in the file.
  struct Entry {
    std::size_t input;    // index into the tensors given to make()
    std::uint64_t begin;  // data_offsets, relative to the data buffer
    std::uint64_t end;
    Dtype dtype;
  };

  // Plans the file. Only name, dtype, shape and data.size() of each tensor are read.
  // Errors: kInvalidArgument (duplicate or reserved name, duplicate metadata key), kTensorInvalidInfo
  // (data.size() different from what dtype and shape need), kValidationOverflow, kMisalignedSlice (sub-byte
  // tensor that is not a whole number of bytes), kHeaderTooLarge.
  static Result<WritePlan> make(std::span<const TensorData> tensors, const std::optional<Metadata>& metadata,
                                std::uint64_t max_header_bytes = kDefaultMaxHeaderBytes);

  // The first data_offset() bytes of the file: 8-byte length, header JSON, padding.
  const std::string& prefix() const { return prefix_; }
  std::uint64_t data_offset() const { return prefix_.size(); }
  // Total size of the file.
  std::uint64_t total_size() const { return prefix_.size() + data_size_; }
  // Entries in file order.
  const std::vector<Entry>& entries() const { return entries_; }
  // Entry position (in entries()) of each input tensor: entries()[position_of(i)].input == i.
  std::size_t position_of(std::size_t input) const { return positions_[input]; }

 private:
  std::string prefix_;
  std::uint64_t data_size_ = 0;
  std::vector<Entry> entries_;
  std::vector<std::size_t> positions_;
};

// Writes the whole file described by `plan` into `out`. REQUIRES: `tensors` is the span the plan was made
// from; out.size() == plan.total_size() (else kInvalidArgument).
SAFETENSORS_EXPORT Status serialize_into(const WritePlan& plan, std::span<const TensorData> tensors,
                                         std::span<std::byte> out);

// Plans and serializes into a new buffer.
SAFETENSORS_EXPORT Result<std::vector<std::byte>> serialize(std::span<const TensorData> tensors,
                                                            const std::optional<Metadata>& metadata = {},
                                                            const WriteOptions& options = {});

// Plans and writes the file atomically (see FileWriter). Errors: those of WritePlan::make and FileWriter.
SAFETENSORS_EXPORT Status save_file(const std::string& path, std::span<const TensorData> tensors,
                                    const std::optional<Metadata>& metadata = {}, const WriteOptions& options = {});

// Streams a planned file to disk and publishes it atomically.
//
//   auto w = FileWriter::create(path, plan);          // temp file created, header written
//   w->write(i, bytes_of_tensor_i) ...                // each entry exactly once, any order
//   w->finish();                                      // or w->abandon()
//
// The new file is created in path's directory (so publishing it cannot cross filesystems), anonymous where
// the filesystem supports O_TMPFILE, with the permission bits of the existing target, or the process umask
// default for a new file.
class SAFETENSORS_EXPORT FileWriter {
 public:
  // Creates the new file and writes the plan's prefix. Errors: kNotFound (missing directory), kIo.
  static Result<FileWriter> create(std::string path, WritePlan plan, const WriteOptions& options = {});

  FileWriter(FileWriter&& other) noexcept;
  FileWriter& operator=(FileWriter&& other) noexcept;
  FileWriter(const FileWriter&) = delete;
  FileWriter& operator=(const FileWriter&) = delete;
  // REQUIRES: finish() or abandon() has been called (asserted in debug builds). In release builds an
  // unfinished writer is abandoned; failures to clean up are reported on stderr, never thrown.
  ~FileWriter();

  const WritePlan& plan() const { return plan_; }

  // Writes the bytes of the plan's input tensor `input`. REQUIRES: finish() or abandon() has not been called;
  // each input is written once; bytes.size() == its size. Errors: kInvalidArgument, kIo (e.g. ENOSPC).
  // Distinct inputs may be written concurrently from different threads.
  Status write(std::size_t input, std::span<const std::byte> bytes);
  // Writes part of input `input`'s bytes, `offset` bytes into the tensor. The parts of one input must cover
  // it exactly once; parts may be written concurrently. REQUIRES: a multi-byte dtype's parts hold whole
  // swap units (offset and size multiples of dtype_swap_bytes, on every host; else kInvalidArgument).
  // Same requirements and errors as write().
  Status write_part(std::size_t input, std::uint64_t offset, std::span<const std::byte> bytes);

  // Makes the file visible at its path: optional fsync, link or rename over the target, optional directory
  // fsync. REQUIRES: finish() or abandon() has not been called; every input has been written in full.
  // On error the new file is removed and the target is untouched. Errors: kInvalidArgument, kIo.
  Status finish();
  // Removes the new file. The target is untouched. REQUIRES: finish() or abandon() has not been called.
  void abandon();

 private:
  FileWriter(std::string path, std::unique_ptr<internal::AtomicFile> file, WritePlan plan, WriteOptions options);

  std::string path_;
  // The file being written; null once finished or abandoned.
  std::unique_ptr<internal::AtomicFile> file_;
  WritePlan plan_;
  WriteOptions options_;
  // Bytes written per input (one counter per entry of the plan): atomic, since parts of one input may be
  // written from several threads.
  std::unique_ptr<std::atomic<std::uint64_t>[]> written_;
  bool done_ = true;
};

}  // namespace safetensors

#endif  // SAFETENSORS_WRITER_H_
