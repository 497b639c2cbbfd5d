// libFuzzer entry point for the packed-dataset manifest reader (PackedDataset::open in src/data/dataset.cpp):
// the input is written as manifest.json into a temporary directory that also holds the two row files of a
// tiny real `olmosft data build` (tests/fuzz/manifest_rows: seq_len 96, 2 rows per epoch, 2 epochs; the seed
// corpus holds its manifest). When the manifest opens, every row is read (checksums verified) and decoded.
// Any input must either open or throw olmosft::Error; a crash, a sanitizer report, another exception type or
// a hang (-timeout) is a bug.
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "core/error.h"
#include "data/dataset.h"

#ifndef OLMOSFT_FUZZ_ROWS_DIR
#error "OLMOSFT_FUZZ_ROWS_DIR (tests/fuzz/manifest_rows) must be defined"
#endif

namespace fs = std::filesystem;

namespace {
// The directory, made once per process and removed at exit (the string is never freed: the exit handler
// runs after static destructors of objects constructed before it was registered).
const std::string& dataset_dir() {
  static const std::string* dir = [] {
    std::string tmpl = (fs::temp_directory_path() / "olmosft-fuzz-manifest-XXXXXX").string();
    if (!::mkdtemp(tmpl.data())) std::abort();
    for (const auto& e : fs::directory_iterator(OLMOSFT_FUZZ_ROWS_DIR))
      fs::copy_file(e.path(), fs::path(tmpl) / e.path().filename());
    auto* d = new std::string(tmpl);
    std::atexit([] {
      std::error_code ec;
      fs::remove_all(dataset_dir(), ec);
    });
    return d;
  }();
  return *dir;
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string& dir = dataset_dir();
  {
    std::ofstream out(dir + "/manifest.json", std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
    if (!out) std::abort();
  }
  try {
    olmosft::PackedDataset ds = olmosft::PackedDataset::open(dir);
    ds.verify_all();
    for (int e = 0; e < ds.epochs(); ++e) {
      for (int64_t i = 0; i < ds.rows(e); ++i) {
        olmosft::PackedRow r = ds.row(e, i);
        (void)r.positions();
        (void)r.targets();
        (void)r.num_segments();
      }
    }
  } catch (const olmosft::Error&) {
  }
  return 0;
}
