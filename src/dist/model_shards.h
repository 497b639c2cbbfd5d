// Binds a model::CausalLM's parameters to ShardedParams, so the trainer can run the real model in
// data-parallel (dp) or fully sharded (zero3) mode with rank-count-independent gradients.
//
// Units (the sharding/gathering granularity): one per transformer block ("model.layers.<l>.*"), one for
// the tensors before the first block (embedding, embedding norm) and one for those after the last (final
// norm, LM head). A model without "model.layers." names (test models) is one unit.
//
// Storage. ShardedParams owns the fp32 master weights and AdamW moments (a 1/N shard in zero3, a full
// copy in dp). The model's Param::value / Param::grad tensors become non-owning views:
//   dp:    value -> the replicated master (persistent, no second copy); grad -> a per-leaf buffer.
//   zero3: value -> a gathered copy that exists only between bind_params() and release_params(); in
//          between steps the model holds no parameter or gradient storage (undefined tensors), so the
//          persistent per-rank memory is params + grads + moments / N (ShardedParams::memory()).
// Gathering (zero3). Per layer when the model honours model::ParamResidency (Olmo 3, the hybrid): each unit
// is all-gathered right before the model reads it and released after its last use, in the forward and again
// in the backward of every leaf, so at most one block (plus the LM-head unit across the loss) is resident.
// Otherwise (test models) per step and whole-model: every unit is gathered once before the
// step's first leaf and released after its last. Gradients are full-size per unit during the step in both
// cases (needed to sum several leaves pairwise before the reduce-scatter).
//
// Leaves (the determinism unit): each leaf's gradients are computed into zeroed per-unit buffers
// (begin_leaf) and pushed into a PairwiseSum per unit (end_leaf); reduce() finishes the sums into the
// ShardedParams gradient buffers and reduce-scatters (zero3) / all-reduces (dp) them across ranks. With
// 2^k leaves per step and N a power of two dividing it, the summed gradients are bit-identical for every
// N (docs/dist.md). With one leaf per rank no extra buffer is used; in dp the leaf buffers and pairwise
// partial sums are kept from step to step (in zero3 they are freed after each step).
#pragma once
#include <memory>
#include <vector>

#include "dist/comm.h"
#include "dist/sharded.h"
#include "model/model.h"

namespace olmosft::dist {

// Units for a parameter list (see the header comment); shapes/decay copied from the Params.
std::vector<TensorSpec> model_specs(const std::vector<model::Param>& params);

class ModelShards {
 public:
  // Copies the model's current parameter values into the shards (every rank must hold the same values)
  // and detaches the model's own storage (freed unless shared elsewhere).
  // per_layer: in zero3, gather one layer at a time when the model supports it (false: whole model per step).
  ModelShards(Comm& comm, model::CausalLM& model, ShardMode mode, bool per_layer = true);
  // Leaves the model holding owned tensors again: after finish() the final weights; otherwise (an
  // exception unwinding) the locally available values (exact in dp and on one rank; zeros elsewhere).
  ~ModelShards();
  ModelShards(const ModelShards&) = delete;
  ModelShards& operator=(const ModelShards&) = delete;

  ShardedParams& params() { return *sp_; }
  ShardMode mode() const { return sp_->mode(); }

  // Collective in zero3: all-gather every unit and point the model's values at the full weights.
  void bind_params();
  // Before a step's leaves: bind_params() unless the model gathers per layer (then nothing).
  void bind_for_step();
  bool per_layer() const { return per_layer_; }
  // zero3: free the gathered weights (the model's values become undefined). dp: no-op.
  void release_params();
  bool bound() const { return bound_; }

  // Gradients of one step made of `local_leaves` leaves on this rank.
  void begin_step(int64_t local_leaves);
  void begin_leaf();  // model grads -> zeroed buffers
  void end_leaf();    // accumulate the leaf (pairwise)
  void reduce();      // collective: leaf sums -> ShardedParams grads, reduced across ranks

  // Collective: the model gets owned tensors with the current full weights (for export and callers).
  void finish();

 private:
  void point_grads(const std::vector<float*>& unit_bufs);
  void need(int u);
  void done(int u);
  void detach_model(bool keep_values);

  Comm& comm_;
  model::CausalLM& model_;
  std::unique_ptr<ShardedParams> sp_;
  std::vector<int64_t> unit_padded_;  // full (padded) length of each unit's flat buffer
  bool bound_ = false, finished_ = false, per_layer_ = false;
  int64_t local_leaves_ = 0, pushed_ = 0;
  std::vector<std::vector<float>> leaf_;  // per unit, while several leaves are accumulated
  std::vector<std::unique_ptr<PairwiseSum>> sums_;
};

}  // namespace olmosft::dist
