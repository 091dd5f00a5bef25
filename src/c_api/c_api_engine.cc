// The C API's loading engine (include/safetensors/c.h): pieces, prefetchers and the process-wide slab pool.
#include "safetensors/c.h"

#include <chrono>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "c_api/c_api_internal.h"
#include "safetensors/dtype.h"
#include "safetensors/engine.h"
#include "safetensors/error.h"
#include "safetensors/file.h"

using safetensors::Error;
using safetensors::c_api::checked_tensor_at;
using safetensors::c_api::fail;
using safetensors::c_api::guarded;

struct safetensors_prefetcher_t {
  std::unique_ptr<safetensors::Prefetcher> prefetcher;
};

namespace {

void to_c_piece(const safetensors::Piece& p, size_t i, safetensors_piece_t* out) {
  *out = safetensors_piece_t{p.begin, p.end, i, SAFETENSORS_DELIVERY_STAGED, nullptr, 0};
}

}  // namespace

extern "C" {

// -------------------------------------------------------------------------------------------------------
// Prefetch

safetensors_code_t safetensors_tensor_piece(const safetensors_file_t* file, size_t i, safetensors_piece_t* piece,
                                            safetensors_error_t** error) {
  return guarded(error, [&] {
    auto found = checked_tensor_at(file, i);
    if (!found.ok()) return fail(error, found.error());
    const auto* t = *found;
    auto p = safetensors::tensor_piece(file->set, *t);
    if (!p.ok()) return fail(error, p.error());
    to_c_piece(*p, i, piece);
    return SAFETENSORS_OK;
  });
}

safetensors_code_t safetensors_row_piece(const safetensors_file_t* file, size_t i, uint64_t r0, uint64_t r1,
                                         safetensors_piece_t* piece, safetensors_error_t** error) {
  return guarded(error, [&] {
    auto found = checked_tensor_at(file, i);
    if (!found.ok()) return fail(error, found.error());
    const auto* t = *found;
    auto p = safetensors::row_piece(file->set, *t, r0, r1);
    if (!p.ok()) return fail(error, p.error());
    to_c_piece(*p, i, piece);
    return SAFETENSORS_OK;
  });
}

safetensors_code_t safetensors_prefetch_start(const safetensors_file_t* file, const safetensors_piece_t* pieces,
                                              size_t count, const safetensors_prefetch_options_t* options,
                                              safetensors_prefetcher_t** prefetcher, safetensors_error_t** error) {
  *prefetcher = nullptr;
  return guarded(error, [&] {
    const std::string& path = file->set.path();
    if (pieces == nullptr && count != 0) return fail(error, Error::invalid_argument(path, "pieces is NULL"));
    std::vector<safetensors::Piece> plan;
    plan.reserve(count);
    for (size_t k = 0; k < count; ++k) {
      const safetensors_piece_t& c = pieces[k];
      auto found = checked_tensor_at(file, c.tensor);
      if (!found.ok()) return fail(error, found.error());
      const auto* t = *found;
      if (c.delivery != SAFETENSORS_DELIVERY_STAGED && c.delivery != SAFETENSORS_DELIVERY_DIRECT) {
        return fail(error, Error::invalid_argument(path, "piece " + std::to_string(k) + " has unknown delivery " +
                                                             std::to_string(c.delivery)));
      }
      if (c.dst == nullptr && c.dst_len != 0) {
        return fail(error, Error::invalid_argument(path, "piece " + std::to_string(k) + " has a NULL dst"));
      }
      safetensors::Piece p;
      p.begin = c.begin;
      p.end = c.end;
      p.tensor = t->name;
      p.swap_bytes = safetensors::dtype_swap_bytes(t->dtype);  // native values in events (convention 8)
      if (c.delivery == SAFETENSORS_DELIVERY_DIRECT) {
        p.delivery = safetensors::Delivery::kDirect;
        p.dst = std::span<std::byte>(static_cast<std::byte*>(c.dst), c.dst_len);
      }
      plan.push_back(p);
    }
    safetensors::PrefetchOptions o;
    if (options != nullptr) {
      if (options->threads != 0) o.threads = options->threads;
      if (options->chunk_bytes != 0) o.chunk_bytes = options->chunk_bytes;
      o.merge_gap = options->merge_gap;
      o.max_slabs = options->max_slabs;
    }
    auto started = safetensors::Prefetcher::start(file->set, std::move(plan), o);
    if (!started.ok()) return fail(error, started.error());
    *prefetcher = new safetensors_prefetcher_t{std::move(started).value()};
    return SAFETENSORS_OK;
  });
}

void safetensors_prefetch_free(safetensors_prefetcher_t* prefetcher) { delete prefetcher; }

safetensors_code_t safetensors_prefetch_next(safetensors_prefetcher_t* prefetcher, int64_t timeout_ms,
                                             safetensors_prefetch_event_t* event, safetensors_error_t** error) {
  return guarded(error, [&] {
    auto ev = timeout_ms < 0 ? prefetcher->prefetcher->next()
                             : prefetcher->prefetcher->next_for(std::chrono::milliseconds(timeout_ms));
    if (!ev.ok()) return fail(error, ev.error());
    using Kind = safetensors::PrefetchEvent::Kind;
    const int32_t kind = ev->kind == Kind::kStaged   ? SAFETENSORS_EVENT_STAGED
                         : ev->kind == Kind::kDirect ? SAFETENSORS_EVENT_DIRECT
                         : ev->kind == Kind::kEnd    ? SAFETENSORS_EVENT_END
                                                     : SAFETENSORS_EVENT_TIMEOUT;
    *event = safetensors_prefetch_event_t{kind,       ev->piece_done ? 1 : 0, ev->piece,
                                          ev->offset, ev->bytes.data(),       ev->bytes.size(),
                                          ev->slab,   ev->slab_data};
    return SAFETENSORS_OK;
  });
}

safetensors_code_t safetensors_prefetch_release(safetensors_prefetcher_t* prefetcher, uint64_t slab,
                                                safetensors_error_t** error) {
  return guarded(error, [&] {
    auto st = prefetcher->prefetcher->release(slab);
    return st.ok() ? SAFETENSORS_OK : fail(error, st.error());
  });
}

safetensors_code_t safetensors_prefetch_wait_piece(safetensors_prefetcher_t* prefetcher, size_t i,
                                                   safetensors_error_t** error) {
  return guarded(error, [&] {
    auto st = prefetcher->prefetcher->wait_piece(i);
    return st.ok() ? SAFETENSORS_OK : fail(error, st.error());
  });
}

void safetensors_prefetch_cancel(safetensors_prefetcher_t* prefetcher) { prefetcher->prefetcher->cancel(); }

void safetensors_prefetch_stats(const safetensors_prefetcher_t* prefetcher, safetensors_prefetch_stats_t* stats) {
  const safetensors::PrefetchStats s = prefetcher->prefetcher->stats();
  *stats = safetensors_prefetch_stats_t{s.bytes_read,   s.reads,  s.bytes_staged,
                                        s.bytes_direct, s.chunks, static_cast<std::uint64_t>(s.slab_wait.count()),
                                        s.events_lent};
}

safetensors_code_t safetensors_slab_pool_set_capacity(uint64_t bytes, safetensors_error_t** error) {
  return guarded(error, [&] {
    auto st = safetensors::SlabPool::global().set_capacity(bytes);
    return st.ok() ? SAFETENSORS_OK : fail(error, st.error());
  });
}

safetensors_code_t safetensors_slab_pool_set_slab_bytes(uint64_t bytes, safetensors_error_t** error) {
  return guarded(error, [&] {
    auto st = safetensors::SlabPool::global().set_slab_bytes(bytes);
    return st.ok() ? SAFETENSORS_OK : fail(error, st.error());
  });
}

safetensors_code_t safetensors_slab_pool_set_allocator(void* (*alloc)(size_t size, void* user),
                                                       void (*free_fn)(void* p, size_t size, void* user), void* user,
                                                       safetensors_error_t** error) {
  return guarded(error, [&] {
    safetensors::SlabAllocator a;
    if (alloc != nullptr) a.alloc = [alloc, user](std::size_t n) { return alloc(n, user); };
    if (free_fn != nullptr) a.free = [free_fn, user](void* p, std::size_t n) { free_fn(p, n, user); };
    auto st = safetensors::SlabPool::global().set_allocator(std::move(a));
    return st.ok() ? SAFETENSORS_OK : fail(error, st.error());
  });
}

void safetensors_slab_pool_trim(void) { safetensors::SlabPool::global().trim(); }

void safetensors_slab_pool_stats(safetensors_slab_pool_stats_t* stats) {
  const safetensors::SlabPoolStats s = safetensors::SlabPool::global().stats();
  *stats = safetensors_slab_pool_stats_t{s.capacity,   s.slab_bytes,   s.allocated_bytes,
                                         s.peak_bytes, s.slabs_in_use, s.slabs_free};
}
}  // extern "C"
