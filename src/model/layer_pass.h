// The decoder's layers between the embedding and the LM head as one pass of a step program on XLA
// (LayerPass): unrolled, one block after another (the backward reading each block's emitted values, or
// re-emitting them under remat), or scanned.
//
// Scanned layers (xla.scan_layers; docs/xla.md "Scanned layers"): a model whose layer list repeats a
// group of P layers (Olmo 3: three sliding-window layers and one full) emits that group once, as the body of
// a loop over the G = L / P groups, its weights sliced from stacked copies [G, ...] of the group's tensors
// (lax.scan over layers: a stablehlo.while with dynamic_slice in and dynamic_update_slice out), so the
// program's size and compile time stay flat as depth grows. The backward is a second loop over the groups in
// reverse that re-emits each layer's forward from its saved input (remat full: only the layers' inputs are
// kept, [G, P, N, d]) and writes the group's weight gradients into stacked sums, sliced apart at the end.
// Parameters, checkpoints and the export keep their per-layer tensors: stacking happens inside the program.
#pragma once
#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

#include "model/config.h"
#include "model/decoder_units.h"
#include "model/unit_emit.h"

namespace olmosft::model {

struct LayerScan {
  int64_t period = 0, groups = 0;
  std::vector<std::vector<int>> params;  // params[l]: the registry indices of layer l's tensors, in order
};
// The smallest repeating group of C's layers (same kinds, windows, RoPE, norms and tensor shapes), or throws
// naming why the layers cannot be scanned (MoE layers: their statistics are not carried out of the loop yet).
LayerScan layer_scan(const ModelConfig& c);

// What the forward loop leaves for the backward: the last layer's output, every layer's input.
struct ScannedForward {
  xla::Value out, inputs;                                // [N, d], [G, P, N, d]
  std::vector<std::vector<xla::Value>> stacked_weights;  // [j][k]: group layer j's tensor k, [G, ...]
};
// How the pass lays its values out over the mesh (model/xla_layout.h mesh_layout; identities on one
// device): TOKENS an activation [N, d], GATHER a weight where it is used (FSDP: the partitioner gathers the
// weight, not the activations), INPUTS the saved layer inputs [G, P, N, d], STACKED a stacked parameter
// [G, ...] (split as the parameter).
struct PassLayout {
  std::function<xla::Value(const xla::Value&)> tokens, gather;
  std::function<xla::Value(const xla::Value&)> inputs, stacked;
};
ScannedForward scanned_forward(unit::Emit& e, const DecoderUnits& u, const LayerScan& s, const xla::Value& h0,
                               const PassLayout& lay);
// The gradient w.r.t. the first layer's input; every layer tensor's gradient set in e.g.
xla::Value scanned_backward(unit::Emit& e, const DecoderUnits& u, const LayerScan& s, const ScannedForward& f,
                            const xla::Value& dy, const PassLayout& lay);

// The layers' forward and backward in a step: E's weights (e.w) as the pass reads them (gathered, except
// a scanned pass's layer tensors, which it stacks and gathers per group itself), REMAT as the step's policy.
class LayerPass {
 public:
  LayerPass(unit::Emit& e, const DecoderUnits& u, bool scan, PassLayout lay);
  xla::Value forward(const xla::Value& h0);   // the last layer's output (once)
  xla::Value backward(const xla::Value& dy);  // the first layer's input gradient (after forward)

 private:
  unit::Emit& e_;
  const DecoderUnits& u_;
  PassLayout lay_;
  std::optional<LayerScan> scan_;
  std::vector<xla::Value> h_;  // unrolled: h_[l] layer l's input
  std::vector<unit::Block::Emitted> saved_;
  std::optional<ScannedForward> scanned_;
};

}  // namespace olmosft::model
