#include "safetensors/source.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include "io/direct_source.h"
#include "io/file_source.h"
#include "io/posix.h"
#include "io/residency.h"
#include "safetensors/testing.h"
#include "util/checked.h"

namespace safetensors {
namespace {

std::atomic<bool> g_force_pread{false};
std::atomic<std::uint64_t> g_live_mappings{0};

Status check_range(const Source& s, std::uint64_t offset, std::uint64_t n) {
  auto end = internal::checked_add(offset, n);
  if (!end || *end > s.size()) {
    return Error::invalid_argument(s.name(), "read of " + std::to_string(n) + " bytes at offset " +
                                                 std::to_string(offset) + " is outside the " +
                                                 std::to_string(s.size()) + "-byte source");
  }
  return ok_status();
}

using internal::close_reporting;

class MemorySource final : public Source {
 public:
  MemorySource(std::span<const std::byte> bytes, std::shared_ptr<const void> owner, std::string name)
      : bytes_(bytes), owner_(std::move(owner)), name_(std::move(name)) {}

  const std::string& name() const override { return name_; }
  std::uint64_t size() const override { return bytes_.size(); }
  std::string_view kind() const override { return "memory"; }
  const std::byte* data() const override { return bytes_.data(); }
  bool data_is_memory() const override { return true; }

 private:
  Result<std::span<const std::byte>> read_checked(std::uint64_t offset, std::span<std::byte> dst,
                                                  std::string_view /*what*/) const override {
    return bytes_.subspan(offset, dst.size());
  }

  std::span<const std::byte> bytes_;
  std::shared_ptr<const void> owner_;
  std::string name_;
};

// The mapping serves zero-copy views (data()); reads go through the descriptor, which the Source keeps open
// for that reason: a positional read of a file that shrank returns an error where a copy out of the mapping
// would raise SIGBUS.
class MmapSource final : public Source {
 public:
  MmapSource(std::string path, int fd, void* base, std::uint64_t size, bool writable)
      : path_(std::move(path)), fd_(fd), base_(base), size_(size), writable_(writable) {
    g_live_mappings.fetch_add(1, std::memory_order_relaxed);
  }
  ~MmapSource() override {
    if (::munmap(base_, size_) != 0) {
      std::fprintf(stderr, "safetensors: munmap(\"%s\") failed: %s\n", path_.c_str(), std::strerror(errno));
    }
    g_live_mappings.fetch_sub(1, std::memory_order_relaxed);
    close_reporting(fd_, path_);
  }

  const std::string& name() const override { return path_; }
  std::uint64_t size() const override { return size_; }
  std::string_view kind() const override { return "mmap"; }
  const std::byte* data() const override { return static_cast<const std::byte*>(base_); }
  bool writable() const override { return writable_; }
  Result<std::shared_ptr<const Source>> reopen(Backend backend) const override {
    return internal::reopen_file_source(fd_, path_, size_, backend);
  }
  void prefetch(std::uint64_t offset, std::uint64_t length) const override {
    // madvise needs a page-aligned start.
    const std::uint64_t page = static_cast<std::uint64_t>(::sysconf(_SC_PAGESIZE));
    if (offset >= size_) return;
    length = std::min(length, size_ - offset);
    const std::uint64_t start = offset - offset % page;
    (void)::madvise(static_cast<char*>(base_) + start, length + (offset - start), MADV_WILLNEED);
  }

 private:
  Result<std::span<const std::byte>> read_checked(std::uint64_t offset, std::span<std::byte> dst,
                                                  std::string_view what) const override {
    SAFETENSORS_RETURN_IF_ERROR(internal::pread_full(fd_, path_, offset, dst, what));
    return std::span<const std::byte>(dst);
  }

  std::string path_;
  // Kept open for read(): positional reads of a file that shrank fail cleanly, where the mapping faults.
  int fd_;
  void* base_;
  std::uint64_t size_;
  bool writable_;
};

// Why a file opened for kDirect or kAuto is read through the page cache, for stats().
struct CacheChoice {
  // The filesystem refused O_DIRECT when the file was opened.
  bool direct_refused = false;
  // What kAuto's probe found (empty where it did not ask).
  internal::Residency residency;
};

// Every read through the page cache: kPread, a mapping that failed, and kDirect or kAuto where the factory chose
// the cache (`choice`, whose source counts cached_bytes in stats() as a direct source does).
class PreadSource final : public Source {
 public:
  PreadSource(std::string path, int fd, std::uint64_t size, std::optional<CacheChoice> choice = std::nullopt)
      : path_(std::move(path)), fd_(fd), size_(size), choice_(choice) {}
  ~PreadSource() override { close_reporting(fd_, path_); }

  const std::string& name() const override { return path_; }
  std::uint64_t size() const override { return size_; }
  std::string_view kind() const override { return "pread"; }
  void prefetch(std::uint64_t offset, std::uint64_t length) const override {
    (void)::posix_fadvise(fd_, static_cast<off_t>(offset), static_cast<off_t>(length), POSIX_FADV_WILLNEED);
  }
  Result<std::shared_ptr<const Source>> reopen(Backend backend) const override {
    return internal::reopen_file_source(fd_, path_, size_, backend);
  }
  SourceStats stats() const override {
    if (!choice_) return {};
    return {.cached_bytes = cached_bytes_.load(std::memory_order_relaxed),
            .direct_refused = choice_->direct_refused,
            .resident_bytes = choice_->residency.resident_bytes,
            .residency_probe = choice_->residency.probe};
  }

 private:
  Result<std::span<const std::byte>> read_checked(std::uint64_t offset, std::span<std::byte> dst,
                                                  std::string_view what) const override {
    SAFETENSORS_RETURN_IF_ERROR(internal::pread_full(fd_, path_, offset, dst, what));
    if (choice_) cached_bytes_.fetch_add(dst.size(), std::memory_order_relaxed);
    return std::span<const std::byte>(dst);
  }

  std::string path_;
  int fd_;
  std::uint64_t size_;
  std::optional<CacheChoice> choice_;
  mutable std::atomic<std::uint64_t> cached_bytes_{0};
};

// mincore tells page-cache residency only to an owner or writer of the file (residency.h); root may write.
bool may_mincore(int fd, const std::string& path) {
  struct stat st;
  return ::geteuid() == 0 || (::fstat(fd, &st) == 0 && st.st_uid == ::geteuid()) ||
         ::faccessat(AT_FDCWD, path.c_str(), W_OK, AT_EACCESS) == 0;
}

// The Source of a file opened for kDirect or kAuto: a direct source, or a page-cache one where kAuto finds the
// file cached enough (or too small to ask) or the filesystem refuses O_DIRECT.
std::shared_ptr<const Source> direct_or_cached_source(std::string path, int fd, std::uint64_t size, Backend backend) {
  internal::Residency residency;
  bool use_direct = backend == Backend::kDirect;
  if (backend == Backend::kAuto && size >= kAutoDirectMinBytes) {
    residency = internal::probe_residency(fd, size, may_mincore(fd, path));
    // Less than a third cached: reading it all from the device beats reading the rest through the cache. Cold
    // reads through the cache run somewhat slower than direct reads and cached reads a few times faster, so the
    // two break even near 30% cached (BENCHMARKS.md, section "Load, cold page cache", and the machine's
    // ceilings in "Machine ceilings").
    use_direct = !residency.probe.empty() && residency.resident_bytes < size / 3;
  }
  if (use_direct) {
    // A second descriptor of the same open file (/proc/self/fd, so a path replaced meanwhile is not opened
    // instead). EINVAL: tmpfs before Linux 6.6, some FUSE filesystems.
    const int dfd = internal::reopen_descriptor(fd, path, O_DIRECT);
    if (dfd >= 0) return internal::open_direct_source(std::move(path), fd, dfd, size, residency);
  }
  return std::make_shared<PreadSource>(std::move(path), fd, size,
                                       CacheChoice{.direct_refused = use_direct, .residency = residency});
}

// What a file that is not a regular file is, for the error that refuses it.
const char* file_kind(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  return "a special file";
}

Error not_a_regular_file(const std::string& path, mode_t mode) {
  const std::string what = std::string("open: not a regular file (") + file_kind(mode) + ")";
  if (S_ISDIR(mode)) return internal::errno_error(path, what, EISDIR);
  return Error::io(path, what);
}

// Opens `path` for reading if it is a regular file. O_NONBLOCK keeps open(2) from waiting for a writer of a
// FIFO (or a device from waiting for its carrier); the type is checked on the descriptor, so nothing can swap
// the file between the check and the use, and the flag is cleared again before any read.
Result<int> open_regular_file(const std::string& path, struct stat* st) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
  if (fd < 0) {
    const int err = errno;
    // A socket cannot be opened at all (ENXIO): say what it is.
    struct stat lst;
    if (err == ENXIO && ::stat(path.c_str(), &lst) == 0 && !S_ISREG(lst.st_mode)) {
      return not_a_regular_file(path, lst.st_mode);
    }
    return internal::errno_error(path, "open", err);
  }
  if (::fstat(fd, st) != 0) {
    const int err = errno;
    close_reporting(fd, path);
    return internal::errno_error(path, "stat", err);
  }
  if (!S_ISREG(st->st_mode)) {
    close_reporting(fd, path);
    return not_a_regular_file(path, st->st_mode);
  }
  const int flags = ::fcntl(fd, F_GETFL);
  if (flags < 0 || ::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK) != 0) {
    const int err = errno;
    close_reporting(fd, path);
    return internal::errno_error(path, "fcntl", err);
  }
  return fd;
}

}  // namespace

Source::~Source() = default;

Result<std::span<const std::byte>> Source::read(std::uint64_t offset, std::span<std::byte> dst,
                                                std::string_view what) const {
  SAFETENSORS_RETURN_IF_ERROR(check_range(*this, offset, dst.size()));
  return read_checked(offset, dst, what);
}

Status Source::pread_into(std::uint64_t offset, std::span<std::byte> dst) const {
  return read_exact(*this, offset, dst);
}

Status read_exact(const Source& source, std::uint64_t offset, std::span<std::byte> dst, std::string_view what) {
  auto got = source.read(offset, dst, what);
  if (!got.ok()) return std::move(got).error();
  if (got->data() != dst.data() && !dst.empty()) std::memcpy(dst.data(), got->data(), dst.size());
  return ok_status();
}

Result<std::shared_ptr<const Source>> Source::reopen(Backend /*backend*/) const {
  return std::shared_ptr<const Source>();
}

namespace internal {

Result<std::shared_ptr<const Source>> file_source_for(std::string path, int fd, std::uint64_t size, Backend backend) {
  switch (backend) {
    case Backend::kDirect:
    case Backend::kAuto: return direct_or_cached_source(std::move(path), fd, size, backend);
    case Backend::kMmap:
      // Empty files, and any mapping failure, take pread.
      if (size > 0 && !g_force_pread.load(std::memory_order_relaxed) && size <= SIZE_MAX) {
        bool writable = true;
        void* base = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
        if (base == MAP_FAILED) {
          // Without overcommit a writable private mapping may be refused; a read-only one may not be.
          writable = false;
          base = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
        }
        if (base != MAP_FAILED) {
          // The descriptor stays open (every read() is a positional read); the mapping holds its own reference.
          return std::shared_ptr<const Source>(std::make_shared<MmapSource>(std::move(path), fd, base, size, writable));
        }
      }
      break;
    case Backend::kPread: break;
  }
  return std::shared_ptr<const Source>(std::make_shared<PreadSource>(std::move(path), fd, size));
}

Result<std::shared_ptr<const Source>> reopen_file_source(int fd, const std::string& path, std::uint64_t size,
                                                         Backend backend) {
  const int again = reopen_descriptor(fd, path, 0);
  if (again < 0) return errno_error(path, "open", errno);
  return file_source_for(path, again, size, backend);
}

}  // namespace internal

Result<std::shared_ptr<const Source>> open_file_source(const std::string& path, Backend backend) {
  struct stat st;
  SAFETENSORS_ASSIGN_OR_RETURN(const int fd, open_regular_file(path, &st));
  return internal::file_source_for(path, fd, static_cast<std::uint64_t>(st.st_size), backend);
}

std::shared_ptr<const Source> memory_source(std::span<const std::byte> bytes, std::shared_ptr<const void> owner,
                                            std::string name) {
  return std::make_shared<MemorySource>(bytes, std::move(owner), std::move(name));
}

namespace testing {

FaultySource::FaultySource(std::shared_ptr<const Source> base) : base_(std::move(base)) {}
FaultySource::~FaultySource() = default;

const std::string& FaultySource::name() const { return base_->name(); }
std::uint64_t FaultySource::size() const { return base_->size(); }
std::string_view FaultySource::kind() const { return base_->kind(); }
const std::byte* FaultySource::data() const { return hide_mapping.load() ? nullptr : base_->data(); }
bool FaultySource::writable() const { return hide_mapping.load() ? false : base_->writable(); }
bool FaultySource::data_is_memory() const { return hide_mapping.load() ? false : base_->data_is_memory(); }
ReadHints FaultySource::read_hints() const { return base_->read_hints(); }
SourceStats FaultySource::stats() const { return base_->stats(); }
// The faults are this object's: a source read another way would escape them.
Result<std::shared_ptr<const Source>> FaultySource::reopen(Backend /*backend*/) const {
  return std::shared_ptr<const Source>();
}
void FaultySource::prefetch(std::uint64_t offset, std::uint64_t length) const {
  bytes_prefetched.fetch_add(length, std::memory_order_relaxed);
  base_->prefetch(offset, length);
}

Result<std::span<const std::byte>> FaultySource::read_checked(std::uint64_t offset, std::span<std::byte> dst,
                                                              std::string_view what) const {
  reads.fetch_add(1);
  bytes_read.fetch_add(dst.size());
  if (short_read.load()) {
    return Error::io(name(), "file is shorter than expected (it changed after it was opened): injected");
  }
  const std::int64_t eio = eio_at_offset.load();
  if (eio >= 0 && static_cast<std::uint64_t>(eio) >= offset && static_cast<std::uint64_t>(eio) - offset < dst.size()) {
    return internal::errno_error(name(), what, EIO);
  }
  // read() checked that offset + dst.size() does not overflow.
  const std::int64_t end = end_at_offset.load();
  if (end >= 0 && !dst.empty() && offset + dst.size() > static_cast<std::uint64_t>(end)) {
    return Error::io(name(), "file is shorter than expected (it changed after it was opened): " + std::string(what) +
                                 " (" + std::to_string(dst.size()) + " bytes at offset " + std::to_string(offset) +
                                 ") reached end of file (injected)");
  }
  return base_->read(offset, dst, what);
}

void set_force_pread(bool force) { g_force_pread.store(force); }
std::uint64_t live_mappings() { return g_live_mappings.load(); }

}  // namespace testing
}  // namespace safetensors
