// fuzz_replay: runs the fuzz targets' entry points over their seed corpora without libFuzzer, in the normal
// (gcc, non-sanitizer) build, so that `make test` catches a corpus input that crashes, hangs (ctest timeout)
// or throws anything but olmosft::Error without building the instrumented targets (cmake/fuzz.cmake).
// Each tests/fuzz/fuzz_<name>.cpp is compiled here with LLVMFuzzerTestOneInput renamed to
// olmosft_fuzz_<name>. Usage: fuzz_replay NAME FILE_OR_DIR...   (directories: every file in them, sorted)
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

extern "C" int olmosft_fuzz_safetensors(const uint8_t* data, size_t size);
extern "C" int olmosft_fuzz_template(const uint8_t* data, size_t size);
extern "C" int olmosft_fuzz_tokenizer(const uint8_t* data, size_t size);
extern "C" int olmosft_fuzz_recipe(const uint8_t* data, size_t size);
extern "C" int olmosft_fuzz_manifest(const uint8_t* data, size_t size);
extern "C" int olmosft_fuzz_pickle(const uint8_t* data, size_t size);

namespace fs = std::filesystem;

int main(int argc, char** argv) {
  struct Target {
    const char* name;
    int (*run)(const uint8_t*, size_t);
  };
  const Target targets[] = {{"safetensors", olmosft_fuzz_safetensors}, {"template", olmosft_fuzz_template},
                            {"tokenizer", olmosft_fuzz_tokenizer},     {"recipe", olmosft_fuzz_recipe},
                            {"manifest", olmosft_fuzz_manifest},       {"pickle", olmosft_fuzz_pickle}};
  const Target* t = nullptr;
  for (const auto& c : targets)
    if (argc >= 2 && std::strcmp(argv[1], c.name) == 0) t = &c;
  if (!t || argc < 3) {
    std::fprintf(stderr,
                 "usage: fuzz_replay safetensors|template|tokenizer|recipe|manifest FILE_OR_DIR...\n");
    return 2;
  }
  std::vector<fs::path> files;
  for (int i = 2; i < argc; ++i) {
    if (fs::is_directory(argv[i])) {
      std::vector<fs::path> in_dir;
      for (const auto& e : fs::directory_iterator(argv[i]))
        if (e.is_regular_file()) in_dir.push_back(e.path());
      std::sort(in_dir.begin(), in_dir.end());
      files.insert(files.end(), in_dir.begin(), in_dir.end());
    } else {
      files.emplace_back(argv[i]);
    }
  }
  if (files.empty()) {
    std::fprintf(stderr, "fuzz_replay %s: no input files\n", t->name);
    return 2;
  }
  for (const auto& f : files) {
    std::ifstream in(f, std::ios::binary);
    if (!in) {
      std::fprintf(stderr, "fuzz_replay %s: cannot read %s\n", t->name, f.c_str());
      return 2;
    }
    std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    auto t0 = std::chrono::steady_clock::now();
    try {
      t->run(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
    } catch (const std::exception& e) {
      std::fprintf(stderr, "FINDING: fuzz_%s on %s: uncaught exception (not olmosft::Error): %s\n", t->name,
                   f.c_str(), e.what());
      return 1;
    } catch (...) {
      std::fprintf(stderr, "FINDING: fuzz_%s on %s: uncaught non-std exception\n", t->name, f.c_str());
      return 1;
    }
    double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    std::printf("fuzz_%s: %s (%zu bytes) ok in %.1f ms\n", t->name, f.c_str(), bytes.size(), ms);
  }
  std::printf("fuzz_%s: replayed %zu inputs, no finding\n", t->name, files.size());
  return 0;
}
