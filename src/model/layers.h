// The decoder as a list of layers: what one config builds, read once (docs/model.md, "One decoder"). Every
// family is one configuration of the same decoder: an embedding, one block per layer (a mixer and an FFN,
// each wrapped in norms), a final norm and the LM head. A block's spec says which mixer and FFN it has and
// where its norms sit; the units (model/unit_*.h) and the runner (model/decoder.h) read only these specs and
// the config's sizes, never the family. Backend-neutral: the CPU runner executes this list; an emitter
// (src/xla) builds the same list.
//
// Adding a mixer kind: its unit file (which also declares its tensors), its config keys (config.cpp), its
// case in layer_specs (here) and its entry in unit_block.h's mixer list (MixerKind below follows that list).
#pragma once
#include <cstdint>
#include <vector>

#include "model/config.h"

namespace olmosft::model {

// In unit_block.h's Mixers order (a static_assert there checks the count).
enum class MixerKind { Attention, Kda, Gdn };
inline constexpr int kMixerKinds = 3;
enum class FfnKind { SwiGlu, Moe };
enum class RopeKind { None, Full, Sliding };  // which of the config's RoPE tables an attention layer reads

struct LayerSpec {
  int64_t index = 0;
  MixerKind mixer = MixerKind::Attention;
  FfnKind ffn = FfnKind::SwiGlu;
  int64_t window = 0;  // attention: sliding window (0 = full causal)
  RopeKind rope = RopeKind::None;
  // Norm placement around each sub-layer (mixer, FFN): post-norm (Olmo 3: y = x + N(f(x))), peri-LN
  // (Olmo 3.5: y = x + N(f(N'(x)))) or pre-norm (Olmo Hybrid's GDN layers: y = x + f(N'(x))).
  bool pre_norm = false;
  bool post_norm = true;
  int64_t ffn_hidden = 0;  // SwiGLU hidden size (the MoE's sizes are the config's)
  // Layers of one kind have Saved buffers of one shape (recomputation shares one per kind).
  int kind() const {
    return (static_cast<int>(mixer) * 2 + (ffn == FfnKind::Moe ? 1 : 0)) * 4 + (pre_norm ? 2 : 0) +
           (post_norm ? 1 : 0);
  }
  static constexpr int kKinds = kMixerKinds * 2 * 4;
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
