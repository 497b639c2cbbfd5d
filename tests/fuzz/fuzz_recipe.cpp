// libFuzzer entry point for the recipe reader (src/train/recipe.cpp): the input is a YAML recipe. It is
// flattened (Recipe::parse), typed and validated (Recipe::config, which also derives the batch arithmetic
// and writes the resolved YAML), and diffed against the defaults. Any input must either give a config or
// throw olmosft::Error; a crash, a sanitizer report, another exception type (yaml-cpp's included) or a hang
// (-timeout) is a bug.
#include <cstdint>
#include <cstdlib>
#include <string>

#include "core/error.h"
#include "train/recipe.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    olmosft::Recipe r = olmosft::Recipe::parse(text, "fuzz.yaml");
    (void)olmosft::Recipe::diff(olmosft::Recipe::parse("", "defaults.yaml"), r);
    olmosft::TrainConfig c = r.config();
    if (c.batch.grad_accum < 1 || c.batch.slots < 1) std::abort();  // config() must refuse such a batch
  } catch (const olmosft::Error&) {
  }
  return 0;
}
