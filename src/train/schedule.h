// Learning-rate schedule: linear warmup over floor(horizon x warmup_frac) steps, then linear decay to
// lr x final_frac at the horizon (OLMo-core's LinearWithWarmup, as open-instruct's H045 recipe uses), or
// constant after warmup. Steps are 1-indexed: step s is the s-th optimizer update.
//   warmup W > 0:  lr(s) = lr x s / W                                   for s <= W
//   linear decay:  lr(s) = lr x (f + (1 - f) x (1 - (s - W) / (L - W)))  for W < s <= L
//   after L:       lr x f
// MaxText's WSD join (the TPU runbook) differs from this by at most one step in the decay phase
// (step 600 of 11768: 4.8922e-5 there vs 4.8918e-5 here); see README.
#pragma once
#include <cstdint>
#include <string>

namespace olmosft {

struct Schedule {
  std::string kind = "linear";  // linear | constant
  double lr = 5e-5;
  int64_t warmup_steps = 0;
  int64_t horizon = 1;
  double final_frac = 0.0;
  double at(int64_t step) const;
};

}  // namespace olmosft
