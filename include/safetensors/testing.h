// Test doubles and hooks that ship with the Source seam (source.h), as LevelDB ships memenv and its
// fault-injecting Envs: for the library's tests, fuzzers and the Python binding's test functions. Built into the
// library but not installed (CMakeLists.txt excludes this header): no user program depends on it.
#ifndef SAFETENSORS_TESTING_H_
#define SAFETENSORS_TESTING_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "safetensors/error.h"
#include "safetensors/export.h"
#include "safetensors/source.h"

namespace safetensors {
namespace testing {

// Forwards to a base Source and injects faults, one atomic flag per fault. Safe for concurrent use.
class SAFETENSORS_EXPORT FaultySource final : public Source {
 public:
  explicit FaultySource(std::shared_ptr<const Source> base);
  ~FaultySource() override;

  // The faults and counters apply to every read (read(), pread_into(), read_exact()).
  // When set, every read returns kIo as if the file ended before the requested bytes.
  std::atomic<bool> short_read{false};
  // When >= 0, a read whose range contains this offset fails with kIo (EIO).
  std::atomic<std::int64_t> eio_at_offset{-1};
  // When >= 0, the file seems to end here (it shrank after it was opened): a read that reaches past this
  // offset fails with kIo, "file is shorter than expected" (an empty read never fails). size() is unchanged,
  // as for a real file.
  std::atomic<std::int64_t> end_at_offset{-1};
  // When set, data() returns nullptr, so callers must take the positional-read path.
  std::atomic<bool> hide_mapping{false};
  // Number of read() calls made, for asserting how many reads an operation took.
  mutable std::atomic<std::uint64_t> reads{0};
  // Total bytes requested through read().
  mutable std::atomic<std::uint64_t> bytes_read{0};
  // Total bytes hinted through prefetch() (forwarded to the base).
  mutable std::atomic<std::uint64_t> bytes_prefetched{0};

  const std::string& name() const override;
  std::uint64_t size() const override;
  std::string_view kind() const override;
  const std::byte* data() const override;
  bool writable() const override;
  bool data_is_memory() const override;
  void prefetch(std::uint64_t offset, std::uint64_t length) const override;
  ReadHints read_hints() const override;
  SourceStats stats() const override;
  Result<std::shared_ptr<const Source>> reopen(Backend backend) const override;

 private:
  Result<std::span<const std::byte>> read_checked(std::uint64_t offset, std::span<std::byte> dst,
                                                  std::string_view what) const override;

  std::shared_ptr<const Source> base_;
};

// Direct sources opened from now on read everything through bounce memory (true), straight into aligned
// destinations where they can (false), or as the device under the file suggests (nullopt, the default; see
// SourceStats and README). Process-wide; for tests only.
SAFETENSORS_EXPORT void set_direct_bounce(std::optional<bool> always);

// While set, open_file_source(path, kMmap) behaves as if mapping failed and returns a pread Source
// (LevelDB's EnvPosixTestHelper::SetReadOnlyMMapLimit(0)). Process-wide; for tests only.
SAFETENSORS_EXPORT void set_force_pread(bool force);

// Number of file mappings currently alive in the process: lets tests assert that a mapping is released
// exactly when the last view of it dies.
SAFETENSORS_EXPORT std::uint64_t live_mappings();

}  // namespace testing
}  // namespace safetensors

#endif  // SAFETENSORS_TESTING_H_
