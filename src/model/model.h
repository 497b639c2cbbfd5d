// The model interface the trainer, `olmosft forward` and the checks use. One implementation, the decoder
// (src/model/decoder.h), of which Olmo 3 dense and the Olmo 3.5 hybrid (KDA + latent MoE) are configurations.
// Parameters are fp32 masters keyed by HF tensor name in registry order (model/params.h), so loading,
// checkpoints and export share one naming.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "io/safetensors.h"
#include "kernels/adamw.h"
#include "model/config.h"
#include "model/loss_terms.h"
#include "model/memory_policy.h"

namespace olmosft::model {

// One micro-batch of B packed rows of T tokens (row-major [B, T] arrays).
struct Batch {
  int64_t B = 0, T = 0;
  const int32_t* tokens = nullptr;     // input ids
  const int32_t* segments = nullptr;   // document id per token within its row; < 0 = padding
  const int32_t* positions = nullptr;  // position within its document (restarts at 0 per document)
  const int32_t* targets = nullptr;    // next-token target per position (-100 or any value when untrained)
  const uint8_t* trained = nullptr;    // 1 = position t's target is a training target
};

struct MoeLayerStats {
  int64_t layer = 0;
  double lb_loss = 0;                 // unweighted load-balance loss of this layer
  double router_z = 0;                // unweighted router z-loss of this layer
  double required_buffer_factor = 0;  // max expert load / balanced load
  int64_t dropped_tokens = 0;         // (token, slot) assignments dropped by the capacity limit
};

// Sums over the micro-batch, so the trainer can form one token-mean over the global batch.
struct LossParts {
  // Per loss term (model/loss_terms.h): ce = sum over trained targets of -log p(target); lm_z = sum over
  // trained targets of logsumexp^2 (not multiplied by the coefficient); moe_lb, router_z: weighted (already
  // multiplied by their coefficients), summed over MoE layers.
  LossValues sum{};
  int64_t tokens = 0;  // trained targets
  std::vector<MoeLayerStats> moe_layers;
};

struct LossConfig {
  LossValues weight{1.0, 0.0, 0.0, 0.0};  // per loss term: ce 1, lm_z, moe_lb (per MoE layer), router_z
  double moe_buffer_factor = -1;          // -1 = dropless
  int64_t vocab_tile = 8192;              // 0 = untiled cross-entropy
};

struct Param {
  std::string name;   // HF tensor name
  Tensor value;       // fp32 master
  Tensor grad;        // fp32, same shape; accumulated by backward()
  bool decay = true;  // weight decay applies (norm gains and biases: false)
};

// Parameter residency hooks, for fully sharded training that gathers weights one layer at a time
// (dist::ModelShards). Groups are the units of dist::model_specs: 0 = the tensors before the first block
// (embedding), 1 + l = block l, L + 1 = the tensors after the last block (final norm, LM head). A model
// that honours them calls need(g) before it reads the VALUES of group g in a call and done(g) after their
// last use in that call (in forward_backward: groups 0..L+1 in the forward, L+1 stays until the loss
// gradient is through the final norm, then blocks L..1 again in the backward). Gradient tensors must stay
// valid for the whole call. ZeRO-3 reduce-scatters gradients early on this contract: once done(L+1) came
// after the loss gradient, group L+1's gradient and, at its next done(g), block group g's (1 <= g <= L)
// gradient of the call must be complete (group 0's may be written until the call returns); a model that
// writes a group's gradient after that is refused by dist::ModelShards (an error, never a wrong sum).
struct ParamResidency {
  std::function<void(int group)> need, done;
};

// Training state kept on the model's device between steps (the XLA backend, docs/xla.md "Training state on
// the device"): the parameters, the current step's gradient sum and the AdamW moments. While a model holds
// it (after upload), its forward_backward adds each leaf's gradients into the device's sum and leaves
// Param::grad alone, and its forward reads the device's parameters. The host copy (the trainer's master)
// changes only by download. The trainer: upload after loading or resuming; per step the leaves'
// forward_backward, with several processes (dist.mode dp) all_reduce_grads, then grad_norm and clip_and_step
// (which consumes the sum); download before every checkpoint and at the end of the run.
class DeviceTraining {
 public:
  virtual ~DeviceTraining() = default;
  // Per parameter (registry order): its values and AdamW moments (exp_avg, exp_avg_sq), numel floats each.
  virtual void upload(const std::vector<const float*>& values, const std::vector<const float*>& exp_avg,
                      const std::vector<const float*>& exp_avg_sq) = 0;
  virtual void download(const std::vector<float*>& values, const std::vector<float*>& exp_avg,
                        const std::vector<float*>& exp_avg_sq) = 0;
  // With several processes (data parallel): the step's gradient sum summed across them by SUM (in place over
  // n floats; the trainer passes its communicator's all-reduce), so that every process updates alike.
  virtual void all_reduce_grads(const std::function<void(float* data, int64_t n)>& sum) = 0;
  // The global norm of the step's gradient sum (no sum yet: an error).
  virtual double grad_norm() = 0;
  // Clip to max_norm (> 0) and one AdamW update with cfg's LR at 1-based step `step`; consumes the sum.
  virtual void clip_and_step(const AdamWConfig& cfg, double max_norm, int64_t step) = 0;
};

class CausalLM {
 public:
  virtual ~CausalLM() = default;
  virtual const ModelConfig& config() const = 0;
  // Every parameter, in registry (HF state-dict) order.
  virtual std::vector<Param>& params() = 0;
  // Forward and backward of  loss = grad_scale * (ce_sum + lm_z * z_sum) + moe_lb + router_z  on one
  // micro-batch; gradients are ACCUMULATED into params()[i].grad. grad_scale is 1 / (global trained
  // tokens) for a global token-mean; the MoE terms are scaled by aux_scale (the micro-batch's share).
  virtual LossParts forward_backward(const Batch& batch, const LossConfig& loss, double grad_scale,
                                     double aux_scale) = 0;
  // Forward only. When logits != nullptr it receives [B, T, vocab_size] fp32 logits (small inputs only);
  // when logprobs != nullptr it receives log p(targets[t]) per position (0 where untrained).
  virtual LossParts forward(const Batch& batch, const LossConfig& loss, float* logits, float* logprobs) = 0;
  // Installs (or, with empty functions, removes) the hooks; returns false when the model does not call
  // them (then every Param::value must be valid for the whole call).
  virtual bool set_param_residency(ParamResidency /*hooks*/) { return false; }
  // Sets what the model keeps between forward and backward; returns false when the model cannot follow
  // `policy` (then it keeps its previous one).
  virtual bool set_memory_policy(const MemoryPolicy& policy) { return policy == MemoryPolicy{}; }
  // The model's device training state, or nullptr when the host holds it (the CPU backend).
  virtual DeviceTraining* device_training() { return nullptr; }
};

// Builds the model for a config with fp32 parameters initialised from N(0, initializer_range) (norm
// gains 1, biases 0; seeded Philox, the same whatever the thread count), or loaded from an HF dir.
std::unique_ptr<CausalLM> make_model(const ModelConfig& config, uint64_t seed);

// The activation memory of one forward_backward on B rows of T tokens under `policy`, from the plan the
// model carves its workspace with (the same code path, so the two cannot drift).
struct ActivationBytes {
  size_t saved = 0;  // kept from the forward for the backward, all layers (MoE dispatch caches not included)
  size_t working = 0;  // the rest of the planned block: residual streams, batch arrays, the layers' shared
                       // scratch and, under recomputation, the one Saved the backward re-runs a layer into
  size_t kernels = 0;  // allocated by kernels outside the block: the attention kernel's workspace (MoE
                       // dispatch caches and cross-entropy tiles are not counted here)
  size_t total() const { return saved + working + kernels; }
};
ActivationBytes activation_bytes(const ModelConfig& config, int64_t B, int64_t T, const MemoryPolicy& policy);

// A model family: what parse_config, make_model and load_model dispatch on. Adding a family takes its
// config keys (model/config.cpp), its layer list (model/layers.cpp: which mixers, FFNs and norms) and one
// entry in model_families() (model_factory.cpp); every family is run by the one Decoder.
struct ModelFamily {
  ModelType type;
  const char* model_type;                                      // HF config.json "model_type"
  std::unique_ptr<CausalLM> (*construct)(const ModelConfig&);  // allocates; parameters zero
  ActivationBytes (*activations)(const ModelConfig&, int64_t B, int64_t T, const MemoryPolicy&);
};
const std::vector<ModelFamily>& model_families();

// What the model constructors call: zero values and gradients in registry order, with the weight-decay
// flags of the registry (model/params.h).
std::vector<Param> allocate_params(const ModelConfig& config);
// The one initialisation (make_model; make_decoder), the same for both families; each tensor draws from
// its own Philox stream, so its values depend on neither the thread count nor the other tensors:
//   "*norm.weight" = 1;  "*.bias", "*dt_bias" = 0;  "*ssmax_scale" = 1;
//   A_log = log U[1, 16] (stream = registry index; Olmo Hybrid GDN: log U[0, 16], and dt_bias the inverse
//   softplus of a log-uniform dt in [1e-3, 0.1], as HF);  other tensors of >= 2 dims ~ N(0,
//   initializer_range) (stream = FNV-1a of the name). Gradients are zeroed.
void init_params(std::vector<Param>& params, const ModelConfig& config, uint64_t seed);
// An HF directory, or an OLMo-core step directory (model/olmo_core.h).
std::unique_ptr<CausalLM> load_model(const std::string& hf_dir);

// Loading one shard at a time (dist::ModelShards): a model built with no parameter storage (every
// Param::value and grad undefined; the registry's shapes, model/params.h) and a ParamFill that writes
// elements [begin, begin + n) of parameter `index` (registry order, flat row-major) as fp32 into out.
using ParamFill = std::function<void(size_t index, int64_t begin, int64_t n, float* out)>;
std::unique_ptr<CausalLM> make_model_unallocated(const ModelConfig& config);
// The same with another constructor (e.g. the XLA backend's XlaDecoder, model/decoder_xla.h): CONSTRUCT's
// allocate_params leaves the storage out.
std::unique_ptr<CausalLM> make_model_unallocated(
    const ModelConfig& config, const std::function<std::unique_ptr<CausalLM>(const ModelConfig&)>& construct);
// The values make_model(config, seed) would hold; each call initialises the whole tensor it reads from
// (one tensor at a time, so a rank holds at most one full tensor besides its shard).
ParamFill init_param_fill(const ModelConfig& config, uint64_t seed);
// The values load_model(hf_dir) would hold, read with pread from the safetensors files: only the bytes
// asked for (bf16/f16 converted exactly). The directory is validated at once (config, names, shapes,
// dtypes, index); *config receives its config.
// An OLMo-core step directory (distributed checkpoint, model/olmo_core.h) is accepted too: it is validated
// at once against its config.json, and each call reads the whole tensor it needs (cached until another is
// asked for, so a rank holds at most one full tensor besides its shard).
ParamFill hf_param_fill(const std::string& hf_dir, ModelConfig* config);
// model.init's config: DIR/config.json of an HF directory, or an OLMo-core step directory's config mapped to
// the HF config (model/olmo_core.h).
ModelConfig load_init_config(const std::string& dir);

// The model's current parameters as (HF name, tensor) pairs in registry order, for export_hf_dir /
// safetensors::write: views of the fp32 masters (no copy), converted to `dtype` while being written
// when one is given (bf16 rounds to nearest even).
std::vector<safetensors::NamedTensor> export_tensors(CausalLM& model,
                                                     std::optional<DType> dtype = std::nullopt);

}  // namespace olmosft::model
