// StableHLO emitters for the dense layer math, forward and backward, mirroring src/kernels (rmsnorm.h,
// swiglu.h, gemm.h's linear, rope.h). Each function takes builder values and returns builder values; all
// arithmetic is f32 (the kernels' float instantiation) unless a function says otherwise. docs/xla.md "Layer
// ops" lists the forms and the tolerances measured against the CPU kernels.
#pragma once
#include <optional>
#include <vector>

#include "xla/hlo_builder.h"

namespace olmosft::xla::ops {

// RMSNorm over the last dimension, as kernels/rmsnorm.h (HF Olmo3RMSNorm, in f32):
//   r = 1 / sqrt(mean(x^2) + eps),  y = w * (x * r)      (w optional: y = x * r)
//   backward, with g = w * dy:  dx = r g - x (r^3 mean(x g)),  dw = sum_rows dy * x * r
// GROUPS > 1 is the grouped form (the hybrid's q/k norm): the last dimension D is GROUPS groups of D/GROUPS
// values, each normalised on its own, with one gain w [D] over all of them.
// x: f32 [..., D]; w: f32 [D]; rstd: [...] (GROUPS == 1) or [..., GROUPS].
struct RmsNormForward {
  Value y, rstd;
};
RmsNormForward rmsnorm_forward(HloBuilder& b, const Value& x, const std::optional<Value>& w, double eps,
                               int64_t groups = 1);
// RSTD: the forward's. dw is set when w is given.
struct RmsNormBackward {
  Value dx;
  std::optional<Value> dw;
};
RmsNormBackward rmsnorm_backward(HloBuilder& b, const Value& dy, const Value& x,
                                 const std::optional<Value>& w, const Value& rstd, int64_t groups = 1);

// SwiGLU, as kernels/swiglu.h: h = silu(a) * b, silu(a) = a / (1 + exp(-a)).
//   backward, s = 1 / (1 + exp(-a)):  db = dh * (a s),  da = dh * b * (s (1 + a (1 - s)))
// a, b, dh: f32, any (equal) shape.
Value swiglu_forward(HloBuilder& b, const Value& a, const Value& up);
struct SwigluBackward {
  Value da, db;
};
SwigluBackward swiglu_backward(HloBuilder& b, const Value& dh, const Value& a, const Value& up);

// nn.Linear without bias, as kernels/gemm.h's linear_*: x [..., in], W [out, in] (f32):
//   y = x W^T,   backward:  dx = dy W,  dW = dy^T x  (summed over every leading dimension of x)
// Operands kBF16 rounds both operands of every product to bf16 (nearest even, as ComputeDtype::BF16) and
// accumulates in f32 (dot_general with an f32 result); results are f32 either way.
enum class Operands { kF32, kBF16 };
// V as a product's operand under O: rounded to bf16 (kBF16) or as it is (kF32).
Value operand(HloBuilder& b, const Value& v, Operands o);
Value linear_forward(HloBuilder& b, const Value& x, const Value& w, Operands operands = Operands::kF32);
struct LinearBackward {
  Value dx, dw;
};
LinearBackward linear_backward(HloBuilder& b, const Value& dy, const Value& x, const Value& w,
                               Operands operands = Operands::kF32);

// RoPE / YaRN (rotate-half), as kernels/rope.h, with per-token positions (packed rows restart them per
// document):
//   angle = f32(pos) * inv_freq_i (an f32 product, as HF),  cos/sin = f32(cos/sin(f64(angle))) * f32(scaling)
//   forward:  y = x cos + rotate_half(x) sin,   backward:  dx = dy cos - rotate_half(dy sin)
// INV_FREQ is kernels' rope_frequencies(cfg).inv_freq (bit-exact HF values) as an f32 [D/2] value: an
// argument or rope_inv_freq_constant. ATTENTION_SCALING is its attention_scaling. The trigonometry is
// evaluated in f64 and rounded once, as the CPU kernel does (with F64_TRIG false it is f32, for devices
// without f64).
struct RopeTables {
  Value cos, sin;  // f32 [T, D/2]
};
// INV_FREQ as a constant of the graph (its f32 values bit for bit), for a caller that does not pass it in.
Value rope_inv_freq_constant(HloBuilder& b, const std::vector<float>& inv_freq);
RopeTables rope_tables(HloBuilder& b, const Value& positions, const Value& inv_freq, double attention_scaling,
                       bool f64_trig = true);
// x / dy: f32 [T, H, D] with D = 2 * (D/2 of the tables).
Value rope_forward(HloBuilder& b, const Value& x, const RopeTables& tables);
Value rope_backward(HloBuilder& b, const Value& dy, const RopeTables& tables);

}  // namespace olmosft::xla::ops
