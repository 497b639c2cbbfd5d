// Olmo 3.5 hybrid (HF "olmo3moe"): KDA + softmax-attention mixers, dense SwiGLU and latent MoE FFNs,
// peri-LN blocks (docs/reference/architecture.md Part B; conventions in docs/model_reference.md;
// docs/hybrid.md).
//
// The forward/backward (olmo3moe_run) composes the layer units of src/model/unit_*.h (embedding, one
// peri-LN block per layer with a KDA or attention mixer and a SwiGLU or MoE FFN, LM head) over weight /
// gradient pointers in parameter-registry order, instantiated for float (the CausalLM) and double
// (finite-difference tests).
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "model/model.h"

namespace olmosft::model {

struct Olmo3MoeOptions {
  int64_t kda_chunk = 64;      // chunk size of the chunked delta rule (16 for the tiny fixture tests)
  bool kda_recurrent = false;  // use the token-by-token recurrence instead of the chunked form
  // Scalable-softmax query scale log(pos + 1): false = document-relative positions (Batch::positions,
  // OLMo-core's `cu_doc_lens` convention; packed == per-document), true = row positions 0..T-1.
  bool ssmax_row_positions = false;
  MemoryPolicy memory;  // what the blocks keep for the backward (model.remat; memory_policy.h)
};

// The workspace of the last call (one block planned from the units' declarations, see HybridWork in
// olmo3moe.cpp). Per token: divide by tokens.
struct Olmo3MoeRunInfo {
  int64_t tokens = 0;          // B*T of the call
  size_t saved_bytes = 0;      // the blocks' activations kept for the backward (all layers, MoE caches too)
  size_t scratch_bytes = 0;    // the rest of the planned block: residual streams, embedding and LM-head
                               // Saved, batch arrays, the layers' shared backward scratch
  size_t workspace_bytes = 0;  // the planned block (planned for the largest B*T so far)
};

// One forward (and, when grads != nullptr, backward) on a batch. w[i] / (*grads)[i] point at the values
// and gradients of param_registry(c)[i] (row-major, registry shapes). Gradients are accumulated.
// The loss is  grad_scale * (ce_sum + lm_z * z_sum) + aux_scale * sum_l (moe_lb * LB_l + router_z * Z_l).
template <typename T>
LossParts olmo3moe_run(const ModelConfig& c, const Olmo3MoeOptions& opts, const std::vector<const T*>& w,
                       const std::vector<T*>* grads, const Batch& batch, const LossConfig& loss,
                       double grad_scale, double aux_scale, float* logits, float* logprobs,
                       Olmo3MoeRunInfo* info = nullptr);

// Checks that the config is one this implementation supports (throws olmosft::Error naming the field).
void olmo3moe_check_supported(const ModelConfig& c);

struct HybridUnits;  // olmo3moe.cpp: the layer units of a config
template <typename T>
struct HybridWork;  // olmo3moe.cpp: the planned workspace

class Olmo3MoeModel : public CausalLM {
 public:
  // Allocates the parameters (values and gradients zero); make_olmo3moe / make_model / load_model fill them.
  explicit Olmo3MoeModel(const ModelConfig& c, const Olmo3MoeOptions& opts = {});
  const ModelConfig& config() const override { return config_; }
  std::vector<Param>& params() override { return params_; }
  LossParts forward_backward(const Batch& batch, const LossConfig& loss, double grad_scale,
                             double aux_scale) override;
  LossParts forward(const Batch& batch, const LossConfig& loss, float* logits, float* logprobs) override;
  // Honours the hooks: groups 0 (embedding, embedding norm), 1 + l (block l), L + 1 (final norm, LM head).
  bool set_param_residency(ParamResidency hooks) override;
  // remat none / attn / full with fp32 saved activations.
  bool set_memory_policy(const MemoryPolicy& policy) override;
  Olmo3MoeOptions& options() { return opts_; }
  const Olmo3MoeRunInfo& last_run() const { return info_; }
  // What the planned block holds per token besides the blocks' Saved (Olmo3MoeRunInfo::scratch_bytes):
  // the residual stream and its gradient, the batch arrays, the embedding's and LM head's Saved and the
  // layers' shared Scratch (byte fields counted as one float; a few per-layer-size stand-ins not counted).
  static int64_t scratch_floats_per_token(const ModelConfig& c);
  // model.h activation_bytes for this family.
  static ActivationBytes activation_bytes(const ModelConfig& c, int64_t B, int64_t T, const MemoryPolicy& p);

 private:
  LossParts run(const Batch& batch, const LossConfig& loss, double grad_scale, double aux_scale,
                bool backward, float* logits, float* logprobs);
  ModelConfig config_;
  Olmo3MoeOptions opts_;
  std::vector<Param> params_;
  Olmo3MoeRunInfo info_;
  ParamResidency res_;
  std::shared_ptr<const HybridUnits> units_;  // resolved once, on the first call
  std::shared_ptr<HybridWork<float>> work_;   // planned on the first call, re-planned when B*T grows
};

// A model initialised by init_params (model.h), the factory's one initialisation: the same values as
// make_model(c, seed) with default options.
std::unique_ptr<CausalLM> make_olmo3moe(const ModelConfig& c, uint64_t seed = 0,
                                        const Olmo3MoeOptions& opts = {});

}  // namespace olmosft::model
