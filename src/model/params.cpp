#include "model/params.h"

#include "model/unit_block.h"
#include "model/unit_embedding.h"
#include "model/unit_lm_head.h"

namespace olmosft::model {

std::string hf::layer(int64_t l) { return std::string(kLayersPrefix) + std::to_string(l) + "."; }

int64_t hf::layer_of(const std::string& name) {
  const std::string pre = kLayersPrefix;
  if (name.compare(0, pre.size(), pre) != 0) return -1;
  int64_t l = 0;
  size_t i = pre.size();
  for (; i < name.size() && i < pre.size() + 12 && name[i] >= '0' && name[i] <= '9'; ++i)
    l = l * 10 + (name[i] - '0');
  return i > pre.size() && i < name.size() && name[i] == '.' ? l : -1;
}
std::string hf::expert(int64_t e) { return "experts." + std::to_string(e) + "."; }
std::string hf::shared_expert(const char* proj) { return std::string("shared_expert.") + proj; }

hf::BlockNorms hf::block_norms(const LayerSpec& s) {
  if (s.pre_norm && !s.post_norm) return {kInputNorm, nullptr, kPostAttnNorm, nullptr};
  if (s.pre_norm) return {kPreAttnNorm, kPostAttnNorm, kPreFfnNorm, kPostFfnNorm};
  return {nullptr, kPostAttnNorm, nullptr, kPostFfnNorm};
}

std::optional<hf::ImportAlias> hf::import_alias(const ModelConfig& c, const std::string& stored) {
  if (c.model_type != ModelType::OlmoHybrid) return std::nullopt;
  const int64_t l = layer_of(stored);
  if (l < 0) return std::nullopt;
  const std::string p = layer(l), rest = stored.substr(p.size());
  const std::string la = kLinearAttn;
  if (rest == "attention_layer_norm.weight") return ImportAlias{p + kInputNorm};
  if (rest == "feedforward_layer_norm.weight") return ImportAlias{p + kPostAttnNorm};
  if (rest == la + "out_proj.weight") return ImportAlias{p + la + kOProj};
  if (rest == la + "norm.weight") return ImportAlias{p + la + kONorm};
  const char* convs[3] = {kQConv, kKConv, kVConv};
  for (int i = 0; i < 3; ++i)
    if (rest == la + convs[i]) return ImportAlias{p + la + kConv1d, i, 3};
  return std::nullopt;
}

std::vector<ParamSpec> param_registry(const ModelConfig& c) {
  std::vector<ParamSpec> rows;
  unit::Params p(rows);
  unit::EmbeddingUnit().params(p, c);
  for (const LayerSpec& s : layer_list(c)) unit::Block::of(s).params(p, c);
  unit::LmHeadUnit().params(p, c);
  return rows;
}

ParamCounts count_params(const ModelConfig& c, const std::vector<ParamSpec>& reg) {
  ParamCounts pc;
  int64_t routed = 0;
  for (const auto& p : reg) {
    int64_t n = shape_numel(p.shape);
    pc.total += n;
    if (p.routed_expert) routed += n;
  }
  pc.tensors = reg.size();
  pc.active = pc.total - routed;
  if (c.is_moe() && routed > 0) pc.active += routed / c.n_routed_experts * c.num_experts_per_tok;
  return pc;
}

ParamCounts count_params(const ModelConfig& c) { return count_params(c, param_registry(c)); }

}  // namespace olmosft::model
