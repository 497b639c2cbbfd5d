// Link-time fallbacks until the dense and hybrid model branches are merged (the lead deletes this file at
// merge): `olmosft train` links and fails with a clear message.
#include "core/error.h"
#include "model/model.h"

namespace olmosft::model {

__attribute__((weak)) std::unique_ptr<CausalLM> make_model(const ModelConfig&, uint64_t) {
  throw Error("model implementation not linked");
}

__attribute__((weak)) std::unique_ptr<CausalLM> load_model(const std::string&) {
  throw Error("model implementation not linked");
}

}  // namespace olmosft::model
