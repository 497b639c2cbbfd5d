#include "model/unit.h"

#include <algorithm>
#include <cmath>

#include "core/bf16.h"
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

void Params::add(int& slot, std::string name, Shape shape, bool routed, bool fp32) {
  if (idx_ != nullptr) {
    slot = idx_->get(name);
    return;
  }
  const bool decay = shape.size() >= 2 && !name.ends_with("norm.weight");
  slot = static_cast<int>(rows_->size());
  rows_->push_back({std::move(name), std::move(shape), layer_, routed, fp32, decay});
}

namespace {
constexpr size_t kAlignBytes = 64;
size_t round_up(size_t n) { return (n + kAlignBytes - 1) / kAlignBytes * kAlignBytes; }
}  // namespace

size_t Plan::bytes() const {
  size_t t = 0;
  for (const auto& it : items_) t += round_up(it.bytes);
  return t;
}

void Plan::keep_activations_in(Bf16Store* store, int64_t tokens) {
  bf16_ = store;
  if (store == nullptr) return;
  store->staging = Plan{};
  store->items.clear();
  store->planned_tokens = tokens;
}

void Plan::add_bf16(float** ptr, int64_t n) {
  bf16_->staging.add(ptr, n);
  bf16_->items.push_back({ptr, n});
  add(&bf16_->items.back().bf16, n);
}

void Bf16Store::compress(int64_t tokens) const {
  for (const Item& it : items)
    f32_to_bf16(*it.fp32, it.bf16, static_cast<size_t>(it.n / planned_tokens * tokens));
}

void Bf16Store::expand(int64_t tokens) const {
  for (const Item& it : items)
    bf16_to_f32(it.bf16, *it.fp32, static_cast<size_t>(it.n / planned_tokens * tokens));
}

std::vector<Plan> Bf16Store::stagings(const std::vector<Bf16Store>& layers) {
  std::vector<Plan> v;
  for (const Bf16Store& s : layers) v.push_back(s.staging);
  return v;
}

void Plan::add_overlay(std::vector<Plan> alternatives) {
  size_t n = 0;
  for (const Plan& a : alternatives) n = std::max(n, a.bytes());
  overlays_.push_back(std::move(alternatives));
  items_.push_back({nullptr, n, nullptr, static_cast<int>(overlays_.size()) - 1});
}

void Plan::carve(std::byte* base) const {
  size_t off = 0;
  for (const auto& it : items_) {
    if (it.overlay >= 0) {
      for (const Plan& a : overlays_[static_cast<size_t>(it.overlay)]) a.carve(base + off);
    } else {
      it.set(it.slot, base + off);
    }
    off += round_up(it.bytes);
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

AttentionConfig attention_config(const ModelConfig& c, int64_t B, int64_t T, int64_t window) {
  AttentionConfig ac;
  ac.batch = B;
  ac.seq = T;
  ac.heads = c.num_attention_heads;
  ac.kv_heads = c.num_key_value_heads;
  ac.head_dim = ac.v_head_dim = c.head_dim;
  ac.window = window;
  ac.scale = 1.0 / std::sqrt(static_cast<double>(c.head_dim));
  return ac;
}

template <typename T>
size_t attention_workspace_bytes(const ModelConfig& c, int64_t B, int64_t T_) {
  size_t need = 0;
  for (int64_t win : {int64_t(0), c.sliding_window}) {
    const AttentionConfig ac = attention_config(c, B, T_, win);
    need =
        std::max({need, attention_forward_workspace_bytes<T>(ac), attention_backward_workspace_bytes<T>(ac)});
  }
  return need;
}
template size_t attention_workspace_bytes<float>(const ModelConfig&, int64_t, int64_t);
template size_t attention_workspace_bytes<double>(const ModelConfig&, int64_t, int64_t);

}  // namespace olmosft::model::unit
