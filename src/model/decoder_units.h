// The layer list and units of a config, resolved once, shared by the decoder's backends: the CPU runner
// (decoder.cpp) executes them, the XLA one (decoder_xla.cpp) emits them.
#pragma once
#include <vector>

#include "kernels/rope.h"
#include "model/decoder.h"
#include "model/layers.h"
#include "model/unit_block.h"
#include "model/unit_embedding.h"
#include "model/unit_lm_head.h"

namespace olmosft::model {

// The layer list and units of a config: parameter indices resolved by name once.
struct DecoderUnits {
  std::vector<LayerSpec> layers;
  unit::EmbeddingUnit embed;
  std::vector<unit::Block> blocks;
  unit::LmHeadUnit head;
  size_t count = 0;
  std::vector<int> group;  // residency group per parameter
  RopeFreqs rope[3];       // per RopeKind (None unused)
  DecoderUnits(const ModelConfig& c, const DecoderOptions& o) : layers(layer_specs(c)) {
    unit::ParamIndex idx(c);
    idx.who = c.model_type_name;
    count = idx.size();
    unit::Params p(idx);
    embed.params(p, c);
    for (const LayerSpec& s : layers) blocks.push_back(unit::Block::resolve(idx, c, s));
    head = unit::LmHeadUnit::resolve(idx, c);
    group = unit::residency_groups(c);
    if (uses_rope(layers)) {
      const int full = static_cast<int>(RopeKind::Full), sliding = static_cast<int>(RopeKind::Sliding);
      rope[full] = olmo3_rope_frequencies(c.rope_full, c.head_dim, c.max_position_embeddings);
      rope[sliding] = o.yarn_on_all_layers
                          ? rope[full]
                          : olmo3_rope_frequencies(c.rope_sliding, c.head_dim, c.max_position_embeddings);
    }
  }
};

}  // namespace olmosft::model
