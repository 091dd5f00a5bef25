// The direct source (source.h, "direct"): a local file read with O_DIRECT. Whether a file is read so (kDirect, and
// kAuto's choice) is the factory's (file_source_for, source.cc).
#ifndef SAFETENSORS_SRC_IO_DIRECT_SOURCE_H_
#define SAFETENSORS_SRC_IO_DIRECT_SOURCE_H_

#include <cstdint>
#include <memory>
#include <string>

#include "io/residency.h"
#include "safetensors/source.h"

namespace safetensors::internal {

// 4096: the largest logical block size of common devices, and the page size. A filesystem that needs more
// fails the reads with EINVAL, and the source falls back to the page cache.
inline constexpr std::uint64_t kDefaultDirectAlignment = 4096;
// The direct-I/O alignment of an open file, in bytes (powers of two): of the destination's address and of the
// file offset and length. From statx(STATX_DIOALIGN) (Linux 6.1) where the filesystem reports it, else
// kDefaultDirectAlignment for both.
struct DirectAlignment {
  std::uint64_t memory = 0;
  std::uint64_t offset = 0;
  // Whether the filesystem reported them.
  bool reported = false;
};
DirectAlignment direct_alignment(int fd);

// Bytes of each read through bounce memory, and so of each bounce buffer (a multiple of any alignment up to
// it): large enough that a destination the alignment does not fit still gets reads of a useful size, small
// enough that a buffer per reader thread stays in the CPU's cache while it is copied out.
inline constexpr std::uint64_t kBounceBytes = std::uint64_t{1} << 20;
// Bytes of each read through bounce memory where every read bounces (a device that splits reads into memory of
// 4 KiB pages into small requests): huge pages, two full 4 MiB requests of such a device per read.
inline constexpr std::uint64_t kHugeBounceBytes = std::uint64_t{8} << 20;
// The direct source's ReadHints::parallelism: reads in flight from a load's threads. With one read per thread,
// a thread faults its destination's pages in before its read starts, so more threads than CPUs keep the device
// busy meanwhile; past 8 the gain is lost in the noise (BENCHMARKS.md, section "Load, cold page cache").
inline constexpr unsigned kDirectParallelism = 8;
// The direct source's ReadHints::merge_gap: pieces smaller than this and closer together are read as one (a
// direct read costs a device round trip, with no readahead to share it).
inline constexpr std::uint64_t kDirectMergeGap = std::uint64_t{256} << 10;

// A Source over the regular file `path`, open as `fd` for the page cache and as `dfd` with O_DIRECT (a second
// descriptor of the same open file; it takes over both), of `size` bytes (fixed now, as every source's). Where the
// first read is refused (EINVAL: an alignment the filesystem needs beyond what it reported, some FUSE filesystems)
// it reads through the page cache with `fd` from then on, and says so in stats(). Where the device under the file
// splits reads into 4 KiB-page memory into smaller requests than it takes (its max_segments pages are less than
// max_sectors_kb) and transparent huge pages are available, every read goes through huge-page bounce memory
// instead of straight into its destination (2 GiB on the virtio disk of BENCHMARKS.md: 1 MiB requests straight
// in, 4 MiB through huge pages; 1.4-1.9 s against 0.93-1.09 s in new processes, the copy included). `residency`
// is what kAuto's probe found, for stats(). Never fails.
std::shared_ptr<const Source> open_direct_source(std::string path, int fd, int dfd, std::uint64_t size,
                                                 Residency residency);

}  // namespace safetensors::internal

#endif  // SAFETENSORS_SRC_IO_DIRECT_SOURCE_H_
