// The decoder: every model family as one list of layers (model/layers.h) run by one runner over the layer
// units (model/unit_*.h): an embedding, one block per layer (a mixer and an FFN with their norms), the final
// norm and the LM head. Olmo 3 (HF "olmo3", docs/reference/architecture.md Part A: post-norm blocks of RoPE
// attention and SwiGLU) and Olmo 3.5 (HF "olmo3moe", Part B: peri-LN blocks of KDA or NoPE attention and
// SwiGLU or latent MoE) are two configurations of it (docs/model.md, docs/hybrid.md).
//
// Parameters are fp32 masters in registry order (model/params.h). The runner is templated on the value type:
// float for the model, double for finite-difference tests (decoder_run). Memory: one workspace block planned
// from the units' Saved / Scratch declarations for the call's B*T and memory policy (memory_policy.h), kept
// while B*T does not grow; the residual streams h[0..L] are the blocks' inputs and outputs.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "kernels/rope.h"
#include "model/model.h"

namespace olmosft {
class Bf16Weights;  // kernels/gemm.h
}  // namespace olmosft

namespace olmosft::model {

struct DecoderOptions {
  int64_t kda_chunk = 64;      // chunk size of KDA's chunked delta rule (16 for the tiny fixture tests)
  bool kda_recurrent = false;  // KDA: the token-by-token recurrence instead of the chunked form
  // Scalable-softmax query scale log(pos + 1): false = document-relative positions (Batch::positions,
  // OLMo-core's `cu_doc_lens` convention; packed == per-document), true = row positions 0..T-1.
  bool ssmax_row_positions = false;
  // TEST-ONLY: apply the full_attention RoPE (YaRN) to every layer, the transformers 5.2.0 regression
  // (docs/reference/architecture.md A.4); shows that the fixture's correct logits are not that variant.
  bool yarn_on_all_layers = false;
  MemoryPolicy memory;  // what the blocks keep for the backward (model.remat, model.saved_dtype)
};

// The workspace of the last call. Per token: divide by tokens.
struct DecoderRunInfo {
  int64_t tokens = 0;          // B*T of the call
  size_t saved_bytes = 0;      // kept for the backward: the residual streams, the blocks' Saved, MoE caches
  size_t scratch_bytes = 0;    // the rest of the planned block: the embedding's and LM head's Saved, batch
                               // arrays, RoPE tables, the layers' shared scratch
  size_t workspace_bytes = 0;  // the planned block (planned for the largest B*T so far)
};

// One forward (and, when grads != nullptr, backward) on a batch. w[i] / (*grads)[i] point at the values and
// gradients of param_registry(c)[i] (row-major, registry shapes). Gradients are accumulated. The loss is
//   grad_scale * (ce_sum + lm_z * z_sum) + aux_scale * sum_l (moe_lb * LB_l + router_z * Z_l).
template <typename T>
LossParts decoder_run(const ModelConfig& c, const DecoderOptions& opts, const std::vector<const T*>& w,
                      const std::vector<T*>* grads, const Batch& batch, const LossConfig& loss,
                      double grad_scale, double aux_scale, float* logits, float* logprobs,
                      DecoderRunInfo* info = nullptr);

// The per-token arrays of a batch, the same for every backend: seg[i] (Batch::segments, 0 without them;
// each document one contiguous run per row, checked), valid[i] = not padding (seg >= 0), pos[i]
// (Batch::positions, or restarting at 0 per document) and the scalable softmax's logpos[i] = log(p + 1)
// (p per DecoderOptions::ssmax_row_positions; padding 0). Throws naming the row and position of a token id
// outside the vocabulary or a bad segment layout. Arrays of B * T.
template <typename T>
void batch_token_arrays(const ModelConfig& c, const DecoderOptions& o, const Batch& b, int32_t* seg,
                        uint8_t* valid, int32_t* pos, T* logpos);

struct DecoderUnits;  // decoder.cpp: the layer list and units of a config, resolved once
template <typename T>
struct DecoderWork;  // decoder.cpp: the planned workspace

class Decoder : public CausalLM {
 public:
  // Allocates the parameters (values and gradients zero); make_decoder / make_model / load_model fill them.
  // Throws naming the config field when the decoder does not support the config (layers.h).
  explicit Decoder(const ModelConfig& c, const DecoderOptions& opts = {});
  ~Decoder() override;
  const ModelConfig& config() const override { return config_; }
  std::vector<Param>& params() override { return params_; }
  LossParts forward_backward(const Batch& batch, const LossConfig& loss, double grad_scale,
                             double aux_scale) override;
  LossParts forward(const Batch& batch, const LossConfig& loss, float* logits, float* logprobs) override;
  // Honours the hooks: groups 0 (embedding, embedding norm), 1 + l (block l), L + 1 (final norm, LM head).
  bool set_param_residency(ParamResidency hooks) override;
  // remat none / attn / full with fp32 saved activations; none / attn with bf16.
  bool set_memory_policy(const MemoryPolicy& policy) override;
  DecoderOptions& options() { return opts_; }
  const DecoderRunInfo& last_run() const { return info_; }
  // Residual stream of the last call: index 0 = after the embedding, l + 1 = after layer l; [B*T, d].
  const float* hidden_state(int64_t index) const;
  // The planned block plus the attention kernel's workspace (what activation_bytes().total() plans).
  size_t workspace_bytes() const;
  // Under compute.dtype=bf16: the bf16 copies of the weights kept between calls (2 bytes per matrix
  // element; with residency hooks, only while a call runs).
  size_t bf16_weight_bytes() const;
  // What the planned block holds per token besides the blocks' Saved and the residual streams
  // (DecoderRunInfo::scratch_bytes): the embedding's and LM head's Saved, dh, the batch arrays, RoPE tables
  // and the layers' shared Scratch (byte fields counted as one float).
  static int64_t scratch_floats_per_token(const ModelConfig& c);
  // model.h activation_bytes.
  static ActivationBytes activation_bytes(const ModelConfig& c, int64_t B, int64_t T, const MemoryPolicy& p);

 private:
  LossParts run(const Batch& batch, const LossConfig& loss, double grad_scale, double aux_scale,
                bool backward, float* logits, float* logprobs);
  ModelConfig config_;
  DecoderOptions opts_;
  std::vector<Param> params_;
  DecoderRunInfo info_;
  ParamResidency res_;
  std::shared_ptr<const DecoderUnits> units_;
  std::shared_ptr<DecoderWork<float>> work_;  // planned on the first call, re-planned when B*T grows
  std::shared_ptr<Bf16Weights> bf16w_;        // compute.dtype=bf16: the weights' rounded copies
};

// A decoder initialised by init_params (model.h), the factory's one initialisation: the same values as
// make_model(c, seed) with default options.
std::unique_ptr<CausalLM> make_decoder(const ModelConfig& c, uint64_t seed = 0,
                                       const DecoderOptions& opts = {});

// Converts the config's per-layer-type RoPE parameters to the kernel's frequencies (default, linear or
// YaRN), for a head dimension and max_position_embeddings.
RopeFreqs olmo3_rope_frequencies(const RopeParams& p, int64_t head_dim, int64_t max_position_embeddings);

}  // namespace olmosft::model
