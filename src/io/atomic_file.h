// AtomicFile: a file that appears at its path only once it is complete -- the one atomic-publish
// implementation, behind FileWriter and the sharded index writer.
//
// Where the filesystem supports it (ext4, xfs, btrfs, tmpfs, ...) the file is anonymous (O_TMPFILE) until it
// is published, so a process killed while writing leaves nothing behind. Elsewhere (EOPNOTSUPP, EISDIR,
// EINVAL: NFS, FUSE, old kernels) it is a named temporary sibling, ".NAME.<16 hex>.tmp", removed by
// discard() but left behind by a crash.
//
// Thread safety: external synchronization, except that positional writes to fd() may run concurrently.
#ifndef SAFETENSORS_SRC_IO_ATOMIC_FILE_H_
#define SAFETENSORS_SRC_IO_ATOMIC_FILE_H_

#include <sys/types.h>

#include <string>
#include <string_view>

#include "safetensors/error.h"

namespace safetensors::internal {

class AtomicFile {
 public:
  // Creates the file that will become `path`, empty and open for writing, in path's directory (so the
  // final rename cannot cross filesystems). It gets the permission bits of the existing target, or 0666
  // minus the umask for a new file. Errors: kNotFound (no such directory), kIo (e.g. `path` is a directory).
  static Result<AtomicFile> create(std::string path);

  AtomicFile(AtomicFile&& other) noexcept;
  AtomicFile& operator=(AtomicFile&& other) noexcept;
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;
  // Discards the file unless it was published; failures are reported on stderr, never thrown.
  ~AtomicFile();

  // The descriptor to write the content through (pwrite). REQUIRES: neither published nor discarded.
  int fd() const { return fd_; }
  // The name errors about the content use: the temporary file's, or the target's while anonymous.
  const std::string& name() const { return temp_path_.empty() ? path_ : temp_path_; }
  // True when the file is anonymous (O_TMPFILE) until published.
  bool anonymous() const { return anonymous_; }

  // Makes the complete file visible at its path, replacing any file there; with `durable` it also survives
  // a power loss once this returns. REQUIRES: neither published nor discarded. On error the file is
  // discarded and whatever was at the path is untouched. Errors: kIo.
  Status publish(bool durable);
  // Closes and removes the file; the target is untouched. Idempotent.
  void discard();

 private:
  AtomicFile(std::string path, std::string temp_path, int fd, bool anonymous)
      : path_(std::move(path)), temp_path_(std::move(temp_path)), fd_(fd), anonymous_(anonymous) {}

  std::string path_;
  // The named temporary file, or empty while the file is anonymous (also once an anonymous file has been
  // linked under a temporary name: the name is then removed on failure right where it was made).
  std::string temp_path_;
  int fd_ = -1;
  bool anonymous_ = false;
};

// Writes `bytes` as the whole file at `path` through an AtomicFile: published complete or not at all, with
// the permission bits create() gives and publish(durable)'s guarantees. Errors: those of create(), kIo.
Status write_file_atomically(std::string path, std::string_view bytes, bool durable);

}  // namespace safetensors::internal

#endif  // SAFETENSORS_SRC_IO_ATOMIC_FILE_H_
