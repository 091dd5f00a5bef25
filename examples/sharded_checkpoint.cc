// Writes a small model as a sharded checkpoint (transformers layout), then opens it through its index and
// reads every tensor in parallel across the shards.
//
//   sharded_checkpoint DIR                          write a demo checkpoint into DIR, then read it back
//   sharded_checkpoint DIR/model.safetensors.index.json   read an existing checkpoint
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "safetensors/sharded.h"

namespace st = safetensors;

namespace {

int fail(const st::Error& e) {
  std::fprintf(stderr, "error: %s\n", e.to_string().c_str());
  return 1;
}

// Eight 64x64 F32 layers and a bias, with contents derived from their position.
st::Result<st::ShardPlan> write_demo(const std::string& dir, std::vector<std::vector<float>>* storage) {
  std::vector<st::TensorData> tensors;
  for (int layer = 0; layer < 8; ++layer) {
    std::vector<float>& w = storage->emplace_back(64 * 64);
    for (std::size_t i = 0; i < w.size(); ++i) w[i] = static_cast<float>(layer) + static_cast<float>(i) / 4096.0f;
    tensors.push_back({"layers." + std::to_string(layer) + ".weight",
                       st::Dtype::kF32,
                       {64, 64},
                       std::as_bytes(std::span<const float>(w))});
  }
  std::vector<float>& bias = storage->emplace_back(64, 0.5f);
  tensors.push_back({"head.bias", st::Dtype::kF32, {64}, std::as_bytes(std::span<const float>(bias))});

  st::ShardingOptions options;
  options.max_shard_bytes = 40'000;  // two 16 KiB layers per shard
  options.shard_metadata = st::Metadata{{"format", "pt"}};
  return st::save_sharded(dir, tensors, options);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s DIR | INDEX.json\n", argv[0]);
    return 2;
  }
  std::string index = argv[1];
  std::vector<std::vector<float>> storage;
  if (!index.ends_with(".json")) {
    std::filesystem::create_directories(index);
    auto plan = write_demo(index, &storage);
    if (!plan.ok()) return fail(plan.error());
    for (const auto& shard : plan->shards) {
      std::printf("wrote %s: %zu tensors, %llu bytes\n", shard.file_name.c_str(), shard.inputs.size(),
                  static_cast<unsigned long long>(shard.bytes));
    }
    index += "/" + plan->index_file_name;
  }

  auto ckpt = st::ShardedFile::open_index(index);
  if (!ckpt.ok()) return fail(ckpt.error());
  std::printf("%s: %zu tensors in %zu shards, total_size=%llu\n", index.c_str(), ckpt->tensors().size(),
              ckpt->shards().size(), static_cast<unsigned long long>(ckpt->total_size().value_or(0)));

  // One buffer per tensor, filled by one parallel read across all shards.
  std::vector<std::vector<std::byte>> buffers;
  std::vector<st::ReadRequest> requests;
  buffers.reserve(ckpt->tensors().size());
  for (const st::TensorInfo& t : ckpt->tensors()) {
    buffers.emplace_back(t.nbytes());
    requests.push_back({&t, buffers.back()});
  }
  if (auto read = ckpt->read_many(requests); !read.ok()) return fail(read.error());

  for (std::size_t i = 0; i < requests.size(); ++i) {
    const st::TensorInfo& t = *requests[i].tensor;
    std::uint64_t sum = 1469598103934665603ull;  // FNV-1a of the bytes
    for (std::byte b : buffers[i]) sum = (sum ^ static_cast<std::uint8_t>(b)) * 1099511628211ull;
    const std::string shard = std::filesystem::path(ckpt->file_of(t).path()).filename().string();
    std::printf("  %-20s %-4s %8llu bytes  %s  fnv1a=%016llx\n", std::string(t.name).c_str(),
                std::string(st::dtype_code(t.dtype)).c_str(), static_cast<unsigned long long>(t.nbytes()),
                shard.c_str(), static_cast<unsigned long long>(sum));
  }
  return 0;
}
