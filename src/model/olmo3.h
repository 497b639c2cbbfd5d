// Olmo 3 dense (HF model_type "olmo3", docs/reference/architecture.md Part A): explicit forward and backward
// over packed rows, fp32, on the kernels of src/kernels (BLAS GEMMs, flash-style attention, tiled
// cross-entropy).
//
//   h0 = E[tok]
//   per layer: q = RMSNorm_q(x Wq^T) over the full H*D vector, k likewise over Hkv*D, v = x Wv^T;
//              head split; RoPE of the layer's type at the per-document positions (YaRN on full_attention
//              layers, default RoPE on sliding_attention layers); attention within the segment (sliding
//              window on sliding layers; GQA); h' = x + RMSNorm_post_attn(o Wo^T);
//              h = h' + RMSNorm_post_ffn(SwiGLU(h'))
//   logits = RMSNorm_final(h) Wlm^T (untied); loss by the tiled cross-entropy (valid_vocab = vocab_size).
//
// Layers are unit::PostNormBlock (a RopeAttentionUnit and a RecomputedSwiGluMlpUnit; src/model/unit_*.h).
// Memory: one workspace sized for the B*T of the call (reused while B*T does not grow), planned from the
// units' Saved / Scratch declarations; see activation_floats_per_token() and docs/model.md.
#pragma once
#include <cstdint>
#include <vector>

#include "core/tensor.h"
#include "kernels/rope.h"
#include "model/model.h"
#include "model/unit_block.h"

namespace olmosft::model {

struct Olmo3Options {
  // TEST-ONLY knob: apply the full_attention RoPE (YaRN) to every layer, the transformers 5.2.0
  // regression (docs/reference/architecture.md A.4). Used to show that the fixture's correct logits are not
  // that variant.
  bool yarn_on_all_layers = false;
};

class Olmo3 : public CausalLM {
 public:
  // Parameters are allocated (values zero, grads zero) in registry order; make_model/load_model fill them.
  explicit Olmo3(const ModelConfig& config, Olmo3Options options = {});
  ~Olmo3() override;

  const ModelConfig& config() const override { return cfg_; }
  std::vector<Param>& params() override { return params_; }
  LossParts forward_backward(const Batch& batch, const LossConfig& loss, double grad_scale,
                             double aux_scale) override;
  LossParts forward(const Batch& batch, const LossConfig& loss, float* logits, float* logprobs) override;
  bool set_param_residency(ParamResidency hooks) override {
    res_ = std::move(hooks);
    return true;
  }
  // remat none / attn / full with fp32 saved activations.
  bool set_memory_policy(const MemoryPolicy& policy) override;

  // Residual stream of the last call: index 0 = after the embedding, l + 1 = after layer l; [B*T, d].
  const float* hidden_state(int64_t index) const;
  // fp32 values kept per token by the workspace: saved activations + shared scratch (excludes the
  // attention kernel's per-thread tiles and the cross-entropy tiles, which do not grow with T).
  static int64_t activation_floats_per_token(const ModelConfig& c);
  size_t workspace_bytes() const;
  // model.h activation_bytes for this family.
  static ActivationBytes activation_bytes(const ModelConfig& c, int64_t B, int64_t T, const MemoryPolicy& p);

 private:
  struct Work;
  void run_forward(const Batch& batch);
  LossParts loss_forward(const Batch& batch, const LossConfig& loss);
  void run_backward(const Batch& batch, const LossConfig& loss, double grad_scale, const LossParts& parts);
  void prepare(const Batch& batch);
  unit::Ctx<float> context(const Batch& batch) const;
  unit::PostNormBlock::Saved& saved(size_t layer);  // the Saved layer `layer` runs with
  // Residency: calls the hook, then refreshes the group's value pointers (wp_).
  void need(int64_t g);
  void done(int64_t g);

  ModelConfig cfg_;
  Olmo3Options opt_;
  std::vector<Param> params_;
  std::vector<unit::PostNormBlock> blocks_;
  int embed_ = -1, norm_ = -1, lm_head_ = -1;  // indices into params_
  std::vector<int> group_;                     // residency group per parameter
  std::vector<const float*> wp_;               // value pointers of the current call (registry order)
  std::vector<float*> gp_;                     // gradient pointers
  RopeFreqs rope_sliding_, rope_full_;
  Work* w_ = nullptr;
  MemoryPolicy policy_;
  ParamResidency res_;
};

// Converts the config's per-layer-type RoPE parameters to the kernel's frequencies (default, linear or
// YaRN), for a head dimension and max_position_embeddings.
RopeFreqs olmo3_rope_frequencies(const RopeParams& p, int64_t head_dim, int64_t max_position_embeddings);

}  // namespace olmosft::model
