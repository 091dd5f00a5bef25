// Micro-benchmark (smoke target) of the engine on a 2 GiB plan: direct destinations vs File::read_many, and
// staged through a 256 MiB slab pool (a consumer that releases each chunk, and one that also copies it out, as
// a device copy would). The file is written once to $ST_BENCH_DIR (default /tmp) and read from the page cache
// after the first iteration; it is removed at exit.
#include <benchmark/benchmark.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "safetensors/engine.h"
#include "safetensors/file.h"
#include "safetensors/writer.h"

namespace {

constexpr std::uint64_t kTensorBytes = std::uint64_t{8} << 20;
constexpr int kTensors = 256;  // 2 GiB

std::string bench_path() {
  const char* dir = std::getenv("ST_BENCH_DIR");
  return std::string(dir && *dir ? dir : "/tmp") + "/st_engine_bench.safetensors";
}

struct Fixture {
  safetensors::File file;
  std::vector<std::vector<std::byte>> dsts;
};

Fixture& fixture() {
  static const std::unique_ptr<Fixture> f = [] {
    std::vector<std::byte> data(kTensorBytes);
    for (std::size_t i = 0; i < data.size(); ++i) data[i] = static_cast<std::byte>(i * 131 + 7);
    std::vector<safetensors::TensorData> ts;
    for (int i = 0; i < kTensors; ++i) {
      ts.push_back({"layer." + std::to_string(i), safetensors::Dtype::kBF16, {kTensorBytes / 2}, data});
    }
    const std::string path = bench_path();
    if (!safetensors::save_file(path, ts).ok()) std::abort();
    auto file = safetensors::File::open(path, {.backend = safetensors::Backend::kPread});
    if (!file.ok()) std::abort();
    auto fx = std::make_unique<Fixture>(Fixture{std::move(file).value(), {}});
    for (const auto& t : fx->file.tensors()) fx->dsts.emplace_back(t.nbytes());
    return fx;
  }();
  return *f;
}

std::uint64_t total_bytes() { return kTensorBytes * kTensors; }

void set_rate(benchmark::State& state) {
  state.counters["GB/s"] = benchmark::Counter(
      static_cast<double>(total_bytes()) * static_cast<double>(state.iterations()) / 1e9, benchmark::Counter::kIsRate);
}

// Runs one prefetch of `plan` with range(0) reader threads to its end, handing each staged event to
// on_staged; returns its stats (a failure is reported as the benchmark's error).
template <class OnStaged>
safetensors::PrefetchStats prefetch_all(benchmark::State& state, const std::vector<safetensors::Piece>& plan,
                                        OnStaged on_staged) {
  auto pf = safetensors::Prefetcher::start(fixture().file, plan, {.threads = static_cast<unsigned>(state.range(0))});
  if (!pf.ok()) {
    state.SkipWithError(pf.error().to_string().c_str());
    return {};
  }
  for (;;) {
    auto ev = (*pf)->next();
    if (!ev.ok()) state.SkipWithError(ev.error().to_string().c_str());
    if (!ev.ok() || ev->kind == safetensors::PrefetchEvent::Kind::kEnd) break;
    if (ev->kind == safetensors::PrefetchEvent::Kind::kStaged) on_staged(**pf, *ev);
  }
  return (*pf)->stats();
}

void BM_ReadMany(benchmark::State& state) {
  Fixture& fx = fixture();
  std::vector<safetensors::ReadRequest> reqs;
  for (std::size_t i = 0; i < fx.dsts.size(); ++i) reqs.push_back({&fx.file.tensors()[i], fx.dsts[i]});
  for (auto _ : state) {
    if (!fx.file.read_many(reqs, static_cast<unsigned>(state.range(0))).ok()) state.SkipWithError("read_many");
  }
  set_rate(state);
}
BENCHMARK(BM_ReadMany)->Arg(8)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_PrefetchDirect(benchmark::State& state) {
  Fixture& fx = fixture();
  std::vector<safetensors::Piece> plan;
  for (std::size_t i = 0; i < fx.dsts.size(); ++i) {
    auto p = *safetensors::tensor_piece(fx.file, fx.file.tensors()[i]);
    p.delivery = safetensors::Delivery::kDirect;
    p.dst = fx.dsts[i];
    plan.push_back(p);
  }
  for (auto _ : state) {
    prefetch_all(state, plan, [](auto&, const auto&) {});
  }
  set_rate(state);
}
BENCHMARK(BM_PrefetchDirect)->Arg(8)->Unit(benchmark::kMillisecond)->UseRealTime();

// range(1): 0 = release each chunk at once; 1 = copy it into the destination first (a stand-in device copy).
void BM_PrefetchStaged(benchmark::State& state) {
  Fixture& fx = fixture();
  auto& pool = safetensors::SlabPool::global();
  (void)pool.set_capacity(safetensors::SlabPool::kDefaultCapacity);
  std::vector<safetensors::Piece> plan;
  for (const auto& t : fx.file.tensors()) plan.push_back(*safetensors::tensor_piece(fx.file, t));
  const bool copy = state.range(1) != 0;
  std::chrono::nanoseconds waited{0};
  for (auto _ : state) {
    waited += prefetch_all(state, plan, [&](safetensors::Prefetcher& pf, const safetensors::PrefetchEvent& ev) {
                if (copy) std::memcpy(fx.dsts[ev.piece].data() + ev.offset, ev.bytes.data(), ev.bytes.size());
                (void)pf.release(ev.slab);
              }).slab_wait;
  }
  set_rate(state);
  state.counters["slab_wait_ms/iter"] =
      static_cast<double>(waited.count()) / 1e6 / static_cast<double>(state.iterations());
  state.counters["pool_peak_MiB"] = static_cast<double>(pool.stats().peak_bytes) / (1 << 20);
}
BENCHMARK(BM_PrefetchStaged)->Args({8, 0})->Args({8, 1})->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  std::remove(bench_path().c_str());
  return 0;
}
