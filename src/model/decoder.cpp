// The decoder: the layer list run over the units (see decoder.h).
#include "model/decoder.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <type_traits>

#include "core/error.h"
#include "core/tensor.h"
#include "kernels/attention.h"
#include "kernels/gemm.h"
#include "kernels/kda.h"
#include "model/decoder_units.h"
#include "model/layers.h"
#include "model/params.h"
#include "model/unit_block.h"
#include "model/unit_embedding.h"
#include "model/unit_lm_head.h"

namespace olmosft::model {

RopeFreqs olmo3_rope_frequencies(const RopeParams& p, int64_t head_dim, int64_t max_pos) {
  RopeConfig rc;
  rc.theta = p.rope_theta;
  rc.head_dim = head_dim;
  rc.max_position_embeddings = max_pos;
  if (p.rope_type == "yarn") {
    rc.rope_type = "yarn";
    rc.factor = p.factor;
    // The config parser fills original_max_position_embeddings with max_position_embeddings when the key
    // is absent; only pass it on when it is consistent with the factor (otherwise the kernel would
    // recompute factor = max_pos / original = 1).
    const int64_t L0 = p.original_max_position_embeddings;
    if (L0 > 0 && std::fabs(double(max_pos) / double(L0) - p.factor) <= 1e-9 * p.factor) {
      rc.original_max_position_embeddings = L0;
    }
    rc.beta_fast = p.beta_fast;
    rc.beta_slow = p.beta_slow;
    rc.attention_factor = p.attention_factor;
    rc.truncate = p.truncate;
    return rope_frequencies(rc);
  }
  RopeFreqs f = rope_frequencies(rc);  // default
  if (p.rope_type == "linear") {
    for (auto& x : f.inv_freq) x /= float(p.factor);  // HF linear scaling: inv_freq / factor
  } else {
    OLMO_CHECK(p.rope_type == "default", "olmo3: unsupported rope_type '", p.rope_type, "'");
  }
  return f;
}

// The per-call workspace of one model: the residual streams and their gradient, the per-token batch arrays,
// every unit's Saved and the shared Scratch, carved from one block planned from the units' declarations
// (unit::Plan) for a memory policy (memory_policy.h) and kept while the token count and the policy do not
// change. The MoE layers' caches are vectors sized by moe.cpp; they live in the Saved too, so their capacity
// is reused.
//   remat none: one Saved per layer.
//   remat attn: one Saved per layer without the mixer's; one mixer Saved per mixer kind, overlaid, shared.
//   remat full: one Saved per layer kind, overlaid and shared; the backward re-runs a block's forward from
//   its
//               input stream into it.
//   saved_dtype bf16 (none / attn): each layer's activations as bf16 copies (acts), their fp32 buffers one
//               staging region overlaid across the layers; compressed after the layer's forward, restored
//               before its backward.
template <typename T>
struct DecoderWork {
  int64_t N = 0;  // planned tokens
  MemoryPolicy policy;
  Tensor block;         // U8 storage of everything below
  std::vector<T*> h;    // L + 1 residual streams [N, d]
  T *dh, *logpos;       // [N, d], [N]
  int32_t *seg, *pos;   // [N]
  uint8_t* valid;       // [N]
  T* rope_cos[3] = {};  // per RopeKind, [N, head_dim / 2]
  T* rope_sin[3] = {};
  unit::EmbeddingUnit::Saved<T> embed;
  std::vector<unit::Block::Saved<T>> blocks;       // per layer (remat none / attn)
  unit::Block::Saved<T> kinds[unit::kLayerKinds];  // remat full: per layer kind
  unit::MixerSaved<T> shared_mixer;                // remat attn: per mixer kind
  std::vector<unit::Bf16Store> acts;               // saved_dtype bf16: each block's activations
  unit::LmHeadUnit::Saved<T> head;
  unit::Block::Scratch<T> scratch;
  std::vector<T> attn_ws;  // the attention kernel's workspace (outside the planned block)
  size_t saved_bytes = 0;  // planned, kept from the forward for the backward (MoE caches not included)

  // What the backward re-runs into under remat attn / full; never live at the same time, so overlaid.
  std::vector<unit::Plan> rerun_alternatives(const ModelConfig& c, const std::vector<LayerSpec>& layers,
                                             int64_t n) {
    std::vector<unit::Plan> alts;
    bool kind_seen[unit::kLayerKinds] = {}, mixer_seen[std::variant_size_v<unit::Mixers>] = {};
    for (const LayerSpec& s : layers) {
      if (policy.remat == Remat::Full && !kind_seen[s.kind()])
        kinds[s.kind()].plan(alts.emplace_back(), c, s, n);
      if (policy.remat == Remat::Attn && !mixer_seen[static_cast<size_t>(s.mixer)])
        unit::Block::plan_mixer<T>(alts.emplace_back(), c, s.mixer, n, shared_mixer);
      kind_seen[s.kind()] = mixer_seen[static_cast<size_t>(s.mixer)] = true;
    }
    return alts;
  }
  // The plan for n tokens: sets saved_bytes and the pointer slots the plan carves.
  unit::Plan plan(const ModelConfig& c, int64_t n) {
    const std::vector<LayerSpec> layers = layer_specs(c);
    const int64_t L = c.num_hidden_layers, d = c.hidden_size;
    unit::Plan plan;
    h.assign(static_cast<size_t>(L + 1), nullptr);
    for (auto& x : h) plan.add(&x, n * d);
    blocks.assign(policy.remat == Remat::Full ? 0 : static_cast<size_t>(L), {});
    const bool bf16 = policy.saved == SavedDtype::BF16 && std::is_same_v<T, float>;
    acts.assign(bf16 ? blocks.size() : 0, {});
    for (size_t l = 0; l < blocks.size(); ++l) {
      if (bf16) plan.keep_activations_in(&acts[l], n);
      blocks[l].plan(plan, c, layers[l], n, policy.remat == Remat::None);
    }
    plan.keep_activations_in(nullptr, 0);
    saved_bytes = plan.bytes();
    if (bf16) plan.add_overlay(unit::Bf16Store::stagings(acts));
    if (policy.remat != Remat::None) plan.add_overlay(rerun_alternatives(c, layers, n));
    embed.plan(plan, c, n);
    head.plan(plan, c, n);
    plan.add(&dh, n * d);
    plan.add(&logpos, n);
    plan.add(&seg, n);
    plan.add(&pos, n);
    plan.add(&valid, n);
    if (uses_rope(layers))
      for (int k : {static_cast<int>(RopeKind::Full), static_cast<int>(RopeKind::Sliding)})
        for (T** t : {&rope_cos[k], &rope_sin[k]}) plan.add(t, n * c.head_dim / 2);
    scratch.plan(plan, c, layers, n);
    return plan;
  }
  // Plans the block for n tokens under policy p unless the current one already holds them.
  void ensure(const ModelConfig& c, int64_t n, const MemoryPolicy& p) {
    if (n <= N && p == policy) return;
    policy = p;
    const unit::Plan pl = plan(c, n);
    block = Tensor::empty({static_cast<int64_t>(pl.bytes())}, DType::U8);
    pl.carve(static_cast<std::byte*>(block.raw_data()));
    if (policy.remat == Remat::Attn)  // every layer's mixer Saved is the shared one of its kind
      for (auto& s : blocks) s.mixer = shared_mixer;
    N = n;
  }
  // The Saved layer `s` runs with.
  unit::Block::Saved<T>& saved(const LayerSpec& s) {
    return policy.remat == Remat::Full ? kinds[s.kind()] : blocks[static_cast<size_t>(s.index)];
  }
  // Planned Saved + the kept layers' MoE caches as sized by the last forward (remat full's shared ones are
  // working memory, not counted).
  size_t saved_bytes_now() const {
    size_t n = saved_bytes;
    for (const auto& s : blocks) n += s.moe_bytes();
    return n;
  }
};

template <typename T>
void batch_token_arrays(const ModelConfig& c, const DecoderOptions& o, const Batch& b, int32_t* seg,
                        uint8_t* valid, int32_t* pos, T* logpos) {
  const int64_t N = b.B * b.T;
  const std::string& who = c.model_type_name;
  for (int64_t i = 0; i < N; ++i)
    OLMO_CHECK(b.tokens[i] >= 0 && b.tokens[i] < c.vocab_size, who, ": token id ", b.tokens[i], " at row ",
               i / b.T, ", position ", i % b.T, " is outside the vocabulary [0, ", c.vocab_size, ")");
  for (int64_t i = 0; i < N; ++i) seg[i] = b.segments ? b.segments[i] : 0;
  for (int64_t r = 0; r < b.B; ++r) attention_check_segments(seg + r * b.T, b.T, r);
  for (int64_t i = 0; i < N; ++i) valid[i] = seg[i] >= 0 ? 1 : 0;
  for (int64_t r = 0; r < b.B; ++r) {
    int32_t p = 0;
    for (int64_t t = 0; t < b.T; ++t) {
      const int64_t i = r * b.T + t;
      if (t > 0 && seg[i] != seg[i - 1]) p = 0;
      pos[i] = b.positions ? b.positions[i] : p++;
    }
  }
  const auto starts = kda::segment_starts(seg, b.B, b.T);
  for (int64_t i = 0; i < N; ++i) {  // SSMax: padding counts as position 0
    const int64_t t = i % b.T, start = starts[static_cast<size_t>(i)];
    double p = o.ssmax_row_positions    ? static_cast<double>(t)
               : b.positions != nullptr ? b.positions[i]
               : start < 0              ? 0.0
                                        : static_cast<double>(t - start);
    OLMO_CHECK(p >= 0, who, ": negative position ", p, " at row ", i / b.T, ", token ", t);
    logpos[i] = static_cast<T>(std::log(p + 1.0));
  }
}
template void batch_token_arrays<float>(const ModelConfig&, const DecoderOptions&, const Batch&, int32_t*,
                                        uint8_t*, int32_t*, float*);
template void batch_token_arrays<double>(const ModelConfig&, const DecoderOptions&, const Batch&, int32_t*,
                                         uint8_t*, int32_t*, double*);

namespace {

// The per-token batch arrays of a call (batch_token_arrays) and the RoPE tables at the tokens' positions.
template <typename T>
void prepare_batch(const ModelConfig& c, const DecoderOptions& o, const DecoderUnits& u, const Batch& b,
                   DecoderWork<T>& k) {
  batch_token_arrays(c, o, b, k.seg, k.valid, k.pos, k.logpos);
  for (int r = 1; r < 3; ++r)
    if (k.rope_cos[r] != nullptr) rope_tables<T>(u.rope[r], k.pos, b.B * b.T, k.rope_cos[r], k.rope_sin[r]);
}

template <typename T>
class Runner {
 public:
  Runner(const ModelConfig& c, const DecoderOptions& o, const std::vector<const T*>& w,
         const std::vector<T*>* g, const Batch& b, const DecoderUnits& u, DecoderWork<T>& work,
         const ParamResidency* res = nullptr)
      : c_(c), o_(o), w_(w), g_(g), b_(b), u_(u), res_(res), k_(work) {
    const std::string& who = c.model_type_name;
    OLMO_CHECK(w.size() == u.count, who, ": expected ", u.count, " weight pointers, got ", w.size());
    OLMO_CHECK(g == nullptr || g->size() == u.count, who, ": expected ", u.count, " gradient pointers");
    OLMO_CHECK(b.B > 0 && b.T > 0, who, ": batch must have B > 0 and T > 0 (got B=", b.B, ", T=", b.T, ")");
    OLMO_CHECK(b.tokens != nullptr, who, ": batch has no tokens");
    OLMO_CHECK(o.kda_chunk > 0, who, ": kda_chunk must be > 0, got ", o.kda_chunk);
    N_ = b.B * b.T;
    k_.ensure(c, N_, o.memory);
    prepare_batch(c, o, u, b, k_);
    const size_t ws = (unit::attention_workspace_bytes<T>(c, b.B, b.T) + sizeof(T) - 1) / sizeof(T);
    if (k_.attn_ws.size() < ws) k_.attn_ws.resize(ws);
  }

  LossParts run(const LossConfig& loss, double grad_scale, double aux_scale, float* logits, float* logprobs,
                DecoderRunInfo* info) {
    const unit::Ctx<T> ctx = context(loss, aux_scale);
    const int64_t L = static_cast<int64_t>(u_.blocks.size());
    const int last = static_cast<int>(L) + 1;  // residency group of the final norm and LM head
    const bool tied = c_.tie_word_embeddings;  // the LM head reads group 0
    LossParts lp;
    lp.moe_layers.reserve(u_.blocks.size());
    need(0);
    u_.embed.forward(ctx, k_.h[0], k_.embed);
    if (!tied) done(0);
    for (int64_t l = 0; l < L; ++l) {
      need(static_cast<int>(l) + 1);
      u_.blocks[l].forward(ctx, k_.h[l], k_.h[l + 1], k_.saved(u_.layers[l]), k_.scratch, lp);
      if (!k_.acts.empty()) k_.acts[l].compress(N_);  // saved_dtype bf16
      done(static_cast<int>(l) + 1);
    }
    need(last);
    const XentStats xs = u_.head.forward(ctx, k_.h[L], k_.head, logits, logprobs);
    lp.sum[kLossCe] = xs.ce_sum;
    lp.sum[kLossLmZ] = xs.z_sum;
    lp.tokens = xs.count;
    if (info != nullptr) {
      info->tokens = N_;
      info->saved_bytes = k_.saved_bytes_now();
      info->workspace_bytes = k_.block.nbytes();
      info->scratch_bytes = info->workspace_bytes - k_.saved_bytes;
    }
    if (g_ == nullptr) {
      done(last);
      if (tied) done(0);
      return lp;
    }
    u_.head.backward(ctx, k_.h[L], k_.head, grad_scale, k_.dh, k_.scratch.t);
    done(last);
    if (tied) done(0);
    backward_blocks(ctx);
    const bool reads = u_.embed.backward_reads_weights();  // the embedding norm's gain
    if (reads) need(0);
    u_.embed.backward(ctx, k_.dh, k_.embed, k_.scratch.t);
    if (reads) done(0);
    return lp;
  }

 private:
  unit::Ctx<T> context(const LossConfig& loss, double aux_scale) const {
    unit::Ctx<T> ctx{c_, b_, w_, g_};
    ctx.N = N_;
    ctx.d = c_.hidden_size;
    ctx.seg = k_.seg;
    ctx.valid = k_.valid;
    ctx.logpos = k_.logpos;
    for (int r = 0; r < 3; ++r) {
      ctx.rope_cos[r] = k_.rope_cos[r];
      ctx.rope_sin[r] = k_.rope_sin[r];
    }
    ctx.attn_ws = k_.attn_ws.data();
    ctx.attn_ws_bytes = k_.attn_ws.size() * sizeof(T);
    ctx.loss = &loss;
    ctx.aux_scale = aux_scale;
    ctx.kda_chunk = o_.kda_chunk;
    ctx.kda_recurrent = o_.kda_recurrent;
    ctx.recompute_mixer = o_.memory.remat == Remat::Attn;
    return ctx;
  }
  void backward_blocks(const unit::Ctx<T>& ctx) {
    for (size_t l = u_.blocks.size(); l-- > 0;) {
      need(static_cast<int>(l) + 1);
      unit::Block::Saved<T>& s = k_.saved(u_.layers[l]);
      if (!k_.acts.empty()) k_.acts[l].expand(N_);
      if (o_.memory.remat ==
          Remat::Full) {  // re-run the block from its input (h[l + 1] gets the same values)
        LossParts again;  // its MoE statistics were counted by the forward
        u_.blocks[l].forward(ctx, k_.h[l], k_.h[l + 1], s, k_.scratch, again);
      }
      u_.blocks[l].backward(ctx, k_.h[l], s, k_.dh, k_.scratch);
      done(static_cast<int>(l) + 1);
    }
  }
  void need(int g) const {
    if (res_ != nullptr && res_->need) res_->need(g);
  }
  void done(int g) const {
    if (res_ != nullptr && res_->done) res_->done(g);
  }

  const ModelConfig& c_;
  const DecoderOptions& o_;
  const std::vector<const T*>& w_;
  const std::vector<T*>* g_;
  const Batch& b_;
  const DecoderUnits& u_;
  const ParamResidency* res_;
  DecoderWork<T>& k_;
  int64_t N_ = 0;
};

}  // namespace

template <typename T>
LossParts decoder_run(const ModelConfig& c, const DecoderOptions& opts, const std::vector<const T*>& w,
                      const std::vector<T*>* grads, const Batch& batch, const LossConfig& loss,
                      double grad_scale, double aux_scale, float* logits, float* logprobs,
                      DecoderRunInfo* info) {
  OLMO_CHECK((std::is_same_v<T, float>) || opts.memory.saved == SavedDtype::F32, c.model_type_name,
             ": saved_dtype bf16 is for the float model (the float64 path checks gradients)");
  const DecoderUnits units(c, opts);
  DecoderWork<T> work;  // one call: planned here, freed on return
  Runner<T> r(c, opts, w, grads, batch, units, work);
  return r.run(loss, grad_scale, aux_scale, logits, logprobs, info);
}

template LossParts decoder_run<float>(const ModelConfig&, const DecoderOptions&,
                                      const std::vector<const float*>&, const std::vector<float*>*,
                                      const Batch&, const LossConfig&, double, double, float*, float*,
                                      DecoderRunInfo*);
template LossParts decoder_run<double>(const ModelConfig&, const DecoderOptions&,
                                       const std::vector<const double*>&, const std::vector<double*>*,
                                       const Batch&, const LossConfig&, double, double, float*, float*,
                                       DecoderRunInfo*);

// ---------------------------------------------------------------------------------------------------------

Decoder::Decoder(const ModelConfig& c, const DecoderOptions& opts) : config_(c), opts_(opts) {
  check_supported(c);
  params_ = allocate_params(c);
}

Decoder::~Decoder() = default;

bool Decoder::set_memory_policy(const MemoryPolicy& policy) {
  if (policy.saved == SavedDtype::BF16 && policy.remat == Remat::Full) return false;  // nothing to round
  opts_.memory = policy;
  return true;
}

bool Decoder::set_param_residency(ParamResidency hooks) {
  res_ = std::move(hooks);
  return true;
}

LossParts Decoder::run(const Batch& batch, const LossConfig& loss, double grad_scale, double aux_scale,
                       bool backward, float* logits, float* logprobs) {
  if (!units_) units_ = std::make_shared<const DecoderUnits>(config_, opts_);
  if (!work_) work_ = std::make_shared<DecoderWork<float>>();
  // Value pointers as currently resident; the residency hook refreshes a group's when it is gathered.
  std::vector<const float*> w(params_.size(), nullptr);
  std::vector<float*> g;
  for (size_t i = 0; i < params_.size(); ++i) {
    if (params_[i].value.defined()) w[i] = params_[i].value.data<float>();
    if (backward) g.push_back(params_[i].grad.data<float>());
  }
  // Under bf16 compute, each resident group's matrices are held (Bf16Weights): rounded at their first GEMM
  // of the call rather than at every GEMM. Their values are fixed from need(g) to done(g); without residency
  // hooks (the weights replicated) for the whole call, so a group is held once per call and its buffer is
  // kept between calls; with hooks (fully sharded) the copies of a group live from need(g) to done(g) only.
  const bool round_once = cpu_gemm().compute == ComputeDtype::BF16;
  const bool sharded = static_cast<bool>(res_.need);
  if (!round_once)
    bf16w_.reset();
  else if (!bf16w_)
    bf16w_ = std::make_shared<Bf16Weights>();
  else
    bf16w_->release_all(!sharded);  // the last call's copies: the weights may have changed since
  ParamResidency hooks;
  hooks.need = [&](int grp) {
    if (res_.need) res_.need(grp);
    std::vector<std::pair<const float*, int64_t>> mats;
    for (size_t i = 0; i < params_.size(); ++i)
      if (units_->group[i] == grp) {
        w[i] = params_[i].value.defined() ? params_[i].value.data<float>() : nullptr;
        if (round_once && w[i] != nullptr && params_[i].value.ndim() == 2)
          mats.push_back({w[i], params_[i].value.numel()});
      }
    if (round_once && !bf16w_->holds(grp)) bf16w_->hold(grp, mats);
  };
  hooks.done = [&](int grp) {
    if (round_once && sharded) bf16w_->release(grp, false);
    if (res_.done) res_.done(grp);
  };
  const ScopedBf16Weights held(round_once ? bf16w_.get() : nullptr);
  Runner<float> r(config_, opts_, w, backward ? &g : nullptr, batch, *units_, *work_, &hooks);
  return r.run(loss, grad_scale, aux_scale, logits, logprobs, &info_);
}

const float* Decoder::hidden_state(int64_t index) const {
  OLMO_CHECK(work_ && index >= 0 && index <= config_.num_hidden_layers, config_.model_type_name,
             "::hidden_state: no state ", index);
  return work_->h[static_cast<size_t>(index)];
}

size_t Decoder::bf16_weight_bytes() const { return bf16w_ ? bf16w_->bytes() : 0; }

size_t Decoder::workspace_bytes() const {
  return work_ ? work_->block.nbytes() + work_->attn_ws.size() * sizeof(float) : 0;
}

int64_t Decoder::scratch_floats_per_token(const ModelConfig& c) {
  const std::vector<LayerSpec> layers = layer_specs(c);
  const int64_t rope = uses_rope(layers) ? 2 * c.head_dim : 0;  // cos and sin of two tables, D / 2 each
  // dh; logpos seg pos valid; the embedding's and LM head's Saved; the blocks' shared Scratch
  return c.hidden_size + 4 + rope + unit::EmbeddingUnit::saved_floats_per_token(c) +
         unit::LmHeadUnit::saved_floats_per_token(c) + unit::Block::Scratch<float>::per_token(c, layers);
}

ActivationBytes Decoder::activation_bytes(const ModelConfig& c, int64_t B, int64_t T,
                                          const MemoryPolicy& policy) {
  check_supported(c);
  return unit::planned_activations<DecoderWork<float>>(c, B, T, policy);
}

LossParts Decoder::forward_backward(const Batch& batch, const LossConfig& loss, double grad_scale,
                                    double aux_scale) {
  OLMO_CHECK(batch.targets != nullptr, config_.model_type_name, ": forward_backward needs targets");
  OLMO_CHECK(std::isfinite(grad_scale), config_.model_type_name, ": grad_scale must be finite, got ",
             grad_scale);
  return run(batch, loss, grad_scale, aux_scale, true, nullptr, nullptr);
}

LossParts Decoder::forward(const Batch& batch, const LossConfig& loss, float* logits, float* logprobs) {
  return run(batch, loss, 1.0, 1.0, false, logits, logprobs);
}

std::unique_ptr<CausalLM> make_decoder(const ModelConfig& c, uint64_t seed, const DecoderOptions& opts) {
  auto m = std::make_unique<Decoder>(c, opts);
  init_params(m->params(), c, seed);
  return m;
}

}  // namespace olmosft::model
