#include "dist/model_shards.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <map>

#include "core/error.h"
#include "model/params.h"

namespace olmosft::dist {

std::vector<TensorSpec> model_specs(const std::vector<model::Param>& params) {
  std::vector<TensorSpec> specs;
  std::map<std::string, int> unit_of_key;
  bool seen_block = false;
  for (const auto& p : params) {
    std::string key;
    if (const int64_t l = model::hf::layer_of(p.name); l >= 0) {
      key = "block " + std::to_string(l);
      seen_block = true;
    } else {
      key = seen_block ? "after the blocks" : "before the blocks";
    }
    auto it = unit_of_key.find(key);
    if (it == unit_of_key.end()) it = unit_of_key.emplace(key, int(unit_of_key.size())).first;
    specs.push_back({p.name, p.value.shape(), it->second, p.decay});
  }
  return specs;
}

ModelShards::ModelShards(Comm& comm, model::CausalLM& model, ShardMode mode, bool per_layer)
    : comm_(comm), model_(model) {
  std::vector<model::Param>& ps = model_.params();
  for (const auto& p : ps) {
    OLMO_CHECK(p.value.defined() && p.value.dtype() == DType::F32 && p.value.is_contiguous() &&
                   p.grad.defined() && p.grad.dtype() == DType::F32 && p.grad.shape() == p.value.shape(),
               "model parameter ", p.name, ": expected contiguous fp32 value and grad of the same shape");
  }
  sp_ = std::make_unique<ShardedParams>(comm_, model_specs(ps), mode);
  for (size_t t = 0; t < ps.size(); ++t) sp_->set_param(int(t), ps[t].value.data<float>());
  sp_->reset_optimizer();
  for (int u = 0; u < sp_->units(); ++u) unit_padded_.push_back(sp_->unit_padded(u));
  for (auto& p : ps) {
    p.value = Tensor();
    p.grad = Tensor();
  }
  if (mode == ShardMode::Replicated) {
    bind_params();  // views of the replicated masters, for good
    return;
  }
  // Per-layer gathering needs the model's residency groups to be exactly our units.
  const auto& specs = sp_->specs();
  bool match = true;
  int blocks = 0;
  for (const auto& s : specs) {
    const int64_t l = model::hf::layer_of(s.name);
    if (l >= 0) {
      blocks = std::max(blocks, static_cast<int>(l) + 1);
      match = match && s.unit == l + 1;
    }
  }
  for (const auto& s : specs)
    if (model::hf::layer_of(s.name) < 0) match = match && (s.unit == 0 || s.unit == blocks + 1);
  match = match && blocks > 0 && sp_->units() == blocks + 2;
  if (match && per_layer) {
    model::ParamResidency hooks;
    hooks.need = [this](int g) { need(g); };
    hooks.done = [this](int g) { done(g); };
    per_layer_ = model_.set_param_residency(std::move(hooks));
  }
}

ModelShards::~ModelShards() {
  if (per_layer_) model_.set_param_residency({});
  if (finished_) return;
  // Unwinding (no collectives allowed): keep what is available locally.
  std::vector<model::Param>& ps = model_.params();
  const bool local_full = sp_->mode() == ShardMode::Replicated || comm_.size() == 1;
  for (size_t t = 0; t < ps.size(); ++t) {
    const auto& s = sp_->specs()[t];
    Tensor v = Tensor::zeros(s.shape);
    if (local_full) {
      try {
        const float* src = sp_->gather(s.unit) + sp_->offset_in_unit(int(t));
        std::memcpy(v.data<float>(), src, size_t(s.numel()) * 4);
      } catch (...) {
      }
    }
    ps[t].value = v;
    ps[t].grad = Tensor::zeros(s.shape);
  }
}

void ModelShards::bind_params() {
  if (bound_) return;
  std::vector<model::Param>& ps = model_.params();
  std::vector<float*> base(size_t(sp_->units()));
  for (int u = 0; u < sp_->units(); ++u) base[size_t(u)] = sp_->gather(u);
  for (size_t t = 0; t < ps.size(); ++t) {
    const auto& s = sp_->specs()[t];
    ps[t].value = Tensor::wrap(base[size_t(s.unit)] + sp_->offset_in_unit(int(t)), s.shape, DType::F32);
  }
  bound_ = true;
}

void ModelShards::bind_for_step() {
  if (!per_layer_) bind_params();
}

void ModelShards::release_params() {
  if (sp_->mode() == ShardMode::Replicated) return;
  for (auto& p : model_.params()) p.value = Tensor();
  for (int u = 0; u < sp_->units(); ++u) sp_->release(u);  // also units a failed leaf left gathered
  bound_ = false;
}

void ModelShards::need(int u) {
  OLMO_CHECK(u >= 0 && u < sp_->units(), "ModelShards: the model asked for residency group ", u, " of ",
             sp_->units());
  if (bound_) return;            // everything is resident (evaluation)
  float* base = sp_->gather(u);  // collective; every rank runs the same sequence of leaves
  std::vector<model::Param>& ps = model_.params();
  for (size_t t = 0; t < ps.size(); ++t) {
    const auto& s = sp_->specs()[t];
    if (s.unit == u) ps[t].value = Tensor::wrap(base + sp_->offset_in_unit(int(t)), s.shape, DType::F32);
  }
}

void ModelShards::done(int u) {
  if (bound_) return;
  std::vector<model::Param>& ps = model_.params();
  for (size_t t = 0; t < ps.size(); ++t)
    if (sp_->specs()[t].unit == u) ps[t].value = Tensor();
  sp_->release(u);
}

void ModelShards::point_grads(const std::vector<float*>& unit_bufs) {
  std::vector<model::Param>& ps = model_.params();
  for (size_t t = 0; t < ps.size(); ++t) {
    const auto& s = sp_->specs()[t];
    ps[t].grad = Tensor::wrap(unit_bufs[size_t(s.unit)] + sp_->offset_in_unit(int(t)), s.shape, DType::F32);
  }
}

void ModelShards::begin_step(int64_t local_leaves) {
  OLMO_CHECK(local_leaves >= 1, "ModelShards: a step needs at least one leaf, got ", local_leaves);
  local_leaves_ = local_leaves;
  pushed_ = 0;
  if (local_leaves_ > 1 && leaf_.empty()) {
    for (int u = 0; u < sp_->units(); ++u) {
      leaf_.emplace_back(size_t(unit_padded_[size_t(u)]));
      sums_.push_back(std::make_unique<PairwiseSum>(unit_padded_[size_t(u)]));
    }
  }
}

void ModelShards::begin_leaf() {
  OLMO_CHECK(pushed_ < local_leaves_, "ModelShards: more leaves than begin_step announced");
  std::vector<float*> bufs(size_t(sp_->units()));
  for (int u = 0; u < sp_->units(); ++u) {
    if (local_leaves_ == 1) {
      bufs[size_t(u)] = sp_->grad_buffer(u);  // zero-filled when created
    } else {
      std::fill(leaf_[size_t(u)].begin(), leaf_[size_t(u)].end(), 0.0f);
      bufs[size_t(u)] = leaf_[size_t(u)].data();
    }
  }
  point_grads(bufs);
}

void ModelShards::end_leaf() {
  if (local_leaves_ > 1)
    for (int u = 0; u < sp_->units(); ++u) sums_[size_t(u)]->push(leaf_[size_t(u)].data());
  ++pushed_;
}

void ModelShards::reduce() {
  OLMO_CHECK(pushed_ == local_leaves_, "ModelShards: ", pushed_, " leaves accumulated, ", local_leaves_,
             " announced");
  for (auto& p : model_.params()) p.grad = Tensor();
  if (local_leaves_ > 1) {
    for (int u = 0; u < sp_->units(); ++u) sums_[size_t(u)]->finish(sp_->grad_buffer(u));
    // dp keeps the leaf buffers for the next step (its memory is not sharded anyway; saves re-faulting
    // the pages every step); zero3 frees them so that between steps a rank holds only its 1/N.
    if (sp_->mode() == ShardMode::Sharded) {
      leaf_.clear();
      sums_.clear();
    }
  }
  // Backward order (last unit first), the order a per-layer schedule would overlap them in.
  for (int u = sp_->units() - 1; u >= 0; --u) sp_->reduce_grads(u);
  local_leaves_ = pushed_ = 0;
}

void ModelShards::finish() {
  if (per_layer_) model_.set_param_residency({});
  per_layer_ = false;
  std::vector<model::Param>& ps = model_.params();
  std::vector<Tensor> vals(ps.size());
  for (int u = 0; u < sp_->units(); ++u) {
    const float* base = sp_->gather(u);
    for (size_t t = 0; t < ps.size(); ++t) {
      const auto& s = sp_->specs()[t];
      if (s.unit != u) continue;
      vals[t] = Tensor::empty(s.shape);
      std::memcpy(vals[t].data<float>(), base + sp_->offset_in_unit(int(t)), size_t(s.numel()) * 4);
    }
    if (!bound_) sp_->release(u);
  }
  for (size_t t = 0; t < ps.size(); ++t) {
    ps[t].value = vals[t];
    ps[t].grad = Tensor::zeros(vals[t].shape());
  }
  if (bound_ && sp_->mode() == ShardMode::Sharded)
    for (int u = 0; u < sp_->units(); ++u) sp_->release(u);
  bound_ = false;
  finished_ = true;
}

}  // namespace olmosft::dist
