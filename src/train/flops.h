// MFU accounting: the training FLOPs of one micro-batch, counted the way our kernels do the work, and the
// peak FLOP/s of a run, measured (or configured) once per run and stored in the run directory.
//
// FLOPs are counted per part (docs/train.md, "MFU accounting", has the formulas):
//   dense      every GEMM against a weight matrix that runs per token: attention and KDA projections,
//              the dense SwiGLU MLP, the MoE router, latent projections, shared expert and the top_k
//              routed experts of each token;
//   attention  softmax attention's score and value GEMMs over the (query, key) pairs that are visible:
//              per packed DOCUMENT (attention never crosses documents), causal, within the sliding window;
//   kda        the chunked delta rule (kernels/kda_chunk.cpp) per document, chunk by chunk;
//   lm_head    LM head + cross-entropy over trained targets only (the tiled cross-entropy skips the rest).
// A multiply-add counts 2. Model FLOPs (the default) are forward + backward without recomputation;
// FlopOptions::recompute adds what our backward recomputes (hardware FLOPs). Padding tokens (segment < 0)
// do no useful work and count nothing unless FlopOptions::count_padding asks for the rows the per-token
// GEMMs really process. Elementwise work (norms, RoPE, SwiGLU, gates, softmax exponentials, short conv)
// is not counted.
#pragma once
#include <cstdint>
#include <functional>
#include <string>

#include "model/config.h"
#include "model/model.h"

namespace olmosft::train {

struct FlopOptions {
  int64_t kda_chunk = 64;  // the model's KDA chunk size (model::DecoderOptions::kda_chunk)
  bool recompute = false;  // add the work the backward recomputes (attention scores, MoE experts' forward,
                           // the KDA chunk forward and state pass, LM-head logits): hardware FLOPs
  bool count_padding = false;  // per-token GEMMs over every row position, padding included, as the
                               // kernels run them (routed experts, attention, KDA and LM head skip padding)
};

// Training FLOPs (forward + backward) of one micro-batch, by part.
struct FlopCount {
  double dense = 0;         // projections, MLP / active MoE experts, router, KDA's projections
  double attention = 0;     // softmax attention score + value work, per document and window
  double kda = 0;           // the chunked delta rule itself (intra-chunk and state updates)
  double lm_head = 0;       // LM head + cross-entropy over trained targets only
  double kda_gemm = 0;      // the part of `kda` done by GEMMs (kernels/gemm.h); already in kda
  double conventional = 0;  // 6 x N x tokens (N: active parameters less the input embedding); NOT in total()
  int64_t tokens = 0;       // non-padding tokens
  int64_t trained = 0;      // trained targets
  int64_t documents = 0;    // documents (maximal runs of one non-negative segment id in a row)
  double total() const { return dense + attention + kda + lm_head; }
  FlopCount& operator+=(const FlopCount& o);
};

// Counts one micro-batch. Documents are the batch's segments (one per row when segments == nullptr); a
// target is trained when targets != nullptr, (trained == nullptr || trained[i] != 0), targets[i] != -100
// and position i is not padding. Errors (olmosft::Error) name what is invalid.
FlopCount training_flops(const model::ModelConfig& c, const model::Batch& b, const FlopOptions& o = {});

// The same with the per-config constants computed once (training_flops rebuilds them on every call,
// ~10 ms for a 512-expert config): build one per run, then count() each micro-batch (O(B*T)).
class FlopModel {
 public:
  explicit FlopModel(const model::ModelConfig& c, const FlopOptions& o = {});
  FlopCount count(const model::Batch& b) const;

 private:
  FlopOptions o_;
  double per_token_ = 0, per_routed_ = 0, top_k_ = 0, vd_ = 0, per_pair_ = 0, n_params_ = 0;
  double delta_heads_ = 0;  // per-head delta-rule recurrences over the layers (KDA, GDN)
  double full_layers_ = 0, sliding_layers_ = 0;
  int64_t window_ = 0, dk_ = 0, dv_ = 0;
};

// The training FLOPs (total()) of ROWS rows of T tokens, each row one document, every target trained: a
// plan's step and `olmosft xla compile`'s model count.
double one_document_rows_flops(const model::ModelConfig& c, int64_t rows, int64_t T);

// (query, key) pairs visible in one document of n tokens: sum over t < n of min(t + 1, window), or of
// t + 1 when window <= 0 (full causal).
double attention_pairs(int64_t n, int64_t window);

// Per (row, head) FLOPs of the chunked delta rule over one document of n tokens (chunks of `chunk`
// tokens from the document's first token), K = key head dim, V = value head dim.
struct KdaFlops {
  double gemm = 0;   // chunk GEMMs (kernels/gemm.h)
  double other = 0;  // triangular solves (cblas trsm) and the pairwise decayed products
};
KdaFlops kda_document_flops(int64_t n, int64_t K, int64_t V, int64_t chunk, bool recompute);

// Peak FLOP/s of this process: the best of `reps` 1024^3 GEMMs in the run's compute dtype (cpu_gemm(): fp32
// on its library, or bf16 operands), all threads.
double measure_peak_flops(int reps = 3);

// The run's peak FLOP/s per process, fixed for the whole run. On the first start it is
// configured_tflops * 1e12 when configured_tflops > 0, else measure(); it is written atomically to
// RUN_DIR/peak_flops.json (`measure` defaults to measure_peak_flops()). On a resume the file is read back and
// nothing is measured. Errors name the file: unreadable, not JSON, not a peak-FLOP/s file, an invalid value,
// or a configured value that differs from the stored one. `origin` (when given) receives a short note for the
// log.
double run_peak_flops(const std::string& run_dir, double configured_tflops, std::string* origin = nullptr,
                      const std::function<double()>& measure = {});

}  // namespace olmosft::train
