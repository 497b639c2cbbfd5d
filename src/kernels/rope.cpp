#include "kernels/rope.h"

#include <cmath>

#include "core/error.h"
#include "core/threads.h"

namespace olmosft {

void RopeConfig::validate(const std::string& context) const {
  OLMO_CHECK(rope_type == "default" || rope_type == "yarn", context, ": rope_type '", rope_type,
             "' is not supported (expected 'default' or 'yarn')");
  OLMO_CHECK(head_dim > 0 && head_dim % 2 == 0, context, ": head_dim must be a positive even number, got ",
             head_dim);
  OLMO_CHECK(std::isfinite(theta) && theta > 1.0, context, ": rope_theta must be > 1, got ", theta);
  if (rope_type == "yarn") {
    OLMO_CHECK(std::isfinite(factor) && factor > 0, context, ": yarn factor must be > 0, got ", factor);
    if (original_max_position_embeddings) {
      OLMO_CHECK(*original_max_position_embeddings > 0, context,
                 ": original_max_position_embeddings must be > 0, got ", *original_max_position_embeddings);
      OLMO_CHECK(max_position_embeddings > 0, context,
                 ": max_position_embeddings must be > 0 when original_max_position_embeddings is given");
    } else {
      OLMO_CHECK(max_position_embeddings > 0, context, ": max_position_embeddings must be > 0 for yarn");
    }
    OLMO_CHECK(std::isfinite(beta_fast) && beta_fast > 0 && std::isfinite(beta_slow) && beta_slow > 0,
               context, ": beta_fast/beta_slow must be > 0, got ", beta_fast, "/", beta_slow);
    if (attention_factor)
      OLMO_CHECK(std::isfinite(*attention_factor) && *attention_factor > 0, context,
                 ": attention_factor must be > 0, got ", *attention_factor);
  }
}

namespace {
// HF's pos_freqs: base ** (arange(0, dim, 2).float() / dim), all fp32. torch's float pow returned the
// correctly rounded value for every exponent checked (D = 16, 32, 128), while glibc powf differs by
// 1 ulp for some, so the power is evaluated in double and rounded once.
float pos_freq(double theta, int64_t i, int64_t dim) {
  const float e = float(2 * i) / float(dim);
  return float(std::pow(double(float(theta)), double(e)));
}
double yarn_mscale(double scale, double m) { return scale <= 1 ? 1.0 : 0.1 * m * std::log(scale) + 1.0; }
}  // namespace

RopeFreqs rope_frequencies(const RopeConfig& cfg) {
  cfg.validate();
  const int64_t dim = cfg.head_dim, half = dim / 2;
  RopeFreqs r;
  r.inv_freq.resize(size_t(half));
  if (cfg.rope_type == "default") {
    for (int64_t i = 0; i < half; ++i) r.inv_freq[size_t(i)] = 1.0f / pos_freq(cfg.theta, i, dim);
    return r;
  }
  // YaRN.
  const double L0 = cfg.original_max_position_embeddings ? double(*cfg.original_max_position_embeddings)
                                                         : double(cfg.max_position_embeddings);
  double factor = cfg.factor;
  if (cfg.original_max_position_embeddings) factor = double(cfg.max_position_embeddings) / L0;
  double att;
  if (cfg.attention_factor)
    att = *cfg.attention_factor;
  else if (cfg.mscale && cfg.mscale_all_dim && *cfg.mscale != 0 && *cfg.mscale_all_dim != 0)
    att = yarn_mscale(factor, *cfg.mscale) / yarn_mscale(factor, *cfg.mscale_all_dim);
  else
    att = yarn_mscale(factor, 1.0);
  auto fcd = [&](double rot) {
    return double(dim) * std::log(L0 / (rot * 2 * M_PI)) / (2 * std::log(cfg.theta));
  };
  double low = fcd(cfg.beta_fast), high = fcd(cfg.beta_slow);
  if (cfg.truncate) {
    low = std::floor(low);
    high = std::ceil(high);
  }
  low = std::max(low, 0.0);
  high = std::min(high, double(dim - 1));
  double hi_eff = high == low ? high + 0.001 : high;
  const float fl = float(low), den = float(hi_eff - low), ffac = float(factor);
  for (int64_t i = 0; i < half; ++i) {
    const float pf = pos_freq(cfg.theta, i, dim);
    const float extra = 1.0f / pf, inter = 1.0f / (ffac * pf);
    float ramp = (float(i) - fl) / den;
    ramp = std::min(1.0f, std::max(0.0f, ramp));
    const float ef = 1.0f - ramp;  // inv_freq_extrapolation_factor
    const float a = inter * (1.0f - ef), b = extra * ef;
    r.inv_freq[size_t(i)] = a + b;
  }
  r.attention_scaling = att;
  r.yarn_low = low;
  r.yarn_high = high;
  r.yarn_factor = factor;
  return r;
}

template <typename T>
void rope_tables(const RopeFreqs& f, const int32_t* positions, int64_t ntok, T* cos, T* sin) {
  const int64_t half = int64_t(f.inv_freq.size());
  OLMO_CHECK(half > 0, "rope_tables: empty frequency table");
  for (int64_t t = 0; t < ntok; ++t)
    OLMO_CHECK(positions[t] >= 0, "rope_tables: negative position ", positions[t], " at token ", t);
  const T scale = T(f.attention_scaling);
  parallel_for(
      ntok,
      [&](int64_t b, int64_t e) {
        for (int64_t t = b; t < e; ++t) {
          const float p = float(positions[t]);
          for (int64_t i = 0; i < half; ++i) {
            const float ang = p * f.inv_freq[size_t(i)];  // fp32 product, as HF
            if constexpr (std::is_same_v<T, float>) {
              cos[t * half + i] = float(std::cos(double(ang))) * scale;
              sin[t * half + i] = float(std::sin(double(ang))) * scale;
            } else {
              cos[t * half + i] = std::cos(double(ang)) * scale;
              sin[t * half + i] = std::sin(double(ang)) * scale;
            }
          }
        }
      },
      16);
}

namespace {
template <typename T, bool Backward>
void rope_apply(T* x, const T* cos, const T* sin, int64_t ntok, int64_t H, int64_t D, int64_t ld_tok) {
  OLMO_CHECK(D > 0 && D % 2 == 0 && H > 0 && ntok >= 0, "rope: bad shape T=", ntok, " H=", H, " D=", D);
  OLMO_CHECK(ld_tok >= H * D, "rope: token stride ", ld_tok, " < H*D = ", H * D);
  const int64_t half = D / 2;
  parallel_for(
      ntok,
      [&](int64_t b, int64_t e) {
        for (int64_t t = b; t < e; ++t) {
          const T* c = cos + t * half;
          const T* s = sin + t * half;
          for (int64_t h = 0; h < H; ++h) {
            T* x1 = x + t * ld_tok + h * D;
            T* x2 = x1 + half;
            for (int64_t i = 0; i < half; ++i) {
              const T a = x1[i], bb = x2[i];
              if constexpr (!Backward) {  // [a, b] -> [a c - b s, b c + a s]
                x1[i] = a * c[i] + (-bb) * s[i];
                x2[i] = bb * c[i] + a * s[i];
              } else {  // transpose: [a, b] -> [a c + b s, b c - a s]
                x1[i] = a * c[i] + bb * s[i];
                x2[i] = bb * c[i] - a * s[i];
              }
            }
          }
        }
      },
      8);
}
}  // namespace

template <typename T>
void rope_forward(T* x, const T* cos, const T* sin, int64_t ntok, int64_t H, int64_t D, int64_t ld_tok) {
  rope_apply<T, false>(x, cos, sin, ntok, H, D, ld_tok);
}
template <typename T>
void rope_backward(T* dx, const T* cos, const T* sin, int64_t ntok, int64_t H, int64_t D, int64_t ld_tok) {
  rope_apply<T, true>(dx, cos, sin, ntok, H, D, ld_tok);
}

namespace {
template <typename T, bool Backward>
void rope_tensor(Tensor& x, const RopeTable<T>& t, const char* who) {
  OLMO_CHECK(x.defined() && x.dtype() == dtype_of<T>(), who, ": x must be ", dtype_name(dtype_of<T>()),
             ", got ", x.defined() ? dtype_name(x.dtype()) : "undefined");
  OLMO_CHECK(x.ndim() == 3, who, ": x must be [tokens, heads, head_dim], got ", shape_str(x.shape()));
  const int64_t n = x.size(0), H = x.size(1), D = x.size(2);
  OLMO_CHECK(x.strides()[2] == 1 && (H == 1 || x.strides()[1] == D), who,
             ": heads and head_dim must be contiguous within a token (strides ", shape_str(x.strides()), ")");
  OLMO_CHECK(D == 2 * t.half, who, ": head_dim ", D, " does not match the table's ", 2 * t.half);
  OLMO_CHECK(n == t.ntok, who, ": ", n, " tokens but the table was built for ", t.ntok);
  const int64_t ld = n > 1 ? x.strides()[0] : H * D;
  OLMO_CHECK(ld >= H * D, who, ": token stride ", ld, " < heads*head_dim ", H * D);
  T* p = x.data<T>();
  if constexpr (Backward)
    rope_backward<T>(p, t.cos.data(), t.sin.data(), n, H, D, ld);
  else
    rope_forward<T>(p, t.cos.data(), t.sin.data(), n, H, D, ld);
}
}  // namespace

void rope_forward(Tensor& x, const RopeTable<float>& t) { rope_tensor<float, false>(x, t, "rope_forward"); }
void rope_backward(Tensor& dx, const RopeTable<float>& t) {
  rope_tensor<float, true>(dx, t, "rope_backward");
}
void rope_forward(Tensor& x, const RopeTable<double>& t) { rope_tensor<double, false>(x, t, "rope_forward"); }
void rope_backward(Tensor& dx, const RopeTable<double>& t) {
  rope_tensor<double, true>(dx, t, "rope_backward");
}

template void rope_tables<float>(const RopeFreqs&, const int32_t*, int64_t, float*, float*);
template void rope_tables<double>(const RopeFreqs&, const int32_t*, int64_t, double*, double*);
template void rope_forward<float>(float*, const float*, const float*, int64_t, int64_t, int64_t, int64_t);
template void rope_forward<double>(double*, const double*, const double*, int64_t, int64_t, int64_t, int64_t);
template void rope_backward<float>(float*, const float*, const float*, int64_t, int64_t, int64_t, int64_t);
template void rope_backward<double>(double*, const double*, const double*, int64_t, int64_t, int64_t,
                                    int64_t);

}  // namespace olmosft
