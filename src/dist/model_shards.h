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
// Loading. The weights come from the model's own values, or, for a model built without parameter storage
// (model::make_model_unallocated), from a model::ParamFill that each rank asks for the elements it owns
// only (model::hf_param_fill reads just those bytes of the safetensors files): a rank never holds more
// than its shard (plus one tensor for a random init).
// Gathering (zero3). Per layer when the model honours model::ParamResidency (Olmo 3, the hybrid): each unit
// is all-gathered right before the model reads it and released after its last use, in the forward and again
// in the backward of every leaf, so at most one block (plus the LM-head unit across the loss) is resident.
// Otherwise (test models, dist.gather=step) per step and whole-model: every unit is gathered once before the
// step's first leaf and released after its last.
//
// Gradients (the determinism unit is the leaf; docs/dist.md "Order of summation").
//   dp: each leaf's gradients go into zeroed full-size per-unit buffers (begin_leaf), are pushed into a
//       PairwiseSum per unit (end_leaf); reduce() finishes the sums and all-reduces them. Rank p runs the
//       contiguous leaves [p*V/N, (p+1)*V/N).
//   zero3: rank p runs the interleaved leaves m*N + p (dist::leaf_of), so the N leaves of "round" m run at
//       the same time on the N ranks. A leaf's gradient of unit u is written into u's reserved zero pages
//       (address space for one full unit; physical pages only where the backward writes) and
//       reduce-scattered to the owners as soon as u's backward is done: for the blocks and the last unit
//       at the model's done(u) after the loss gradient (the residency hooks), for the first unit (and any
//       unit without hooks) at end_leaf. The pages are then given back (they read as zero for the next
//       leaf). The owner adds the rounds pairwise on its shard (log2(rounds)+1 shard-sized buffers per
//       unit); reduce() writes the sums into the ShardedParams gradients. So the full-size gradient alive
//       at once is about one block (plus the embedding unit between its first gradient and the end of the
//       leaf), never the whole model. A model that writes a unit's gradient after its backward was
//       declared done is detected at end_leaf (those pages are resident again) and throws.
// With V = 2^k leaves per step and N a power of two dividing it, both orders are the perfect binary tree
// over the leaves in leaf order: the summed gradients are bit-identical for every N and in both modes.
#pragma once
#include <memory>
#include <vector>

#include "core/tensor.h"
#include "dist/comm.h"
#include "dist/sharded.h"
#include "model/model.h"

namespace olmosft::dist {

// Units for a parameter list (see the header comment); shapes from `shapes` when given (a model without
// parameter storage), else from the Params' values; decay copied from the Params.
std::vector<TensorSpec> model_specs(const std::vector<model::Param>& params,
                                    const std::vector<Shape>& shapes = {});

class ModelShards {
 public:
  // Copies the model's current parameter values into the shards (every rank must hold the same values)
  // and detaches the model's own storage (freed unless shared elsewhere); or, when `fill` is given, asks it
  // for the elements this rank owns (required when the model has no parameter storage).
  // per_layer: in zero3, gather one layer at a time when the model supports it (false: whole model per step).
  ModelShards(Comm& comm, model::CausalLM& model, ShardMode mode, bool per_layer = true,
              const model::ParamFill& fill = {});
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

  // Gradients of one step made of `local_leaves` leaves on this rank; this rank's m-th leaf is the step's
  // leaf dist::leaf_of(mode(), local_leaves * N, N, rank, m) (the caller feeds it that leaf's rows).
  void begin_step(int64_t local_leaves);
  int64_t leaf_index(int64_t m) const;  // that global leaf index, for this step
  void begin_leaf();                    // model grads -> zeroed buffers
  void end_leaf();  // dp: accumulate the leaf (pairwise); zero3 (collective): reduce-scatter what is left
  void reduce();    // collective in dp: leaf sums -> ShardedParams grads, reduced across ranks

  // Collective: the model gets owned tensors with the current full weights (for export and callers); with
  // hand_back false (ranks that need no weights after training) the units are still gathered one at a time
  // for the ranks that do, but this model is left without parameter storage.
  void finish(bool hand_back = true);

 private:
  struct GradPages;  // reserved zero pages for one unit's leaf gradient (zero3)
  void point_grads(const std::vector<float*>& unit_bufs);
  void need(int u);
  void done(int u);
  void reduce_unit(int u);  // zero3: this leaf's gradient of unit u -> the owners (a collective)
  void load(const model::ParamFill& fill);

  Comm& comm_;
  model::CausalLM& model_;
  std::unique_ptr<ShardedParams> sp_;
  std::vector<int64_t> unit_padded_;  // full (padded) length of each unit's flat buffer
  bool bound_ = false, finished_ = false, per_layer_ = false, hooks_ = false;
  int64_t local_leaves_ = 0, pushed_ = 0;
  std::vector<std::vector<float>> leaf_;            // dp: per unit, while several leaves are accumulated
  std::vector<std::unique_ptr<PairwiseSum>> sums_;  // dp: leaves; zero3: rounds (shard-sized)
  std::vector<std::unique_ptr<GradPages>> pages_;   // zero3: per unit, this leaf's full gradient
  std::vector<float> round_;                        // zero3: one reduce-scattered shard (several leaves)
  std::vector<char> reduced_, early_;               // zero3, this leaf: unit reduced; reduced before end_leaf
  bool leaf_open_ = false, backward_ = false;       // zero3: inside a leaf; past the loss gradient
};

}  // namespace olmosft::dist
