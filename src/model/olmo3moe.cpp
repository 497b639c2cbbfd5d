// Olmo 3.5 hybrid model: the layer units (model/unit_*.h) composed over registry-ordered parameters (see
// olmo3moe.h).
#include "model/olmo3moe.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <type_traits>

#include "core/error.h"
#include "core/tensor.h"
#include "kernels/attention.h"
#include "kernels/kda.h"
#include "model/params.h"
#include "model/unit_block.h"
#include "model/unit_embedding.h"
#include "model/unit_lm_head.h"

namespace olmosft::model {

// The hybrid as units: embedding, one peri-LN block per layer, final norm + LM head; parameter indices
// resolved by name once.
struct HybridUnits {
  unit::ScaledEmbeddingUnit embed;
  std::vector<unit::PeriLnBlock> blocks;
  unit::LmHeadUnit head;
  size_t count = 0;
  std::vector<int> group;  // residency group per parameter
  explicit HybridUnits(const ModelConfig& c) {
    unit::ParamIndex idx(c);
    idx.who = "olmo3moe";
    count = idx.size();
    embed = unit::ScaledEmbeddingUnit::resolve(idx);
    for (int64_t l = 0; l < c.num_hidden_layers; ++l) blocks.push_back(unit::PeriLnBlock::resolve(idx, c, l));
    head = unit::LmHeadUnit::resolve(idx, c);
    group = unit::residency_groups(c);
  }
};

// The per-call workspace of one model: the residual stream and its gradient, the per-token batch
// arrays, every unit's Saved and the shared Scratch, carved from one block planned from the units'
// declarations (unit::Plan) for a memory policy (memory_policy.h) and kept while the token count and the
// policy do not change. The MoE layers' caches are vectors sized by moe.cpp; they live in the Saved too, so
// their capacity is reused.
//   remat none: one Saved per layer.
//   remat attn: one Saved per layer without the mixer's; the mixers' Saved (KDA, attention) overlaid, shared.
//   remat full: the block inputs [N, d] per layer, and one Saved per layer kind (mixer x FFN) overlaid and
//               shared; the backward re-runs a block's forward from its input (in `rerun`) into it.
//   saved_dtype bf16 (none / attn): each layer's activations as bf16 copies (acts), their fp32 buffers one
//               staging region overlaid across the layers; compressed after the layer's forward, restored
//               before its backward.
template <typename T>
struct HybridWork {
  int64_t N = 0;  // planned tokens
  MemoryPolicy policy;
  Tensor block;  // U8 storage of everything below
  T *h, *dh, *logpos, *rerun = nullptr;
  int32_t* seg;
  uint8_t* valid;
  unit::ScaledEmbeddingUnit::Saved<T> embed;
  std::vector<unit::PeriLnBlock::Saved<T>> blocks;  // per layer (remat none / attn)
  std::vector<T*> inputs;                           // remat full: each block's input
  std::vector<unit::Bf16Store> acts;                // saved_dtype bf16: each block's activations
  unit::PeriLnBlock::Saved<T> kinds[4];  // remat full: per layer kind; attn: kinds[0] holds the mixers
  unit::LmHeadUnit::Saved<T> head;
  unit::PeriLnBlock::Scratch<T> scratch;
  size_t saved_bytes = 0;  // planned Saved kept from the forward for the backward (MoE caches not included)

  static int kind(const ModelConfig& c, int64_t l) {
    return (c.layer_types[static_cast<size_t>(l)] == LayerType::LinearAttention ? 2 : 0) +
           (c.is_dense_layer(l) ? 1 : 0);
  }
  // What the backward re-runs into under remat attn / full; never live at the same time, so overlaid.
  std::vector<unit::Plan> rerun_alternatives(const ModelConfig& c, int64_t n) {
    std::vector<unit::Plan> alts;
    bool seen[4] = {false, false, false, false};
    for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
      const int k = kind(c, l);
      if (seen[k]) continue;
      seen[k] = true;
      if (policy.remat != Remat::Full) continue;
      alts.emplace_back();
      kinds[k].plan(alts.back(), c, l, n, /*input=*/false);
    }
    if (policy.remat == Remat::Attn && (seen[2] || seen[3])) kinds[0].kda.plan(alts.emplace_back(), c, n);
    if (policy.remat == Remat::Attn && (seen[0] || seen[1])) kinds[0].attn.plan(alts.emplace_back(), c, n);
    return alts;
  }
  // The plan for n tokens: sets saved_bytes and the pointer slots the plan carves.
  unit::Plan plan(const ModelConfig& c, int64_t n) {
    unit::Plan plan;
    const int64_t L = c.num_hidden_layers, d = c.hidden_size;
    const bool full = policy.remat == Remat::Full;
    blocks.assign(full ? 0 : static_cast<size_t>(L), {});
    inputs.assign(full ? static_cast<size_t>(L) : 0, nullptr);
    for (auto& x : inputs) plan.add(&x, n * d);
    const bool bf16 = policy.saved == SavedDtype::BF16 && std::is_same_v<T, float>;
    acts.assign(bf16 ? blocks.size() : 0, {});
    for (int64_t l = 0; l < static_cast<int64_t>(blocks.size()); ++l) {
      if (bf16) plan.keep_activations_in(&acts[static_cast<size_t>(l)], n);
      blocks[static_cast<size_t>(l)].plan(plan, c, l, n, true, policy.remat == Remat::None);
    }
    plan.keep_activations_in(nullptr, 0);
    saved_bytes = plan.bytes();
    if (bf16) plan.add_overlay(unit::Bf16Store::stagings(acts));
    if (policy.remat != Remat::None) plan.add_overlay(rerun_alternatives(c, n));
    if (full) plan.add(&rerun, n * d);
    embed.plan(plan, c, n);
    head.plan(plan, c, n);
    for (T** b : {&h, &dh}) plan.add(b, n * d);
    plan.add(&logpos, n);
    plan.add(&seg, n);
    plan.add(&valid, n);
    scratch.plan(plan, c, n);
    return plan;
  }
  // Plans the block for N tokens under policy p unless the current one already holds them.
  void ensure(const ModelConfig& c, int64_t n, const MemoryPolicy& p) {
    if (n <= N && p == policy) return;
    policy = p;
    const unit::Plan pl = plan(c, n);
    block = Tensor::empty({static_cast<int64_t>(pl.bytes())}, DType::U8);
    pl.carve(static_cast<std::byte*>(block.raw_data()));
    for (auto& s : blocks)  // remat attn: every layer's mixer Saved is the shared one
      if (policy.remat == Remat::Attn) {
        s.kda = kinds[0].kda;
        s.attn = kinds[0].attn;
      }
    N = n;
  }
  // The Saved layer l runs with (remat full: its kind's, pointed at the layer's kept input).
  unit::PeriLnBlock::Saved<T>& saved(const ModelConfig& c, int64_t l) {
    if (policy.remat != Remat::Full) return blocks[static_cast<size_t>(l)];
    unit::PeriLnBlock::Saved<T>& s = kinds[kind(c, l)];
    s.h_in = inputs[static_cast<size_t>(l)];
    return s;
  }
  // Planned Saved + the kept layers' MoE caches as sized by the last forward (remat full's shared ones
  // are working memory, not counted).
  size_t saved_bytes_now() const {
    size_t n = saved_bytes;
    for (const auto& s : blocks) n += s.moe_bytes();
    return n;
  }
};

namespace {

template <typename T>
class Runner {
 public:
  Runner(const ModelConfig& c, const Olmo3MoeOptions& o, const std::vector<const T*>& w,
         const std::vector<T*>* g, const Batch& b, const HybridUnits& U, HybridWork<T>& work,
         const ParamResidency* res = nullptr)
      : c_(c), o_(o), w_(w), g_(g), b_(b), u_(U), res_(res), k_(work) {
    OLMO_CHECK(w.size() == U.count, "olmo3moe: expected ", U.count, " weight pointers, got ", w.size());
    OLMO_CHECK(g == nullptr || g->size() == U.count, "olmo3moe: expected ", U.count, " gradient pointers");
    OLMO_CHECK(b.B > 0 && b.T > 0, "olmo3moe: batch must have B > 0 and T > 0 (got B=", b.B, ", T=", b.T,
               ")");
    OLMO_CHECK(b.tokens != nullptr, "olmo3moe: batch has no tokens");
    N_ = b.B * b.T;
    d_ = c.hidden_size;
    k_.ensure(c, N_, o.memory);
    int32_t* seg = k_.seg;
    for (int64_t i = 0; i < N_; ++i) seg[i] = b.segments ? b.segments[i] : 0;
    for (int64_t r = 0; r < b.B; ++r) attention_check_segments(seg + r * b.T, b.T, r);
    for (int64_t i = 0; i < N_; ++i) k_.valid[i] = seg[i] >= 0 ? 1 : 0;
    // SSMax log-position factor.
    const auto starts = kda::segment_starts(seg, b.B, b.T);
    for (int64_t i = 0; i < N_; ++i) {
      const int64_t t = i % b.T;
      double pos;
      if (o.ssmax_row_positions)
        pos = static_cast<double>(t);
      else if (b.positions != nullptr)
        pos = b.positions[i];
      else
        pos = starts[static_cast<size_t>(i)] < 0 ? 0.0
                                                 : static_cast<double>(t - starts[static_cast<size_t>(i)]);
      OLMO_CHECK(pos >= 0, "olmo3moe: negative position ", pos, " at row ", i / b.T, ", token ", t);
      k_.logpos[i] = static_cast<T>(std::log(pos + 1.0));
    }
    for (int64_t i = 0; i < N_; ++i)
      OLMO_CHECK(b.tokens[i] >= 0 && b.tokens[i] < c.vocab_size, "olmo3moe: token id ", b.tokens[i],
                 " at row ", i / b.T, ", position ", i % b.T, " is outside [0, ", c.vocab_size, ")");
  }

  LossParts run(const LossConfig& loss, double grad_scale, double aux_scale, float* logits, float* logprobs,
                Olmo3MoeRunInfo* info) {
    unit::Ctx<T> ctx{c_, b_, w_, g_};
    ctx.N = N_;
    ctx.d = d_;
    ctx.seg = k_.seg;
    ctx.valid = k_.valid;
    ctx.logpos = k_.logpos;
    ctx.loss = &loss;
    ctx.aux_scale = aux_scale;
    ctx.kda_chunk = o_.kda_chunk;
    ctx.kda_recurrent = o_.kda_recurrent;
    ctx.recompute_mixer = o_.memory.remat == Remat::Attn;
    const bool bwd = g_ != nullptr;
    const int last = static_cast<int>(u_.blocks.size()) + 1;  // residency group of the final norm, LM head
    const bool tied = c_.tie_word_embeddings;                 // the LM head reads group 0
    LossParts lp;
    lp.moe_layers.reserve(u_.blocks.size());
    T* h = k_.h;
    need(0);
    u_.embed.forward(ctx, h, k_.embed);
    if (!tied) done(0);
    for (size_t l = 0; l < u_.blocks.size(); ++l) {
      need(static_cast<int>(l) + 1);
      u_.blocks[l].forward(ctx, h, k_.saved(c_, static_cast<int64_t>(l)), k_.scratch, lp);
      if (!k_.acts.empty()) k_.acts[l].compress(N_);  // saved_dtype bf16
      done(static_cast<int>(l) + 1);
    }
    need(last);
    const XentStats xs = u_.head.forward(ctx, h, k_.head, logits, logprobs);
    lp.sum[kLossCe] = xs.ce_sum;
    lp.sum[kLossLmZ] = xs.z_sum;
    lp.tokens = xs.count;
    if (info != nullptr) {
      info->tokens = N_;
      info->saved_bytes = k_.saved_bytes_now();
      info->workspace_bytes = k_.block.nbytes();
      info->scratch_bytes = info->workspace_bytes - k_.saved_bytes;
    }
    if (bwd) {
      T* dh = k_.dh;
      u_.head.backward(ctx, h, k_.head, grad_scale, dh, k_.scratch.t);
      done(last);
      if (tied) done(0);
      for (size_t l = u_.blocks.size(); l-- > 0;) {
        need(static_cast<int>(l) + 1);
        unit::PeriLnBlock::Saved<T>& s = k_.saved(c_, static_cast<int64_t>(l));
        if (!k_.acts.empty()) k_.acts[l].expand(N_);
        if (o_.memory.remat == Remat::Full) {  // re-run the block from its kept input into the shared Saved
          std::copy(s.h_in, s.h_in + N_ * d_, k_.rerun);
          LossParts again;  // its MoE statistics were counted by the forward
          u_.blocks[l].forward(ctx, k_.rerun, s, k_.scratch, again);
        }
        u_.blocks[l].backward(ctx, dh, s, k_.scratch);
        done(static_cast<int>(l) + 1);
      }
      need(0);  // the embedding norm's gain
      u_.embed.backward(ctx, dh, k_.embed, k_.scratch.t);
      done(0);
    } else {
      done(last);
      if (tied) done(0);
    }
    return lp;
  }

 private:
  void need(int g) const {
    if (res_ != nullptr && res_->need) res_->need(g);
  }
  void done(int g) const {
    if (res_ != nullptr && res_->done) res_->done(g);
  }

  const ModelConfig& c_;
  const Olmo3MoeOptions& o_;
  const std::vector<const T*>& w_;
  const std::vector<T*>* g_;
  const Batch& b_;
  const HybridUnits& u_;
  const ParamResidency* res_;
  HybridWork<T>& k_;
  int64_t N_ = 0, d_ = 0;
};
}  // namespace

void olmo3moe_check_supported(const ModelConfig& c) {
  const std::string ctx = "olmo3moe config";
  OLMO_CHECK(c.is_moe(), ctx, ": model_type must be olmo3moe, got '", c.model_type_name, "'");
  OLMO_CHECK(c.use_peri_ln, ctx, ": use_peri_ln=false is not supported (expected true)");
  OLMO_CHECK(!c.use_rope, ctx, ": use_rope=true is not supported by the hybrid (expected false: NoPE)");
  OLMO_CHECK(c.gating_function == "softmax", ctx, ": gating_function '", c.gating_function,
             "' is not supported (expected softmax)");
  OLMO_CHECK(c.normalize_expert_weights == 1.0, ctx, ": normalize_expert_weights ",
             c.normalize_expert_weights, " is not supported (expected 1.0: L1)");
  OLMO_CHECK(c.restore_weight_scale, ctx, ": restore_weight_scale=false is not supported (expected true)");
  OLMO_CHECK(!c.latent_moe_bias, ctx, ": latent_moe_bias=true is not supported (expected false)");
  OLMO_CHECK(!c.latent_moe_up_proj_input_norm, ctx, ": latent_moe_up_proj_input_norm=true is not supported");
  OLMO_CHECK(c.attention_gate_type.empty() || c.attention_gate_type == "elementwise", ctx,
             ": attention_gate_type '", c.attention_gate_type,
             "' is not supported (expected elementwise or none)");
  OLMO_CHECK(c.linear_num_key_heads == c.linear_num_value_heads, ctx, ": linear_num_key_heads (",
             c.linear_num_key_heads, ") must equal linear_num_value_heads (", c.linear_num_value_heads, ")");
  OLMO_CHECK(c.hidden_act == "silu", ctx, ": hidden_act '", c.hidden_act,
             "' is not supported (expected silu)");
}

template <typename T>
LossParts olmo3moe_run(const ModelConfig& c, const Olmo3MoeOptions& opts, const std::vector<const T*>& w,
                       const std::vector<T*>* grads, const Batch& batch, const LossConfig& loss,
                       double grad_scale, double aux_scale, float* logits, float* logprobs,
                       Olmo3MoeRunInfo* info) {
  olmo3moe_check_supported(c);
  OLMO_CHECK(opts.kda_chunk > 0, "olmo3moe: kda_chunk must be > 0, got ", opts.kda_chunk);
  OLMO_CHECK((std::is_same_v<T, float>) || opts.memory.saved == SavedDtype::F32,
             "olmo3moe: saved_dtype bf16 is for the float model (the float64 path checks gradients)");
  const HybridUnits units(c);
  HybridWork<T> work;  // one call: planned here, freed on return
  Runner<T> r(c, opts, w, grads, batch, units, work);
  return r.run(loss, grad_scale, aux_scale, logits, logprobs, info);
}

template LossParts olmo3moe_run<float>(const ModelConfig&, const Olmo3MoeOptions&,
                                       const std::vector<const float*>&, const std::vector<float*>*,
                                       const Batch&, const LossConfig&, double, double, float*, float*,
                                       Olmo3MoeRunInfo*);
template LossParts olmo3moe_run<double>(const ModelConfig&, const Olmo3MoeOptions&,
                                        const std::vector<const double*>&, const std::vector<double*>*,
                                        const Batch&, const LossConfig&, double, double, float*, float*,
                                        Olmo3MoeRunInfo*);

// ---------------------------------------------------------------------------------------------------------

Olmo3MoeModel::Olmo3MoeModel(const ModelConfig& c, const Olmo3MoeOptions& opts) : config_(c), opts_(opts) {
  olmo3moe_check_supported(c);
  params_ = allocate_params(c);
}

bool Olmo3MoeModel::set_memory_policy(const MemoryPolicy& policy) {
  if (policy.saved == SavedDtype::BF16 && policy.remat == Remat::Full) return false;  // nothing to round
  opts_.memory = policy;
  return true;
}

bool Olmo3MoeModel::set_param_residency(ParamResidency hooks) {
  res_ = std::move(hooks);
  return true;
}

LossParts Olmo3MoeModel::run(const Batch& batch, const LossConfig& loss, double grad_scale, double aux_scale,
                             bool backward, float* logits, float* logprobs) {
  olmo3moe_check_supported(config_);
  OLMO_CHECK(opts_.kda_chunk > 0, "olmo3moe: kda_chunk must be > 0, got ", opts_.kda_chunk);
  if (!units_) units_ = std::make_shared<const HybridUnits>(config_);
  if (!work_) work_ = std::make_shared<HybridWork<float>>();
  // Value pointers as currently resident; the residency hook refreshes a group's when it is gathered.
  std::vector<const float*> w(params_.size(), nullptr);
  std::vector<float*> g;
  for (size_t i = 0; i < params_.size(); ++i) {
    if (params_[i].value.defined()) w[i] = params_[i].value.data<float>();
    if (backward) g.push_back(params_[i].grad.data<float>());
  }
  ParamResidency hooks;
  hooks.need = [&](int grp) {
    if (res_.need) res_.need(grp);
    for (size_t i = 0; i < params_.size(); ++i)
      if (units_->group[i] == grp)
        w[i] = params_[i].value.defined() ? params_[i].value.data<float>() : nullptr;
  };
  hooks.done = [&](int grp) {
    if (res_.done) res_.done(grp);
  };
  Runner<float> r(config_, opts_, w, backward ? &g : nullptr, batch, *units_, *work_, &hooks);
  return r.run(loss, grad_scale, aux_scale, logits, logprobs, &info_);
}

int64_t Olmo3MoeModel::scratch_floats_per_token(const ModelConfig& c) {
  return 2 * c.hidden_size + 3 + unit::ScaledEmbeddingUnit::saved_floats_per_token(c) +
         unit::LmHeadUnit::saved_floats_per_token(c) + unit::PeriLnBlock::Scratch<float>::per_token(c);
}

ActivationBytes Olmo3MoeModel::activation_bytes(const ModelConfig& c, int64_t B, int64_t T,
                                                const MemoryPolicy& policy) {
  olmo3moe_check_supported(c);
  return unit::planned_activations<HybridWork<float>>(c, B, T, policy);
}

LossParts Olmo3MoeModel::forward_backward(const Batch& batch, const LossConfig& loss, double grad_scale,
                                          double aux_scale) {
  return run(batch, loss, grad_scale, aux_scale, true, nullptr, nullptr);
}

LossParts Olmo3MoeModel::forward(const Batch& batch, const LossConfig& loss, float* logits, float* logprobs) {
  return run(batch, loss, 1.0, 1.0, false, logits, logprobs);
}

std::unique_ptr<CausalLM> make_olmo3moe(const ModelConfig& c, uint64_t seed, const Olmo3MoeOptions& opts) {
  auto m = std::make_unique<Olmo3MoeModel>(c, opts);
  init_params(m->params(), c, seed);
  return m;
}

}  // namespace olmosft::model
