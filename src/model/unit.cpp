#include "model/unit.h"

#include "core/error.h"
#include "model/params.h"

namespace olmosft::model::unit {

ParamIndex::ParamIndex(const ModelConfig& c) {
  const auto reg = param_registry(c);
  for (size_t i = 0; i < reg.size(); ++i) by_[reg[i].name] = static_cast<int>(i);
  size_ = reg.size();
}

int ParamIndex::get(const std::string& name, bool required) const {
  auto it = by_.find(name);
  OLMO_CHECK(it != by_.end() || !required, who, ": parameter registry has no '", name, "'");
  return it == by_.end() ? -1 : it->second;
}

void resolve_attention(const ParamIndex& idx, const std::string& a, int* q, int* k, int* v, int* o,
                       int* qnorm, int* knorm) {
  *q = idx.get(a + hf::kQProj);
  *k = idx.get(a + hf::kKProj);
  *v = idx.get(a + hf::kVProj);
  *o = idx.get(a + hf::kOProj);
  *qnorm = idx.get(a + hf::kQNorm);
  *knorm = idx.get(a + hf::kKNorm);
}

namespace {
constexpr int64_t kAlignFloats = 16;  // 64 bytes
int64_t round_up(int64_t n) { return (n + kAlignFloats - 1) / kAlignFloats * kAlignFloats; }
}  // namespace

int64_t FloatPlan::total() const {
  int64_t t = 0;
  for (const auto& it : items_) t += round_up(it.second);
  return t;
}

void FloatPlan::carve(float* base) const {
  int64_t off = 0;
  for (const auto& [ptr, n] : items_) {
    *ptr = base + off;
    off += round_up(n);
  }
}

std::vector<int> residency_groups(const ModelConfig& c) {
  const auto reg = param_registry(c);
  std::vector<int> g(reg.size(), 0);
  bool seen_block = false;
  for (size_t i = 0; i < reg.size(); ++i) {
    if (reg[i].layer >= 0) {
      g[i] = static_cast<int>(reg[i].layer) + 1;
      seen_block = true;
    } else {
      g[i] = seen_block ? static_cast<int>(c.num_hidden_layers) + 1 : 0;
    }
  }
  return g;
}

}  // namespace olmosft::model::unit
