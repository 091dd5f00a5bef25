#include "safetensors/writer.h"

#include <algorithm>
#include <cassert>
#include <cstdio>
#include <cstring>
#include <memory>
#include <numeric>
#include <string>
#include <unordered_set>

#include "format/json_writer.h"
#include "io/atomic_file.h"
#include "io/posix.h"
#include "util/checked.h"
#include "util/parallel.h"
#include "util/quote.h"

namespace safetensors {
namespace {

// Tensor bytes are copied out in chunks of at most this many bytes, by a few threads: copying into the page
// cache or a fresh buffer is CPU work (and page faults) that parallelizes.
constexpr std::uint64_t kWriteChunk = 8u << 20;
static_assert(kWriteChunk % 8 == 0, "write chunks must hold whole swap units");
// A big-endian host swaps native values into scratch memory of at most this many bytes per write call (per
// thread), then writes the scratch: the caller's memory is never modified.
constexpr std::uint64_t kSwapScratch = 1u << 20;

struct WriteChunk {
  std::size_t input;
  std::uint64_t offset;  // into the tensor
  std::span<const std::byte> bytes;
};

// The plan's tensors as chunks in file order; *total receives the bytes they hold.
std::vector<WriteChunk> split_for_write(const WritePlan& plan, std::span<const TensorData> tensors,
                                        std::uint64_t* total) {
  std::vector<WriteChunk> chunks;
  *total = 0;
  for (const WritePlan::Entry& e : plan.entries()) {
    const std::span<const std::byte> data = tensors[e.input].data;
    internal::for_each_chunk(data.size(), kWriteChunk, [&](std::uint64_t off, std::uint64_t len) {
      chunks.push_back({e.input, off, data.subspan(off, len)});
    });
    *total += data.size();
  }
  return chunks;
}

}  // namespace

Result<WritePlan> WritePlan::make(std::span<const TensorData> tensors, const std::optional<Metadata>& metadata,
                                  std::uint64_t max_header_bytes) {
  const std::string_view context = "<plan>";
  {
    std::unordered_set<std::string_view> names;
    names.reserve(tensors.size());
    for (const TensorData& t : tensors) {
      if (t.name == "__metadata__") {
        return Error::invalid_argument(context, "`__metadata__` is reserved and cannot name a tensor");
      }
      if (!names.insert(t.name).second) {
        return Error::invalid_argument(context, "duplicate tensor name " + internal::quote(t.name));
      }
    }
  }
  if (metadata) {
    std::unordered_set<std::string_view> keys;
    for (const auto& kv : *metadata) {
      if (!keys.insert(kv.first).second) {
        return Error::invalid_argument(context, "duplicate metadata key " + internal::quote(kv.first));
      }
    }
  }

  WritePlan plan;
  std::vector<std::size_t> order(tensors.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    const int ra = dtype_rank(tensors[a].dtype), rb = dtype_rank(tensors[b].dtype);
    return ra != rb ? ra > rb : tensors[a].name < tensors[b].name;
  });

  std::string json = "{";
  if (metadata) {
    json += "\"__metadata__\":{";
    bool first = true;
    for (const auto& [k, v] : *metadata) {
      if (!first) json.push_back(',');
      first = false;
      internal::append_json_string(&json, k, internal::JsonEscape::kRawUtf8);
      json.push_back(':');
      internal::append_json_string(&json, v, internal::JsonEscape::kRawUtf8);
    }
    json += "}";
  }
  std::uint64_t offset = 0;
  plan.entries_.reserve(tensors.size());
  plan.positions_.resize(tensors.size());
  for (std::size_t i : order) {
    const TensorData& t = tensors[i];
    auto numel = internal::checked_product(t.shape);
    bool aligned = false;
    auto nbytes = numel ? internal::checked_nbytes(*numel, dtype_bits(t.dtype), &aligned) : std::nullopt;
    if (!nbytes) return Error::validation_overflow(context, t.name);
    if (!aligned) return Error::misaligned_slice(context, t.name);
    if (*nbytes != t.data.size()) {
      return Error::tensor_invalid_info(context, t.name,
                                        std::string(dtype_code(t.dtype)) + " with " + std::to_string(*numel) +
                                            " elements needs " + std::to_string(*nbytes) + " bytes but " +
                                            std::to_string(t.data.size()) + " were given");
    }
    auto end = internal::checked_add(offset, *nbytes);
    if (!end) return Error::validation_overflow(context, t.name);
    if (json.size() > 1) json.push_back(',');
    internal::append_json_string(&json, t.name, internal::JsonEscape::kRawUtf8);
    json += ":{\"dtype\":\"";
    json += dtype_code(t.dtype);
    json += "\",\"shape\":[";
    for (std::size_t d = 0; d < t.shape.size(); ++d) {
      if (d) json.push_back(',');
      json += std::to_string(t.shape[d]);
    }
    json += "],\"data_offsets\":[";
    json += std::to_string(offset);
    json.push_back(',');
    json += std::to_string(*end);
    json += "]}";
    plan.positions_[i] = plan.entries_.size();
    plan.entries_.push_back({i, offset, *end, t.dtype});
    offset = *end;
  }
  json.push_back('}');
  // Pad with spaces so the data buffer starts at a multiple of 8.
  json.append((8 - json.size() % 8) % 8, ' ');
  if (json.size() > max_header_bytes) {
    return Error::header_too_large(context, "the header would be " + std::to_string(json.size()) +
                                                " bytes, above the limit of " + std::to_string(max_header_bytes));
  }
  if (!internal::checked_add(8 + json.size(), offset)) return Error::validation_overflow(context, "");

  plan.prefix_.resize(8);
  std::uint64_t n = json.size();
  for (int i = 0; i < 8; ++i) plan.prefix_[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  plan.prefix_ += json;
  plan.data_size_ = offset;
  return plan;
}

Status serialize_into(const WritePlan& plan, std::span<const TensorData> tensors, std::span<std::byte> out) {
  if (out.size() != plan.total_size() || tensors.size() != plan.entries().size()) {
    return Error::invalid_argument("<memory>", "serialize_into: buffer or tensors do not match the plan");
  }
  for (const WritePlan::Entry& e : plan.entries()) {
    if (tensors[e.input].data.size() != e.end - e.begin) {
      return Error::invalid_argument(
          "<memory>", "serialize_into: tensor " + internal::quote(tensors[e.input].name) + " does not match the plan");
    }
  }
  std::memcpy(out.data(), plan.prefix().data(), plan.prefix().size());
  std::uint64_t total = 0;
  const std::vector<WriteChunk> chunks = split_for_write(plan, tensors, &total);
  return internal::run_parallel(chunks.size(), internal::default_threads(total, kWriteChunk), [&](std::size_t i) {
    const WriteChunk& p = chunks[i];
    const WritePlan::Entry& e = plan.entries()[plan.position_of(p.input)];
    // The file's little-endian bytes from native values (a plain copy on a little-endian host).
    byteswap_copy(p.bytes, out.subspan(plan.data_offset() + e.begin + p.offset, p.bytes.size()),
                  host_swap_bytes(e.dtype));
    return ok_status();
  });
}

Result<std::vector<std::byte>> serialize(std::span<const TensorData> tensors, const std::optional<Metadata>& metadata,
                                         const WriteOptions& options) {
  SAFETENSORS_ASSIGN_OR_RETURN(auto plan, WritePlan::make(tensors, metadata, options.max_header_bytes));
  std::vector<std::byte> out(plan.total_size());
  SAFETENSORS_RETURN_IF_ERROR(serialize_into(plan, tensors, out));
  return out;
}

Status save_file(const std::string& path, std::span<const TensorData> tensors, const std::optional<Metadata>& metadata,
                 const WriteOptions& options) {
  SAFETENSORS_ASSIGN_OR_RETURN(auto plan, WritePlan::make(tensors, metadata, options.max_header_bytes));
  SAFETENSORS_ASSIGN_OR_RETURN(auto writer, FileWriter::create(path, std::move(plan), options));
  std::uint64_t total = 0;
  const std::vector<WriteChunk> chunks = split_for_write(writer.plan(), tensors, &total);
  Status st = internal::run_parallel(chunks.size(), internal::default_threads(total, kWriteChunk), [&](std::size_t i) {
    return writer.write_part(chunks[i].input, chunks[i].offset, chunks[i].bytes);
  });
  if (!st.ok()) {
    writer.abandon();
    return st;
  }
  return writer.finish();
}

// ---------------------------------------------------------------------------------------------------------
// FileWriter

FileWriter::FileWriter(std::string path, std::unique_ptr<internal::AtomicFile> file, WritePlan plan,
                       WriteOptions options)
    : path_(std::move(path)),
      file_(std::move(file)),
      plan_(std::move(plan)),
      options_(options),
      written_(std::make_unique<std::atomic<std::uint64_t>[]>(plan_.entries().size())),
      done_(false) {}

FileWriter::FileWriter(FileWriter&& other) noexcept
    : path_(std::move(other.path_)),
      file_(std::move(other.file_)),
      plan_(std::move(other.plan_)),
      options_(other.options_),
      written_(std::move(other.written_)),
      done_(std::exchange(other.done_, true)) {}

FileWriter& FileWriter::operator=(FileWriter&& other) noexcept {
  if (this != &other) {
    if (!done_) abandon();
    path_ = std::move(other.path_);
    file_ = std::move(other.file_);
    plan_ = std::move(other.plan_);
    options_ = other.options_;
    written_ = std::move(other.written_);
    done_ = std::exchange(other.done_, true);
  }
  return *this;
}

FileWriter::~FileWriter() {
  assert(done_ && "FileWriter destroyed without finish() or abandon()");
  if (!done_) abandon();
}

Result<FileWriter> FileWriter::create(std::string path, WritePlan plan, const WriteOptions& options) {
  SAFETENSORS_ASSIGN_OR_RETURN(auto file, internal::AtomicFile::create(path));
  FileWriter w(std::move(path), std::make_unique<internal::AtomicFile>(std::move(file)), std::move(plan), options);
  const std::string& prefix = w.plan_.prefix();
  Status s = internal::pwrite_full(
      w.file_->fd(), w.file_->name(), 0,
      std::span<const std::byte>(reinterpret_cast<const std::byte*>(prefix.data()), prefix.size()));
  if (!s.ok()) {
    w.abandon();
    return std::move(s).error();
  }
  return w;
}

Status FileWriter::write(std::size_t input, std::span<const std::byte> bytes) {
  if (input < plan_.entries().size()) {
    const auto& e = plan_.entries()[plan_.position_of(input)];
    if (bytes.size() != e.end - e.begin) {
      return Error::invalid_argument(path_, "write: input " + std::to_string(input) + " needs " +
                                                std::to_string(e.end - e.begin) + " bytes, got " +
                                                std::to_string(bytes.size()));
    }
  }
  return write_part(input, 0, bytes);
}

Status FileWriter::write_part(std::size_t input, std::uint64_t offset, std::span<const std::byte> bytes) {
  assert(!done_);
  if (done_) return Error::invalid_argument(path_, "write after finish() or abandon()");
  if (input >= plan_.entries().size()) {
    return Error::invalid_argument(path_, "write: no input " + std::to_string(input) + " in the plan");
  }
  const auto& e = plan_.entries()[plan_.position_of(input)];
  auto end = internal::checked_add(offset, bytes.size());
  if (!end || *end > e.end - e.begin) {
    return Error::invalid_argument(path_, "write: bytes past the end of input " + std::to_string(input));
  }
  // Checked on every host, so that a caller that splits badly learns it on the host it develops on.
  if (const unsigned w = dtype_swap_bytes(e.dtype); w != 0 && (offset % w != 0 || bytes.size() % w != 0)) {
    return Error::invalid_argument(path_, "write: a part of input " + std::to_string(input) + " (" +
                                              std::string(dtype_code(e.dtype)) + ") at byte " + std::to_string(offset) +
                                              " of " + std::to_string(bytes.size()) + " bytes splits an element");
  }
  // end <= e.end - e.begin, so data_offset + e.begin + offset does not overflow (the plan checked the total).
  const std::uint64_t at = plan_.data_offset() + e.begin + offset;
  if (const unsigned w = host_swap_bytes(e.dtype); w == 0) {
    SAFETENSORS_RETURN_IF_ERROR(internal::pwrite_full(file_->fd(), file_->name(), at, bytes));
  } else {
    const std::size_t scratch_size = static_cast<std::size_t>(std::min<std::uint64_t>(kSwapScratch, bytes.size()));
    auto scratch = std::make_unique_for_overwrite<std::byte[]>(scratch_size);
    for (std::uint64_t done = 0; done < bytes.size(); done += scratch_size) {
      const std::size_t n = static_cast<std::size_t>(std::min<std::uint64_t>(scratch_size, bytes.size() - done));
      const std::span<std::byte> out(scratch.get(), n);
      byteswap_copy(bytes.subspan(done, n), out, w);
      SAFETENSORS_RETURN_IF_ERROR(internal::pwrite_full(file_->fd(), file_->name(), at + done, out));
    }
  }
  written_[input].fetch_add(bytes.size(), std::memory_order_relaxed);
  return ok_status();
}

Status FileWriter::finish() {
  assert(!done_);
  if (done_) return Error::invalid_argument(path_, "finish() after finish() or abandon()");
  for (std::size_t i = 0; i < plan_.entries().size(); ++i) {
    const auto& e = plan_.entries()[plan_.position_of(i)];
    if (written_[i].load(std::memory_order_relaxed) != e.end - e.begin) {
      abandon();
      return Error::invalid_argument(path_, "finish: input " + std::to_string(i) + " was not written in full");
    }
  }
  done_ = true;
  // Crash ordering: AtomicFile::publish.
  Status st = file_->publish(options_.fsync);
  file_.reset();
  return st;
}

void FileWriter::abandon() {
  if (file_) file_->discard();
  file_.reset();
  done_ = true;
}

}  // namespace safetensors
