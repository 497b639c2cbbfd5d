#include "xla/ops_adamw.h"

#include <cmath>

#include "xla/ops_util.h"

namespace olmosft::xla::ops {

using namespace detail;

std::array<float, 3> adamw_scalars(const AdamWOptions& o, int64_t step) {
  OLMO_CHECK(step >= 1, "adamw_scalars: step must be >= 1 (1-based), got ", step);
  OLMO_CHECK(o.beta1 >= 0 && o.beta1 < 1 && o.beta2 >= 0 && o.beta2 < 1, "adamw_scalars: betas ", o.beta1,
             ", ", o.beta2, " must be in [0, 1)");
  const double bc1 = 1.0 - std::pow(o.beta1, double(step));
  const double bc2 = 1.0 - std::pow(o.beta2, double(step));
  return {float(o.lr / bc1), float(std::sqrt(bc2)), float(1.0 - o.lr * o.weight_decay)};
}

ClipResult clip_grad_norm(HloBuilder& b, const std::vector<Value>& grads, double max_norm) {
  OLMO_CHECK(!grads.empty(), "xla ops: clip_grad_norm: no gradients");
  Value ss = b.scalar(kF32, 0.0);
  for (const Value& g : grads) {
    expect_type(g, kF32, "clip_grad_norm", "a gradient");
    ss = b.add(ss, b.reduce_sum(b.mul(g, g), range(0, g.type().rank())));
  }
  ClipResult r{grads, b.sqrt(ss)};
  if (max_norm <= 0) return r;
  const Value coef =
      b.min(b.scalar(kF32, 1.0), b.div(b.scalar(kF32, max_norm), b.add(r.norm, b.scalar(kF32, 1e-6))));
  for (Value& g : r.grads) g = b.mul(g, bcast(b, coef, g.type().dims, {}));
  return r;
}

std::vector<AdamWState> adamw_update(HloBuilder& b, const std::vector<AdamWParam>& params,
                                     const Value& scalars, const AdamWOptions& o) {
  expect_type(scalars, kF32, "adamw_update", "scalars");
  expect_dims(scalars, {3}, "adamw_update", "scalars");
  auto pick = [&](int64_t i) { return b.reshape(b.slice(scalars, {i}, {i + 1}), {}); };
  const Value step_size = pick(0), bc2_sqrt = pick(1), keep = pick(2);
  std::vector<AdamWState> out;
  for (const AdamWParam& P : params) {
    for (const Value* x : {&P.p, &P.g, &P.m, &P.v}) {
      expect_type(*x, kF32, "adamw_update", "p, g, m and v");
      expect_dims(*x, P.p.type().dims, "adamw_update", "g, m and v (p's dims)");
    }
    const auto& dims = P.p.type().dims;
    auto c = [&](double v) { return full(b, dims, v); };
    auto s = [&](const Value& v) { return bcast(b, v, dims, {}); };
    const Value m = b.add(b.mul(P.m, c(float(o.beta1))), b.mul(P.g, c(float(1.0 - o.beta1))));
    const Value v = b.add(b.mul(P.v, c(float(o.beta2))), b.mul(b.mul(P.g, P.g), c(float(1.0 - o.beta2))));
    const Value denom = b.add(b.div(b.sqrt(v), s(bc2_sqrt)), c(float(o.eps)));
    const Value kept = P.decay ? b.mul(P.p, s(keep)) : P.p;
    out.push_back({b.sub(kept, b.mul(s(step_size), b.div(m, denom))), m, v});
  }
  return out;
}

}  // namespace olmosft::xla::ops
