// Writes a file with the installed library, reads it back and checks the bytes.
#include <safetensors/file.h>
#include <safetensors/writer.h>

#include <cstdio>
#include <vector>

int main() {
  std::vector<float> w = {1.5f, -2.0f, 3.25f, 0.0f};
  std::vector<safetensors::TensorData> tensors = {
      {"w", safetensors::Dtype::kF32, {2, 2}, std::as_bytes(std::span<const float>(w))}};
  auto bytes = safetensors::serialize(tensors, safetensors::Metadata{{"by", "consumer"}});
  if (!bytes.ok()) return std::fprintf(stderr, "%s\n", bytes.error().to_string().c_str()), 1;
  auto owner = std::make_shared<std::vector<std::byte>>(std::move(*bytes));
  auto file = safetensors::File::open(safetensors::memory_source(*owner, owner));
  if (!file.ok()) return std::fprintf(stderr, "%s\n", file.error().to_string().c_str()), 1;
  std::vector<float> back(4);
  auto st = file->read_into("w", std::as_writable_bytes(std::span<float>(back)));
  if (!st.ok() || back != w) return std::fprintf(stderr, "round trip failed\n"), 1;
  std::printf("consumer ok: %zu tensor, metadata by=%s\n", file->tensors().size(),
              file->metadata()->at(0).second.c_str());
  return 0;
}
