// A tiny deterministic model + dataset to prove the distributed engine (tests, bench): a two-layer
// MLP classifier  logits = W2 tanh(W1 x + b1) + b2  trained with mean cross-entropy, on synthetic rows
// (x ~ N(0,1) by Philox, label = argmax of a fixed random teacher). Units: 0 = fc1.*, 1 = fc2.*.
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
#include <cstdint>
#include <vector>

#include "dist/comm.h"
#include "dist/sharded.h"

namespace olmosft::dist {

struct ToyConfig {
  int64_t in = 32, hidden = 64, classes = 8;
  int64_t global_batch = 32;  // G
  int64_t leaves = 4;         // V (virtual shards per step)
  uint64_t seed = 1234;
  double lr = 0.01, weight_decay = 0.01, max_norm = 1.0;
  void validate(int ranks) const;
};

std::vector<TensorSpec> toy_specs(const ToyConfig& c);
void toy_init(const ToyConfig& c, const TensorSpec& s, float* full);
void toy_row(const ToyConfig& c, int64_t g, float* x, int32_t* label);

struct ToyStep {
  double loss = 0;       // mean CE over the G rows of the step
  double grad_norm = 0;  // pre-clip global norm
};
// One optimizer step (a collective). `step` is 1-based.
ToyStep toy_train_step(Comm& comm, ShardedParams& sp, const ToyConfig& c, int64_t step);

}  // namespace olmosft::dist
