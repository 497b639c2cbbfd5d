#include "model/olmo3.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/threads.h"
#include "kernels/cross_entropy.h"
#include "kernels/gemm.h"
#include "kernels/rmsnorm.h"
#include "model/params.h"

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

// The per-call workspace: saved activations (per layer) and scratch, carved from one block by the units'
// plans (unit::Plan).
using RopeAttentionSaved = unit::RopeAttentionUnit::Saved;

struct Olmo3::Work {
  int64_t N = 0, B = 0, T = 0;
  Tensor block;           // U8 storage for everything below
  std::vector<float*> h;  // L + 1 residual streams [N, d]
  std::vector<unit::PostNormBlock::Saved> s;
  float *hf, *rf, *xlse;
  float *cos_s, *sin_s, *cos_f, *sin_f;
  unit::PostNormBlock::Scratch scratch;  // shared by the layers
  float* dh;                             // gradient of the residual stream
  std::vector<int32_t> seg, pos;         // defaults when the batch has none
  Tensor attn_ws;                        // U8, attention kernel workspace
  size_t attn_ws_bytes = 0;
  size_t saved_bytes = 0;  // the layers' Saved in the plan
  MemoryPolicy policy;
  RopeAttentionSaved shared_attn;     // remat attn: the attention Saved every layer re-runs into
  std::vector<unit::Bf16Store> acts;  // saved_dtype bf16: each layer's activations

  // The plan for N tokens: sets saved_bytes and the pointer slots the plan carves. The residual streams
  // h are the blocks' inputs and outputs under every policy; remat full keeps one Saved (s[0]) for all
  // layers, remat attn one attention Saved.
  unit::Plan plan(const ModelConfig& c, int64_t N) {
    const int64_t d = c.hidden_size, D = c.head_dim, L = c.num_hidden_layers;
    unit::Plan plan;
    h.assign(size_t(L + 1), nullptr);
    for (auto& p : h) plan.add(&p, N * d);
    const bool full = policy.remat == Remat::Full;
    s.assign(full ? 0 : size_t(L), {});
    const bool bf16 = policy.saved == SavedDtype::BF16;
    acts.assign(bf16 ? s.size() : 0, {});
    for (size_t l = 0; l < s.size(); ++l) {
      if (bf16) plan.keep_activations_in(&acts[l], N);
      s[l].plan(plan, c, N, /*attn=*/policy.remat == Remat::None);
    }
    plan.keep_activations_in(nullptr, 0);
    saved_bytes = plan.bytes();
    if (bf16) plan.add_overlay(unit::Bf16Store::stagings(acts));
    if (full) s.emplace_back().plan(plan, c, N);
    if (policy.remat == Remat::Attn) shared_attn.plan(plan, c, N);
    plan.add(&hf, N * d);
    plan.add(&rf, N);
    plan.add(&xlse, N);
    for (float** t : {&cos_s, &sin_s, &cos_f, &sin_f}) plan.add(t, N * D / 2);
    scratch.plan(plan, c, N);
    plan.add(&dh, N * d);
    return plan;
  }
};

Olmo3::Olmo3(const ModelConfig& config, Olmo3Options options) : cfg_(config), opt_(options) {
  OLMO_CHECK(cfg_.model_type == ModelType::Olmo3, "Olmo3: config has model_type '", cfg_.model_type_name,
             "', expected olmo3");
  OLMO_CHECK(cfg_.hidden_act == "silu", "Olmo3: hidden_act '", cfg_.hidden_act, "' is not supported (silu)");
  OLMO_CHECK(!cfg_.tie_word_embeddings, "Olmo3: tie_word_embeddings=true is not supported");
  OLMO_CHECK(!cfg_.attention_bias, "Olmo3: attention_bias=true is not supported");
  OLMO_CHECK(cfg_.num_attention_heads % cfg_.num_key_value_heads == 0, "Olmo3: num_attention_heads ",
             cfg_.num_attention_heads, " is not a multiple of num_key_value_heads ",
             cfg_.num_key_value_heads);
  params_ = allocate_params(cfg_);
  unit::ParamIndex idx(cfg_);
  idx.who = "Olmo3";
  embed_ = idx.get(hf::kEmbedTokens);
  norm_ = idx.get(hf::kFinalNorm);
  lm_head_ = idx.get(hf::kLmHead);
  for (int64_t l = 0; l < cfg_.num_hidden_layers; ++l) {
    const LayerType t = cfg_.layer_types.at(size_t(l));
    OLMO_CHECK(t == LayerType::SlidingAttention || t == LayerType::FullAttention, "Olmo3: layer ", l,
               " has type ", layer_type_name(t), " (olmo3 has sliding_attention and full_attention only)");
    blocks_.push_back(unit::PostNormBlock::resolve(idx, cfg_, l));
  }
  group_ = unit::residency_groups(cfg_);
  rope_full_ = olmo3_rope_frequencies(cfg_.rope_full, cfg_.head_dim, cfg_.max_position_embeddings);
  rope_sliding_ = opt_.yarn_on_all_layers ? rope_full_
                                          : olmo3_rope_frequencies(cfg_.rope_sliding, cfg_.head_dim,
                                                                   cfg_.max_position_embeddings);
}

Olmo3::~Olmo3() { delete w_; }

int64_t Olmo3::activation_floats_per_token(const ModelConfig& c) {
  const int64_t d = c.hidden_size, HD = c.num_attention_heads * c.head_dim,
                KD = c.num_key_value_heads * c.head_dim, F = c.intermediate_size, L = c.num_hidden_layers,
                D = c.head_dim;
  const int64_t per_layer = unit::PostNormBlock::saved_floats_per_token(c);  // saved
  const int64_t global = (L + 1) * d + d + 2 + 2 * D;  // residual streams, final norm, rope
  const int64_t scratch = 3 * HD + 3 * KD + 2 * F + 2 * d;
  return L * per_layer + global + scratch;
}

size_t Olmo3::workspace_bytes() const {
  return w_ ? w_->block.nbytes() + w_->attn_ws_bytes + (w_->seg.size() + w_->pos.size()) * 4 : 0;
}

ActivationBytes Olmo3::activation_bytes(const ModelConfig& c, int64_t B, int64_t T,
                                        const MemoryPolicy& policy) {
  return unit::planned_activations<Work>(c, B, T, policy);
}

const float* Olmo3::hidden_state(int64_t index) const {
  OLMO_CHECK(w_ && index >= 0 && index <= cfg_.num_hidden_layers, "Olmo3::hidden_state: no state ", index);
  return w_->h[size_t(index)];
}

void Olmo3::need(int64_t g) {
  if (res_.need) res_.need(int(g));
  for (size_t i = 0; i < params_.size(); ++i)
    if (group_[i] == g) wp_[i] = params_[i].value.defined() ? params_[i].value.data<float>() : nullptr;
}

void Olmo3::done(int64_t g) {
  if (res_.done) res_.done(int(g));
}

void Olmo3::prepare(const Batch& b) {
  OLMO_CHECK(b.B > 0 && b.T > 0, "olmo3: batch must have B > 0 and T > 0, got B=", b.B, " T=", b.T);
  OLMO_CHECK(b.tokens != nullptr, "olmo3: batch has no tokens");
  const int64_t N = b.B * b.T, V = cfg_.vocab_size;
  for (int64_t i = 0; i < N; ++i) {
    OLMO_CHECK(b.tokens[i] >= 0 && b.tokens[i] < V, "olmo3: token id ", b.tokens[i], " at row ", i / b.T,
               ", position ", i % b.T, " is outside the vocabulary [0, ", V, ")");
  }
  // Parameter pointers for the units: values as currently resident, gradients (valid for the whole call).
  wp_.assign(params_.size(), nullptr);
  gp_.assign(params_.size(), nullptr);
  for (size_t i = 0; i < params_.size(); ++i) {
    if (params_[i].value.defined()) wp_[i] = params_[i].value.data<float>();
    if (params_[i].grad.defined()) gp_[i] = params_[i].grad.data<float>();
  }
  if (!w_ || w_->N < N || !(w_->policy == policy_)) {
    delete w_;
    w_ = nullptr;
    auto* w = new Work();
    w->policy = policy_;
    const unit::Plan plan = w->plan(cfg_, N);
    w->block = Tensor::empty({int64_t(plan.bytes())}, DType::U8);
    plan.carve(static_cast<std::byte*>(w->block.raw_data()));
    if (policy_.remat == Remat::Attn)
      for (auto& x : w->s) x.attn = w->shared_attn;
    w->N = N;
    w_ = w;
  }
  w_->B = b.B;
  w_->T = b.T;
  if (!b.segments) w_->seg.assign(size_t(N), 0);
  if (!b.positions) {
    // Positions restart at 0 per document (per row when there are no segments).
    w_->pos.resize(size_t(N));
    for (int64_t r = 0; r < b.B; ++r) {
      int32_t p = 0;
      for (int64_t t = 0; t < b.T; ++t) {
        const int64_t i = r * b.T + t;
        if (t > 0 && b.segments && b.segments[i] != b.segments[i - 1]) p = 0;
        w_->pos[size_t(i)] = p++;
      }
    }
  }
  // Attention workspace for both window settings and both passes, at the current thread count.
  const size_t need = unit::attention_workspace_bytes(cfg_, b.B, b.T);
  if (need > w_->attn_ws_bytes) {
    w_->attn_ws = Tensor::empty({int64_t(need)}, DType::U8);
    w_->attn_ws_bytes = need;
  }
  auto& sa = w_->scratch.attn;
  sa.cos_s = w_->cos_s;
  sa.sin_s = w_->sin_s;
  sa.cos_f = w_->cos_f;
  sa.sin_f = w_->sin_f;
  sa.attn_ws = w_->attn_ws.raw_data();
  sa.attn_ws_bytes = w_->attn_ws_bytes;
}

unit::PostNormBlock::Saved& Olmo3::saved(size_t layer) {
  return w_->s[policy_.remat == Remat::Full ? 0 : layer];
}

bool Olmo3::set_memory_policy(const MemoryPolicy& policy) {
  if (policy.saved == SavedDtype::BF16 && policy.remat == Remat::Full) return false;  // nothing to round
  policy_ = policy;
  return true;
}

unit::Ctx<float> Olmo3::context(const Batch& b) const {
  unit::Ctx<float> ctx{cfg_, b, wp_, &gp_};
  ctx.recompute_mixer = policy_.remat == Remat::Attn;
  ctx.N = b.B * b.T;
  ctx.d = cfg_.hidden_size;
  ctx.seg = b.segments ? b.segments : w_->seg.data();
  return ctx;
}

void Olmo3::run_forward(const Batch& b) {
  Work& w = *w_;
  const int64_t N = b.B * b.T, d = cfg_.hidden_size;
  const int32_t* pos = b.positions ? b.positions : w.pos.data();
  rope_tables<float>(rope_sliding_, pos, N, w.cos_s, w.sin_s);
  rope_tables<float>(rope_full_, pos, N, w.cos_f, w.sin_f);

  need(0);
  const float* E = wp_[size_t(embed_)];
  float* h0 = w.h[0];
  parallel_for(
      N,
      [&](int64_t s, int64_t e) {
        for (int64_t i = s; i < e; ++i) std::memcpy(h0 + i * d, E + int64_t(b.tokens[i]) * d, size_t(d) * 4);
      },
      64);
  done(0);

  const unit::Ctx<float> ctx = context(b);
  for (size_t l = 0; l < blocks_.size(); ++l) {
    need(int64_t(l) + 1);
    blocks_[l].forward(ctx, w.h[l], w.h[l + 1], saved(l), w.scratch);
    if (!w.acts.empty()) w.acts[l].compress(N);  // saved_dtype bf16
    done(int64_t(l) + 1);
  }
  need(int64_t(blocks_.size()) + 1);  // released by forward() after the logits, by run_backward() after the
                                      // final norm
  rmsnorm_forward<float>(w.h[blocks_.size()], wp_[size_t(norm_)], w.hf, w.rf, N, d, cfg_.rms_norm_eps);
}

LossParts Olmo3::loss_forward(const Batch& b, const LossConfig& loss) {
  LossParts parts;
  if (!b.targets) return parts;
  XentConfig xc;
  xc.valid_vocab = cfg_.vocab_size;
  xc.z_loss = loss.weight[kLossLmZ];
  xc.vocab_chunk = loss.vocab_tile;
  const int64_t N = b.B * b.T;
  auto st = xent_forward<float>(w_->hf, wp_[size_t(lm_head_)], b.targets, b.trained, N, cfg_.hidden_size,
                                cfg_.vocab_size, xc, w_->xlse);
  parts.sum[kLossCe] = st.ce_sum;
  parts.sum[kLossLmZ] = st.z_sum;
  parts.tokens = st.count;
  return parts;
}

LossParts Olmo3::forward(const Batch& batch, const LossConfig& loss, float* logits, float* logprobs) {
  prepare(batch);
  run_forward(batch);
  LossParts parts = loss_forward(batch, loss);
  const int64_t N = batch.B * batch.T, d = cfg_.hidden_size, V = cfg_.vocab_size;
  const float* W = wp_[size_t(lm_head_)];
  if (logits)
    gemm_compute<float>(Precision::Compute, Trans::N, Trans::T, N, V, d, 1.0f, w_->hf, d, W, d, 0.0f, logits,
                        V);
  if (logprobs) {
    parallel_for(
        N,
        [&](int64_t s, int64_t e) {
          for (int64_t i = s; i < e; ++i) {
            logprobs[i] = 0.0f;
            if (!batch.targets) continue;
            const int32_t t = batch.targets[i];
            if (t == -100 || (batch.trained && batch.trained[i] == 0)) continue;
            const float* hr = w_->hf + i * d;
            const float* wr = W + int64_t(t) * d;
            double acc = 0;
            for (int64_t j = 0; j < d; ++j) acc += double(hr[j]) * double(wr[j]);
            logprobs[i] = float(acc - double(w_->xlse[i]));
          }
        },
        16);
  }
  done(int64_t(blocks_.size()) + 1);
  return parts;
}

LossParts Olmo3::forward_backward(const Batch& batch, const LossConfig& loss, double grad_scale,
                                  double /*aux_scale*/) {
  OLMO_CHECK(batch.targets != nullptr, "olmo3: forward_backward needs targets");
  OLMO_CHECK(std::isfinite(grad_scale), "olmo3: grad_scale must be finite, got ", grad_scale);
  prepare(batch);
  run_forward(batch);
  LossParts parts = loss_forward(batch, loss);
  run_backward(batch, loss, grad_scale, parts);
  return parts;
}

void Olmo3::run_backward(const Batch& b, const LossConfig& loss, double grad_scale, const LossParts&) {
  Work& w = *w_;
  const int64_t N = b.B * b.T, d = cfg_.hidden_size;
  XentConfig xc;
  xc.valid_vocab = cfg_.vocab_size;
  xc.z_loss = loss.weight[kLossLmZ];
  xc.vocab_chunk = loss.vocab_tile;
  // dL/dhf into dtmp, then through the final norm into dh.
  float* dtmp = w.scratch.dtmp;
  xent_backward<float>(w.hf, wp_[size_t(lm_head_)], b.targets, b.trained, w.xlse, N, d, cfg_.vocab_size, xc,
                       grad_scale, dtmp, gp_[size_t(lm_head_)]);
  rmsnorm_backward<float>(dtmp, w.h[blocks_.size()], wp_[size_t(norm_)], w.rf, w.dh, gp_[size_t(norm_)], N, d,
                          cfg_.rms_norm_eps);
  done(int64_t(blocks_.size()) + 1);

  const unit::Ctx<float> ctx = context(b);
  for (size_t li = blocks_.size(); li-- > 0;) {
    need(int64_t(li) + 1);
    unit::PostNormBlock::Saved& s = saved(li);
    if (!w.acts.empty()) w.acts[li].expand(N);
    // remat full: re-run the block from its input (its output h[li + 1] is rewritten with the same values)
    if (policy_.remat == Remat::Full) blocks_[li].forward(ctx, w.h[li], w.h[li + 1], s, w.scratch);
    blocks_[li].backward(ctx, w.h[li], s, w.dh, w.scratch);
    done(int64_t(li) + 1);
  }
  // Embedding: dE[tok] += dh (columns split across threads, so the order per element is fixed).
  float* dE = gp_[size_t(embed_)];
  parallel_for(
      d,
      [&](int64_t c0, int64_t c1) {
        for (int64_t i = 0; i < N; ++i) {
          float* dst = dE + int64_t(b.tokens[i]) * d;
          const float* src = w.dh + i * d;
          for (int64_t c = c0; c < c1; ++c) dst[c] += src[c];
        }
      },
      16);
}

}  // namespace olmosft::model
