// Olmo 3.5 hybrid model: forward/backward over registry-ordered parameters (see olmo3moe.h).
#include "model/olmo3moe.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <string>

#include "core/error.h"
#include "core/rng.h"
#include "kernels/attention.h"
#include "kernels/cross_entropy.h"
#include "kernels/gemm.h"
#include "kernels/kda.h"
#include "kernels/moe.h"
#include "kernels/rmsnorm.h"
#include "model/params.h"

namespace olmosft::model {

namespace {

template <typename T>
using Vec = std::vector<T>;

template <typename T>
Vec<T> zeros(int64_t n) {
  return Vec<T>(static_cast<size_t>(n), T(0));
}

template <typename T>
void add_into(T* dst, const T* src, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] += src[i];
}

// Grouped RMSNorm: N*G rows of length L; row r uses gain w + (r % G) * L (w holds G*L gains). Used for
// the attention q/k norms (per head: G = heads, L = head_dim; whole vector: G = 1, L = heads*head_dim).
template <typename T>
void group_rms_forward(const T* x, const T* w, int64_t rows, int64_t G, int64_t L, double eps, T* y,
                       T* rstd) {
#pragma omp parallel for schedule(static) if (rows * L >= (1 << 16))
  for (int64_t r = 0; r < rows; ++r) {
    const T* xr = x + r * L;
    double ss = 0;
    for (int64_t i = 0; i < L; ++i) ss += static_cast<double>(xr[i]) * xr[i];
    const double rs = 1.0 / std::sqrt(ss / static_cast<double>(L) + eps);
    rstd[r] = static_cast<T>(rs);
    const T* wr = w + (r % G) * L;
    for (int64_t i = 0; i < L; ++i) y[r * L + i] = static_cast<T>(static_cast<double>(xr[i]) * rs * wr[i]);
  }
}

template <typename T>
void group_rms_backward(const T* x, const T* w, const T* rstd, const T* dy, int64_t rows, int64_t G,
                        int64_t L, T* dx, T* dw) {
  Vec<double> dwacc(static_cast<size_t>(G * L), 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    const T* xr = x + r * L;
    const T* dyr = dy + r * L;
    const T* wr = w + (r % G) * L;
    const double rs = rstd[r];
    double m = 0;
    for (int64_t i = 0; i < L; ++i) m += static_cast<double>(xr[i]) * wr[i] * dyr[i];
    m /= static_cast<double>(L);
    double* dwr = dwacc.data() + (r % G) * L;
    for (int64_t i = 0; i < L; ++i) {
      const double gi = static_cast<double>(wr[i]) * dyr[i];
      dx[r * L + i] = static_cast<T>(rs * (gi - static_cast<double>(xr[i]) * rs * rs * m));
      dwr[i] += static_cast<double>(dyr[i]) * xr[i] * rs;
    }
  }
  if (dw != nullptr)
    for (int64_t i = 0; i < G * L; ++i) dw[i] += static_cast<T>(dwacc[static_cast<size_t>(i)]);
}

template <typename T>
T sigmoid(T x) {
  return static_cast<T>(1.0 / (1.0 + std::exp(-static_cast<double>(x))));
}

// Parameter indices of one layer.
struct LayerIdx {
  LayerType type = LayerType::LinearAttention;
  bool dense = false;
  int pre_attn = -1, post_attn = -1, pre_ffn = -1, post_ffn = -1;
  // mixer
  int q = -1, k = -1, v = -1, o = -1;
  int f1 = -1, f2 = -1, bproj = -1, A_log = -1, dt_bias = -1, qconv = -1, kconv = -1, vconv = -1, g1 = -1,
      g2 = -1, g2b = -1, onorm = -1;                  // KDA
  int qnorm = -1, knorm = -1, gate = -1, ssmax = -1;  // attention
  // ffn
  int mlp_g = -1, mlp_u = -1, mlp_d = -1;  // dense
  int router = -1, ldown = -1, lup = -1, sh_g = -1, sh_u = -1, sh_d = -1;
  std::vector<int> eg, eu, ed;
};

struct Layout {
  int embed = -1, embed_norm = -1, norm = -1, lm_head = -1;
  std::vector<LayerIdx> layers;
  size_t count = 0;
};

Layout make_layout(const ModelConfig& c) {
  const auto reg = param_registry(c);
  std::map<std::string, int> by;
  for (size_t i = 0; i < reg.size(); ++i) by[reg[i].name] = static_cast<int>(i);
  auto get = [&](const std::string& n, bool required = true) {
    auto it = by.find(n);
    OLMO_CHECK(it != by.end() || !required, "olmo3moe: parameter registry has no '", n, "'");
    return it == by.end() ? -1 : it->second;
  };
  Layout L;
  L.count = reg.size();
  L.embed = get("model.embed_tokens.weight");
  L.embed_norm = get("model.embed_norm.weight", false);
  L.norm = get("model.norm.weight");
  L.lm_head = c.tie_word_embeddings ? L.embed : get("lm_head.weight");
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    LayerIdx li;
    const std::string p = "model.layers." + std::to_string(i) + ".";
    const std::string a = p + "self_attn.", m = p + "mlp.";
    li.type = c.layer_types[static_cast<size_t>(i)];
    li.dense = c.is_dense_layer(i);
    li.pre_attn = get(p + "pre_attention_layernorm.weight");
    li.post_attn = get(p + "post_attention_layernorm.weight");
    li.pre_ffn = get(p + "pre_feedforward_layernorm.weight");
    li.post_ffn = get(p + "post_feedforward_layernorm.weight");
    li.q = get(a + "q_proj.weight");
    li.k = get(a + "k_proj.weight");
    li.v = get(a + "v_proj.weight");
    li.o = get(a + "o_proj.weight");
    if (li.type == LayerType::LinearAttention) {
      li.f1 = get(a + "f_proj_1.weight");
      li.f2 = get(a + "f_proj_2.weight");
      li.bproj = get(a + "beta_proj.weight");
      li.A_log = get(a + "A_log");
      li.dt_bias = get(a + "dt_bias");
      li.qconv = get(a + "q_conv1d.weight");
      li.kconv = get(a + "k_conv1d.weight");
      li.vconv = get(a + "v_conv1d.weight");
      li.g1 = get(a + "g_proj_1.weight");
      li.g2 = get(a + "g_proj_2.weight");
      li.g2b = get(a + "g_proj_2.bias");
      li.onorm = get(a + "o_norm.weight");
    } else {
      li.qnorm = get(a + "q_norm.weight");
      li.knorm = get(a + "k_norm.weight");
      li.gate = get(a + "g_proj.weight", false);
      li.ssmax = get(a + "ssmax_scale", false);
    }
    if (li.dense) {
      li.mlp_g = get(m + "gate_proj.weight");
      li.mlp_u = get(m + "up_proj.weight");
      li.mlp_d = get(m + "down_proj.weight");
    } else {
      li.router = get(m + "router.gate.weight");
      li.ldown = get(m + "latent_down_proj.weight", false);
      li.lup = get(m + "latent_up_proj.weight", false);
      for (int64_t e = 0; e < c.n_routed_experts; ++e) {
        const std::string x = m + "experts." + std::to_string(e) + ".";
        li.eg.push_back(get(x + "gate_proj.weight"));
        li.eu.push_back(get(x + "up_proj.weight"));
        li.ed.push_back(get(x + "down_proj.weight"));
      }
      li.sh_g = get(m + "shared_expert.gate_proj.weight", false);
      li.sh_u = get(m + "shared_expert.up_proj.weight", false);
      li.sh_d = get(m + "shared_expert.down_proj.weight", false);
    }
    L.layers.push_back(std::move(li));
  }
  return L;
}

template <typename T>
struct KdaCache {
  Vec<T> qin, kin, vin, qc, kc, vc, qn, kn, flow, f, g, blog, beta, o, glow, zg, y;
};

template <typename T>
struct AttnCache {
  Vec<T> q, k, v, qn, kn, qrs, krs, qs, o, lse, zg, og;
};

template <typename T>
struct LayerCache {
  Vec<T> h_in, x1, rs_pre_attn, a, rs_post_attn, h_mid, x2, rs_pre_ffn, f, rs_post_ffn;
  KdaCache<T> kda;
  AttnCache<T> attn;
  Vec<T> da, db, dh;  // dense FFN pre-activations and hidden
  moe::MoeCache<T> moe;
};

template <typename T>
size_t vec_bytes(const Vec<T>& v) {
  return v.size() * sizeof(T);
}

template <typename T>
size_t cache_bytes(const LayerCache<T>& l) {
  size_t n = 0;
  for (const Vec<T>* v : {&l.h_in, &l.x1, &l.rs_pre_attn, &l.a, &l.rs_post_attn, &l.h_mid, &l.x2,
                          &l.rs_pre_ffn, &l.f, &l.rs_post_ffn, &l.da, &l.db, &l.dh})
    n += vec_bytes(*v);
  const auto& k = l.kda;
  for (const Vec<T>* v : {&k.qin, &k.kin, &k.vin, &k.qc, &k.kc, &k.vc, &k.qn, &k.kn, &k.flow, &k.f, &k.g,
                          &k.blog, &k.beta, &k.o, &k.glow, &k.zg, &k.y})
    n += vec_bytes(*v);
  const auto& a = l.attn;
  for (const Vec<T>* v : {&a.q, &a.k, &a.v, &a.qn, &a.kn, &a.qrs, &a.krs, &a.qs, &a.o, &a.lse, &a.zg, &a.og})
    n += vec_bytes(*v);
  return n + l.moe.bytes();
}

template <typename T>
class Runner {
 public:
  Runner(const ModelConfig& c, const Olmo3MoeOptions& o, const std::vector<const T*>& w,
         const std::vector<T*>* g, const Batch& b)
      : c_(c), o_(o), w_(w), g_(g), b_(b), L_(make_layout(c)) {
    OLMO_CHECK(w.size() == L_.count, "olmo3moe: expected ", L_.count, " weight pointers, got ", w.size());
    OLMO_CHECK(g == nullptr || g->size() == L_.count, "olmo3moe: expected ", L_.count, " gradient pointers");
    OLMO_CHECK(b.B > 0 && b.T > 0, "olmo3moe: batch must have B > 0 and T > 0 (got B=", b.B, ", T=", b.T,
               ")");
    OLMO_CHECK(b.tokens != nullptr, "olmo3moe: batch has no tokens");
    N_ = b.B * b.T;
    d_ = c.hidden_size;
    seg_.resize(static_cast<size_t>(N_));
    for (int64_t i = 0; i < N_; ++i) seg_[static_cast<size_t>(i)] = b.segments ? b.segments[i] : 0;
    for (int64_t r = 0; r < b.B; ++r) attention_check_segments(seg_.data() + r * b.T, b.T, r);
    valid_.resize(static_cast<size_t>(N_));
    for (int64_t i = 0; i < N_; ++i)
      valid_[static_cast<size_t>(i)] = seg_[static_cast<size_t>(i)] >= 0 ? 1 : 0;
    // SSMax log-position factor.
    const auto starts = kda::segment_starts(seg_.data(), b.B, b.T);
    logpos_.resize(static_cast<size_t>(N_));
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
      logpos_[static_cast<size_t>(i)] = static_cast<T>(std::log(pos + 1.0));
    }
    for (int64_t i = 0; i < N_; ++i)
      OLMO_CHECK(b.tokens[i] >= 0 && b.tokens[i] < c.vocab_size, "olmo3moe: token id ", b.tokens[i],
                 " at row ", i / b.T, ", position ", i % b.T, " is outside [0, ", c.vocab_size, ")");
  }

  const T* W(int idx) const { return w_[static_cast<size_t>(idx)]; }
  T* G(int idx) const { return (g_ == nullptr || idx < 0) ? nullptr : (*g_)[static_cast<size_t>(idx)]; }

  LossParts run(const LossConfig& loss, double grad_scale, double aux_scale, float* logits, float* logprobs,
                Olmo3MoeRunInfo* info) {
    const bool bwd = g_ != nullptr;
    const double eps = c_.rms_norm_eps;
    LossParts lp;
    // Embedding: scale, then the embedding norm.
    Vec<T> e = zeros<T>(N_ * d_);
    const T* E = W(L_.embed);
    for (int64_t i = 0; i < N_; ++i)
      for (int64_t j = 0; j < d_; ++j)
        e[static_cast<size_t>(i * d_ + j)] = static_cast<T>(E[b_.tokens[i] * d_ + j] * c_.embed_scale);
    Vec<T> h(e.size()), e_rs(static_cast<size_t>(N_));
    if (L_.embed_norm >= 0)
      rmsnorm_forward(e.data(), W(L_.embed_norm), h.data(), e_rs.data(), N_, d_, eps);
    else
      h = e;
    std::vector<LayerCache<T>> caches(L_.layers.size());
    size_t saved = 0;
    for (size_t l = 0; l < L_.layers.size(); ++l) {
      const LayerIdx& li = L_.layers[l];
      LayerCache<T>& lc = caches[l];
      lc.h_in = h;
      lc.x1.resize(h.size());
      lc.rs_pre_attn.resize(static_cast<size_t>(N_));
      rmsnorm_forward(h.data(), W(li.pre_attn), lc.x1.data(), lc.rs_pre_attn.data(), N_, d_, eps);
      if (li.type == LayerType::LinearAttention)
        kda_forward(li, lc.x1.data(), lc);
      else
        attn_forward(li, lc.x1.data(), lc);
      Vec<T> t(h.size());
      lc.rs_post_attn.resize(static_cast<size_t>(N_));
      rmsnorm_forward(lc.a.data(), W(li.post_attn), t.data(), lc.rs_post_attn.data(), N_, d_, eps);
      add_into(h.data(), t.data(), N_ * d_);
      lc.h_mid = h;
      lc.x2.resize(h.size());
      lc.rs_pre_ffn.resize(static_cast<size_t>(N_));
      rmsnorm_forward(h.data(), W(li.pre_ffn), lc.x2.data(), lc.rs_pre_ffn.data(), N_, d_, eps);
      lc.f.resize(h.size());
      if (li.dense) {
        const int64_t F = c_.dense_mlp_intermediate_size;
        lc.da.resize(static_cast<size_t>(N_ * F));
        lc.db.resize(lc.da.size());
        lc.dh.resize(lc.da.size());
        moe::swiglu_mlp_forward(lc.x2.data(), W(li.mlp_g), W(li.mlp_u), W(li.mlp_d), N_, d_, F, lc.da.data(),
                                lc.db.data(), lc.dh.data(), lc.f.data());
      } else {
        auto st = moe::moe_forward(moe_dims(loss), moe_weights(li), lc.x2.data(), valid_.data(), N_,
                                   lc.f.data(), lc.moe);
        MoeLayerStats ms;
        ms.layer = static_cast<int64_t>(l);
        ms.lb_loss = st.lb;
        ms.router_z = st.router_z;
        ms.required_buffer_factor = st.required_buffer_factor;
        ms.dropped_tokens = st.dropped;
        lp.moe_lb += loss.moe_lb * st.lb;
        lp.router_z += loss.router_z * st.router_z;
        lp.moe_layers.push_back(ms);
      }
      lc.rs_post_ffn.resize(static_cast<size_t>(N_));
      rmsnorm_forward(lc.f.data(), W(li.post_ffn), t.data(), lc.rs_post_ffn.data(), N_, d_, eps);
      add_into(h.data(), t.data(), N_ * d_);
      if (!bwd) {
        caches[l] = LayerCache<T>{};  // forward only: nothing to keep
      } else {
        saved += cache_bytes(lc);
      }
    }
    // Final norm and LM head.
    Vec<T> hn(h.size()), hn_rs(static_cast<size_t>(N_));
    rmsnorm_forward(h.data(), W(L_.norm), hn.data(), hn_rs.data(), N_, d_, eps);
    const T* Wlm = W(L_.lm_head);
    const int64_t V = c_.vocab_size;
    std::vector<int32_t> targets(static_cast<size_t>(N_), -100);
    std::vector<uint8_t> mask(static_cast<size_t>(N_), 0);
    if (b_.targets != nullptr && b_.trained != nullptr) {
      for (int64_t i = 0; i < N_; ++i) {
        if (!b_.trained[i] || !valid_[static_cast<size_t>(i)]) continue;
        OLMO_CHECK(b_.targets[i] >= 0 && b_.targets[i] < V, "olmo3moe: trained target ", b_.targets[i],
                   " at row ", i / b_.T, ", position ", i % b_.T, " is outside [0, ", V, ")");
        targets[static_cast<size_t>(i)] = b_.targets[i];
        mask[static_cast<size_t>(i)] = 1;
      }
    }
    XentConfig xc;
    xc.valid_vocab = V;
    xc.z_loss = loss.lm_z;
    xc.vocab_chunk = loss.vocab_tile;
    Vec<T> lse(static_cast<size_t>(N_));
    XentStats xs = xent_forward(hn.data(), Wlm, targets.data(), mask.data(), N_, d_, V, xc, lse.data());
    lp.ce_sum = xs.ce_sum;
    lp.z_sum = xs.z_sum;
    lp.tokens = xs.count;
    if (logits != nullptr) {
      Vec<T> lg(static_cast<size_t>(N_ * V));
      linear_forward(hn.data(), Wlm, lg.data(), N_, d_, V);
      for (size_t i = 0; i < lg.size(); ++i) logits[i] = static_cast<float>(lg[i]);
    }
    if (logprobs != nullptr) {
      for (int64_t i = 0; i < N_; ++i) {
        if (!mask[static_cast<size_t>(i)]) {
          logprobs[i] = 0.0f;
          continue;
        }
        double dot = 0;
        const T* wr = Wlm + static_cast<int64_t>(targets[static_cast<size_t>(i)]) * d_;
        for (int64_t j = 0; j < d_; ++j)
          dot += static_cast<double>(hn[static_cast<size_t>(i * d_ + j)]) * wr[j];
        logprobs[i] = static_cast<float>(dot - static_cast<double>(lse[static_cast<size_t>(i)]));
      }
    }
    if (info != nullptr) info->saved_bytes = saved;
    if (!bwd) return lp;

    // ---------------- backward ----------------
    Vec<T> dhn(h.size()), dh(h.size()), tmp(h.size());
    xent_backward(hn.data(), Wlm, targets.data(), mask.data(), lse.data(), N_, d_, V, xc, grad_scale,
                  dhn.data(), G(L_.lm_head));
    rmsnorm_backward(dhn.data(), h.data(), W(L_.norm), hn_rs.data(), dh.data(), G(L_.norm), N_, d_, eps);
    for (size_t l = L_.layers.size(); l-- > 0;) {
      const LayerIdx& li = L_.layers[l];
      LayerCache<T>& lc = caches[l];
      // h_out = h_mid + RMS_post_ffn(f)
      Vec<T> df(h.size());
      rmsnorm_backward(dh.data(), lc.f.data(), W(li.post_ffn), lc.rs_post_ffn.data(), df.data(),
                       G(li.post_ffn), N_, d_, eps);
      Vec<T> dx2(h.size());
      if (li.dense) {
        const int64_t F = c_.dense_mlp_intermediate_size;
        moe::swiglu_mlp_backward(lc.x2.data(), W(li.mlp_g), W(li.mlp_u), W(li.mlp_d), N_, d_, F, lc.da.data(),
                                 lc.db.data(), lc.dh.data(), df.data(), dx2.data(), G(li.mlp_g), G(li.mlp_u),
                                 G(li.mlp_d), false);
      } else {
        moe::moe_backward(moe_dims(loss), moe_weights(li), moe_grads(li), lc.x2.data(), lc.moe, df.data(),
                          aux_scale * loss.moe_lb, aux_scale * loss.router_z, dx2.data());
      }
      rmsnorm_backward(dx2.data(), lc.h_mid.data(), W(li.pre_ffn), lc.rs_pre_ffn.data(), tmp.data(),
                       G(li.pre_ffn), N_, d_, eps);
      add_into(dh.data(), tmp.data(), N_ * d_);
      // h_mid = h_in + RMS_post_attn(a)
      Vec<T> da(h.size());
      rmsnorm_backward(dh.data(), lc.a.data(), W(li.post_attn), lc.rs_post_attn.data(), da.data(),
                       G(li.post_attn), N_, d_, eps);
      Vec<T> dx1(h.size());
      if (li.type == LayerType::LinearAttention)
        kda_backward(li, lc.x1.data(), lc, da.data(), dx1.data());
      else
        attn_backward(li, lc.x1.data(), lc, da.data(), dx1.data());
      rmsnorm_backward(dx1.data(), lc.h_in.data(), W(li.pre_attn), lc.rs_pre_attn.data(), tmp.data(),
                       G(li.pre_attn), N_, d_, eps);
      add_into(dh.data(), tmp.data(), N_ * d_);
      caches[l] = LayerCache<T>{};
    }
    Vec<T> de(h.size());
    if (L_.embed_norm >= 0)
      rmsnorm_backward(dh.data(), e.data(), W(L_.embed_norm), e_rs.data(), de.data(), G(L_.embed_norm), N_,
                       d_, eps);
    else
      de = dh;
    if (T* dE = G(L_.embed)) {
      for (int64_t i = 0; i < N_; ++i) {
        T* row = dE + static_cast<int64_t>(b_.tokens[i]) * d_;
        for (int64_t j = 0; j < d_; ++j)
          row[j] += static_cast<T>(de[static_cast<size_t>(i * d_ + j)] * c_.embed_scale);
      }
    }
    return lp;
  }

 private:
  moe::MoeDims moe_dims(const LossConfig& loss) const {
    moe::MoeDims m;
    m.d = d_;
    m.experts = c_.n_routed_experts;
    m.top_k = c_.num_experts_per_tok;
    m.expert_hidden = c_.moe_intermediate_size;
    m.latent = c_.latent_moe_dim;
    m.shared_hidden = c_.shared_expert_intermediate_size;
    if (c_.original_num_experts_per_tok && *c_.original_num_experts_per_tok != c_.num_experts_per_tok)
      m.weight_mult = std::sqrt(static_cast<double>(*c_.original_num_experts_per_tok) /
                                static_cast<double>(c_.num_experts_per_tok));
    m.buffer_factor = loss.moe_buffer_factor;
    return m;
  }
  moe::MoeWeights<T> moe_weights(const LayerIdx& li) const {
    moe::MoeWeights<T> m;
    m.router = W(li.router);
    if (li.ldown >= 0) {
      m.latent_down = W(li.ldown);
      m.latent_up = W(li.lup);
    }
    for (size_t e = 0; e < li.eg.size(); ++e) {
      m.gate.push_back(W(li.eg[e]));
      m.up.push_back(W(li.eu[e]));
      m.down.push_back(W(li.ed[e]));
    }
    if (li.sh_g >= 0) {
      m.shared_gate = W(li.sh_g);
      m.shared_up = W(li.sh_u);
      m.shared_down = W(li.sh_d);
    }
    return m;
  }
  moe::MoeGrads<T> moe_grads(const LayerIdx& li) const {
    moe::MoeGrads<T> m;
    m.router = G(li.router);
    m.latent_down = G(li.ldown);
    m.latent_up = G(li.lup);
    for (size_t e = 0; e < li.eg.size(); ++e) {
      m.gate.push_back(G(li.eg[e]));
      m.up.push_back(G(li.eu[e]));
      m.down.push_back(G(li.ed[e]));
    }
    m.shared_gate = G(li.sh_g);
    m.shared_up = G(li.sh_u);
    m.shared_down = G(li.sh_d);
    return m;
  }

  kda::KdaDims kdims() const {
    kda::KdaDims kd;
    kd.B = b_.B;
    kd.L = b_.T;
    kd.H = c_.linear_num_key_heads;
    kd.K = c_.linear_key_head_dim;
    kd.V = c_.linear_value_head_dim;
    return kd;
  }
  int64_t rank() const { return c_.linear_value_head_dim; }

  void kda_forward(const LayerIdx& li, const T* x, LayerCache<T>& lc) {
    auto& k = lc.kda;
    const auto kd = kdims();
    const int64_t H = kd.H, Dk = kd.K, Dv = kd.V, KD = H * Dk, VD = H * Dv, R = rank(),
                  C = c_.linear_conv_kernel_dim;
    k.qin.resize(static_cast<size_t>(N_ * KD));
    k.kin.resize(k.qin.size());
    k.vin.resize(static_cast<size_t>(N_ * VD));
    linear_forward(x, W(li.q), k.qin.data(), N_, d_, KD);
    linear_forward(x, W(li.k), k.kin.data(), N_, d_, KD);
    linear_forward(x, W(li.v), k.vin.data(), N_, d_, VD);
    k.qc.resize(k.qin.size());
    k.kc.resize(k.kin.size());
    k.vc.resize(k.vin.size());
    kda::short_conv_silu_forward(k.qin.data(), W(li.qconv), seg_.data(), b_.B, b_.T, KD, C, k.qc.data());
    kda::short_conv_silu_forward(k.kin.data(), W(li.kconv), seg_.data(), b_.B, b_.T, KD, C, k.kc.data());
    kda::short_conv_silu_forward(k.vin.data(), W(li.vconv), seg_.data(), b_.B, b_.T, VD, C, k.vc.data());
    k.qn.resize(k.qc.size());
    k.kn.resize(k.kc.size());
    kda::l2norm_forward(k.qc.data(), N_ * H, Dk, static_cast<T>(kda::kL2NormEps), k.qn.data());
    kda::l2norm_forward(k.kc.data(), N_ * H, Dk, static_cast<T>(kda::kL2NormEps), k.kn.data());
    k.flow.resize(static_cast<size_t>(N_ * R));
    linear_forward(x, W(li.f1), k.flow.data(), N_, d_, R);
    k.f.resize(static_cast<size_t>(N_ * KD));
    linear_forward(k.flow.data(), W(li.f2), k.f.data(), N_, R, KD);
    k.g.resize(k.f.size());
    kda::kda_gate_forward(k.f.data(), W(li.A_log), W(li.dt_bias), N_, H, Dk, k.g.data());
    k.blog.resize(static_cast<size_t>(N_ * H));
    linear_forward(x, W(li.bproj), k.blog.data(), N_, d_, H);
    k.beta.resize(k.blog.size());
    kda::kda_beta_forward(k.blog.data(), N_ * H, c_.linear_allow_neg_eigval, k.beta.data());
    k.o.resize(static_cast<size_t>(N_ * VD));
    const T scale = static_cast<T>(1.0 / std::sqrt(static_cast<double>(Dk)));
    if (o_.kda_recurrent)
      kda::kda_recurrent_forward(k.qn.data(), k.kn.data(), k.vc.data(), k.g.data(), k.beta.data(),
                                 seg_.data(), kd, scale, k.o.data());
    else
      kda::kda_chunk_forward(k.qn.data(), k.kn.data(), k.vc.data(), k.g.data(), k.beta.data(), seg_.data(),
                             kd, scale, k.o.data(), o_.kda_chunk);
    k.glow.resize(static_cast<size_t>(N_ * R));
    linear_forward(x, W(li.g1), k.glow.data(), N_, d_, R);
    k.zg.resize(static_cast<size_t>(N_ * VD));
    linear_forward(k.glow.data(), W(li.g2), k.zg.data(), N_, R, VD);
    const T* bias = W(li.g2b);
    for (int64_t i = 0; i < N_; ++i) add_into(k.zg.data() + i * VD, bias, VD);
    k.y.resize(k.o.size());
    kda::kda_output_norm_forward(k.o.data(), k.zg.data(), W(li.onorm), N_ * H, Dv,
                                 static_cast<T>(c_.linear_norm_eps), k.y.data());
    lc.a.resize(static_cast<size_t>(N_ * d_));
    linear_forward(k.y.data(), W(li.o), lc.a.data(), N_, VD, d_);
  }

  void kda_backward(const LayerIdx& li, const T* x, LayerCache<T>& lc, const T* da, T* dx) {
    auto& k = lc.kda;
    const auto kd = kdims();
    const int64_t H = kd.H, Dk = kd.K, Dv = kd.V, KD = H * Dk, VD = H * Dv, R = rank(),
                  C = c_.linear_conv_kernel_dim;
    Vec<T> dy(k.y.size()), dO(k.o.size()), dzg(k.zg.size());
    linear_backward(da, k.y.data(), W(li.o), dy.data(), G(li.o), N_, VD, d_);
    Vec<T> donorm_dummy;
    T* donw = G(li.onorm);
    if (donw == nullptr) {
      donorm_dummy.assign(static_cast<size_t>(Dv), T(0));
      donw = donorm_dummy.data();
    }
    kda::kda_output_norm_backward(k.o.data(), k.zg.data(), W(li.onorm), dy.data(), N_ * H, Dv,
                                  static_cast<T>(c_.linear_norm_eps), dO.data(), dzg.data(), donw);
    if (T* db = G(li.g2b))
      for (int64_t i = 0; i < N_; ++i) add_into(db, dzg.data() + i * VD, VD);
    Vec<T> dglow(k.glow.size());
    linear_backward(dzg.data(), k.glow.data(), W(li.g2), dglow.data(), G(li.g2), N_, R, VD);
    linear_backward(dglow.data(), x, W(li.g1), dx, G(li.g1), N_, d_, R, false);
    Vec<T> dq(k.qn.size()), dk(k.kn.size()), dv(k.vc.size()), dg(k.g.size()), dbeta(k.beta.size());
    const T scale = static_cast<T>(1.0 / std::sqrt(static_cast<double>(Dk)));
    if (o_.kda_recurrent)
      kda::kda_recurrent_backward(k.qn.data(), k.kn.data(), k.vc.data(), k.g.data(), k.beta.data(),
                                  seg_.data(), kd, scale, dO.data(), dq.data(), dk.data(), dv.data(),
                                  dg.data(), dbeta.data());
    else
      kda::kda_chunk_backward(k.qn.data(), k.kn.data(), k.vc.data(), k.g.data(), k.beta.data(), seg_.data(),
                              kd, scale, dO.data(), dq.data(), dk.data(), dv.data(), dg.data(), dbeta.data(),
                              o_.kda_chunk);
    Vec<T> dblog(k.blog.size());
    kda::kda_beta_backward(k.blog.data(), dbeta.data(), N_ * H, c_.linear_allow_neg_eigval, dblog.data());
    linear_backward(dblog.data(), x, W(li.bproj), dx, G(li.bproj), N_, d_, H, true);
    Vec<T> df(k.f.size());
    Vec<T> dA_dummy, ddt_dummy;
    T* dA = G(li.A_log);
    T* ddt = G(li.dt_bias);
    if (dA == nullptr) {
      dA_dummy.assign(static_cast<size_t>(H), T(0));
      ddt_dummy.assign(static_cast<size_t>(KD), T(0));
      dA = dA_dummy.data();
      ddt = ddt_dummy.data();
    }
    kda::kda_gate_backward(k.f.data(), W(li.A_log), W(li.dt_bias), dg.data(), N_, H, Dk, df.data(), dA, ddt);
    Vec<T> dflow(k.flow.size());
    linear_backward(df.data(), k.flow.data(), W(li.f2), dflow.data(), G(li.f2), N_, R, KD);
    linear_backward(dflow.data(), x, W(li.f1), dx, G(li.f1), N_, d_, R, true);
    // q, k, v: l2norm, conv + SiLU, projection.
    Vec<T> dc(std::max(k.qc.size(), k.vc.size())), din(dc.size());
    Vec<T> dconv_dummy;
    auto conv_grad = [&](int idx, int64_t CC) -> T* {
      T* p = G(idx);
      if (p) return p;
      dconv_dummy.assign(static_cast<size_t>(CC * C), T(0));
      return dconv_dummy.data();
    };
    kda::l2norm_backward(k.qc.data(), dq.data(), N_ * H, Dk, static_cast<T>(kda::kL2NormEps), dc.data());
    kda::short_conv_silu_backward(k.qin.data(), W(li.qconv), seg_.data(), b_.B, b_.T, KD, C, dc.data(),
                                  din.data(), conv_grad(li.qconv, KD));
    linear_backward(din.data(), x, W(li.q), dx, G(li.q), N_, d_, KD, true);
    kda::l2norm_backward(k.kc.data(), dk.data(), N_ * H, Dk, static_cast<T>(kda::kL2NormEps), dc.data());
    kda::short_conv_silu_backward(k.kin.data(), W(li.kconv), seg_.data(), b_.B, b_.T, KD, C, dc.data(),
                                  din.data(), conv_grad(li.kconv, KD));
    linear_backward(din.data(), x, W(li.k), dx, G(li.k), N_, d_, KD, true);
    kda::short_conv_silu_backward(k.vin.data(), W(li.vconv), seg_.data(), b_.B, b_.T, VD, C, dv.data(),
                                  din.data(), conv_grad(li.vconv, VD));
    linear_backward(din.data(), x, W(li.v), dx, G(li.v), N_, d_, VD, true);
  }

  AttentionConfig attn_config(const LayerIdx& li) const {
    AttentionConfig ac;
    ac.batch = b_.B;
    ac.seq = b_.T;
    ac.heads = c_.num_attention_heads;
    ac.kv_heads = c_.num_key_value_heads;
    ac.head_dim = c_.head_dim;
    ac.v_head_dim = c_.head_dim;
    ac.window = li.type == LayerType::SlidingAttention ? c_.sliding_window : 0;
    ac.scale = 1.0 / std::sqrt(static_cast<double>(c_.head_dim));
    return ac;
  }

  void qk_norm_shape(bool is_q, int64_t* G, int64_t* Ls) const {
    const int64_t H = is_q ? c_.num_attention_heads : c_.num_key_value_heads, D = c_.head_dim;
    *G = c_.use_head_qk_norm ? H : 1;
    *Ls = c_.use_head_qk_norm ? D : H * D;
  }

  void attn_forward(const LayerIdx& li, const T* x, LayerCache<T>& lc) {
    auto& a = lc.attn;
    const auto ac = attn_config(li);
    const int64_t H = ac.heads, Hkv = ac.kv_heads, D = ac.head_dim, QD = H * D, KVD = Hkv * D;
    a.q.resize(static_cast<size_t>(N_ * QD));
    a.k.resize(static_cast<size_t>(N_ * KVD));
    a.v.resize(a.k.size());
    linear_forward(x, W(li.q), a.q.data(), N_, d_, QD);
    linear_forward(x, W(li.k), a.k.data(), N_, d_, KVD);
    linear_forward(x, W(li.v), a.v.data(), N_, d_, KVD);
    int64_t Gq, Lq, Gk, Lk;
    qk_norm_shape(true, &Gq, &Lq);
    qk_norm_shape(false, &Gk, &Lk);
    a.qn.resize(a.q.size());
    a.kn.resize(a.k.size());
    a.qrs.resize(static_cast<size_t>(N_ * Gq));
    a.krs.resize(static_cast<size_t>(N_ * Gk));
    group_rms_forward(a.q.data(), W(li.qnorm), N_ * Gq, Gq, Lq, c_.rms_norm_eps, a.qn.data(), a.qrs.data());
    group_rms_forward(a.k.data(), W(li.knorm), N_ * Gk, Gk, Lk, c_.rms_norm_eps, a.kn.data(), a.krs.data());
    const T* qs_in = a.qn.data();
    if (li.ssmax >= 0) {
      a.qs.resize(a.qn.size());
      const T* s = W(li.ssmax);
      for (int64_t i = 0; i < N_; ++i)
        for (int64_t hh = 0; hh < H; ++hh) {
          const T f = logpos_[static_cast<size_t>(i)] * s[hh];
          for (int64_t j = 0; j < D; ++j)
            a.qs[static_cast<size_t>((i * H + hh) * D + j)] =
                a.qn[static_cast<size_t>((i * H + hh) * D + j)] * f;
        }
      qs_in = a.qs.data();
    }
    a.o.resize(a.q.size());
    a.lse.resize(static_cast<size_t>(N_ * H));
    Vec<T> ws(attention_forward_workspace_bytes<T>(ac) / sizeof(T) + 16);
    attention_forward(ac, qs_in, a.kn.data(), a.v.data(), seg_.data(), a.o.data(), a.lse.data(), ws.data(),
                      ws.size() * sizeof(T));
    const T* og = a.o.data();
    if (li.gate >= 0) {
      a.zg.resize(a.o.size());
      linear_forward(x, W(li.gate), a.zg.data(), N_, d_, QD);
      a.og.resize(a.o.size());
      for (size_t i = 0; i < a.o.size(); ++i) a.og[i] = a.o[i] * sigmoid(a.zg[i]);
      og = a.og.data();
    }
    lc.a.resize(static_cast<size_t>(N_ * d_));
    linear_forward(og, W(li.o), lc.a.data(), N_, QD, d_);
  }

  void attn_backward(const LayerIdx& li, const T* x, LayerCache<T>& lc, const T* da, T* dx) {
    auto& a = lc.attn;
    const auto ac = attn_config(li);
    const int64_t H = ac.heads, Hkv = ac.kv_heads, D = ac.head_dim, QD = H * D, KVD = Hkv * D;
    Vec<T> dog(a.o.size());
    const T* og = li.gate >= 0 ? a.og.data() : a.o.data();
    linear_backward(da, og, W(li.o), dog.data(), G(li.o), N_, QD, d_);
    Vec<T> dO(a.o.size());
    bool dx_written = false;
    if (li.gate >= 0) {
      Vec<T> dz(a.o.size());
      for (size_t i = 0; i < a.o.size(); ++i) {
        const T s = sigmoid(a.zg[i]);
        dO[i] = dog[i] * s;
        dz[i] = dog[i] * a.o[i] * s * (T(1) - s);
      }
      linear_backward(dz.data(), x, W(li.gate), dx, G(li.gate), N_, d_, QD, false);
      dx_written = true;
    } else {
      dO = dog;
    }
    Vec<T> dqs(a.q.size()), dkn(a.k.size()), dv(a.v.size());
    const T* qs_in = li.ssmax >= 0 ? a.qs.data() : a.qn.data();
    Vec<T> ws(attention_backward_workspace_bytes<T>(ac) / sizeof(T) + 16);
    attention_backward(ac, qs_in, a.kn.data(), a.v.data(), seg_.data(), a.o.data(), a.lse.data(), dO.data(),
                       dqs.data(), dkn.data(), dv.data(), ws.data(), ws.size() * sizeof(T));
    Vec<T> dqn(a.q.size());
    if (li.ssmax >= 0) {
      const T* s = W(li.ssmax);
      Vec<double> ds(static_cast<size_t>(H), 0.0);
      for (int64_t i = 0; i < N_; ++i)
        for (int64_t hh = 0; hh < H; ++hh) {
          const double lpv = logpos_[static_cast<size_t>(i)];
          double dot = 0;
          const size_t base = static_cast<size_t>((i * H + hh) * D);
          for (int64_t j = 0; j < D; ++j) {
            dot += static_cast<double>(dqs[base + j]) * a.qn[base + j];
            dqn[base + j] = static_cast<T>(dqs[base + j] * lpv * s[hh]);
          }
          ds[static_cast<size_t>(hh)] += lpv * dot;
        }
      if (T* gs = G(li.ssmax))
        for (int64_t hh = 0; hh < H; ++hh) gs[hh] += static_cast<T>(ds[static_cast<size_t>(hh)]);
    } else {
      dqn = dqs;
    }
    int64_t Gq, Lq, Gk, Lk;
    qk_norm_shape(true, &Gq, &Lq);
    qk_norm_shape(false, &Gk, &Lk);
    Vec<T> dq(a.q.size()), dk(a.k.size());
    group_rms_backward(a.q.data(), W(li.qnorm), a.qrs.data(), dqn.data(), N_ * Gq, Gq, Lq, dq.data(),
                       G(li.qnorm));
    group_rms_backward(a.k.data(), W(li.knorm), a.krs.data(), dkn.data(), N_ * Gk, Gk, Lk, dk.data(),
                       G(li.knorm));
    linear_backward(dq.data(), x, W(li.q), dx, G(li.q), N_, d_, QD, dx_written);
    linear_backward(dk.data(), x, W(li.k), dx, G(li.k), N_, d_, KVD, true);
    linear_backward(dv.data(), x, W(li.v), dx, G(li.v), N_, d_, KVD, true);
  }

  const ModelConfig& c_;
  const Olmo3MoeOptions& o_;
  const std::vector<const T*>& w_;
  const std::vector<T*>* g_;
  const Batch& b_;
  Layout L_;
  int64_t N_ = 0, d_ = 0;
  std::vector<int32_t> seg_;
  std::vector<uint8_t> valid_;
  Vec<T> logpos_;
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
  Runner<T> r(c, opts, w, grads, batch);
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

Olmo3MoeModel::Olmo3MoeModel(const ModelConfig& c, uint64_t seed, const Olmo3MoeOptions& opts)
    : config_(c), opts_(opts) {
  olmo3moe_check_supported(c);
  const auto reg = param_registry(c);
  params_.reserve(reg.size());
  for (size_t i = 0; i < reg.size(); ++i) {
    const ParamSpec& s = reg[i];
    Param p;
    p.name = s.name;
    p.value = Tensor::zeros(s.shape, DType::F32);
    p.grad = Tensor::zeros(s.shape, DType::F32);
    const std::string& n = s.name;
    auto ends = [&](const std::string& suf) {
      return n.size() >= suf.size() && n.compare(n.size() - suf.size(), suf.size(), suf) == 0;
    };
    const bool is_norm = ends("layernorm.weight") || ends("norm.weight");  // incl. q_norm/k_norm/o_norm
    const bool is_bias = ends(".bias");
    const Rng rng{seed, static_cast<uint64_t>(i)};
    if (ends("A_log")) {
      fill_uniform(p.value, rng, 1.0f, 16.0f);
      float* v = p.value.data<float>();
      for (int64_t j = 0; j < p.value.numel(); ++j) v[j] = std::log(v[j]);
      p.decay = false;
    } else if (ends("dt_bias") || is_bias) {
      p.decay = false;  // zeros
    } else if (is_norm) {
      p.value.fill(1.0f);
      p.decay = false;
    } else if (ends("ssmax_scale")) {
      p.value.fill(1.0f);
      p.decay = false;
    } else {
      fill_normal(p.value, rng, 0.0f, static_cast<float>(c.initializer_range));
    }
    params_.push_back(std::move(p));
  }
}

LossParts Olmo3MoeModel::forward_backward(const Batch& batch, const LossConfig& loss, double grad_scale,
                                          double aux_scale) {
  std::vector<const float*> w;
  std::vector<float*> g;
  for (auto& p : params_) {
    w.push_back(p.value.data<float>());
    g.push_back(p.grad.data<float>());
  }
  return olmo3moe_run<float>(config_, opts_, w, &g, batch, loss, grad_scale, aux_scale, nullptr, nullptr,
                             &info_);
}

LossParts Olmo3MoeModel::forward(const Batch& batch, const LossConfig& loss, float* logits, float* logprobs) {
  std::vector<const float*> w;
  for (auto& p : params_) w.push_back(p.value.data<float>());
  return olmo3moe_run<float>(config_, opts_, w, nullptr, batch, loss, 1.0, 1.0, logits, logprobs, &info_);
}

std::unique_ptr<CausalLM> make_olmo3moe(const ModelConfig& c, uint64_t seed, const Olmo3MoeOptions& opts) {
  return std::make_unique<Olmo3MoeModel>(c, seed, opts);
}

}  // namespace olmosft::model
