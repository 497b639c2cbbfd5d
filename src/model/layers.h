// The decoder as a list of layers: what one config builds, read once (docs/model.md, "One decoder"). Every
// family is one configuration of the same decoder: an embedding, one block per layer (a mixer and an FFN,
// each wrapped in norms), a final norm and the LM head. A block's spec says which mixer and FFN it has and
// where its norms sit; the units (model/unit_*.h) and the runner (model/decoder.h) read only these specs and
// the config's sizes, never the family. Backend-neutral: the CPU runner executes this list; an emitter
// (src/xla) builds the same list.
//
// Adding a mixer kind: its unit file (which also declares its tensors), its entry in unit_block.h's mixer
// list (MixerKind below indexes that list) and its case in layer_list (layers.cpp); config keys of its own
// go to config.h / config.cpp (docs/model.md, "Adding a mixer kind").
#pragma once
#include <array>
#include <cstdint>
#include <vector>

#include "model/config.h"

namespace olmosft::model {

// A layer's mixer kind: its unit's index in unit::Mixers (unit_block.h), the one list of mixer units;
// unit::kMixer<U> is unit U's.
enum class MixerKind : uint8_t {};
enum class FfnKind { SwiGlu, Moe };
enum class RopeKind { None, Full, Sliding };  // which of the config's RoPE tables an attention layer reads
enum class LayerPart { Mixer, Ffn, Norms };   // a block's tensors: its mixer's, its FFN's, its norms

struct LayerSpec {
  int64_t index = 0;
  MixerKind mixer{};
  FfnKind ffn = FfnKind::SwiGlu;
  int64_t window = 0;  // attention: sliding window (0 = full causal)
  RopeKind rope = RopeKind::None;
  // Norm placement around each sub-layer (mixer, FFN): post-norm (Olmo 3: y = x + N(f(x))), peri-LN
  // (Olmo 3.5: y = x + N(f(N'(x)))) or pre-norm (Olmo Hybrid's GDN layers: y = x + f(N'(x))).
  bool pre_norm = false;
  bool post_norm = true;
  int64_t ffn_hidden = 0;  // SwiGLU hidden size (the MoE's sizes are the config's)
  // The order of the block's tensors in the HF state dict, which is the registry's and so the export and
  // ZeRO-3 sharding order (model/params.h): the order the family's HF decoder layer registers its modules.
  std::array<LayerPart, 3> hf_order = {LayerPart::Mixer, LayerPart::Ffn, LayerPart::Norms};
  // Layers of one kind have Saved buffers of one shape (recomputation shares one per kind):
  // kKindsPerMixer kinds per mixer kind (unit_block.h kLayerKinds in all).
  int kind() const {
    return static_cast<int>(mixer) * kKindsPerMixer + (ffn == FfnKind::Moe ? 4 : 0) + (pre_norm ? 2 : 0) +
           (post_norm ? 1 : 0);
  }
  static constexpr int kKindsPerMixer = 2 * 4;
};

// The layer list of a config (validated: throws olmosft::Error naming the config field that this decoder
// does not support).
std::vector<LayerSpec> layer_specs(const ModelConfig& c);
// The same list unvalidated (the parameter registry of a config, which may name what the decoder refuses).
std::vector<LayerSpec> layer_list(const ModelConfig& c);
// Whether the config has a layer with this RoPE table / FFN.
bool uses_rope(const std::vector<LayerSpec>& layers);
bool has_ffn(const std::vector<LayerSpec>& layers, FfnKind f);
// The checks of layer_specs alone (the family's supported settings).
void check_supported(const ModelConfig& c);

}  // namespace olmosft::model
