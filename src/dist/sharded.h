// Parameter state for data-parallel (replicated) and fully sharded (ZeRO-3 style) training.
//
// Layout. Tensors are grouped into units (e.g. one per transformer layer). Each unit is one flat fp32
// buffer: its tensors concatenated in the given order, then zero padding up to a multiple of
// size()*kAlign elements (kAlign = 256), so every rank owns an equal shard of S_u = padded/size()
// elements, S_u a multiple of kAlign. Rank p owns unit-flat elements [p*S_u, (p+1)*S_u). Padding
// elements have zero parameter, gradient and moments and stay zero under AdamW. Replicated mode keeps
// the whole unit on every rank (padded to kAlign only).
//
// Per step, the trainer drives:
//   gather(u)          -> full parameters of unit u (all-gather; a view in replicated mode)
//   release(u)         -> frees the gathered copy (sharded mode)
//   grad_buffer(u)     -> full-size local gradient accumulator of unit u (zeroed on first use)
//   reduce_grads(u)    -> sharded: reduce-scatter to the owner shard and free the full buffer;
//                         replicated: all-reduce in place (the previous step's buffer is kept and
//                         reused, so dp holds one extra gradient-sized buffer between steps)
//   clip_and_step(...) -> deterministic global grad norm, clip, AdamW (kernels/adamw.h) on the local
//                         shard (sharded) or on every full unit (replicated)
//
// Determinism: with gradients summed over a fixed set of 2^k "virtual shards" (leaves) via PairwiseSum
// locally and the pairwise rank tree of Comm (comm.h), gradients, the grad norm (fixed kAlign-chunk
// grid, chunks summed in global order) and the AdamW update are bit-identical for 1, 2, 4, ... ranks
// and between the two modes.
//
// Checkpoints: train/checkpoint.h (save_checkpoint_sharded / load_checkpoint_sharded) reads and writes
// the elements each rank owns through owned_ranges().
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "dist/comm.h"
#include "kernels/adamw.h"

namespace olmosft::dist {

enum class ShardMode { Replicated, Sharded };
const char* mode_name(ShardMode m);
ShardMode parse_mode(const std::string& s);  // "dp" | "replicated" | "zero3" | "sharded"

struct TensorSpec {
  std::string name;
  std::vector<int64_t> shape;
  int unit = 0;       // units are numbered 0..U-1; every unit must have at least one tensor
  bool decay = true;  // AdamW weight decay applies
  int64_t numel() const;
};

struct MemoryStats {
  int64_t persistent_bytes = 0;      // params + grads + m + v held by this rank between steps
  int64_t peak_transient_bytes = 0;  // max gathered params + full grad buffers alive at once
  int64_t padding_elements = 0;      // per buffer kind, on this rank
};

// Pairwise (binary-counter) summation of leaves pushed in order: for 2^k leaves it computes the
// perfect binary tree ((l0+l1)+(l2+l3))..., matching tree_sum, with at most log2(count)+1 buffers.
class PairwiseSum {
 public:
  explicit PairwiseSum(int64_t n) : n_(n) {}
  void push(const float* leaf);
  // Writes the sum into out (zeros if nothing was pushed) and resets.
  void finish(float* out);
  int64_t pushed() const { return pushed_; }
  // Buffers are kept for reuse after finish() (no allocation, no page faults, from the second use on);
  // release() frees them.
  void release() { pool_.clear(); }

 private:
  std::vector<float> take();
  int64_t n_, pushed_ = 0;
  std::vector<std::pair<int64_t, std::vector<float>>> stack_;  // (leaf count, partial sum)
  std::vector<std::vector<float>> pool_;
};

// The global index of this rank's m-th leaf (0 <= m < leaves/size) of a step of `leaves` leaves:
//   Replicated: contiguous, rank p runs leaves [p*leaves/size, (p+1)*leaves/size) (summed locally, then one
//               all-reduce);
//   Sharded:    interleaved, rank p runs leaves m*size + p, so "round" m is the `size` consecutive leaves
//               [m*size, (m+1)*size) and each unit's gradient can be reduce-scattered right after its
//               backward; the rounds are then summed pairwise on the owner's shard (docs/dist.md).
// For leaves and size powers of two both give the perfect binary tree over the leaves in leaf order.
int64_t leaf_of(ShardMode mode, int64_t leaves, int size, int rank, int64_t m);

class ShardedParams {
 public:
  static constexpr int64_t kAlign = 256;

  ShardedParams(Comm& comm, std::vector<TensorSpec> specs, ShardMode mode);

  ShardMode mode() const { return mode_; }
  int units() const { return int(units_.size()); }
  const std::vector<TensorSpec>& specs() const { return specs_; }
  int tensor_index(const std::string& name) const;  // throws on unknown name

  // Sets every parameter: init(spec, full) fills the full tensor (called on every rank; each keeps the
  // elements it owns). Moments are zeroed and the step count reset.
  template <typename F>
  void init(F&& fill) {
    for (size_t t = 0; t < specs_.size(); ++t) {
      std::vector<float> full(size_t(specs_[t].numel()));
      fill(specs_[t], full.data());
      set_param(int(t), full.data());
    }
    reset_optimizer();
  }
  void set_param(int tensor, const float* full);
  void reset_optimizer();

  // Full parameters of unit u; tensor t of that unit is at gathered + offset_in_unit(t).
  float* gather(int u);
  void release(int u);
  const float* param(int tensor) const;  // pointer into the gathered unit (it must be gathered)
  int64_t offset_in_unit(int tensor) const { return toff_[size_t(tensor)]; }
  int64_t unit_padded(int u) const { return units_[size_t(u)].padded; }  // full flat length of unit u

  float* grad_buffer(int u);  // full-size local gradient of unit u (zeroed when created)
  // This rank's reduced gradient of unit u: unit_shard(u) elements (the owned part in zero3, the whole
  // padded unit in replicated mode), for callers that reduce-scatter into it themselves (ModelShards).
  float* owned_grad(int u) { return units_[size_t(u)].g.data(); }
  int64_t unit_shard(int u) const { return units_[size_t(u)].shard; }
  float* grad(int tensor) { return grad_buffer(specs_[size_t(tensor)].unit) + toff_[size_t(tensor)]; }
  void reduce_grads(int u);  // see the header comment
  // Deterministic global gradient norm (of the reduced gradients; a collective).
  double grad_norm();
  // clip (max_norm > 0) + AdamW on what this rank owns; returns the pre-clip norm. step is 1-based.
  // A non-finite norm throws (on every rank alike, since the norm is global).
  double clip_and_step(const AdamWConfig& cfg, double max_norm, int64_t step);
  // The same with the norm already computed by grad_norm() (saves the second pass and collective).
  double clip_and_step(const AdamWConfig& cfg, double max_norm, int64_t step, double norm);

  // Full copy of a tensor's parameters / moments (a collective in sharded mode; for tests and export).
  std::vector<float> full_param(int tensor);
  std::vector<float> full_moment(int tensor, int which);  // which: 0 = exp_avg, 1 = exp_avg_sq

  MemoryStats memory() const;
  int64_t adam_step() const { return adam_step_; }
  void set_adam_step(int64_t s) { adam_step_ = s; }

  // The elements this rank owns, as runs of one tensor: elements [begin, begin + n) of tensor `tensor`
  // live at p/g/m/v (params, gradients, exp_avg, exp_avg_sq). Replicated mode: every element of every
  // tensor. For external checkpoint writers/readers (train/checkpoint.h) and the AdamW step.
  struct OwnedRange {
    int tensor = 0;
    int64_t begin = 0, n = 0;
    float *p = nullptr, *g = nullptr, *m = nullptr, *v = nullptr;
  };
  std::vector<OwnedRange> owned_ranges();
  Comm& comm() { return comm_; }

 private:
  struct Unit {
    int64_t numel = 0;              // unpadded
    int64_t padded = 0;             // total padded length
    int64_t shard = 0;              // elements owned per rank (== padded in replicated mode)
    std::vector<float> p, g, m, v;  // owned part (shard) of params, reduced grads and moments
    std::vector<float> gathered;    // full params while gathered (sharded mode)
    std::vector<float> full_grad;   // full local gradient accumulator (until reduce_grads)
    std::vector<float> spare;       // replicated mode: last step's gradient buffer, reused (no page faults)
    bool is_gathered = false;
  };
  int64_t owned_begin(const Unit& U) const;  // unit-flat index of this rank's first owned element
  std::vector<float> full_of(int tensor, std::vector<float> Unit::*field);  // all ranks' elements gathered
  void track_transient();

  Comm& comm_;
  std::vector<TensorSpec> specs_;
  ShardMode mode_;
  std::vector<Unit> units_;
  std::vector<int64_t> toff_;  // offset of each tensor inside its unit
  int64_t adam_step_ = 0;
  int64_t transient_ = 0, peak_transient_ = 0;
};

}  // namespace olmosft::dist
