// Opens a safetensors file and prints its tensors: name, dtype, shape, size, and a checksum of the bytes.
//
//   inspect_file model.safetensors [--pread]
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "safetensors/file.h"

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s FILE [--pread]\n", argv[0]);
    return 2;
  }
  safetensors::OpenOptions options;
  if (argc > 2 && std::strcmp(argv[2], "--pread") == 0) options.backend = safetensors::Backend::kPread;

  auto file = safetensors::File::open(argv[1], options);
  if (!file.ok()) {
    std::fprintf(stderr, "error: %s\n", file.error().to_string().c_str());
    return 1;
  }
  if (const auto& md = file->metadata()) {
    for (const auto& [key, value] : *md) std::printf("metadata %s = %s\n", key.c_str(), value.c_str());
  }
  std::uint64_t total = 0;
  std::vector<std::byte> buf;
  for (const safetensors::TensorInfo& t : file->tensors()) {
    buf.resize(t.nbytes());
    if (auto st = file->read_into(t, buf); !st.ok()) {
      std::fprintf(stderr, "error: %s\n", st.error().to_string().c_str());
      return 1;
    }
    std::uint64_t sum = 1469598103934665603ull;  // FNV-1a
    for (std::byte b : buf) sum = (sum ^ static_cast<std::uint8_t>(b)) * 1099511628211ull;
    std::string shape = "[";
    for (std::size_t i = 0; i < t.shape.size(); ++i) shape += (i ? ", " : "") + std::to_string(t.shape[i]);
    shape += "]";
    std::printf("%-40s %-12s %-20s %12llu bytes  fnv1a=%016llx\n", std::string(t.name).c_str(),
                std::string(safetensors::dtype_code(t.dtype)).c_str(), shape.c_str(),
                static_cast<unsigned long long>(t.nbytes()), static_cast<unsigned long long>(sum));
    total += t.nbytes();
  }
  std::printf("%zu tensors, %llu bytes of data\n", file->tensors().size(), static_cast<unsigned long long>(total));
  return 0;
}
