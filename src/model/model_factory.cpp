// make_model / load_model / export_tensors: the one place that maps a ModelConfig to an implementation.
#include <cmath>
#include <cstring>

#include "core/rng.h"
#include "model/hf_dir.h"
#include "model/model.h"
#include "model/olmo3.h"
#include "model/olmo3moe.h"

namespace olmosft::model {

namespace {

// The hybrid initialises its own 1-D tensors (A_log, dt_bias, ssmax_scale) from `seed`; make_model then
// overwrites matrices, norm gains and biases the same way for both families.
std::unique_ptr<CausalLM> construct(const ModelConfig& c, uint64_t seed) {
  switch (c.model_type) {
    case ModelType::Olmo3:
      return std::make_unique<Olmo3>(c);
    case ModelType::Olmo3Moe:
      return make_olmo3moe(c, seed);
  }
  fail("make_model: unknown model type '", c.model_type_name, "'");
}

bool ends_with(const std::string& s, const char* suffix) {
  const size_t n = std::strlen(suffix);
  return s.size() >= n && s.compare(s.size() - n, n, suffix) == 0;
}

// FNV-1a of the tensor name: each parameter draws from its own Philox stream, so a tensor's values do
// not depend on the thread count, on the order of initialisation or on which other tensors exist.
uint64_t name_stream(const std::string& name) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char ch : name) {
    h ^= ch;
    h *= 1099511628211ull;
  }
  return h;
}

}  // namespace

std::unique_ptr<CausalLM> make_model(const ModelConfig& config, uint64_t seed) {
  auto m = construct(config, seed);
  const float stdev = float(config.initializer_range);
  OLMO_CHECK(stdev >= 0 && std::isfinite(stdev),
             "make_model: initializer_range must be finite and >= 0, got ", config.initializer_range);
  for (auto& p : m->params()) {
    // HF Olmo3PreTrainedModel._init_weights: Linear/Embedding ~ N(0, initializer_range), RMSNorm gains 1,
    // biases 0. Other 1-D tensors (the hybrid's A_log, dt_bias, ssmax_scale) keep the constructor's values.
    if (ends_with(p.name, "norm.weight")) {
      p.value.fill(1.0f);
    } else if (ends_with(p.name, ".bias")) {
      p.value.zero();
    } else if (p.value.ndim() >= 2) {
      fill_normal(p.value, Rng{seed, name_stream(p.name)}, 0.0f, stdev);
    }
    p.grad.zero();
  }
  return m;
}

std::unique_ptr<CausalLM> load_model(const std::string& hf_dir) {
  HfModel hf = load_hf_dir(hf_dir);  // validated against the registry (names, shapes, dtypes)
  auto m = construct(hf.config, 0);
  for (auto& p : m->params()) {
    const Tensor& src = hf.at(p.name);
    OLMO_CHECK(src.shape() == p.value.shape(), hf_dir, ": tensor ", p.name, " has shape ",
               shape_str(src.shape()), ", the model expects ", shape_str(p.value.shape()));
    p.value.copy_from(src);  // bf16/f16 -> fp32 is exact
    p.grad.zero();
  }
  return m;
}

std::vector<safetensors::NamedTensor> export_tensors(CausalLM& model, std::optional<DType> dtype) {
  std::vector<safetensors::NamedTensor> out;
  out.reserve(model.params().size());
  for (auto& p : model.params()) out.push_back({p.name, p.value, dtype});
  return out;
}

}  // namespace olmosft::model
