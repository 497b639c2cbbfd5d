// AdamW's hyperparameters, shared by the CPU optimizer (kernels/adamw.h) and the CUDA one (cuda/adamw.h): one
// definition, one set of defaults (torch.optim.AdamW's). Header-only and dependency-free,
// so that src/cuda (beside kernels, built without olmosft_lib on the GPU machine) can include it.
#pragma once

namespace olmosft {

struct AdamWConfig {
  double lr = 1e-3;
  double beta1 = 0.9, beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.01;
  // Throws olmosft::Error naming the bad field. Defined in kernels/adamw.cpp (olmosft_lib); the CUDA
  // optimizer checks the same ranges itself and throws std::invalid_argument (it does not link olmosft_lib).
  void validate() const;
};

}  // namespace olmosft
