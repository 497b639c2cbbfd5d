// Test helper, header-only (tests/unit/dist/dist_test.cpp, bench/dist.cpp): a tiny deterministic model +
// dataset to prove the distributed engine: a two-layer MLP classifier  logits = W2 tanh(W1 x + b1) + b2
// trained with mean cross-entropy, on synthetic rows (x ~ N(0,1) by Philox, label = argmax of a fixed random
// teacher). Units: 0 = fc1.*, 1 = fc2.*.
//
// Data order (rank-count independent): step s (1-based) uses global rows g = (s-1)*G + r, r in [0, G);
// rank p of N takes rows [p*G/N, (p+1)*G/N). The G rows form V equal "virtual shards" (leaves); a
// rank's rows are exactly leaves [p*V/N, (p+1)*V/N), so N must divide V. Gradients of each leaf are
// summed pairwise (PairwiseSum) and across ranks by the Comm tree: for power-of-two V and N the
// per-step loss, gradients and update are bit-identical for every N (see docs/dist.md).
//
// ZeRO-3 schedule per step: gather fc1 -> forward -> release; gather fc2 -> logits/loss -> release;
// gather fc2 -> backward -> release -> reduce-scatter fc2 grads; fc1 backward needs no weights (first
// layer) -> reduce-scatter fc1 grads; clip + AdamW on the shard.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "core/error.h"
#include "core/rng.h"
#include "dist/comm.h"
#include "dist/sharded.h"
#include "kernels/adamw.h"

namespace olmosft::dist {

struct ToyConfig {
  int64_t in = 32, hidden = 64, classes = 8;
  int64_t global_batch = 32;  // G
  int64_t leaves = 4;         // V (virtual shards per step)
  uint64_t seed = 1234;
  double lr = 0.01, weight_decay = 0.01, max_norm = 1.0;
  void validate(int ranks) const;
};

struct ToyStep {
  double loss = 0;       // mean CE over the G rows of the step
  double grad_norm = 0;  // pre-clip global norm
};

inline void ToyConfig::validate(int ranks) const {
  OLMO_CHECK(in > 0 && hidden > 0 && classes > 1, "toy: bad model dims");
  OLMO_CHECK(leaves > 0 && global_batch % leaves == 0, "toy: global_batch ", global_batch,
             " must be a multiple of leaves ", leaves);
  OLMO_CHECK(ranks > 0 && leaves % ranks == 0, "toy: leaves ", leaves,
             " must be a multiple of the rank count ", ranks);
}

inline std::vector<TensorSpec> toy_specs(const ToyConfig& c) {
  return {{"fc1.weight", {c.hidden, c.in}, 0, true},
          {"fc1.bias", {c.hidden}, 0, false},
          {"fc2.weight", {c.classes, c.hidden}, 1, true},
          {"fc2.bias", {c.classes}, 1, false}};
}

inline void toy_init(const ToyConfig& c, const TensorSpec& s, float* full) {
  const int64_t n = s.numel();
  if (s.name.ends_with(".bias")) {
    std::memset(full, 0, size_t(n) * 4);
    return;
  }
  const Rng rng{c.seed, s.name == "fc1.weight" ? 11u : 12u};
  const float scale = 1.0f / std::sqrt(float(s.shape[1]));
  for (int64_t i = 0; i < n; ++i) full[i] = scale * rng.normal(uint64_t(i));
}

inline void toy_row(const ToyConfig& c, int64_t g, float* x, int32_t* label) {
  const Rng xr{c.seed, 1}, tr{c.seed, 2};
  for (int64_t j = 0; j < c.in; ++j) x[j] = xr.normal(uint64_t(g * c.in + j));
  int32_t best = 0;
  double bv = -1e300;
  for (int64_t k = 0; k < c.classes; ++k) {
    double s = 0;
    for (int64_t j = 0; j < c.in; ++j) s += double(tr.normal(uint64_t(k * c.in + j))) * x[j];
    if (s > bv) bv = s, best = int32_t(k);
  }
  *label = best;
}

// One optimizer step (a collective). `step` is 1-based.
inline ToyStep toy_train_step(Comm& comm, ShardedParams& sp, const ToyConfig& c, int64_t step) {
  const int N = comm.size(), p = comm.rank();
  c.validate(N);
  const int64_t G = c.global_batch, V = c.leaves, R = G / V, I = c.in, H = c.hidden, C = c.classes;
  const int64_t leaf0 = V * p / N, nleaf = V / N;
  const int64_t rows = nleaf * R, row0 = (step - 1) * G + leaf0 * R;
  const int w1 = sp.tensor_index("fc1.weight"), b1 = sp.tensor_index("fc1.bias");
  const int w2 = sp.tensor_index("fc2.weight"), b2 = sp.tensor_index("fc2.bias");

  std::vector<float> X(static_cast<size_t>(rows * I)), Hd(size_t(rows * H)), dZ(size_t(rows * C));
  std::vector<int32_t> Y(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) toy_row(c, row0 + r, &X[size_t(r * I)], &Y[size_t(r)]);

  // Forward, layer 1.
  sp.gather(0);
  {
    const float *W = sp.param(w1), *B = sp.param(b1);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t h = 0; h < H; ++h) {
        float s = B[h];
        for (int64_t j = 0; j < I; ++j) s += W[h * I + j] * X[size_t(r * I + j)];
        Hd[size_t(r * H + h)] = std::tanh(s);
      }
  }
  sp.release(0);
  // Forward, layer 2 + loss; dZ = (softmax - onehot) / G.
  std::vector<double> leaf_ce(static_cast<size_t>(nleaf), 0.0);
  sp.gather(1);
  {
    const float *W = sp.param(w2), *B = sp.param(b2);
    std::vector<float> z(static_cast<size_t>(C));
    for (int64_t r = 0; r < rows; ++r) {
      float mx = -INFINITY;
      for (int64_t k = 0; k < C; ++k) {
        float s = B[k];
        for (int64_t h = 0; h < H; ++h) s += W[k * H + h] * Hd[size_t(r * H + h)];
        z[size_t(k)] = s;
        mx = std::max(mx, s);
      }
      double se = 0;
      for (int64_t k = 0; k < C; ++k) se += std::exp(double(z[size_t(k)] - mx));
      const double lse = double(mx) + std::log(se);
      leaf_ce[size_t(r / R)] += lse - double(z[size_t(Y[size_t(r)])]);
      for (int64_t k = 0; k < C; ++k) {
        const double pk = std::exp(double(z[size_t(k)]) - lse);
        dZ[size_t(r * C + k)] = float((pk - (k == Y[size_t(r)] ? 1.0 : 0.0)) / double(G));
      }
    }
  }
  sp.release(1);

  // Backward, layer 2 (needs W2 for dH): per-leaf gradients summed pairwise.
  std::vector<float> dH(static_cast<size_t>(rows * H));
  sp.gather(1);
  {
    const float* W = sp.param(w2);
    const int64_t n1 = C * H + C;
    PairwiseSum acc(n1);
    std::vector<float> leaf(static_cast<size_t>(n1));
    for (int64_t l = 0; l < nleaf; ++l) {
      std::fill(leaf.begin(), leaf.end(), 0.0f);
      for (int64_t r = l * R; r < (l + 1) * R; ++r) {
        for (int64_t k = 0; k < C; ++k) {
          const float d = dZ[size_t(r * C + k)];
          for (int64_t h = 0; h < H; ++h) leaf[size_t(k * H + h)] += d * Hd[size_t(r * H + h)];
          leaf[size_t(C * H + k)] += d;
        }
        for (int64_t h = 0; h < H; ++h) {
          float s = 0;
          for (int64_t k = 0; k < C; ++k) s += W[k * H + h] * dZ[size_t(r * C + k)];
          dH[size_t(r * H + h)] = s * (1.0f - Hd[size_t(r * H + h)] * Hd[size_t(r * H + h)]);
        }
      }
      acc.push(leaf.data());
    }
    float* G1 = sp.grad_buffer(1);
    OLMO_CHECK(sp.offset_in_unit(w2) == 0 && sp.offset_in_unit(b2) == C * H, "toy: unexpected fc2 layout");
    acc.finish(G1);
  }
  sp.release(1);
  sp.reduce_grads(1);
  // Backward, layer 1 (first layer: no input gradient, so its weights are not needed).
  {
    const int64_t n0 = H * I + H;
    PairwiseSum acc(n0);
    std::vector<float> leaf(static_cast<size_t>(n0));
    for (int64_t l = 0; l < nleaf; ++l) {
      std::fill(leaf.begin(), leaf.end(), 0.0f);
      for (int64_t r = l * R; r < (l + 1) * R; ++r)
        for (int64_t h = 0; h < H; ++h) {
          const float d = dH[size_t(r * H + h)];
          for (int64_t j = 0; j < I; ++j) leaf[size_t(h * I + j)] += d * X[size_t(r * I + j)];
          leaf[size_t(H * I + h)] += d;
        }
      acc.push(leaf.data());
    }
    OLMO_CHECK(sp.offset_in_unit(w1) == 0 && sp.offset_in_unit(b1) == H * I, "toy: unexpected fc1 layout");
    acc.finish(sp.grad_buffer(0));
  }
  sp.reduce_grads(0);

  // Loss: per-leaf sums gathered in leaf order and added sequentially (exact same order for any N).
  std::vector<double> all(static_cast<size_t>(V));
  comm.all_gather(leaf_ce.data(), all.data(), nleaf);
  double ce = 0;
  for (double v : all) ce += v;

  AdamWConfig cfg;
  cfg.lr = c.lr;
  cfg.weight_decay = c.weight_decay;
  ToyStep out;
  out.loss = ce / double(G);
  out.grad_norm = sp.clip_and_step(cfg, c.max_norm, step);
  return out;
}

}  // namespace olmosft::dist
