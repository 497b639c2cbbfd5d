// Weak fallback for the Olmo 3.5 hybrid's factory, so that make_model links before the hybrid is merged.
// The hybrid's strong definition (src/model/olmo3moe*.cpp) replaces it; delete this file at that merge.
#include "core/error.h"
#include "model/model.h"

namespace olmosft::model {

__attribute__((weak)) std::unique_ptr<CausalLM> make_olmo3moe(const ModelConfig&) {
  throw Error("olmo3moe model not linked in this build");
}

}  // namespace olmosft::model
