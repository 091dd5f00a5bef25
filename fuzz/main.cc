// Replay driver: links a harness into an ordinary executable (any compiler, no libFuzzer) that runs it once
// on every file named on the command line, recursing into directories in sorted order. A missing path is
// skipped (a harness may have no regression inputs yet), but at least one input must run. A failing check
// aborts, exactly as under libFuzzer.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size);

namespace {

std::vector<std::filesystem::path> inputs_under(const std::filesystem::path& root) {
  std::vector<std::filesystem::path> files;
  if (std::filesystem::is_directory(root)) {
    for (const auto& entry : std::filesystem::recursive_directory_iterator(root)) {
      if (entry.is_regular_file()) files.push_back(entry.path());
    }
  } else if (std::filesystem::is_regular_file(root)) {
    files.push_back(root);
  }
  std::sort(files.begin(), files.end());
  return files;
}

}  // namespace

int main(int argc, char** argv) {
  std::size_t ran = 0;
  for (int i = 1; i < argc; ++i) {
    const std::filesystem::path root(argv[i]);
    if (!std::filesystem::exists(root)) {
      std::printf("skipping %s: no such path\n", argv[i]);
      continue;
    }
    for (const auto& path : inputs_under(root)) {
      std::ifstream in(path, std::ios::binary);
      const std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      if (!in.good() && !in.eof()) {
        std::fprintf(stderr, "cannot read %s\n", path.c_str());
        return 2;
      }
      std::fprintf(stderr, "%s\n", path.c_str());
      // A copy of exactly the input's size, so ASan catches a read past its end as libFuzzer would.
      std::vector<std::uint8_t> copy(bytes.begin(), bytes.end());
      LLVMFuzzerTestOneInput(copy.empty() ? nullptr : copy.data(), copy.size());
      ++ran;
    }
  }
  std::printf("replayed %zu inputs\n", ran);
  return ran > 0 ? 0 : 1;
}
