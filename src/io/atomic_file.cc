#include "io/atomic_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <utility>

#include "io/posix.h"
#include "util/path.h"

namespace safetensors::internal {
namespace {

// A fresh, unpredictable sibling name for `path`: ".NAME.<16 hex>.tmp".
std::string temp_name_for(const std::string& path) {
  std::random_device rd;
  char suffix[24];
  std::snprintf(suffix, sizeof suffix, ".%08x%08x.tmp", rd(), rd());
  return sibling_path(path, "." + basename_of(path) + suffix);
}

void report(const char* op, const std::string& path) {
  std::fprintf(stderr, "safetensors: %s(\"%s\") failed: %s\n", op, path.c_str(), std::strerror(errno));
}

void unlink_reporting(const std::string& path) {
  if (::unlink(path.c_str()) != 0 && errno != ENOENT) report("unlink", path);
}

// Gives the anonymous file open as `fd` the name `to`; never replaces an existing file (EEXIST). Returns 0
// or an errno value. /proc/self/fd needs no privilege; AT_EMPTY_PATH (needs CAP_DAC_READ_SEARCH) is the way
// where /proc is not mounted.
int link_anonymous(int fd, const std::string& to) {
  char proc[40];
  std::snprintf(proc, sizeof proc, "/proc/self/fd/%d", fd);
  if (syscalls().linkat(AT_FDCWD, proc, AT_FDCWD, to.c_str(), AT_SYMLINK_FOLLOW) == 0) return 0;
  int err = errno;
  if (err == ENOENT && ::access("/proc/self/fd", F_OK) != 0) {
    if (syscalls().linkat(fd, "", AT_FDCWD, to.c_str(), AT_EMPTY_PATH) == 0) return 0;
    err = errno;
  }
  return err;
}

Status fsync_dir(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return errno_error(dir, "open directory", errno);
  Status st;
  if (syscalls().fsync(fd) != 0) st = errno_error(dir, "fsync directory", errno);
  if (::close(fd) != 0) report("close", dir);
  return st;
}

}  // namespace

Result<AtomicFile> AtomicFile::create(std::string path) {
  const std::string dir = dirname_of(path);
  // Keep the target's permission bits; a new file gets 0666 minus the umask, as open(2) would give it.
  mode_t mode = 0666;
  bool keep_mode = false;
  struct stat st;
  if (::stat(path.c_str(), &st) == 0) {
    if (S_ISDIR(st.st_mode)) return errno_error(path, "open", EISDIR);
    mode = st.st_mode & 07777;
    keep_mode = true;
  }
  // A named file is created 0600 when the mode is set afterwards, so nobody else can open it meanwhile.
  const mode_t create_mode = keep_mode ? 0600 : mode;
  int fd = syscalls().open(dir.c_str(), O_TMPFILE | O_WRONLY | O_CLOEXEC, create_mode);
  std::string temp;
  if (fd < 0) {
    const int err = errno;
    if (err == ENOENT) return errno_error(dir, "create a file in directory", ENOENT);
    // No O_TMPFILE here (EOPNOTSUPP: the filesystem; EISDIR: a kernel that predates it; EINVAL: a
    // filesystem that refuses the flags): a named temporary file, O_EXCL so a collision is an error, not a
    // clobber.
    if (err != EOPNOTSUPP && err != EISDIR && err != EINVAL) return errno_error(path, "create", err);
    for (int attempt = 0; attempt < 16 && fd < 0; ++attempt) {
      temp = temp_name_for(path);
      fd = syscalls().open(temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, create_mode);
      if (fd < 0 && errno != EEXIST) {
        if (errno == ENOENT) return errno_error(dir, "create a file in directory", ENOENT);
        return errno_error(temp, "create", errno);
      }
    }
    if (fd < 0) return errno_error(temp, "create", EEXIST);
  }
  const bool anonymous = temp.empty();
  AtomicFile file(std::move(path), std::move(temp), fd, anonymous);
  if (keep_mode && ::fchmod(fd, mode) != 0) {
    Error err = errno_error(file.name(), "chmod", errno);
    file.discard();
    return err;
  }
  return file;
}

AtomicFile::AtomicFile(AtomicFile&& other) noexcept
    : path_(std::move(other.path_)),
      temp_path_(std::exchange(other.temp_path_, {})),
      fd_(std::exchange(other.fd_, -1)),
      anonymous_(other.anonymous_) {}

AtomicFile& AtomicFile::operator=(AtomicFile&& other) noexcept {
  if (this != &other) {
    discard();
    path_ = std::move(other.path_);
    temp_path_ = std::exchange(other.temp_path_, {});
    fd_ = std::exchange(other.fd_, -1);
    anonymous_ = other.anonymous_;
  }
  return *this;
}

AtomicFile::~AtomicFile() { discard(); }

void AtomicFile::discard() {
  if (fd_ >= 0 && ::close(fd_) != 0) report("close", name());
  fd_ = -1;
  if (!temp_path_.empty()) unlink_reporting(temp_path_);
  temp_path_.clear();
}

// Crash ordering, for every file the library saves:
//   1. With `durable`, fsync the file: its blocks must be on disk before a name makes them visible, or a
//      crash could publish a file whose data was never written.
//   2. Publish it at the path. A named temporary file is renamed over the target. An anonymous file is
//      linked straight to the path when nothing is there (linkat never replaces: EEXIST), and otherwise
//      linked under a temporary name and renamed over the target. rename(2) replaces atomically: a reader
//      opens the old file or the new one, never a partial one, and one that has the old file open or mapped
//      keeps reading the old bytes.
//   3. With `durable`, fsync the directory, so the new name itself survives a power loss.
// A crash before step 2 leaves the previous file untouched and, for an anonymous file, nothing else (the
// kernel frees the unnamed inode); a named temporary file stays behind. A crash between the link and the
// rename -- two adjacent syscalls -- leaves the complete new file under its temporary name. Without
// `durable` a power loss may lose the new file (the old one, or on some filesystems an empty one,
// survives), but a live system never observes a partial file.
Status AtomicFile::publish(bool durable) {
  if (fd_ < 0) return Error::invalid_argument(path_, "publish of a file that was discarded");
  auto fail = [&](Error err) -> Status {
    discard();
    return err;
  };
  if (durable && syscalls().fsync(fd_) != 0) return fail(errno_error(name(), "fsync", errno));
  if (anonymous_) {
    int err = link_anonymous(fd_, path_);
    if (err == EEXIST) {
      std::string temp;
      for (int attempt = 0; attempt < 16 && err == EEXIST; ++attempt) {
        temp = temp_name_for(path_);
        err = link_anonymous(fd_, temp);
      }
      if (err != 0) return fail(errno_error(path_, "link", err));
      temp_path_ = std::move(temp);
      if (syscalls().rename(temp_path_.c_str(), path_.c_str()) != 0) {
        return fail(errno_error(path_, "rename", errno));
      }
      temp_path_.clear();
    } else if (err != 0) {
      return fail(errno_error(path_, "link", err));
    }
    // The file is in place: a close failure can no longer undo that, so it is reported, not returned
    // (the filesystems with O_TMPFILE report write errors at fsync, which `durable` checked).
    if (::close(fd_) != 0) report("close", path_);
    fd_ = -1;
  } else {
    const int closed = ::close(fd_);
    fd_ = -1;
    if (closed != 0) return fail(errno_error(temp_path_, "close", errno));
    if (syscalls().rename(temp_path_.c_str(), path_.c_str()) != 0) {
      return fail(errno_error(path_, "rename", errno));
    }
    temp_path_.clear();
  }
  if (durable) return fsync_dir(dirname_of(path_));
  return ok_status();
}

Status write_file_atomically(std::string path, std::string_view bytes, bool durable) {
  SAFETENSORS_ASSIGN_OR_RETURN(auto file, AtomicFile::create(std::move(path)));
  const std::span<const std::byte> content(reinterpret_cast<const std::byte*>(bytes.data()), bytes.size());
  SAFETENSORS_RETURN_IF_ERROR(pwrite_full(file.fd(), file.name(), 0, content));
  return file.publish(durable);
}

}  // namespace safetensors::internal
