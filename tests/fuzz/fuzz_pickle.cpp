// libFuzzer entry point for the restricted unpickler and the distributed-checkpoint formats built on it
// (src/io/pickle.cpp, src/io/distcp*.cpp): each input is read as a `.metadata` pickle (parse_metadata), as a
// pickle under torch.save's allow-list, and as a torch.save ZIP item (parse_torch_save). Each must either
// succeed with a consistent result or throw olmosft::Error; anything else (crash, sanitizer report, hang,
// unbounded allocation, another exception type) is a bug.
#include <cstdint>
#include <cstdlib>

#include "core/error.h"
#include "io/distcp.h"
#include "io/pickle.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace olmosft;
  try {
    auto m = distcp::parse_metadata(data, size, "fuzz-metadata");
    for (const auto& [key, e] : m.tensors) {
      int64_t total = 0;
      for (const auto& c : e.chunks) total += shape_numel(c.sizes);
      if (total != shape_numel(e.shape)) std::abort();  // parse_metadata checks the tiling
    }
  } catch (const Error&) {
  }
  try {
    auto p = pickle::unpickle(data, size, distcp::torch_save_classes(), "fuzz-pickle");
    (void)pickle::describe(p.root(), 4);
  } catch (const Error&) {
  }
  try {
    auto t = distcp::parse_torch_save(data, size, "fuzz-item");
    if (t.data < data || t.data_bytes > size || t.data + t.data_bytes > data + size) std::abort();
    if (t.data_bytes) (void)(t.data[0] + t.data[t.data_bytes - 1]);  // ASan checks the range
  } catch (const Error&) {
  }
  return 0;
}
