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
    embed = loaded->at("embed.weight");
  }
  // The map is gone; `embed` still holds the mapping and is an ordinary, writable tensor.
  embed.add_(1.0);
  // Compared with the same addition done on the original: (x + 1) - 1 need not round back to x.
  const bool same = torch::equal(embed, model.at("embed.weight") + 1.0);
  std::printf("round trip %s\n", same ? "ok" : "FAILED");
  return same ? 0 : 1;
}
