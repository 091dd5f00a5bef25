#include "io/direct_source.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "io/file_source.h"
#include "io/posix.h"
#include "io/residency.h"
#include "safetensors/testing.h"
#include "util/mutex.h"

namespace safetensors::internal {
namespace {

bool is_power_of_two(std::uint64_t v) { return v != 0 && (v & (v - 1)) == 0; }

// The kernel's struct statx (<linux/stat.h>), down to the direct-I/O fields of Linux 6.1, declared here so that
// a build against older kernel headers (a manylinux toolchain) still asks a newer kernel for them.
struct KernelStatx {
  std::uint32_t mask;
  std::uint8_t unused[148];
  std::uint32_t dio_mem_align;
  std::uint32_t dio_offset_align;
  std::uint8_t spare[96];
};
static_assert(sizeof(KernelStatx) == 256 && offsetof(KernelStatx, dio_mem_align) == 152,
              "struct statx is 256 bytes with stx_dio_mem_align at 152");
constexpr unsigned kStatxDioalign = 0x2000;  // STATX_DIOALIGN
std::uint64_t round_down(std::uint64_t v, std::uint64_t a) { return v & ~(a - 1); }

// Aligned memory for reads that cannot go straight to their destination, kept for reuse: one buffer per
// concurrent bounced read at most, the idle ones up to kMaxIdle. Buffers are `bytes` long; huge ones are
// 2 MiB-aligned and asked to be transparent huge pages (see reads_through_bounce).
class BouncePool {
 public:
  BouncePool(std::uint64_t bytes, bool huge) : bytes_(bytes), huge_(huge) {}
  ~BouncePool() {
    for (std::byte* p : idle_) release(p);
  }
  BouncePool(const BouncePool&) = delete;
  BouncePool& operator=(const BouncePool&) = delete;

  std::uint64_t bytes() const { return bytes_; }

  // A buffer, or nullptr when memory is short.
  std::byte* take() EXCLUDES(mu_) {
    {
      MutexLock lock(&mu_);
      if (!idle_.empty()) {
        std::byte* p = idle_.back();
        idle_.pop_back();
        return p;
      }
    }
    if (!huge_) {
      // bytes_ is a multiple of every alignment up to kBounceBytes (checked when the source is made).
      return static_cast<std::byte*>(std::aligned_alloc(kBounceBytes, bytes_));
    }
    // A 2 MiB-aligned stretch inside a mapping with room to align it; munmap takes it back whole.
    void* base = ::mmap(nullptr, bytes_ + kHuge, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (base == MAP_FAILED) return nullptr;
    const auto first = reinterpret_cast<std::uintptr_t>(base);
    const std::uintptr_t aligned = (first + kHuge - 1) & ~(kHuge - 1);
    if (aligned > first) (void)::munmap(base, aligned - first);
    if (aligned - first < kHuge) (void)::munmap(reinterpret_cast<void*>(aligned + bytes_), kHuge - (aligned - first));
    // Advice only: without transparent huge pages the reads still work, in smaller requests.
    (void)::madvise(reinterpret_cast<void*>(aligned), bytes_, MADV_HUGEPAGE);
    return reinterpret_cast<std::byte*>(aligned);
  }
  void give(std::byte* p) EXCLUDES(mu_) {
    {
      MutexLock lock(&mu_);
      if (idle_.size() < kMaxIdle) {
        idle_.push_back(p);
        return;
      }
    }
    release(p);
  }

 private:
  static constexpr std::size_t kMaxIdle = 8;
  static constexpr std::uintptr_t kHuge = std::uintptr_t{2} << 20;
  void release(std::byte* p) const {
    if (huge_) {
      (void)::munmap(p, bytes_);
    } else {
      std::free(p);
    }
  }
  const std::uint64_t bytes_;
  const bool huge_;
  Mutex mu_;
  std::vector<std::byte*> idle_ GUARDED_BY(mu_);
};

// One number from a sysfs file, or 0.
std::uint64_t sysfs_number(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  char text[32] = {};
  const ssize_t n = ::read(fd, text, sizeof text - 1);
  ::close(fd);
  return n > 0 ? std::strtoull(text, nullptr, 10) : 0;
}

std::atomic<int> g_force_bounce{-1};  // testing::set_direct_bounce: -1 by the device, 0 never, 1 always

// Whether direct reads should all go through huge-page bounce memory (reads_through_bounce): the block device
// under the file splits a read into memory of 4 KiB pages into requests smaller than it accepts, because it
// takes fewer segments (max_segments, one per page) than a full request (max_sectors_kb) has pages, and
// transparent huge pages can give the bounce memory fewer, larger segments.
bool device_prefers_bounce(int fd) {
  const int forced = g_force_bounce.load(std::memory_order_relaxed);
  if (forced >= 0) return forced == 1;
  struct stat st;
  if (::fstat(fd, &st) != 0 || ::major(st.st_dev) == 0) return false;  // not on a block device (tmpfs, FUSE)
  const std::string dev =
      "/sys/dev/block/" + std::to_string(::major(st.st_dev)) + ":" + std::to_string(::minor(st.st_dev));
  std::uint64_t segments = sysfs_number(dev + "/queue/max_segments");
  std::uint64_t sectors_kb = sysfs_number(dev + "/queue/max_sectors_kb");
  if (segments == 0 || sectors_kb == 0) {  // a partition: its disk's queue
    segments = sysfs_number(dev + "/../queue/max_segments");
    sectors_kb = sysfs_number(dev + "/../queue/max_sectors_kb");
  }
  if (segments == 0 || sectors_kb == 0 || segments * 4 >= sectors_kb) return false;
  const int thp = ::open("/sys/kernel/mm/transparent_hugepage/enabled", O_RDONLY | O_CLOEXEC);
  if (thp < 0) return false;
  char text[128] = {};
  const ssize_t n = ::read(thp, text, sizeof text - 1);
  ::close(thp);
  return n > 0 && (std::strstr(text, "[always]") != nullptr || std::strstr(text, "[madvise]") != nullptr);
}

// What a read through the O_DIRECT descriptor came to.
enum class DirectOutcome { kDone, kFailed, kRefused };

class DirectSource final : public Source {
 public:
  DirectSource(std::string path, int fd, int dfd, std::uint64_t size, DirectAlignment align, Residency residency,
               bool bounce_all)
      : path_(std::move(path)),
        fd_(fd),
        dfd_(dfd),
        size_(size),
        align_(align),
        unit_(std::max(align.memory, align.offset)),
        bounce_all_(bounce_all),
        residency_(residency),
        bounce_(bounce_all ? kHugeBounceBytes : kBounceBytes, bounce_all) {}
  ~DirectSource() override {
    close_reporting(dfd_, path_);
    close_reporting(fd_, path_);
  }

  const std::string& name() const override { return path_; }
  std::uint64_t size() const override { return size_; }
  std::string_view kind() const override { return direct() ? "direct" : "pread"; }
  ReadHints read_hints() const override {
    if (!direct()) return {};
    // Destinations congruent with the file matter only where reads go straight into them.
    return ReadHints{.parallelism = kDirectParallelism,
                     .merge_gap = kDirectMergeGap,
                     .alignment = bounce_all_ ? 0 : unit_,
                     .uncached = true};
  }
  SourceStats stats() const override {
    SourceStats s;
    s.direct_bytes = direct_bytes_.load(std::memory_order_relaxed);
    s.bounced_bytes = bounced_bytes_.load(std::memory_order_relaxed);
    s.cached_bytes = cached_bytes_.load(std::memory_order_relaxed);
    s.direct_refused = refused_.load(std::memory_order_relaxed);
    s.resident_bytes = residency_.resident_bytes;
    s.residency_probe = residency_.probe;
    return s;
  }
  Result<std::shared_ptr<const Source>> reopen(Backend backend) const override {
    return reopen_file_source(fd_, path_, size_, backend);
  }
  void prefetch(std::uint64_t offset, std::uint64_t length) const override {
    // Readahead would fill the page cache that direct reads exist to leave alone.
    if (direct()) return;
    (void)::posix_fadvise(fd_, static_cast<off_t>(offset), static_cast<off_t>(length), POSIX_FADV_WILLNEED);
  }

 private:
  bool direct() const { return !refused_.load(std::memory_order_relaxed); }

  Result<std::span<const std::byte>> read_checked(std::uint64_t offset, std::span<std::byte> dst,
                                                  std::string_view what) const override {
    if (dst.empty()) return std::span<const std::byte>(dst);
    if (direct()) {
      Status failure;
      switch (read_direct(offset, dst, what, &failure)) {
        case DirectOutcome::kDone: return std::span<const std::byte>(dst);
        case DirectOutcome::kFailed: return std::move(failure).error();
        case DirectOutcome::kRefused:
          // From now on every read goes through the page cache; this one is read again whole.
          refused_.store(true, std::memory_order_relaxed);
          break;
      }
    }
    SAFETENSORS_RETURN_IF_ERROR(pread_full(fd_, path_, offset, dst, what));
    cached_bytes_.fetch_add(dst.size(), std::memory_order_relaxed);
    return std::span<const std::byte>(dst);
  }

  // [offset, offset + dst.size()) of the file into dst: the whole aligned blocks inside the range straight into
  // dst where dst's address lines up with them (memory alignment), the rest through bounce memory.
  DirectOutcome read_direct(std::uint64_t offset, std::span<std::byte> dst, std::string_view what,
                            Status* failure) const {
    const std::uint64_t a = align_.offset;
    const std::uint64_t end = offset + dst.size();              // Source::read checked: <= size_
    const std::uint64_t first = round_down(offset + a - 1, a);  // offset <= size_ < 2^63: no overflow
    const std::uint64_t last = round_down(end, a);
    const auto mid_address = reinterpret_cast<std::uintptr_t>(dst.data()) + (first - offset);
    if (bounce_all_ || first >= last || mid_address % align_.memory != 0) {
      return read_bounced(offset, dst, what, failure);
    }
    if (first > offset) {
      const DirectOutcome head = read_bounced(offset, dst.first(first - offset), what, failure);
      if (head != DirectOutcome::kDone) return head;
    }
    const DirectOutcome mid = read_aligned(first, dst.subspan(first - offset, last - first), what, failure);
    if (mid != DirectOutcome::kDone || end == last) return mid;
    return read_bounced(last, dst.subspan(last - offset), what, failure);
  }

  // One O_DIRECT pread, retried on EINTR. EINVAL is a refusal of O_DIRECT (the filesystem's, or an alignment
  // it needs beyond what it reported).
  DirectOutcome pread_direct(std::byte* buf, std::uint64_t length, std::uint64_t offset, std::string_view what,
                             ssize_t* got, Status* failure) const {
    for (;;) {
      const ssize_t n = syscalls().pread(dfd_, buf, static_cast<std::size_t>(length), static_cast<off_t>(offset));
      if (n >= 0) {
        *got = n;
        direct_bytes_.fetch_add(static_cast<std::uint64_t>(n), std::memory_order_relaxed);
        return DirectOutcome::kDone;
      }
      if (errno == EINTR) continue;
      if (errno == EINVAL) return DirectOutcome::kRefused;
      *failure = errno_error(path_, what, errno);
      return DirectOutcome::kFailed;
    }
  }

  // Whole aligned blocks [offset, offset + dst.size()) straight into dst. REQUIRES: offset and dst.size() are
  // multiples of the offset alignment, dst.data() of the memory alignment.
  DirectOutcome read_aligned(std::uint64_t offset, std::span<std::byte> dst, std::string_view what,
                             Status* failure) const {
    // Linux transfers at most 0x7ffff000 bytes per call: ask for 1 GiB at most, a multiple of any alignment.
    constexpr std::uint64_t kMaxTransfer = std::uint64_t{1} << 30;
    std::uint64_t done = 0;
    while (done < dst.size()) {
      ssize_t n = 0;
      const std::uint64_t want = std::min<std::uint64_t>(dst.size() - done, kMaxTransfer);
      const DirectOutcome r = pread_direct(dst.data() + done, want, offset + done, what, &n, failure);
      if (r != DirectOutcome::kDone) return r;
      // A direct read ends early only at the end of the file, which then lies inside the range: it shrank.
      if (n == 0 || static_cast<std::uint64_t>(n) % align_.offset != 0) {
        *failure = short_read_error(path_, what, dst.size(), offset);
        return DirectOutcome::kFailed;
      }
      done += static_cast<std::uint64_t>(n);
    }
    return DirectOutcome::kDone;
  }

  // [offset, offset + dst.size()) through bounce memory: the aligned blocks around each step read into a bounce
  // buffer, the asked-for bytes copied out.
  DirectOutcome read_bounced(std::uint64_t offset, std::span<std::byte> dst, std::string_view what,
                             Status* failure) const {
    std::byte* buffer = bounce_.take();
    if (buffer == nullptr) {
      *failure = errno_error(path_, what, ENOMEM);
      return DirectOutcome::kFailed;
    }
    const std::uint64_t a = align_.offset;
    DirectOutcome outcome = DirectOutcome::kDone;
    std::uint64_t done = 0;
    while (done < dst.size()) {
      const std::uint64_t at = offset + done;
      const std::uint64_t block = round_down(at, a);
      // Bytes of this step: to the end of the range or of the buffer, whichever comes first.
      const std::uint64_t take = std::min<std::uint64_t>(dst.size() - done, bounce_.bytes() - (at - block));
      // The blocks holding them; the last may reach past the end of the file (a short read then).
      const std::uint64_t length = round_down(at - block + take + a - 1, a);
      ssize_t n = 0;
      outcome = pread_direct(buffer, length, block, what, &n, failure);
      if (outcome != DirectOutcome::kDone) break;
      if (static_cast<std::uint64_t>(n) < at - block + take) {
        *failure = short_read_error(path_, what, dst.size(), offset);
        outcome = DirectOutcome::kFailed;
        break;
      }
      // Copied out in pread_full's steps, each faulted in first where its pages are not there yet (new memory):
      // the copy then writes pages that are in place and still in the CPU's cache (posix.h, kFillStep).
      for (std::uint64_t step = 0; step < take; step += kFillStep) {
        const std::span<std::byte> to =
            dst.subspan(static_cast<std::size_t>(done + step), std::min<std::size_t>(kFillStep, take - step));
        prefault_for_write(to);
        std::memcpy(to.data(), buffer + (at - block) + step, to.size());
      }
      bounced_bytes_.fetch_add(take, std::memory_order_relaxed);
      done += take;
    }
    bounce_.give(buffer);
    return outcome;
  }

  std::string path_;
  // The page cache's descriptor (reads after a refusal) and the O_DIRECT one.
  int fd_;
  int dfd_;
  std::uint64_t size_;
  DirectAlignment align_;
  // The larger alignment: memory congruent to the file offset modulo this lines up for both.
  std::uint64_t unit_;
  // Every read goes through (huge-page) bounce memory: device_prefers_bounce().
  bool bounce_all_;
  mutable std::atomic<bool> refused_{false};
  Residency residency_;
  mutable BouncePool bounce_;
  mutable std::atomic<std::uint64_t> direct_bytes_{0}, bounced_bytes_{0}, cached_bytes_{0};
};

}  // namespace

DirectAlignment direct_alignment(int fd) {
  DirectAlignment out{kDefaultDirectAlignment, kDefaultDirectAlignment, false};
#if defined(SYS_statx)
  KernelStatx sx;
  std::memset(&sx, 0, sizeof sx);
  // A kernel before 4.11 has no statx (ENOSYS), one before 6.1 leaves the mask bit clear, and a filesystem
  // without direct I/O support (tmpfs) too: the default stays.
  if (::syscall(SYS_statx, fd, "", AT_EMPTY_PATH, kStatxDioalign, &sx) == 0 && (sx.mask & kStatxDioalign) != 0 &&
      is_power_of_two(sx.dio_mem_align) && is_power_of_two(sx.dio_offset_align) &&
      sx.dio_offset_align <= kBounceBytes && sx.dio_mem_align <= kBounceBytes) {
    out = {sx.dio_mem_align, sx.dio_offset_align, true};
  }
#else
  (void)fd;
#endif
  return out;
}

std::shared_ptr<const Source> open_direct_source(std::string path, int fd, int dfd, std::uint64_t size,
                                                 Residency residency) {
  return std::make_shared<DirectSource>(std::move(path), fd, dfd, size, direct_alignment(fd), residency,
                                        device_prefers_bounce(fd));
}

}  // namespace safetensors::internal

namespace safetensors::testing {

void set_direct_bounce(std::optional<bool> always) {
  internal::g_force_bounce.store(always ? (*always ? 1 : 0) : -1, std::memory_order_relaxed);
}

}  // namespace safetensors::testing
