// The parameters of the decoder's programs on XLA (docs/xla.md "Packed experts"): the registry's tensors
// (model/params.h), in registry order, except that each MoE layer's routed experts are one stacked tensor
// per projection, at the place of its first expert's: experts.gate_proj / up_proj [E, F, Lt] and
// experts.down_proj [E, Lt, F] (expert e's registry tensor is row e). A program then takes three expert
// arguments per layer instead of 3 E (Olmo 3.5 small: 45 instead of 23,040), the experts' GEMMs read them
// without concatenating, and over a mesh the stacks split on E (xla::param_split_dim takes the first
// dimension the parameter shards divide), the expert layout an expert-parallel MoE reads
// (moe_capacity_emit.h). The device state (weights, gradient sums, moments) is held in this form; the
// host keeps the registry's tensors for checkpoints and the export, packed on upload and unpacked on
// download (pack / unpack: a copy, no arithmetic).
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "model/config.h"
#include "model/params.h"

namespace olmosft::model {

struct XlaParam {
  std::string name;            // the registry tensor's name, or the stack's (experts.<proj>, no index)
  std::vector<int64_t> shape;  // the registry's shape, or [E, the expert tensor's shape]
  std::vector<int> members;    // the registry indices it holds, in order (one: the tensor itself)
  int64_t layer = -1;          // as ParamSpec::layer
  bool decay = true;           // as ParamSpec::decay (the same for every member)
  bool experts() const { return members.size() > 1; }
};
struct XlaParams {
  std::vector<XlaParam> list;  // the programs' parameter arguments, in order
  std::vector<int> of;         // registry index -> its entry in list
};
// C's program parameters (the experts stacked when C has MoE layers; else the registry one for one).
XlaParams xla_params(const ModelConfig& c);

// The host values of P's members (registry tensors of one shape, row-major) one after another: P's row-major
// value.
void pack(const XlaParam& p, const std::vector<const float*>& members, std::span<float> out);
// The inverse: P's value IN back into its members' tensors.
void unpack(const XlaParam& p, std::span<const float> in, const std::vector<float*>& members);
int64_t numel(const XlaParam& p);

}  // namespace olmosft::model
