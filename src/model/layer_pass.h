// The decoder's layers between the embedding and the LM head as one pass of a step program on XLA
// (LayerPass): unrolled, one block after another (the backward reading each block's emitted values, or
// re-emitting them under remat), or scanned.
//
// Scanned layers (xla.scan_layers; docs/xla.md "Scanned layers"): the layer list is cut into segments, in
// layer order. A segment that repeats a group of P layers G >= 2 times (Olmo 3: three sliding-window layers
// and one full; its 32 layers are one segment) emits that group once, as the body of a loop over its G
// groups, its weights sliced from stacked copies [G, ...] of the group's tensors (lax.scan over layers: a
// stablehlo.while with dynamic_slice in and dynamic_update_slice out), so the program's size and compile
// time stay flat as depth grows. A layer in no repeating run (Olmo 3.5's dense layer 0, an attention layer
// between two runs of KDA layers) is a segment of its own, emitted as is. The backward runs the segments in
// reverse: a loop over a segment's groups in reverse re-emits each layer's forward from its saved input
// (remat full: only the layers' inputs are kept, [G, P, N, d]) and writes the group's weight gradients into
// stacked sums, sliced apart at the end. The MoE layers' statistics (Emit::moe_stats) leave a forward loop
// as one stacked [G, M, 4] result (M: the group's MoE layers). Parameters, checkpoints and the export keep
// their per-layer tensors: stacking happens inside the program. A pass's parameters are the program's
// (model/xla_params.h: a MoE layer's experts one stack per projection); each is gathered where used (FSDP)
// except the expert stacks, which the MoE unit reads in their split (expert parallelism).
#pragma once
#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

#include "model/config.h"
#include "model/decoder_units.h"
#include "model/unit_emit.h"

namespace olmosft::model {

// Layers START .. START + PERIOD * GROUPS - 1: a group of PERIOD layers repeated GROUPS times (1: as is).
struct ScanSegment {
  int64_t start = 0, period = 1, groups = 1;
};
struct LayerScan {
  std::vector<ScanSegment> segments;     // in layer order, every layer in one
  std::vector<std::vector<int>> params;  // params[l]: layer l's program parameters (xla_params), in order
  std::vector<bool> experts;             // per program parameter: an expert stack (the MoE unit lays it out)
};
// C's layers cut into segments greedily in layer order: at each layer the run of repeats that saves the most
// emitted layers (P * (G - 1); ties: the shorter group), else a segment of that one layer. Layers repeat when
// they have the same kinds, windows, RoPE, norms and tensor shapes.
LayerScan layer_scan(const ModelConfig& c);

// How the pass lays its values out over the mesh (model/xla_layout.h mesh_layout; identities on one
// device): TOKENS an activation [N, d], GATHER a weight where it is used (FSDP: the partitioner gathers the
// weight, not the activations), INPUTS the saved layer inputs [G, P, N, d], STACKED a stacked parameter
// [G, ...] (split as the parameter).
struct PassLayout {
  std::function<xla::Value(const xla::Value&)> tokens, gather;
  std::function<xla::Value(const xla::Value&)> inputs, stacked;
};

// What a segment's forward loop leaves for its backward: the last layer's output, every layer's input.
struct ScannedForward {
  xla::Value out, inputs;                                // [N, d], [G, P, N, d]
  std::vector<std::vector<xla::Value>> stacked_weights;  // [j][k]: group layer j's tensor k, [G, ...]
};

// The layers' forward and backward in a step: E's weights (e.w) gathered for the unrolled pass; a scanned
// pass gathers its single layers' tensors itself and stacks and gathers per group the others. REMAT as the
// step's policy.
class LayerPass {
 public:
  LayerPass(unit::Emit& e, const DecoderUnits& u, bool scan, PassLayout lay);
  xla::Value forward(const xla::Value& h0);   // the last layer's output (once)
  xla::Value backward(const xla::Value& dy);  // the first layer's input gradient (after forward)

 private:
  // Layer L's backward under remat full: its forward again from its input h_[l], then its backward from DH.
  xla::Value remat_backward(size_t l, const xla::Value& dh);

  unit::Emit& e_;
  const DecoderUnits& u_;
  PassLayout lay_;
  std::optional<LayerScan> scan_;
  std::vector<std::optional<xla::Value>> h_;  // h_[l]: layer l's input (unrolled, or a segment of one group)
  std::vector<unit::Block::Emitted> saved_;   // unrolled, remat below full: what each backward reads
  std::vector<std::optional<ScannedForward>> scanned_;  // per segment of several groups
};

}  // namespace olmosft::model
