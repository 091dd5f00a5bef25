#include "safetensors/writer.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cassert>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <unordered_set>

#include "checked.h"
#include "parallel.h"
#include "posix.h"

namespace safetensors {
namespace {

// Tensor bytes are copied out in pieces of at most this many bytes, by a few threads: copying into the page
// cache or a fresh buffer is CPU work (and page faults) that parallelizes.
constexpr std::uint64_t kWriteChunk = 8u << 20;

struct Piece {
  std::size_t input;
  std::uint64_t offset;  // into the tensor
  std::span<const std::byte> bytes;
};

// The plan's tensors as pieces in file order; *total receives the bytes they hold.
std::vector<Piece> split_for_write(const WritePlan& plan, std::span<const TensorData> tensors, std::uint64_t* total) {
  std::vector<Piece> pieces;
  *total = 0;
  for (const WritePlan::Entry& e : plan.entries()) {
    const std::span<const std::byte> data = tensors[e.input].data;
    for (std::uint64_t off = 0; off < data.size(); off += kWriteChunk) {
      pieces.push_back({e.input, off, data.subspan(off, std::min<std::uint64_t>(kWriteChunk, data.size() - off))});
    }
    *total += data.size();
  }
  return pieces;
}

// JSON string escaping as the reference writes it: `"` and `\` escaped, control characters as their short
// escapes or \u00xx (lowercase hex), everything else -- including non-ASCII UTF-8 -- raw.
void append_json_string(std::string* out, std::string_view s) {
  static constexpr char kHex[] = "0123456789abcdef";
  out->push_back('"');
  for (char ch : s) {
    const unsigned char c = static_cast<unsigned char>(ch);
    switch (c) {
      case '"': out->append("\\\""); break;
      case '\\': out->append("\\\\"); break;
      case '\n': out->append("\\n"); break;
      case '\t': out->append("\\t"); break;
      case '\r': out->append("\\r"); break;
      case '\b': out->append("\\b"); break;
      case '\f': out->append("\\f"); break;
      default:
        if (c < 0x20) {
          out->append("\\u00");
          out->push_back(kHex[c >> 4]);
          out->push_back(kHex[c & 0xf]);
        } else {
          out->push_back(ch);
        }
    }
  }
  out->push_back('"');
}

std::string dirname_of(const std::string& path) {
  const auto slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

std::string basename_of(const std::string& path) {
  const auto slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

Status fsync_dir(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return internal::errno_error(dir, "open directory", errno);
  Status st;
  if (internal::syscalls().fsync(fd) != 0) st = internal::errno_error(dir, "fsync directory", errno);
  ::close(fd);
  return st;
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
        return Error::invalid_argument(context, "duplicate tensor name `" + t.name + "`");
      }
    }
  }
  if (metadata) {
    std::unordered_set<std::string_view> keys;
    for (const auto& kv : *metadata) {
      if (!keys.insert(kv.first).second) {
        return Error::invalid_argument(context, "duplicate metadata key `" + kv.first + "`");
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
      append_json_string(&json, k);
      json.push_back(':');
      append_json_string(&json, v);
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
    append_json_string(&json, t.name);
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
    plan.entries_.push_back({i, offset, *end});
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
      return Error::invalid_argument("<memory>", "serialize_into: tensor `" + tensors[e.input].name +
                                                     "` does not match the plan");
    }
  }
  std::memcpy(out.data(), plan.prefix().data(), plan.prefix().size());
  std::uint64_t total = 0;
  const std::vector<Piece> pieces = split_for_write(plan, tensors, &total);
  return internal::run_parallel(pieces.size(), internal::default_threads(total, kWriteChunk), [&](std::size_t i) {
    const Piece& p = pieces[i];
    const WritePlan::Entry& e = plan.entries()[plan.position_of(p.input)];
    std::memcpy(out.data() + plan.data_offset() + e.begin + p.offset, p.bytes.data(), p.bytes.size());
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
  const std::vector<Piece> pieces = split_for_write(writer.plan(), tensors, &total);
  Status st = internal::run_parallel(pieces.size(), internal::default_threads(total, kWriteChunk), [&](std::size_t i) {
    return writer.write_part(pieces[i].input, pieces[i].offset, pieces[i].bytes);
  });
  if (!st.ok()) {
    writer.abandon();
    return st;
  }
  return writer.finish();
}

// ---------------------------------------------------------------------------------------------------------
// FileWriter

FileWriter::FileWriter(std::string path, std::string temp_path, int fd, WritePlan plan, WriteOptions options)
    : path_(std::move(path)),
      temp_path_(std::move(temp_path)),
      fd_(fd),
      plan_(std::move(plan)),
      options_(options),
      written_(std::make_unique<std::atomic<std::uint64_t>[]>(plan_.entries().size())),
      done_(false) {}

FileWriter::FileWriter(FileWriter&& other) noexcept
    : path_(std::move(other.path_)),
      temp_path_(std::move(other.temp_path_)),
      fd_(std::exchange(other.fd_, -1)),
      plan_(std::move(other.plan_)),
      options_(other.options_),
      written_(std::move(other.written_)),
      done_(std::exchange(other.done_, true)) {}

FileWriter& FileWriter::operator=(FileWriter&& other) noexcept {
  if (this != &other) {
    if (!done_) abandon();
    path_ = std::move(other.path_);
    temp_path_ = std::move(other.temp_path_);
    fd_ = std::exchange(other.fd_, -1);
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
  const std::string dir = dirname_of(path);
  // Keep the target's permission bits; a new file gets 0666 minus the umask, as open(2) would give it.
  mode_t mode = 0666;
  bool keep_mode = false;
  struct stat st;
  if (::stat(path.c_str(), &st) == 0) {
    if (S_ISDIR(st.st_mode)) return internal::errno_error(path, "open", EISDIR);
    mode = st.st_mode & 07777;
    keep_mode = true;
  }
  // A fresh, unpredictable name in the target's directory; O_EXCL makes a collision an error, not a clobber.
  std::random_device rd;
  std::string temp;
  int fd = -1;
  for (int attempt = 0; attempt < 16 && fd < 0; ++attempt) {
    char suffix[24];
    std::snprintf(suffix, sizeof suffix, ".%08x%08x.tmp", rd(), rd());
    temp = dir + "/." + basename_of(path) + suffix;
    fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, keep_mode ? 0600 : mode);
    if (fd < 0 && errno != EEXIST) {
      if (errno == ENOENT) return internal::errno_error(dir, "create a file in directory", ENOENT);
      return internal::errno_error(temp, "create", errno);
    }
  }
  if (fd < 0) return internal::errno_error(temp, "create", EEXIST);
  if (keep_mode && ::fchmod(fd, mode) != 0) {
    const int err = errno;
    ::close(fd);
    ::unlink(temp.c_str());
    return internal::errno_error(temp, "chmod", err);
  }
  FileWriter w(std::move(path), std::move(temp), fd, std::move(plan), options);
  const std::string& prefix = w.plan_.prefix();
  Status s = internal::pwrite_full(
      w.fd_, w.temp_path_, 0, std::span<const std::byte>(reinterpret_cast<const std::byte*>(prefix.data()), prefix.size()));
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
  SAFETENSORS_RETURN_IF_ERROR(internal::pwrite_full(fd_, temp_path_, plan_.data_offset() + e.begin + offset, bytes));
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
  // Crash ordering: the data must be durable before the rename makes it visible under the target's name,
  // or a crash could publish a file whose blocks were never written; the directory fsync then makes the
  // rename itself durable. Without options_.fsync a crash may lose the new file (the old one, or on some
  // filesystems an empty one, survives), but a live system never observes a partial file.
  if (options_.fsync && internal::syscalls().fsync(fd_) != 0) {
    Error err = internal::errno_error(temp_path_, "fsync", errno);
    abandon();
    return err;
  }
  if (::close(fd_) != 0) {
    fd_ = -1;
    Error err = internal::errno_error(temp_path_, "close", errno);
    abandon();
    return err;
  }
  fd_ = -1;
  if (internal::syscalls().rename(temp_path_.c_str(), path_.c_str()) != 0) {
    Error err = internal::errno_error(path_, "rename", errno);
    abandon();
    return err;
  }
  done_ = true;
  if (options_.fsync) return fsync_dir(dirname_of(path_));
  return ok_status();
}

void FileWriter::abandon() {
  assert(!done_ || fd_ < 0);
  close_and_remove();
  done_ = true;
}

void FileWriter::close_and_remove() {
  if (fd_ >= 0) {
    if (::close(fd_) != 0) {
      std::fprintf(stderr, "safetensors: close(\"%s\") failed: %s\n", temp_path_.c_str(), std::strerror(errno));
    }
    fd_ = -1;
  }
  if (!done_ && !temp_path_.empty() && ::unlink(temp_path_.c_str()) != 0 && errno != ENOENT) {
    std::fprintf(stderr, "safetensors: unlink(\"%s\") failed: %s\n", temp_path_.c_str(), std::strerror(errno));
  }
}

}  // namespace safetensors
