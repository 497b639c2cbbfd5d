// Rotary position embeddings (RoPE), default and YaRN, computed exactly as HF transformers does
// (docs/reference/architecture.md A.4), applied rotate-half (NeoX, non-interleaved) to [T, H, D] with
// per-token positions.
//
//   inv_freq (fp32, HF order of operations): pos_freqs_i = theta ^ (float(2i) / D);
//     default: inv_freq_i = 1 / pos_freqs_i, attention_scaling = 1
//     yarn:    factor = max_position_embeddings / original_max_position_embeddings when the original is
//              given (HF recomputes it), low/high from find_correction_dim(beta_fast/beta_slow) (floor/ceil
//              when truncate), ramp_i = clamp((i - low) / (high - low), 0, 1), e_i = 1 - ramp_i,
//              inv_freq_i = (1 / (factor * pos_freqs_i)) * (1 - e_i) + (1 / pos_freqs_i) * e_i
//              attention_scaling = attention_factor, default 0.1 ln(factor) + 1 (or the mscale ratio)
//   angle = float(pos) * inv_freq_i (fp32), cos/sin = cos/sin(angle) * attention_scaling
//   forward:  y = x * cos + rotate_half(x) * sin,   rotate_half([x1, x2]) = [-x2, x1]
//   backward: dx = dy * cos - rotate_half(dy * sin)  (the transpose: inverse rotation times the scale)
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace olmosft {

// The HF config's rope settings are parsed once, by model::parse_config (model/config.h); the model turns
// them into a RopeConfig (model::olmo3_rope_frequencies).
struct RopeConfig {
  std::string rope_type = "default";  // "default" or "yarn"
  double theta = 10000.0;             // rope_theta
  int64_t head_dim = 0;               // rotary dim (= head dim; partial rotary is not supported)
  int64_t max_position_embeddings = 0;
  // YaRN parameters (rope_type == "yarn").
  double factor = 1.0;
  std::optional<int64_t> original_max_position_embeddings;
  double beta_fast = 32.0, beta_slow = 1.0;
  std::optional<double> attention_factor;
  std::optional<double> mscale, mscale_all_dim;
  bool truncate = true;

  // Throws olmosft::Error naming `context` and the offending field.
  void validate(const std::string& context = "rope config") const;
};

struct RopeFreqs {
  std::vector<float> inv_freq;     // [head_dim / 2], bit-exact fp32 HF values (up to powf rounding)
  double attention_scaling = 1.0;  // multiplies cos and sin
  // YaRN diagnostics (low/high of the ramp after truncation, and the effective factor).
  double yarn_low = 0, yarn_high = 0, yarn_factor = 1;
};
RopeFreqs rope_frequencies(const RopeConfig& cfg);

// cos/sin tables [T, D/2] for per-token positions (positions restart per packed document; the caller
// supplies them). T is float or double; the angle is the fp32 product float(pos) * inv_freq (as HF),
// evaluated by cos/sin in T precision.
template <typename T>
void rope_tables(const RopeFreqs& f, const int32_t* positions, int64_t ntok, T* cos, T* sin);

// In-place rotation of x: ntok tokens, each with H heads of D values; token t's heads start at
// x + t * ld_tok (ld_tok >= H*D, so a fused QKV buffer can be rotated in place), head h at + h*D.
template <typename T>
void rope_forward(T* x, const T* cos, const T* sin, int64_t ntok, int64_t H, int64_t D, int64_t ld_tok);
// In-place backward: dx (given dy in the same buffer) = R^T dy.
template <typename T>
void rope_backward(T* dx, const T* cos, const T* sin, int64_t ntok, int64_t H, int64_t D, int64_t ld_tok);

// cos/sin tables for one batch and one layer type, built once and shared by q and k, forward and backward.
template <typename T>
struct RopeTable {
  int64_t ntok = 0, half = 0;
  std::vector<T> cos, sin;  // [ntok, half]
  void build(const RopeFreqs& f, const int32_t* positions, int64_t n) {
    ntok = n;
    half = int64_t(f.inv_freq.size());
    cos.resize(size_t(n * half));
    sin.resize(size_t(n * half));
    rope_tables<T>(f, positions, n, cos.data(), sin.data());
  }
};

// Tensor overloads: x is F32 (or F64) [ntok, H, D] with unit stride in the last two dims and any token
// stride (a slice of a fused QKV buffer works); D must equal 2 * table.half and ntok table.ntok.
void rope_forward(Tensor& x, const RopeTable<float>& table);
void rope_backward(Tensor& dx, const RopeTable<float>& table);
void rope_forward(Tensor& x, const RopeTable<double>& table);
void rope_backward(Tensor& dx, const RopeTable<double>& table);

}  // namespace olmosft
