#include "model/olmo3.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>

#include "core/threads.h"
#include "kernels/attention.h"
#include "kernels/cross_entropy.h"
#include "kernels/gemm.h"
#include "kernels/rmsnorm.h"
#include "kernels/swiglu.h"
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

struct Olmo3::Layer {
  int64_t wq, wk, wv, wo, qn, kn, wg, wu, wd, pan, pfn;  // indices into params_
  bool sliding = false;
};

// The per-call workspace. Saved activations (per layer) and scratch, carved from one aligned block.
struct Olmo3::Work {
  int64_t N = 0, B = 0, T = 0;
  Tensor block;           // F32 storage for everything below
  std::vector<float*> h;  // L + 1 residual streams [N, d]
  struct Saved {
    float *qraw, *kraw, *v, *o, *lse, *rq, *rk, *a, *ra, *hmid, *gate, *up, *m, *rm;
  };
  std::vector<Saved> s;
  float *hf, *rf, *xlse;
  float *cos_s, *sin_s, *cos_f, *sin_f;
  // Scratch.
  float *q, *k, *act, *dact, *dh, *dtmp, *dO, *dq, *dk, *dv;
  std::vector<int32_t> seg, pos;  // defaults when the batch has none
  Tensor attn_ws;                 // U8, attention kernel workspace
  size_t attn_ws_bytes = 0;
};

namespace {
constexpr int64_t kAlignFloats = 16;  // 64 bytes
int64_t round_up(int64_t n) { return (n + kAlignFloats - 1) / kAlignFloats * kAlignFloats; }

bool is_norm(const std::string& name) {
  auto ends = [&](const char* s) {
    size_t n = std::strlen(s);
    return name.size() >= n && name.compare(name.size() - n, n, s) == 0;
  };
  return ends("norm.weight") || ends("layernorm.weight");
}

// The attention kernel's configuration for a [B, T] batch with the given window (0 = full causal).
AttentionConfig attention_config(const ModelConfig& cfg, int64_t B, int64_t T, int64_t window) {
  AttentionConfig ac;
  ac.batch = B;
  ac.seq = T;
  ac.heads = cfg.num_attention_heads;
  ac.kv_heads = cfg.num_key_value_heads;
  ac.head_dim = ac.v_head_dim = cfg.head_dim;
  ac.window = window;
  ac.scale = 1.0 / std::sqrt(double(cfg.head_dim));
  return ac;
}

}  // namespace

Olmo3::Olmo3(const ModelConfig& config, Olmo3Options options) : cfg_(config), opt_(options) {
  OLMO_CHECK(cfg_.model_type == ModelType::Olmo3, "Olmo3: config has model_type '", cfg_.model_type_name,
             "', expected olmo3");
  OLMO_CHECK(cfg_.hidden_act == "silu", "Olmo3: hidden_act '", cfg_.hidden_act, "' is not supported (silu)");
  OLMO_CHECK(!cfg_.tie_word_embeddings, "Olmo3: tie_word_embeddings=true is not supported");
  OLMO_CHECK(!cfg_.attention_bias, "Olmo3: attention_bias=true is not supported");
  OLMO_CHECK(cfg_.num_attention_heads % cfg_.num_key_value_heads == 0, "Olmo3: num_attention_heads ",
             cfg_.num_attention_heads, " is not a multiple of num_key_value_heads ",
             cfg_.num_key_value_heads);
  auto reg = param_registry(cfg_);
  params_.reserve(reg.size());
  std::map<std::string, int64_t> idx;
  for (const auto& p : reg) {
    idx[p.name] = int64_t(params_.size());
    Param q;
    q.name = p.name;
    q.value = Tensor::zeros(p.shape);
    q.grad = Tensor::zeros(p.shape);
    q.decay = !is_norm(p.name) && p.shape.size() >= 2;
    params_.push_back(std::move(q));
  }
  auto at = [&](const std::string& n) {
    auto it = idx.find(n);
    OLMO_CHECK(it != idx.end(), "Olmo3: registry has no tensor ", n);
    return it->second;
  };
  embed_ = at("model.embed_tokens.weight");
  norm_ = at("model.norm.weight");
  lm_head_ = at("lm_head.weight");
  for (int64_t l = 0; l < cfg_.num_hidden_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    Layer L;
    L.wq = at(p + "self_attn.q_proj.weight");
    L.wk = at(p + "self_attn.k_proj.weight");
    L.wv = at(p + "self_attn.v_proj.weight");
    L.wo = at(p + "self_attn.o_proj.weight");
    L.qn = at(p + "self_attn.q_norm.weight");
    L.kn = at(p + "self_attn.k_norm.weight");
    L.wg = at(p + "mlp.gate_proj.weight");
    L.wu = at(p + "mlp.up_proj.weight");
    L.wd = at(p + "mlp.down_proj.weight");
    L.pan = at(p + "post_attention_layernorm.weight");
    L.pfn = at(p + "post_feedforward_layernorm.weight");
    const LayerType t = cfg_.layer_types.at(size_t(l));
    OLMO_CHECK(t == LayerType::SlidingAttention || t == LayerType::FullAttention, "Olmo3: layer ", l,
               " has type ", layer_type_name(t), " (olmo3 has sliding_attention and full_attention only)");
    L.sliding = t == LayerType::SlidingAttention;
    layers_.push_back(L);
  }
  rope_full_ = olmo3_rope_frequencies(cfg_.rope_full, cfg_.head_dim, cfg_.max_position_embeddings);
  rope_sliding_ = opt_.yarn_on_all_layers ? rope_full_
                                          : olmo3_rope_frequencies(cfg_.rope_sliding, cfg_.head_dim,
                                                                   cfg_.max_position_embeddings);
}

Olmo3::~Olmo3() { delete w_; }

int64_t Olmo3::activation_floats_per_token(const ModelConfig& c) {
  const int64_t d = c.hidden_size, HD = c.num_attention_heads * c.head_dim,
                KD = c.num_key_value_heads * c.head_dim, F = c.intermediate_size, H = c.num_attention_heads,
                L = c.num_hidden_layers, D = c.head_dim;
  const int64_t per_layer = 2 * HD + 2 * KD + 3 * d + 2 * F + H + 4;  // saved
  const int64_t global = (L + 1) * d + d + 2 + 2 * D;                 // residual streams, final norm, rope
  const int64_t scratch = 3 * HD + 3 * KD + 2 * F + 2 * d;
  return L * per_layer + global + scratch;
}

size_t Olmo3::workspace_bytes() const {
  return w_ ? w_->block.nbytes() + w_->attn_ws_bytes + (w_->seg.size() + w_->pos.size()) * 4 : 0;
}

const float* Olmo3::hidden_state(int64_t index) const {
  OLMO_CHECK(w_ && index >= 0 && index <= cfg_.num_hidden_layers, "Olmo3::hidden_state: no state ", index);
  return w_->h[size_t(index)];
}

void Olmo3::prepare(const Batch& b) {
  OLMO_CHECK(b.B > 0 && b.T > 0, "olmo3: batch must have B > 0 and T > 0, got B=", b.B, " T=", b.T);
  OLMO_CHECK(b.tokens != nullptr, "olmo3: batch has no tokens");
  const int64_t N = b.B * b.T, V = cfg_.vocab_size;
  for (int64_t i = 0; i < N; ++i) {
    OLMO_CHECK(b.tokens[i] >= 0 && b.tokens[i] < V, "olmo3: token id ", b.tokens[i], " at row ", i / b.T,
               ", position ", i % b.T, " is outside the vocabulary [0, ", V, ")");
  }
  if (!w_ || w_->N < N) {
    delete w_;
    w_ = nullptr;
    auto* w = new Work();
    const int64_t d = cfg_.hidden_size, H = cfg_.num_attention_heads, D = cfg_.head_dim, HD = H * D,
                  KD = cfg_.num_key_value_heads * D, F = cfg_.intermediate_size, L = cfg_.num_hidden_layers;
    // First pass counts, second pass carves.
    std::vector<std::pair<float**, int64_t>> plan;
    w->h.assign(size_t(L + 1), nullptr);
    w->s.assign(size_t(L), {});
    for (auto& p : w->h) plan.push_back({&p, N * d});
    for (auto& s : w->s) {
      plan.insert(plan.end(), {{&s.qraw, N * HD},
                               {&s.kraw, N * KD},
                               {&s.v, N * KD},
                               {&s.o, N * HD},
                               {&s.lse, N * H},
                               {&s.rq, N},
                               {&s.rk, N},
                               {&s.a, N * d},
                               {&s.ra, N},
                               {&s.hmid, N * d},
                               {&s.gate, N * F},
                               {&s.up, N * F},
                               {&s.m, N * d},
                               {&s.rm, N}});
    }
    plan.insert(plan.end(), {{&w->hf, N * d},
                             {&w->rf, N},
                             {&w->xlse, N},
                             {&w->cos_s, N * D / 2},
                             {&w->sin_s, N * D / 2},
                             {&w->cos_f, N * D / 2},
                             {&w->sin_f, N * D / 2},
                             {&w->q, N * HD},
                             {&w->k, N * KD},
                             {&w->act, N * F},
                             {&w->dact, N * F},
                             {&w->dh, N * d},
                             {&w->dtmp, N * d},
                             {&w->dO, N * HD},
                             {&w->dq, N * HD},
                             {&w->dk, N * KD},
                             {&w->dv, N * KD}});
    int64_t total = 0;
    for (auto& [ptr, n] : plan) total += round_up(n);
    w->block = Tensor::empty({total});
    float* base = w->block.data<float>();
    int64_t off = 0;
    for (auto& [ptr, n] : plan) {
      *ptr = base + off;
      off += round_up(n);
    }
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
  size_t need = 0;
  for (int64_t win : {int64_t(0), cfg_.sliding_window}) {
    const AttentionConfig ac = attention_config(cfg_, b.B, b.T, win);
    need = std::max(
        {need, attention_forward_workspace_bytes<float>(ac), attention_backward_workspace_bytes<float>(ac)});
  }
  if (need > w_->attn_ws_bytes) {
    w_->attn_ws = Tensor::empty({int64_t(need)}, DType::U8);
    w_->attn_ws_bytes = need;
  }
}

void Olmo3::run_forward(const Batch& b) {
  Work& w = *w_;
  const int64_t N = b.B * b.T, d = cfg_.hidden_size, H = cfg_.num_attention_heads,
                Hkv = cfg_.num_key_value_heads, D = cfg_.head_dim, HD = H * D, KD = Hkv * D,
                F = cfg_.intermediate_size;
  const double eps = cfg_.rms_norm_eps;
  const int32_t* seg = b.segments ? b.segments : w.seg.data();
  const int32_t* pos = b.positions ? b.positions : w.pos.data();
  auto P = [&](int64_t i) { return params_[size_t(i)].value.data<float>(); };

  rope_tables<float>(rope_sliding_, pos, N, w.cos_s, w.sin_s);
  rope_tables<float>(rope_full_, pos, N, w.cos_f, w.sin_f);

  need(0);
  const float* E = P(embed_);
  float* h0 = w.h[0];
  parallel_for(
      N,
      [&](int64_t s, int64_t e) {
        for (int64_t i = s; i < e; ++i) std::memcpy(h0 + i * d, E + int64_t(b.tokens[i]) * d, size_t(d) * 4);
      },
      64);
  done(0);

  const int64_t last = int64_t(layers_.size()) + 1;  // residency group of the final norm and LM head
  for (size_t l = 0; l < layers_.size(); ++l) {
    need(int64_t(l) + 1);
    const Layer& Ly = layers_[l];
    auto& s = w.s[l];
    const float* x = w.h[l];
    float* y = w.h[l + 1];
    linear_forward<float>(x, P(Ly.wq), s.qraw, N, d, HD);
    linear_forward<float>(x, P(Ly.wk), s.kraw, N, d, KD);
    linear_forward<float>(x, P(Ly.wv), s.v, N, d, KD);
    rmsnorm_forward<float>(s.qraw, P(Ly.qn), w.q, s.rq, N, HD, eps);
    rmsnorm_forward<float>(s.kraw, P(Ly.kn), w.k, s.rk, N, KD, eps);
    const float* cs = Ly.sliding ? w.cos_s : w.cos_f;
    const float* sn = Ly.sliding ? w.sin_s : w.sin_f;
    rope_forward<float>(w.q, cs, sn, N, H, D, HD);
    rope_forward<float>(w.k, cs, sn, N, Hkv, D, KD);
    const AttentionConfig ac = attention_config(cfg_, b.B, b.T, Ly.sliding ? cfg_.sliding_window : 0);
    attention_forward<float>(ac, w.q, w.k, s.v, seg, s.o, s.lse, w.attn_ws.raw_data(), w.attn_ws_bytes);
    linear_forward<float>(s.o, P(Ly.wo), s.a, N, HD, d);
    rmsnorm_forward<float>(s.a, P(Ly.pan), w.dtmp, s.ra, N, d, eps);
    parallel_for(
        N * d,
        [&](int64_t bb, int64_t e) {
          for (int64_t i = bb; i < e; ++i) s.hmid[i] = x[i] + w.dtmp[i];
        },
        1 << 14);
    linear_forward<float>(s.hmid, P(Ly.wg), s.gate, N, d, F);
    linear_forward<float>(s.hmid, P(Ly.wu), s.up, N, d, F);
    swiglu_forward<float>(s.gate, s.up, w.act, N * F);
    linear_forward<float>(w.act, P(Ly.wd), s.m, N, F, d);
    rmsnorm_forward<float>(s.m, P(Ly.pfn), w.dtmp, s.rm, N, d, eps);
    parallel_for(
        N * d,
        [&](int64_t bb, int64_t e) {
          for (int64_t i = bb; i < e; ++i) y[i] = s.hmid[i] + w.dtmp[i];
        },
        1 << 14);
    done(int64_t(l) + 1);
  }
  need(last);  // released by forward() after the logits, by run_backward() after the final norm
  rmsnorm_forward<float>(w.h[layers_.size()], P(norm_), w.hf, w.rf, N, d, eps);
}

LossParts Olmo3::loss_forward(const Batch& b, const LossConfig& loss) {
  LossParts parts;
  if (!b.targets) return parts;
  XentConfig xc;
  xc.valid_vocab = cfg_.vocab_size;
  xc.z_loss = loss.lm_z;
  xc.vocab_chunk = loss.vocab_tile;
  const int64_t N = b.B * b.T;
  auto st = xent_forward<float>(w_->hf, params_[size_t(lm_head_)].value.data<float>(), b.targets, b.trained,
                                N, cfg_.hidden_size, cfg_.vocab_size, xc, w_->xlse);
  parts.ce_sum = st.ce_sum;
  parts.z_sum = st.z_sum;
  parts.tokens = st.count;
  return parts;
}

LossParts Olmo3::forward(const Batch& batch, const LossConfig& loss, float* logits, float* logprobs) {
  prepare(batch);
  run_forward(batch);
  LossParts parts = loss_forward(batch, loss);
  const int64_t N = batch.B * batch.T, d = cfg_.hidden_size, V = cfg_.vocab_size;
  const float* W = params_[size_t(lm_head_)].value.data<float>();
  if (logits) gemm<float>(Trans::N, Trans::T, N, V, d, 1.0f, w_->hf, d, W, d, 0.0f, logits, V);
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
  done(int64_t(layers_.size()) + 1);
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
  const int64_t N = b.B * b.T, d = cfg_.hidden_size, H = cfg_.num_attention_heads,
                Hkv = cfg_.num_key_value_heads, D = cfg_.head_dim, HD = H * D, KD = Hkv * D,
                F = cfg_.intermediate_size;
  const double eps = cfg_.rms_norm_eps;
  const int32_t* seg = b.segments ? b.segments : w.seg.data();
  auto P = [&](int64_t i) { return params_[size_t(i)].value.data<float>(); };
  auto G = [&](int64_t i) { return params_[size_t(i)].grad.data<float>(); };

  XentConfig xc;
  xc.valid_vocab = cfg_.vocab_size;
  xc.z_loss = loss.lm_z;
  xc.vocab_chunk = loss.vocab_tile;
  // dL/dhf into dtmp, then through the final norm into dh.
  xent_backward<float>(w.hf, P(lm_head_), b.targets, b.trained, w.xlse, N, d, cfg_.vocab_size, xc, grad_scale,
                       w.dtmp, G(lm_head_));
  rmsnorm_backward<float>(w.dtmp, w.h[layers_.size()], P(norm_), w.rf, w.dh, G(norm_), N, d, eps);
  done(int64_t(layers_.size()) + 1);

  for (size_t li = layers_.size(); li-- > 0;) {
    need(int64_t(li) + 1);
    const Layer& Ly = layers_[li];
    auto& s = w.s[li];
    const float* x = w.h[li];
    // MLP block: y = hmid + RMSNorm_ffn(m).
    rmsnorm_backward<float>(w.dh, s.m, P(Ly.pfn), s.rm, w.dtmp, G(Ly.pfn), N, d, eps);
    swiglu_forward<float>(s.gate, s.up, w.act, N * F);  // recompute the activation
    linear_backward<float>(w.dtmp, w.act, P(Ly.wd), w.dact, G(Ly.wd), N, F, d);
    // da (gate) overwrites dact (each element's dh is read before it is written); db (up) goes to act.
    swiglu_backward<float>(w.dact, F, s.gate, F, s.up, F, w.dact, F, w.act, F, N, F);
    linear_backward<float>(w.dact, s.hmid, P(Ly.wg), w.dh, G(Ly.wg), N, d, F, true);
    linear_backward<float>(w.act, s.hmid, P(Ly.wu), w.dh, G(Ly.wu), N, d, F, true);
    // Attention block: hmid = x + RMSNorm_attn(a).
    rmsnorm_backward<float>(w.dh, s.a, P(Ly.pan), s.ra, w.dtmp, G(Ly.pan), N, d, eps);
    linear_backward<float>(w.dtmp, s.o, P(Ly.wo), w.dO, G(Ly.wo), N, HD, d);
    // Recompute the normed, rotated q and k.
    rmsnorm_forward<float>(s.qraw, P(Ly.qn), w.q, nullptr, N, HD, eps);
    rmsnorm_forward<float>(s.kraw, P(Ly.kn), w.k, nullptr, N, KD, eps);
    const float* cs = Ly.sliding ? w.cos_s : w.cos_f;
    const float* sn = Ly.sliding ? w.sin_s : w.sin_f;
    rope_forward<float>(w.q, cs, sn, N, H, D, HD);
    rope_forward<float>(w.k, cs, sn, N, Hkv, D, KD);
    const AttentionConfig ac = attention_config(cfg_, b.B, b.T, Ly.sliding ? cfg_.sliding_window : 0);
    attention_backward<float>(ac, w.q, w.k, s.v, seg, s.o, s.lse, w.dO, w.dq, w.dk, w.dv,
                              w.attn_ws.raw_data(), w.attn_ws_bytes);
    rope_backward<float>(w.dq, cs, sn, N, H, D, HD);
    rope_backward<float>(w.dk, cs, sn, N, Hkv, D, KD);
    float* dqraw = w.dO;  // free after the attention backward
    float* dkraw = w.q;   // free after the attention backward (HD >= KD)
    rmsnorm_backward<float>(w.dq, s.qraw, P(Ly.qn), s.rq, dqraw, G(Ly.qn), N, HD, eps);
    rmsnorm_backward<float>(w.dk, s.kraw, P(Ly.kn), s.rk, dkraw, G(Ly.kn), N, KD, eps);
    linear_backward<float>(dqraw, x, P(Ly.wq), w.dh, G(Ly.wq), N, d, HD, true);
    linear_backward<float>(dkraw, x, P(Ly.wk), w.dh, G(Ly.wk), N, d, KD, true);
    linear_backward<float>(w.dv, x, P(Ly.wv), w.dh, G(Ly.wv), N, d, KD, true);
    done(int64_t(li) + 1);
  }
  // Embedding: dE[tok] += dh (columns split across threads, so the order per element is fixed).
  float* dE = G(embed_);
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
