// Writes or checks the byte-order golden file (golden_le.h), so that a file written on one host can be
// checked on another (x86-64 and s390x under qemu: scripts/test.d/60-big-endian.sh).
//
//   cross_host_file write PATH    saves the golden tensors from this host's native values
//   cross_host_file check PATH    every tensor's file bytes are the golden little-endian bytes, and read_into
//                                 gives this host's native values, on the mmap and pread backends
// Exits 0 on success, 1 with a message on the first mismatch, 2 on bad usage.
#include <cstdio>
#include <cstring>
#include <string>

#include "golden_le.h"
#include "safetensors/file.h"
#include "safetensors/writer.h"

namespace {

int fail(const std::string& message) {
  std::fprintf(stderr, "cross_host_file: %s\n", message.c_str());
  return 1;
}

int check(const std::string& path) {
  using namespace safetensors;
  const auto golden = test::golden_tensors();
  for (Backend backend : {Backend::kMmap, Backend::kPread}) {
    auto file = File::open(path, {.backend = backend});
    if (!file.ok()) return fail(file.error().to_string());
    if (file->tensors().size() != golden.size()) return fail("wrong tensor count");
    for (const auto& g : golden) {
      const TensorInfo* t = file->find(g.name);
      if (t == nullptr || t->dtype != g.dtype) return fail("tensor " + g.name + " missing or of another dtype");
      std::string raw(t->nbytes(), '\0');
      // read_range: the file's own bytes, whatever the host.
      auto st = file->read_range(t->begin, std::as_writable_bytes(std::span(raw)));
      if (!st.ok()) return fail(st.error().to_string());
      if (raw != g.file_bytes) return fail("tensor " + g.name + ": file bytes differ from the golden ones");
      std::vector<std::byte> values(t->nbytes());
      st = file->read_into(*t, values);
      if (!st.ok()) return fail(st.error().to_string());
      if (values != g.native) return fail("tensor " + g.name + ": read_into did not give native values");
    }
  }
  std::printf("cross_host_file: %s ok on a %s-endian host (%zu tensors)\n", path.c_str(),
              safetensors::host_is_little_endian() ? "little" : "big", golden.size());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: cross_host_file write|check PATH\n");
    return 2;
  }
  const std::string mode = argv[1], path = argv[2];
  if (mode == "write") {
    auto st = safetensors::save_file(path, safetensors::test::golden_data(safetensors::test::golden_tensors()));
    if (!st.ok()) return fail(st.error().to_string());
    return 0;
  }
  if (mode == "check") return check(path);
  std::fprintf(stderr, "usage: cross_host_file write|check PATH\n");
  return 2;
}
