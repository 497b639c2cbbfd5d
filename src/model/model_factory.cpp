// make_model / load_model / export_tensors: the one place that maps a ModelConfig to an implementation.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <mutex>

#include "core/rng.h"
#include "model/decoder.h"
#include "model/hf_dir.h"
#include "model/model.h"
#include "model/olmo_core.h"
#include "model/params.h"

namespace olmosft::model {

namespace {

// Allocates the model (parameters zero); make_model initialises, load_model loads.
std::unique_ptr<CausalLM> construct(const ModelConfig& c) {
  for (const ModelFamily& f : model_families())
    if (f.type == c.model_type) return f.construct(c);
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

// Set while make_model_unallocated constructs: allocate_params then leaves the storage out.
thread_local bool t_no_storage = false;

// Olmo Hybrid's GDN decay (HF OlmoHybridGatedDeltaNet.__init__, OLMo-core alike): A_log = ln A, A ~ U[0, 16]
// (floored at 1e-6 so that the log is finite); dt_bias = the inverse softplus of dt = exp(U[ln 1e-3, ln 0.1])
// clamped at >= 1e-4.
void init_gdn_decay(Param& p, size_t i, uint64_t seed) {
  const Rng rng{seed, static_cast<uint64_t>(i)};
  float* v = p.value.data<float>();
  for (int64_t j = 0; j < p.value.numel(); ++j) {
    const double u = rng.uniform(static_cast<uint64_t>(j));
    if (ends_with(p.name, hf::kALog)) {
      v[j] = static_cast<float>(std::log(std::max(16.0 * u, 1e-6)));
    } else {
      const double dt = std::max(std::exp(u * (std::log(0.1) - std::log(1e-3)) + std::log(1e-3)), 1e-4);
      v[j] = static_cast<float>(dt + std::log(-std::expm1(-dt)));
    }
  }
}

// One parameter of init_params (index = its registry position).
void init_param(Param& p, size_t i, float stdev, uint64_t seed) {
  // HF Olmo3PreTrainedModel._init_weights: Linear/Embedding ~ N(0, initializer_range), RMSNorm gains 1,
  // biases 0; the hybrid's KDA decay A_log = log U[1, 16], dt_bias 0, SSMax scale 1 (docs/hybrid.md);
  // Olmo Hybrid's GDN decay as HF initialises it (init_gdn_decay).
  const bool gdn = p.name.find(std::string(".") + hf::kLinearAttn) != std::string::npos;
  if (gdn && (ends_with(p.name, hf::kALog) || ends_with(p.name, hf::kDtBias))) {
    init_gdn_decay(p, i, seed);
  } else if (ends_with(p.name, "norm.weight") || ends_with(p.name, hf::kSsmaxScale)) {
    p.value.fill(1.0f);
  } else if (ends_with(p.name, ".bias") || ends_with(p.name, hf::kDtBias)) {
    p.value.zero();
  } else if (ends_with(p.name, hf::kALog)) {
    fill_uniform(p.value, Rng{seed, static_cast<uint64_t>(i)}, 1.0f, 16.0f);
    float* v = p.value.data<float>();
    for (int64_t j = 0; j < p.value.numel(); ++j) v[j] = std::log(v[j]);
  } else if (p.value.ndim() >= 2) {
    fill_normal(p.value, Rng{seed, name_stream(p.name)}, 0.0f, stdev);
  }
}

float checked_stdev(const ModelConfig& config) {
  const float stdev = float(config.initializer_range);
  OLMO_CHECK(stdev >= 0 && std::isfinite(stdev),
             "make_model: initializer_range must be finite and >= 0, got ", config.initializer_range);
  return stdev;
}

}  // namespace

const std::vector<ModelFamily>& model_families() {
  static const std::vector<ModelFamily> families = {
      {ModelType::Olmo3, "olmo3",
       [](const ModelConfig& c) -> std::unique_ptr<CausalLM> { return std::make_unique<Decoder>(c); },
       &Decoder::activation_bytes},
      {ModelType::Olmo3Moe, "olmo3moe",
       [](const ModelConfig& c) -> std::unique_ptr<CausalLM> { return std::make_unique<Decoder>(c); },
       &Decoder::activation_bytes},
      {ModelType::OlmoHybrid, "olmo_hybrid",
       [](const ModelConfig& c) -> std::unique_ptr<CausalLM> { return std::make_unique<Decoder>(c); },
       &Decoder::activation_bytes},
  };
  return families;
}

ActivationBytes activation_bytes(const ModelConfig& c, int64_t B, int64_t T, const MemoryPolicy& policy) {
  OLMO_CHECK(B > 0 && T > 0, "activation_bytes: B and T must be > 0, got B=", B, " T=", T);
  for (const ModelFamily& f : model_families())
    if (f.type == c.model_type) return f.activations(c, B, T, policy);
  fail("activation_bytes: unknown model type '", c.model_type_name, "'");
}

std::vector<Param> allocate_params(const ModelConfig& config) {
  const auto reg = param_registry(config);
  std::vector<Param> params;
  params.reserve(reg.size());
  for (const auto& s : reg) {
    Param p;
    p.name = s.name;
    if (!t_no_storage) {
      p.value = Tensor::zeros(s.shape, DType::F32);
      p.grad = Tensor::zeros(s.shape, DType::F32);
    }
    p.decay = s.decay;
    params.push_back(std::move(p));
  }
  return params;
}

void init_params(std::vector<Param>& params, const ModelConfig& config, uint64_t seed) {
  const float stdev = checked_stdev(config);
  for (size_t i = 0; i < params.size(); ++i) {
    init_param(params[i], i, stdev, seed);
    params[i].grad.zero();
  }
}

std::unique_ptr<CausalLM> make_model(const ModelConfig& config, uint64_t seed) {
  auto m = construct(config);
  init_params(m->params(), config, seed);
  return m;
}

std::unique_ptr<CausalLM> load_model(const std::string& hf_dir) {
  if (olmo_core::is_olmo_core_dir(hf_dir)) {  // an OLMo-core step directory: one tensor read at a time
    olmo_core::Checkpoint ck = olmo_core::open(hf_dir);
    auto m = construct(ck.config);
    for (auto& p : m->params()) {
      p.value.copy_from(ck.read(p.name));
      p.grad.zero();
    }
    return m;
  }
  HfModel hf = load_hf_dir(hf_dir);  // validated against the registry (names, shapes, dtypes)
  auto m = construct(hf.config);
  for (auto& p : m->params()) {
    const Tensor& src = hf.at(p.name);
    OLMO_CHECK(src.shape() == p.value.shape(), hf_dir, ": tensor ", p.name, " has shape ",
               shape_str(src.shape()), ", the model expects ", shape_str(p.value.shape()));
    p.value.copy_from(src);  // bf16/f16 -> fp32 is exact
    p.grad.zero();
  }
  return m;
}

std::unique_ptr<CausalLM> make_model_unallocated(
    const ModelConfig& config, const std::function<std::unique_ptr<CausalLM>(const ModelConfig&)>& make) {
  struct Flag {
    Flag() { t_no_storage = true; }
    ~Flag() { t_no_storage = false; }
  } flag;
  return make(config);
}

std::unique_ptr<CausalLM> make_model_unallocated(const ModelConfig& config) {
  return make_model_unallocated(config, [](const ModelConfig& c) { return construct(c); });
}

ParamFill init_param_fill(const ModelConfig& config, uint64_t seed) {
  const float stdev = checked_stdev(config);
  auto reg = std::make_shared<const std::vector<ParamSpec>>(param_registry(config));
  return [reg, stdev, seed](size_t i, int64_t begin, int64_t n, float* out) {
    OLMO_CHECK(i < reg->size(), "init_param_fill: parameter ", i, " of ", reg->size());
    const ParamSpec& s = (*reg)[i];
    OLMO_CHECK(begin >= 0 && n >= 0 && begin + n <= shape_numel(s.shape), "init_param_fill: ", s.name,
               ": elements [", begin, ", ", begin + n, ") are outside its ", shape_numel(s.shape));
    Param p;
    p.name = s.name;
    p.value = Tensor::zeros(s.shape, DType::F32);
    init_param(p, i, stdev, seed);
    std::memcpy(out, p.value.data<float>() + begin, size_t(n) * 4);
  };
}

namespace {

ParamFill olmo_core_param_fill(const std::string& dir, ModelConfig* config) {
  struct State {
    olmo_core::Checkpoint ck;
    std::mutex mu;  // the fill may be called from several threads
    size_t cached = SIZE_MAX;
    Tensor value;  // fp32 copy of registry[cached]
  };
  auto st = std::make_shared<State>();
  st->ck = olmo_core::open(dir);
  if (config) *config = st->ck.config;
  return [st](size_t i, int64_t begin, int64_t n, float* out) {
    std::lock_guard<std::mutex> lock(st->mu);
    OLMO_CHECK(i < st->ck.registry.size(), st->ck.dcp.dir(), ": parameter ", i, " of ",
               st->ck.registry.size());
    if (st->cached != i) {
      st->value = Tensor();
      Tensor t = st->ck.read(st->ck.registry[i].name);
      st->value = t.dtype() == DType::F32 ? t : t.to(DType::F32);
      st->cached = i;
    }
    OLMO_CHECK(begin >= 0 && n >= 0 && begin + n <= st->value.numel(), st->ck.dcp.dir(), ": ",
               st->ck.registry[i].name, ": elements [", begin, ", ", begin + n, ") are outside its ",
               st->value.numel());
    std::memcpy(out, st->value.data<float>() + begin, size_t(n) * 4);
  };
}

}  // namespace

ModelConfig load_init_config(const std::string& dir) {
  if (olmo_core::is_olmo_core_dir(dir)) return olmo_core::open(dir).config;
  return load_config(dir + "/config.json");
}

ParamFill hf_param_fill(const std::string& hf_dir, ModelConfig* config) {
  if (olmo_core::is_olmo_core_dir(hf_dir)) return olmo_core_param_fill(hf_dir, config);
  auto hf = std::make_shared<const HfModel>(load_hf_dir(hf_dir));  // validated; nothing read but headers
  if (config) *config = hf->config;
  return [hf](size_t i, int64_t begin, int64_t n, float* out) {
    OLMO_CHECK(i < hf->registry.size(), hf->dir, ": parameter ", i, " of ", hf->registry.size());
    hf->read_f32(hf->registry[i].name, begin, n, out);
  };
}

std::vector<safetensors::NamedTensor> export_tensors(CausalLM& model, std::optional<DType> dtype) {
  std::vector<safetensors::NamedTensor> out;
  out.reserve(model.params().size());
  for (auto& p : model.params()) out.push_back({p.name, p.value, dtype});
  return out;
}

}  // namespace olmosft::model
