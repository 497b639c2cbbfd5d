// libFuzzer entry point for the safetensors header parser: any input must either parse into a header
// whose ranges lie inside the buffer, or throw olmosft::Error. Anything else (crash, ASan report, another
// exception type) is a bug.
#include <cstdint>
#include <cstdlib>

#include "io/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    auto h = olmosft::safetensors::parse(data, size, "fuzz-input");
    uint64_t sum = 0;
    for (const auto& t : h.tensors) {
      if (t.end > h.data_size || t.begin > t.end) std::abort();
      // Touch first and last byte of each tensor to let ASan check the ranges.
      if (t.end > t.begin) sum += data[8 + h.header_size + t.begin] + data[8 + h.header_size + t.end - 1];
    }
    (void)sum;
  } catch (const olmosft::Error&) {
  }
  return 0;
}
