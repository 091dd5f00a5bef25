// Saves a few torch tensors with the libtorch adapter, loads them back as zero-copy views of the file, and
// shows that the tensors outlive everything else.
//
//   libtorch_example [FILE]     (default: libtorch_example.safetensors in the current directory)
#include <cstdio>
#include <string>

#include "safetensors/libtorch.h"

int main(int argc, char** argv) {
  const std::string path = argc > 1 ? argv[1] : "libtorch_example.safetensors";
  namespace lt = safetensors::libtorch;

  torch::manual_seed(0);  // the same values on every run
  const lt::TensorMap model = {
      {"embed.weight", torch::randn({16, 8})},
      {"embed.scale", torch::ones({8}, torch::kBFloat16)},
      {"step", torch::tensor(42, torch::kInt64)},
  };
  if (auto st = lt::save(path, model, safetensors::Metadata{{"format", "pt"}}); !st.ok()) {
    std::fprintf(stderr, "save: %s\n", st.error().to_string().c_str());
    return 1;
  }

  torch::Tensor embed;
  bool same = false;
  {
    auto loaded = lt::load(path);  // CPU, zero-copy views of a private mapping
    if (!loaded.ok()) {
      std::fprintf(stderr, "load: %s\n", loaded.error().to_string().c_str());
      return 1;
    }
    for (const auto& [name, t] : *loaded) {
      std::printf("%-14s %-10s %s\n", name.c_str(), std::string(c10::toString(t.scalar_type())).c_str(),
                  c10::str(t.sizes()).c_str());
    }
    // Saving and loading copy bytes: every tensor comes back bit for bit (same dtype, shape and values).
    same = loaded->size() == model.size();
    for (const auto& [name, t] : model) {
      const auto it = loaded->find(name);
      same = same && it != loaded->end() && it->second.scalar_type() == t.scalar_type() && torch::equal(it->second, t);
    }
    embed = loaded->at("embed.weight");
  }
  // The map is gone; `embed` still holds the mapping and is an ordinary, writable tensor. The same float
  // addition on the same values gives the same bits, so this comparison is exact too.
  embed.add_(1.0);
  same = same && torch::equal(embed, model.at("embed.weight") + 1.0);
  std::printf("round trip %s\n", same ? "ok" : "FAILED");
  return same ? 0 : 1;
}
