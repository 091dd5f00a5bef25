#include "safetensors/file.h"

#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <numeric>
#include <utility>
#include <vector>

#include "file/read_chunks.h"
#include "format/header.h"
#include "io/scratch.h"
#include "util/checked.h"
#include "util/parallel.h"
#include "util/quote.h"

namespace safetensors {

using internal::kReadChunk;
using internal::quote;
using internal::read_of;
using internal::ReadChunk;

struct File::State {
  std::shared_ptr<const Source> source;
  // Shared by the Files with_backend() makes of one open: their TensorInfos are the same objects.
  std::shared_ptr<const internal::ParsedHeader> header;
  // keys() order, computed on first use: many callers never ask, and those that do ask repeatedly.
  mutable std::once_flag sorted_once;
  mutable std::vector<std::uint32_t> sorted;  // positions in header.tensors, by name
  mutable std::vector<std::uint32_t> rank;    // rank[position]: its place in `sorted`
  mutable std::atomic<bool> sorted_ready{false};
  // The position find() returned last (kNoneFound before the first). Callers mostly ask for the names in
  // keys() order or in file order (a loop over keys() or offset_keys()), so find() first tries the tensor
  // after it in each order, which costs one comparison of names instead of a hash and a probe of an index
  // the size of the header's tensors (missing the cache). A guess is always checked: racing threads can
  // only make it miss. (Positions fit in 32 bits: simdjson parses documents below 4 GiB, as NameIndex
  // assumes too.)
  static constexpr std::uint32_t kNoneFound = UINT32_MAX;
  mutable std::atomic<std::uint32_t> last_found{kNoneFound};

  std::uint64_t data_offset() const { return 8 + header->header_length; }
};

namespace {

// Runs of the pread slice path closer than this are read together: a smaller gap costs less than a syscall
// and the page cache reads whole pages anyway.
constexpr std::uint64_t kCoalesceGap = 4096;
// Largest scratch buffer for one coalesced read.
constexpr std::uint64_t kCoalesceSpan = 8u << 20;
// read_slice splits its runs into pieces that cover about this many bytes of the source: small enough that
// two or more threads stay balanced on one tensor.
constexpr std::uint64_t kSlicePiece = 1u << 20;

}  // namespace

std::uint64_t TensorInfo::numel() const {
  // File::open() validated that the product fits.
  return internal::checked_product(shape).value_or(0);
}

Result<std::shared_ptr<const Source>> open_source(const std::string& location, const OpenOptions& options) {
  if (is_remote_location(location)) return open_remote_source(location, options.remote);
  return open_file_source(location, options.backend);
}

Result<File> File::open(const std::string& path, const OpenOptions& options) {
  SAFETENSORS_ASSIGN_OR_RETURN(auto source, open_source(path, options));
  return open(std::move(source), options);
}

Result<File> File::open(std::shared_ptr<const Source> source, const OpenOptions& options) {
  SAFETENSORS_ASSIGN_OR_RETURN(auto parsed, internal::read_header(*source, options.max_header_bytes));
  auto state = std::make_shared<State>();
  state->source = std::move(source);
  state->header = std::make_shared<const internal::ParsedHeader>(std::move(parsed));
  return File(std::move(state));
}

Result<File> File::with_backend(Backend backend) const {
  SAFETENSORS_ASSIGN_OR_RETURN(std::shared_ptr<const Source> again, state_->source->reopen(backend));
  if (again == nullptr) return *this;
  auto state = std::make_shared<State>();
  state->source = std::move(again);
  state->header = state_->header;
  return File(std::move(state));
}

const std::string& File::path() const { return state_->source->name(); }
ReadPath File::backend() const {
  const Source& src = *state_->source;
  if (src.data() != nullptr) return src.data_is_memory() ? ReadPath::kMemory : ReadPath::kMmap;
  return src.read_hints().uncached ? ReadPath::kDirect : ReadPath::kPread;
}
const std::shared_ptr<const Source>& File::source() const { return state_->source; }
std::uint64_t File::data_offset() const { return state_->data_offset(); }
std::uint64_t File::header_length() const { return state_->header->header_length; }
std::uint64_t File::size() const { return state_->source->size(); }
const std::vector<TensorInfo>& File::tensors() const { return state_->header->tensors; }
const std::optional<Metadata>& File::metadata() const { return state_->header->metadata; }

std::vector<std::string_view> File::keys() const {
  const auto& all = tensors();
  std::call_once(state_->sorted_once, [this, &all] {
    auto& order = state_->sorted;
    order.resize(all.size());
    std::iota(order.begin(), order.end(), std::uint32_t{0});
    auto by_name = [&](std::uint32_t a, std::uint32_t b) { return all[a].name < all[b].name; };
    // Writers order tensors by dtype, then by name, so file order is a few sorted runs (one per dtype):
    // merging the runs costs O(n log runs) comparisons of names that often share long prefixes.
    std::vector<std::size_t> run_starts;
    for (std::size_t i = 0; i < order.size(); ++i) {
      if (i == 0 || by_name(order[i], order[i - 1])) run_starts.push_back(i);
    }
    if (run_starts.size() > 64) {
      std::sort(order.begin(), order.end(), by_name);
    } else {
      run_starts.push_back(order.size());
      while (run_starts.size() > 2) {
        std::vector<std::size_t> merged;
        for (std::size_t r = 0; r + 1 < run_starts.size(); r += 2) {
          merged.push_back(run_starts[r]);
          if (r + 2 < run_starts.size()) {
            std::inplace_merge(order.begin() + static_cast<std::ptrdiff_t>(run_starts[r]),
                               order.begin() + static_cast<std::ptrdiff_t>(run_starts[r + 1]),
                               order.begin() + static_cast<std::ptrdiff_t>(run_starts[r + 2]), by_name);
          }
        }
        merged.push_back(order.size());
        run_starts = std::move(merged);
      }
    }
    state_->rank.resize(order.size());
    for (std::size_t i = 0; i < order.size(); ++i) state_->rank[order[i]] = static_cast<std::uint32_t>(i);
    state_->sorted_ready.store(true, std::memory_order_release);
  });
  std::vector<std::string_view> keys;
  keys.reserve(all.size());
  for (std::uint32_t i : state_->sorted) keys.push_back(all[i].name);
  return keys;
}

const TensorInfo* File::find(std::string_view name) const {
  const auto& all = tensors();
  const std::uint32_t last = state_->last_found.load(std::memory_order_relaxed);
  std::size_t found = all.size();
  if (last != State::kNoneFound) {
    // keys() order first once a caller has asked for it: it is what a loop over keys() walks.
    if (state_->sorted_ready.load(std::memory_order_acquire)) {
      const std::size_t next = state_->rank[last] + std::size_t{1};
      if (next < all.size() && all[state_->sorted[next]].name == name) found = state_->sorted[next];
    }
    if (found == all.size() && last + std::size_t{1} < all.size() && all[last + 1].name == name) {
      found = last + std::size_t{1};
    }
  }
  if (found == all.size()) {
    const std::int64_t i = state_->header->index.find(name, [&](std::size_t k) { return all[k].name; });
    if (i < 0) return nullptr;
    found = static_cast<std::size_t>(i);
  }
  state_->last_found.store(static_cast<std::uint32_t>(found), std::memory_order_relaxed);
  return &all[found];
}

Result<const TensorInfo*> File::info(std::string_view name) const {
  const TensorInfo* t = find(name);
  if (t == nullptr) return Error::tensor_not_found(path(), name);
  return t;
}

Result<TensorView> File::view(std::string_view name) const {
  SAFETENSORS_ASSIGN_OR_RETURN(const TensorInfo* t, info(name));
  return view(*t);
}

Result<TensorView> File::view(const TensorInfo& tensor) const {
  const Source& src = *state_->source;
  const std::byte* base = src.data();
  if (base == nullptr) {
    return Error::invalid_argument(path(), "tensor " + quote(tensor.name) +
                                               ": zero-copy views need the mmap or memory backend; this file is "
                                               "read with pread (use read_into)");
  }
  TensorView v;
  v.bytes = std::span<const std::byte>(base + data_offset() + tensor.begin, tensor.nbytes());
  // Aliasing constructor: the view shares ownership of the Source, so it outlives this File.
  v.owner = std::shared_ptr<const void>(state_->source, v.bytes.data());
  v.writable = src.writable();
  return v;
}

Status File::read_into(std::string_view name, std::span<std::byte> dst) const {
  SAFETENSORS_ASSIGN_OR_RETURN(const TensorInfo* t, info(name));
  return read_into(*t, dst);
}

Status File::read_into(const TensorInfo& tensor, std::span<std::byte> dst) const {
  if (dst.size() != tensor.nbytes()) {
    return Error::invalid_argument(path(), "tensor " + quote(tensor.name) + " has " + std::to_string(tensor.nbytes()) +
                                               " bytes but the destination holds " + std::to_string(dst.size()));
  }
  SAFETENSORS_RETURN_IF_ERROR(read_exact(*state_->source, data_offset() + tensor.begin, dst, read_of(tensor.name)));
  swap_to_native(tensor.dtype, dst);
  return ok_status();
}

Result<SlicePlan> File::plan_slice(const TensorInfo& tensor, std::span<const SliceIndex> indices) const {
  return SlicePlan::make(tensor.dtype, tensor.shape, indices, path(), tensor.name);
}

Status File::read_slice(const TensorInfo& tensor, const SlicePlan& plan, std::span<std::byte> dst) const {
  if (dst.size() != plan.nbytes()) {
    return Error::invalid_argument(path(), "slice of tensor " + quote(tensor.name) + " has " +
                                               std::to_string(plan.nbytes()) + " bytes but the destination holds " +
                                               std::to_string(dst.size()));
  }
  if (plan.source_end() > tensor.nbytes()) {
    return Error::invalid_argument(path(), "slice plan does not belong to tensor " + quote(tensor.name));
  }
  const Source& src = *state_->source;
  const std::uint64_t base = data_offset() + tensor.begin;
  if (plan.run_length() > kReadChunk) {
    // Long runs (blocks of rows) are few: they are read like read_many's tensors, in kReadChunk pieces.
    std::vector<ReadChunk> pieces;
    plan.for_each_run([&](const SliceRun& r) {
      // Runs of a multi-byte dtype hold whole elements, so the pieces hold whole swap units.
      internal::split_read(src, base + r.source_offset, dst.subspan(r.dest_offset, r.length), tensor.name,
                           host_swap_bytes(tensor.dtype), &pieces);
      return true;
    });
    return internal::read_chunks(pieces, plan.nbytes(), 0);
  }
  // Otherwise the runs are split into pieces of consecutive runs that cover about kSlicePiece bytes of the
  // source each; slices over a large span are read by a few threads, a piece at a time (a column slice
  // touches every page of the tensor, so the page faults or reads and the copies all parallelize).
  const std::uint64_t span = plan.source_end() - plan.source_begin();
  const std::uint64_t span_per_run =
      std::max<std::uint64_t>({1, plan.run_length(), plan.run_count() ? span / plan.run_count() : 0});
  const std::uint64_t runs_per_piece = std::max<std::uint64_t>(1, kSlicePiece / span_per_run);
  const std::uint64_t pieces = (plan.run_count() + runs_per_piece - 1) / runs_per_piece;
  const ReadHints hints = src.read_hints();
  const unsigned threads = span < 2 * kSlicePiece  ? 1
                           : hints.parallelism > 0 ? hints.parallelism
                                                   : internal::default_threads(span, kSlicePiece);
  // Runs closer than this are read together (a remote source asks for a larger gap than a syscall's worth).
  const std::uint64_t coalesce_gap = std::max(kCoalesceGap, hints.merge_gap);
  auto piece_runs = [&](std::size_t i) {
    const std::uint64_t first = i * runs_per_piece;
    return std::pair{first, std::min(runs_per_piece, plan.run_count() - first)};
  };

  // Only a memory source is copied from directly: a mapping is read with positional reads like a file, so
  // a file that shrank gives kIo instead of SIGBUS.
  if (const std::byte* mem = src.data(); mem != nullptr && src.data_is_memory()) {
    SAFETENSORS_RETURN_IF_ERROR(internal::run_parallel(pieces, threads, [&](std::size_t i) -> Status {
      const auto [first, count] = piece_runs(i);
      plan.for_each_run(first, count, [&](const SliceRun& r) {
        std::memcpy(dst.data() + r.dest_offset, mem + base + r.source_offset, r.length);
        return true;
      });
      return ok_status();
    }));
    swap_to_native(tensor.dtype, dst);
    return ok_status();
  }

  // Positional reads: a run goes straight into dst; runs of a piece that lie close together in the source
  // are read as one span into the piece's scratch memory and scattered, so many small runs do not cost one
  // syscall each.
  const std::string what = read_of(tensor.name);
  SAFETENSORS_RETURN_IF_ERROR(internal::run_parallel(pieces, threads, [&](std::size_t i) -> Status {
    std::vector<SliceRun> group;
    internal::Scratch scratch;
    std::uint64_t lo = 0, hi = 0;
    Status status;
    auto flush = [&]() -> Status {
      if (group.empty()) return ok_status();
      if (group.size() == 1) {
        const SliceRun& r = group.front();
        SAFETENSORS_RETURN_IF_ERROR(
            read_exact(src, base + r.source_offset, dst.subspan(r.dest_offset, r.length), what));
      } else {
        SAFETENSORS_ASSIGN_OR_RETURN(auto bytes,
                                     src.read(base + lo, scratch.get(base + lo, hi - lo, hints.alignment), what));
        for (const SliceRun& r : group) {
          std::memcpy(dst.data() + r.dest_offset, bytes.data() + (r.source_offset - lo), r.length);
        }
      }
      group.clear();
      return ok_status();
    };
    const auto [first, count] = piece_runs(i);
    plan.for_each_run(first, count, [&](const SliceRun& r) {
      const std::uint64_t r_end = r.source_offset + r.length;
      if (!group.empty()) {
        const std::uint64_t new_lo = std::min(lo, r.source_offset);
        const std::uint64_t new_hi = std::max(hi, r_end);
        const bool near = r.source_offset <= hi + coalesce_gap && r_end + coalesce_gap >= lo;
        if (near && new_hi - new_lo <= kCoalesceSpan) {
          lo = new_lo;
          hi = new_hi;
          group.push_back(r);
          return true;
        }
        status = flush();
        if (!status.ok()) return false;
      }
      lo = r.source_offset;
      hi = r_end;
      group.push_back(r);
      return true;
    });
    if (!status.ok()) return status;
    return flush();
  }));
  // The selected elements are whole, so dst holds whole swap units.
  swap_to_native(tensor.dtype, dst);
  return ok_status();
}

Status File::read_many(std::span<const ReadRequest> requests, unsigned threads) const {
  std::vector<ReadChunk> pieces;
  std::uint64_t total = 0;
  for (const ReadRequest& r : requests) {
    if (r.tensor == nullptr || r.dst.size() != r.tensor->nbytes()) {
      return Error::invalid_argument(
          path(), "read_many: destination size does not match tensor " + quote(r.tensor ? r.tensor->name : "<null>"));
    }
    internal::split_read(*state_->source, data_offset() + r.tensor->begin, r.dst, r.tensor->name,
                         host_swap_bytes(r.tensor->dtype), &pieces);
    total += r.dst.size();
  }
  return internal::read_chunks(pieces, total, threads);
}

void advise_fresh_destination(std::span<std::byte> dst) {
#ifdef MADV_NOHUGEPAGE
  // 4 KiB pages, whatever the THP settings: filling fresh memory with 4 KiB pages costs the same CPU time per
  // byte under every THP enabled/defrag setting, while huge pages, asked for by MADV_HUGEPAGE or given by
  // enabled=always, make the same load's cost depend on the host: a fault stalls in direct compaction (defrag
  // madvise/always), and on a VM that reports free memory to its host (virtio free page reporting) the host
  // faults each newly allocated 2 MiB block in again, whatever the defrag setting. MADV_HUGEPAGE can make a
  // load several times slower than the reference's at the common default (madvise/madvise), and no advice
  // leaves enabled=always to the same chance, so the advice is always "no huge pages". Pre-faulting the whole
  // destination too (MADV_POPULATE_WRITE) saves some CPU but no wall time, and taking it off the reader
  // threads would need a second pool. The loads this serves are measured in BENCHMARKS.md, sections
  // "Materialized load, warm page cache" and "Load, cold page cache".
  constexpr std::uintptr_t kHuge = std::uintptr_t{2} << 20;
  const auto first = reinterpret_cast<std::uintptr_t>(dst.data());
  const std::uintptr_t begin = (first + kHuge - 1) & ~(kHuge - 1);
  const std::uintptr_t end = (first + dst.size()) & ~(kHuge - 1);
  // Only whole 2 MiB blocks inside dst can become huge pages that are ours alone to advise. Advice only: a
  // kernel without THP refuses it, and the read works the same.
  if (end > begin) (void)::madvise(reinterpret_cast<void*>(begin), end - begin, MADV_NOHUGEPAGE);
#else
  (void)dst;
#endif
}

Status File::read_range(std::uint64_t offset, std::span<std::byte> dst, unsigned threads) const {
  const std::uint64_t data_size = size() - data_offset();
  auto end = internal::checked_add(offset, dst.size());
  if (!end || *end > data_size) {
    return Error::invalid_argument(path(), "read_range: [" + std::to_string(offset) + ", +" +
                                               std::to_string(dst.size()) + ") is outside the " +
                                               std::to_string(data_size) + "-byte data buffer");
  }
  std::vector<ReadChunk> pieces;
  internal::split_read(*state_->source, data_offset() + offset, dst, {}, 0, &pieces);
  return internal::read_chunks(pieces, dst.size(), threads);
}

}  // namespace safetensors
