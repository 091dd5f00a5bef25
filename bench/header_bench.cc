// Micro-benchmark: opening (parsing + validating the header of) files with 1k, 20k and 100k tensors, from
// memory so that only the header work is measured.
#include <benchmark/benchmark.h>

#include <memory>
#include <string>
#include <vector>

#include "safetensors/file.h"
#include "safetensors/writer.h"

namespace {

std::shared_ptr<std::vector<std::byte>> make_file(int n) {
  std::vector<safetensors::TensorData> tensors;
  tensors.reserve(n);
  static const std::byte kData[64] = {};
  for (int i = 0; i < n; ++i) {
    const int layer = i / 16;
    const auto dtype = i % 3 ? safetensors::Dtype::kBF16 : safetensors::Dtype::kF32;
    tensors.push_back({"model.layers." + std::to_string(layer) + ".mlp.proj_" + std::to_string(i % 16) + ".weight",
                       dtype,
                       {4, 2},
                       std::span<const std::byte>(kData, 8 * safetensors::dtype_bits(dtype) / 8)});
  }
  auto bytes = safetensors::serialize(tensors);
  return std::make_shared<std::vector<std::byte>>(std::move(bytes.value()));
}

void BM_OpenHeader(benchmark::State& state) {
  auto bytes = make_file(static_cast<int>(state.range(0)));
  auto source = safetensors::memory_source(*bytes, bytes);
  for (auto _ : state) {
    auto f = safetensors::File::open(source);
    if (!f.ok()) state.SkipWithError(f.error().to_string().c_str());
    benchmark::DoNotOptimize(f);
  }
  state.counters["tensors"] = static_cast<double>(state.range(0));
  state.counters["header_MB/s"] =
      benchmark::Counter(static_cast<double>(bytes->size()) * state.iterations() / 1e6, benchmark::Counter::kIsRate);
}
BENCHMARK(BM_OpenHeader)->Arg(1000)->Arg(20000)->Arg(100000)->Unit(benchmark::kMillisecond);

void BM_Keys(benchmark::State& state) {
  auto bytes = make_file(static_cast<int>(state.range(0)));
  auto f = safetensors::File::open(safetensors::memory_source(*bytes, bytes));
  for (auto _ : state) benchmark::DoNotOptimize(f->keys());
}
BENCHMARK(BM_Keys)->Arg(20000)->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
