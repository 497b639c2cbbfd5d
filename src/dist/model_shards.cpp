#include "dist/model_shards.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <map>

#include "core/error.h"
#include "model/params.h"

namespace olmosft::dist {

std::vector<TensorSpec> model_specs(const std::vector<model::Param>& params,
                                    const std::vector<Shape>& shapes) {
  OLMO_CHECK(shapes.empty() || shapes.size() == params.size(), "model_specs: ", shapes.size(), " shapes for ",
             params.size(), " parameters");
  std::vector<TensorSpec> specs;
  std::map<std::string, int> unit_of_key;
  bool seen_block = false;
  for (size_t i = 0; i < params.size(); ++i) {
    const model::Param& p = params[i];
    std::string key;
    if (const int64_t l = model::hf::layer_of(p.name); l >= 0) {
      key = "block " + std::to_string(l);
      seen_block = true;
    } else {
      key = seen_block ? "after the blocks" : "before the blocks";
    }
    auto it = unit_of_key.find(key);
    if (it == unit_of_key.end()) it = unit_of_key.emplace(key, int(unit_of_key.size())).first;
    specs.push_back({p.name, shapes.empty() ? p.value.shape() : shapes[i], it->second, p.decay});
  }
  return specs;
}

// Anonymous zero pages reserved for one unit's gradient of one leaf (zero3): physical memory only where the
// backward writes; discard() gives the pages back and they read as zero again.
struct ModelShards::GradPages {
  explicit GradPages(int64_t floats) : bytes(size_t(floats) * 4) {
    void* q =
        ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    OLMO_CHECK(q != MAP_FAILED, "ModelShards: cannot reserve ", bytes,
               " bytes of address space for a gradient: ", std::strerror(errno));
    p = static_cast<float*>(q);
  }
  ~GradPages() { ::munmap(p, bytes); }
  GradPages(const GradPages&) = delete;
  GradPages& operator=(const GradPages&) = delete;
  void discard() {
    OLMO_CHECK(::madvise(p, bytes, MADV_DONTNEED) == 0, "ModelShards: madvise(MADV_DONTNEED) of a ", bytes,
               "-byte gradient failed: ", std::strerror(errno));
  }
  bool touched() const {  // any page resident (written or read since the last discard)
    const size_t page = size_t(::sysconf(_SC_PAGESIZE));
    std::vector<unsigned char> in((bytes + page - 1) / page);
    OLMO_CHECK(::mincore(p, bytes, in.data()) == 0, "ModelShards: mincore failed: ", std::strerror(errno));
    return std::any_of(in.begin(), in.end(), [](unsigned char c) { return (c & 1) != 0; });
  }
  float* p = nullptr;
  size_t bytes = 0;
};

ModelShards::ModelShards(Comm& comm, model::CausalLM& model, ShardMode mode, bool per_layer,
                         const model::ParamFill& fill)
    : comm_(comm), model_(model) {
  std::vector<model::Param>& ps = model_.params();
  size_t hollow = 0;
  for (const auto& p : ps) {
    if (!p.value.defined() && !p.grad.defined()) {
      ++hollow;
      continue;
    }
    OLMO_CHECK(p.value.defined() && p.value.dtype() == DType::F32 && p.value.is_contiguous() &&
                   p.grad.defined() && p.grad.dtype() == DType::F32 && p.grad.shape() == p.value.shape(),
               "model parameter ", p.name, ": expected contiguous fp32 value and grad of the same shape");
  }
  OLMO_CHECK(hollow == 0 || (hollow == ps.size() && fill),
             "ModelShards: a model without parameter storage needs a ParamFill for its weights (", hollow,
             " of ", ps.size(), " parameters have none)");
  std::vector<Shape> shapes;
  if (hollow > 0) {
    const auto reg = model::param_registry(model_.config());
    OLMO_CHECK(reg.size() == ps.size(), "ModelShards: the registry has ", reg.size(), " tensors, the model ",
               ps.size());
    for (size_t t = 0; t < ps.size(); ++t) {
      OLMO_CHECK(reg[t].name == ps[t].name, "ModelShards: parameter ", t, " is ", ps[t].name,
                 ", the registry says ", reg[t].name);
      shapes.push_back(reg[t].shape);
    }
  }
  sp_ = std::make_unique<ShardedParams>(comm_, model_specs(ps, shapes), mode);
  load(fill);
  for (int u = 0; u < sp_->units(); ++u) unit_padded_.push_back(sp_->unit_padded(u));
  for (auto& p : ps) {
    p.value = Tensor();
    p.grad = Tensor();
  }
  if (mode == ShardMode::Replicated) {
    bind_params();  // views of the replicated masters, for good
    return;
  }
  // The residency hooks (per-layer gathering, early gradient reduce-scatter) need the model's groups to be
  // exactly our units.
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
  if (match) {
    model::ParamResidency hooks;
    hooks.need = [this](int g) { need(g); };
    hooks.done = [this](int g) { done(g); };
    hooks_ = model_.set_param_residency(std::move(hooks));
    per_layer_ = hooks_ && per_layer;
  }
}

void ModelShards::load(const model::ParamFill& fill) {
  std::vector<model::Param>& ps = model_.params();
  if (fill) {
    // Only the elements this rank owns: one run per tensor (a rank's shard of a unit is contiguous).
    for (const auto& r : sp_->owned_ranges()) fill(size_t(r.tensor), r.begin, r.n, r.p);
  } else {
    for (size_t t = 0; t < ps.size(); ++t) sp_->set_param(int(t), ps[t].value.data<float>());
  }
  sp_->reset_optimizer();
}

ModelShards::~ModelShards() {
  if (hooks_) model_.set_param_residency({});
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
  leaf_open_ = false;  // a leaf that failed half-way is over
  if (sp_->mode() == ShardMode::Replicated) return;
  for (auto& p : model_.params()) p.value = Tensor();
  for (int u = 0; u < sp_->units(); ++u) sp_->release(u);  // also units a failed leaf left gathered
  bound_ = false;
}

void ModelShards::need(int u) {
  OLMO_CHECK(u >= 0 && u < sp_->units(), "ModelShards: the model asked for residency group ", u, " of ",
             sp_->units());
  if (bound_) return;            // everything is resident (evaluation, whole-model gathering)
  float* base = sp_->gather(u);  // collective; every rank runs the same sequence of leaves
  std::vector<model::Param>& ps = model_.params();
  for (size_t t = 0; t < ps.size(); ++t) {
    const auto& s = sp_->specs()[t];
    if (s.unit == u) ps[t].value = Tensor::wrap(base + sp_->offset_in_unit(int(t)), s.shape, DType::F32);
  }
}

void ModelShards::done(int u) {
  OLMO_CHECK(u >= 0 && u < sp_->units(), "ModelShards: the model released residency group ", u, " of ",
             sp_->units());
  if (!bound_) {
    std::vector<model::Param>& ps = model_.params();
    for (size_t t = 0; t < ps.size(); ++t)
      if (sp_->specs()[t].unit == u) ps[t].value = Tensor();
    sp_->release(u);
  }
  if (!leaf_open_) return;
  // The model.h contract: the last unit is released after the loss gradient went through it (its
  // gradient is complete and the backward has begun); after that, a block's done() ends its backward.
  const int last = sp_->units() - 1;
  if (u == last) backward_ = true;
  if (backward_ && u > 0 && !reduced_[size_t(u)]) {
    reduce_unit(u);
    early_[size_t(u)] = 1;
  }
}

void ModelShards::reduce_unit(int u) {
  GradPages& g = *pages_[size_t(u)];
  if (local_leaves_ == 1) {
    comm_.reduce_scatter_sum(g.p, sp_->owned_grad(u), sp_->unit_shard(u));
  } else {
    comm_.reduce_scatter_sum(g.p, round_.data(), sp_->unit_shard(u));
    sums_[size_t(u)]->push(round_.data());
  }
  g.discard();
  reduced_[size_t(u)] = 1;
}

void ModelShards::point_grads(const std::vector<float*>& unit_bufs) {
  std::vector<model::Param>& ps = model_.params();
  for (size_t t = 0; t < ps.size(); ++t) {
    const auto& s = sp_->specs()[t];
    ps[t].grad = Tensor::wrap(unit_bufs[size_t(s.unit)] + sp_->offset_in_unit(int(t)), s.shape, DType::F32);
  }
}

int64_t ModelShards::leaf_index(int64_t m) const {
  OLMO_CHECK(local_leaves_ >= 1, "ModelShards::leaf_index: no step begun");
  return leaf_of(sp_->mode(), local_leaves_ * comm_.size(), comm_.size(), comm_.rank(), m);
}

void ModelShards::begin_step(int64_t local_leaves) {
  OLMO_CHECK(local_leaves >= 1, "ModelShards: a step needs at least one leaf, got ", local_leaves);
  local_leaves_ = local_leaves;
  pushed_ = 0;
  const int U = sp_->units();
  if (sp_->mode() == ShardMode::Sharded) {
    if (pages_.empty())
      for (int u = 0; u < U; ++u) pages_.push_back(std::make_unique<GradPages>(unit_padded_[size_t(u)]));
    sums_.clear();  // a step abandoned half-way leaves partial sums
    if (local_leaves_ > 1) {
      int64_t most = 0;
      for (int u = 0; u < U; ++u) {
        sums_.push_back(std::make_unique<PairwiseSum>(sp_->unit_shard(u)));
        most = std::max(most, sp_->unit_shard(u));
      }
      round_.resize(size_t(most));
    }
    return;
  }
  if (local_leaves_ > 1 && leaf_.empty()) {
    for (int u = 0; u < U; ++u) {
      leaf_.emplace_back(size_t(unit_padded_[size_t(u)]));
      sums_.push_back(std::make_unique<PairwiseSum>(unit_padded_[size_t(u)]));
    }
  }
}

void ModelShards::begin_leaf() {
  OLMO_CHECK(pushed_ < local_leaves_, "ModelShards: more leaves than begin_step announced");
  std::vector<float*> bufs(size_t(sp_->units()));
  for (int u = 0; u < sp_->units(); ++u) {
    if (sp_->mode() == ShardMode::Sharded) {
      pages_[size_t(u)]->discard();  // zero (a leaf that failed half-way may have left gradients)
      bufs[size_t(u)] = pages_[size_t(u)]->p;
    } else if (local_leaves_ == 1) {
      bufs[size_t(u)] = sp_->grad_buffer(u);  // zero-filled when created
    } else {
      std::fill(leaf_[size_t(u)].begin(), leaf_[size_t(u)].end(), 0.0f);
      bufs[size_t(u)] = leaf_[size_t(u)].data();
    }
  }
  point_grads(bufs);
  if (sp_->mode() == ShardMode::Sharded) {
    reduced_.assign(size_t(sp_->units()), 0);
    early_.assign(size_t(sp_->units()), 0);
    leaf_open_ = true;
    backward_ = false;
  }
}

void ModelShards::end_leaf() {
  if (sp_->mode() == ShardMode::Sharded) {
    leaf_open_ = false;
    // What the hooks did not reduce yet (the first unit; every unit of a model without hooks), last first.
    for (int u = sp_->units() - 1; u >= 0; --u)
      if (!reduced_[size_t(u)]) reduce_unit(u);
    for (int u = 0; u < sp_->units(); ++u)
      OLMO_CHECK(!early_[size_t(u)] || !pages_[size_t(u)]->touched(), "ModelShards: the model wrote the ",
                 "gradient of residency group ", u,
                 " after its backward was declared done (model.h "
                 "ParamResidency: done(g) after the loss gradient ends group g's backward); that gradient "
                 "would be lost");
  } else if (local_leaves_ > 1) {
    for (int u = 0; u < sp_->units(); ++u) sums_[size_t(u)]->push(leaf_[size_t(u)].data());
  }
  ++pushed_;
}

void ModelShards::reduce() {
  OLMO_CHECK(pushed_ == local_leaves_, "ModelShards: ", pushed_, " leaves accumulated, ", local_leaves_,
             " announced");
  for (auto& p : model_.params()) p.grad = Tensor();
  if (sp_->mode() == ShardMode::Sharded) {
    // The rounds, added pairwise on this rank's shard (one leaf per rank: already in place).
    if (local_leaves_ > 1)
      for (int u = 0; u < sp_->units(); ++u) sums_[size_t(u)]->finish(sp_->owned_grad(u));
    sums_.clear();  // between steps a rank holds only its 1/N
    std::vector<float>().swap(round_);
  } else {
    if (local_leaves_ > 1)  // dp keeps the leaf buffers (saves re-faulting the pages every step)
      for (int u = 0; u < sp_->units(); ++u) sums_[size_t(u)]->finish(sp_->grad_buffer(u));
    // Backward order (last unit first).
    for (int u = sp_->units() - 1; u >= 0; --u) sp_->reduce_grads(u);
  }
  local_leaves_ = pushed_ = 0;
}

void ModelShards::finish(bool hand_back) {
  if (hooks_) model_.set_param_residency({});
  per_layer_ = hooks_ = false;
  std::vector<model::Param>& ps = model_.params();
  std::vector<Tensor> vals(ps.size());
  for (int u = 0; u < sp_->units(); ++u) {
    const float* base = sp_->gather(u);
    for (size_t t = 0; t < ps.size(); ++t) {
      const auto& s = sp_->specs()[t];
      if (s.unit != u || !hand_back) continue;
      vals[t] = Tensor::empty(s.shape);
      std::memcpy(vals[t].data<float>(), base + sp_->offset_in_unit(int(t)), size_t(s.numel()) * 4);
    }
    if (!bound_) sp_->release(u);
  }
  for (size_t t = 0; t < ps.size(); ++t) {
    ps[t].value = vals[t];
    ps[t].grad = hand_back ? Tensor::zeros(vals[t].shape()) : Tensor();
  }
  if (bound_ && sp_->mode() == ShardMode::Sharded)
    for (int u = 0; u < sp_->units(); ++u) sp_->release(u);
  bound_ = false;
  finished_ = true;
}

}  // namespace olmosft::dist
