// The decoder as a list of layers: what one config builds, read once (docs/model.md, "One decoder"). Every
// family is one configuration of the same decoder: an embedding, one block per layer (a mixer and an FFN,
// each wrapped in norms), a final norm and the LM head. A block's spec says which mixer and FFN it has and
// where its norms sit; the units (model/unit_*.h) and the runner (model/decoder.h) read only these specs and
// the config's sizes, never the family. Backend-neutral: the CPU runner executes this list; an emitter
// (src/xla) builds the same list.
//
// Adding a mixer kind: its unit file, its config keys (config.cpp), its tensors (params.cpp), its case in
// layer_specs (here) and its entry in unit_block.h's mixer list.
#pragma once
#include <cstdint>
#include <vector>

#include "model/config.h"

namespace olmosft::model {

enum class MixerKind { Attention, Kda };
enum class FfnKind { SwiGlu, Moe };
enum class RopeKind { None, Full, Sliding };  // which of the config's RoPE tables an attention layer reads

struct LayerSpec {
  int64_t index = 0;
  MixerKind mixer = MixerKind::Attention;
  FfnKind ffn = FfnKind::SwiGlu;
  int64_t window = 0;  // attention: sliding window (0 = full causal)
  RopeKind rope = RopeKind::None;
  bool pre_norm = false;   // peri-LN: a norm before each sub-layer too (post-norms always)
  int64_t ffn_hidden = 0;  // SwiGLU hidden size (the MoE's sizes are the config's)
  // Layers of one kind have Saved buffers of one shape (recomputation shares one per kind).
  int kind() const { return (mixer == MixerKind::Kda ? 2 : 0) + (ffn == FfnKind::Moe ? 1 : 0); }
  static constexpr int kKinds = 4;
};

// The layer list of a config (validated: throws olmosft::Error naming the config field that this decoder
// does not support).
std::vector<LayerSpec> layer_specs(const ModelConfig& c);
// Whether the config has a layer with this mixer / RoPE table.
bool has_mixer(const std::vector<LayerSpec>& layers, MixerKind m);
bool uses_rope(const std::vector<LayerSpec>& layers);
bool has_ffn(const std::vector<LayerSpec>& layers, FfnKind f);
// The checks of layer_specs alone (the family's supported settings).
void check_supported(const ModelConfig& c);

}  // namespace olmosft::model
