#include "train/step.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "train/trainer.h"

namespace olmosft::train {

bool any_rank(dist::Comm& c, bool local) { return c.size() > 1 ? !c.all_ok(!local) : local; }

// ---- loss parts ---------------------------------------------------------------------------------------

namespace {
constexpr size_t kHead = model::kLossTermCount + 1, kPerLayer = 5;  // the packed layout of step.h
}  // namespace

size_t packed_loss_parts_size(size_t moe_layers) { return kHead + kPerLayer * moe_layers; }

void pack_loss_parts(const model::LossParts& lp, double* r) {
  for (size_t t = 0; t < model::kLossTermCount; ++t) r[t] = lp.sum[t];
  r[model::kLossTermCount] = static_cast<double>(lp.tokens);
  for (size_t k = 0; k < lp.moe_layers.size(); ++k) {
    const model::MoeLayerStats& ls = lp.moe_layers[k];
    double* q = r + kHead + kPerLayer * k;
    q[0] = static_cast<double>(ls.layer), q[1] = ls.lb_loss, q[2] = ls.router_z;
    q[3] = ls.required_buffer_factor, q[4] = static_cast<double>(ls.dropped_tokens);
  }
}

model::LossParts unpack_loss_parts(const double* r, size_t moe_layers) {
  model::LossParts lp;
  for (size_t t = 0; t < model::kLossTermCount; ++t) lp.sum[t] = r[t];
  lp.tokens = static_cast<int64_t>(r[model::kLossTermCount]);
  lp.moe_layers.resize(moe_layers);
  for (size_t k = 0; k < moe_layers; ++k) {
    const double* q = r + kHead + kPerLayer * k;
    model::MoeLayerStats& ls = lp.moe_layers[k];
    ls.layer = static_cast<int64_t>(q[0]), ls.lb_loss = q[1], ls.router_z = q[2];
    ls.required_buffer_factor = q[3], ls.dropped_tokens = static_cast<int64_t>(q[4]);
  }
  return lp;
}

void StepParts::add_leaf(const model::LossParts& lp, int64_t leaves) {
  for (size_t t = 0; t < model::kLossTermCount; ++t) sum[t] += lp.sum[t];
  tokens += lp.tokens;
  for (const model::MoeLayerStats& ls : lp.moe_layers) {
    model::MoeLayerStats& acc = moe[ls.layer];
    acc.layer = ls.layer;
    acc.dropped_tokens += ls.dropped_tokens;
    acc.required_buffer_factor = std::max(acc.required_buffer_factor, ls.required_buffer_factor);
    acc.lb_loss += ls.lb_loss / static_cast<double>(leaves);
    acc.router_z += ls.router_z / static_cast<double>(leaves);
  }
}

StepParts gather_loss_parts(dist::Comm& comm, const std::vector<model::LossParts>& mine, int64_t leaves,
                            int64_t step, dist::ShardMode mode) {
  const size_t world = static_cast<size_t>(comm.size());
  double nm = static_cast<double>(mine[0].moe_layers.size());
  std::vector<double> nms(world);
  comm.all_gather(&nm, nms.data(), 1);
  for (double x : nms) OLMO_CHECK(x == nm, "step ", step, ": ranks report different numbers of MoE layers");
  const size_t moe_layers = static_cast<size_t>(nm), R = packed_loss_parts_size(moe_layers);
  std::vector<double> packed(mine.size() * R), all(static_cast<size_t>(leaves) * R);
  for (size_t m = 0; m < mine.size(); ++m) {
    OLMO_CHECK(mine[m].moe_layers.size() == moe_layers, "step ", step,
               ": leaves report different numbers of MoE layers");
    pack_loss_parts(mine[m], &packed[m * R]);
  }
  comm.all_gather(packed.data(), all.data(), static_cast<int64_t>(packed.size()));
  // all[] holds rank 0's leaves, then rank 1's, ...; slot[l] = where leaf l is.
  const int64_t per = leaves / static_cast<int64_t>(world);
  std::vector<size_t> slot(static_cast<size_t>(leaves));
  for (int p = 0; p < static_cast<int>(world); ++p)
    for (int64_t m = 0; m < per; ++m)
      slot[static_cast<size_t>(dist::leaf_of(mode, leaves, static_cast<int>(world), p, m))] =
          static_cast<size_t>(p * per + m);
  StepParts sp;
  for (int64_t l = 0; l < leaves; ++l)
    sp.add_leaf(unpack_loss_parts(&all[slot[static_cast<size_t>(l)] * R], moe_layers), leaves);
  return sp;
}

StepLosses step_losses(const StepParts& sp, int64_t total, int64_t leaves, const model::LossValues& weight) {
  StepLosses l;
  const double dt = static_cast<double>(total);
  for (size_t t = 0; t < model::kLossTermCount; ++t) {
    if (model::kLossTerms[t].reduction == model::LossReduction::TokenMean)
      l.value[t] = weight[t] * sp.sum[t] / dt;
    else
      l.value[t] = sp.sum[t] / static_cast<double>(leaves);
    l.loss = t == 0 ? l.value[t] : l.loss + l.value[t];
  }
  return l;
}

// ---- the step ------------------------------------------------------------------------------------------

namespace {

// This rank's rows of step s cut into its leaves (a data error on any rank stops every rank), and the
// trained targets of the whole step (the loss denominator).
std::vector<HostBatch> load_leaves(const StepContext& c, int64_t s, StepOutcome& o) {
  std::vector<HostBatch> micro;
  int64_t local_total = 0;
  double local_flops = 0;
  try {
    // This rank's m-th leaf is the step's leaf dist::leaf_of(...) (ModelShards::leaf_index): its rows are
    // the step's rows [leaf * mb_rows, (leaf + 1) * mb_rows).
    for (int64_t m = 0; m < c.ga; ++m) {
      const int64_t leaf = dist::leaf_of(c.shards.mode(), c.leaves, c.comm.size(), c.comm.rank(), m);
      micro.push_back(
          make_batch(c.ds, c.order.step_rows(s, static_cast<int>(leaf), static_cast<int>(c.leaves))));
      local_total += micro.back().trained_count;
      if (c.flops) local_flops += c.flops->count(micro.back().view()).total();
    }
  } catch (const Error& e) {
    o.error = e.what();
  }
  if (any_rank(c.comm, !o.error.empty()) && o.error.empty()) o.error = "a data error on another rank";
  if (o.error.empty()) {
    double t[2] = {static_cast<double>(local_total), local_flops};  // t[0] exact: integer counts < 2^53
    c.comm.all_reduce_sum(t, 2);
    o.total = static_cast<int64_t>(t[0]);
    o.flops = t[1];
    if (o.total <= 0)
      o.error = "step " + std::to_string(s) + ": no trained targets in its " +
                std::to_string(c.global_batch) + " rows";
  }
  return micro;
}

// Forward + backward of each leaf. After SIGTERM, a leaf is started only while the rest of the step fits in
// half the grace period (decided on every rank alike); otherwise the step is abandoned.
std::vector<model::LossParts> run_leaves(const StepContext& c, const std::vector<HostBatch>& micro,
                                         Clock::time_point t0, StepOutcome& o) {
  std::vector<model::LossParts> parts(static_cast<size_t>(c.ga));
  Clock::time_point sig_seen{};
  bool sig_noted = false;
  for (int64_t m = 0; m < c.ga; ++m) {
    if (m > 0) {
      bool want = false;
      if (sigterm_requested()) {
        if (!sig_noted) {
          sig_seen = Clock::now();
          sig_noted = true;
        }
        double per_micro = seconds_since(t0) / static_cast<double>(m);
        want = seconds_since(sig_seen) + per_micro * static_cast<double>(c.ga - m) > 0.5 * c.grace;
      }
      if (any_rank(c.comm, want)) {
        o.abandoned = true;
        break;
      }
    }
    if (!o.error.empty()) continue;  // keep taking part in the collectives
    try {
      if (!c.device_grads) c.shards.begin_leaf();
      parts[static_cast<size_t>(m)] =
          c.model.forward_backward(micro[static_cast<size_t>(m)].view(), c.lc,
                                   1.0 / static_cast<double>(o.total), 1.0 / static_cast<double>(c.leaves));
      if (!c.device_grads) c.shards.end_leaf();
    } catch (const Error& e) {
      o.error = e.what();
    }
  }
  if (any_rank(c.comm, !o.error.empty()) && o.error.empty()) o.error = "an error on another rank";
  return parts;
}

}  // namespace

StepOutcome run_step(const StepContext& c, int64_t s, Clock::time_point t0) {
  StepOutcome o;
  std::vector<HostBatch> micro = load_leaves(c, s, o);
  if (!o.error.empty()) return o;
  c.shards.bind_for_step();  // zero3: whole-model all-gather, unless the model gathers per layer
  c.shards.begin_step(c.ga);
  std::vector<model::LossParts> parts = run_leaves(c, micro, t0, o);
  if (o.error.empty() && !o.abandoned) {
    // Loss parts of every leaf, gathered in leaf order and added in that order (any process count).
    o.parts = gather_loss_parts(c.comm, parts, c.leaves, s, c.shards.mode());
    if (!c.device_grads) c.shards.reduce();  // leaf sums -> all-reduce (dp) / the rounds' sums (zero3)
  }
  c.shards.release_params();
  return o;
}

double apply_update(dist::ShardedParams& master, AdamWConfig& acfg, const Schedule& sched, double clip,
                    int64_t s, double gnorm) {
  const double lr = sched.at(s);
  acfg.lr = lr;
  master.clip_and_step(acfg, clip, s, gnorm);  // clip, then AdamW on what this rank owns
  return lr;
}

}  // namespace olmosft::train

namespace olmosft::train {

namespace {

// The master's parameters and moments per model parameter (registry order, matched by name).
struct MasterViews {
  std::vector<float*> p, m, v;
};

MasterViews master_views(dist::ShardedParams& master, model::CausalLM& model) {
  const std::vector<model::Param>& params = model.params();
  MasterViews mv;
  mv.p.assign(params.size(), nullptr), mv.m = mv.p, mv.v = mv.p;
  for (const auto& r : master.owned_ranges()) {
    const dist::TensorSpec& spec = master.specs()[size_t(r.tensor)];
    OLMO_CHECK(r.begin == 0 && r.n == spec.numel(), "device training: tensor ", spec.name,
               " is split across processes (it needs one process holding every tensor)");
    size_t i = 0;
    while (i < params.size() && params[i].name != spec.name) ++i;
    OLMO_CHECK(i < params.size(), "device training: the master's tensor ", spec.name, " is not a parameter");
    mv.p[i] = r.p, mv.m[i] = r.m, mv.v[i] = r.v;
  }
  for (size_t i = 0; i < params.size(); ++i)
    OLMO_CHECK(mv.p[i] != nullptr, "device training: parameter ", params[i].name, " has no master copy");
  return mv;
}

}  // namespace

void upload_state(model::DeviceTraining& dt, dist::ShardedParams& master, model::CausalLM& model) {
  const MasterViews mv = master_views(master, model);
  auto in = [](const std::vector<float*>& v) { return std::vector<const float*>(v.begin(), v.end()); };
  dt.upload(in(mv.p), in(mv.m), in(mv.v));
}

void download_state(model::DeviceTraining& dt, dist::ShardedParams& master, model::CausalLM& model,
                    int64_t adam_step) {
  const MasterViews mv = master_views(master, model);
  dt.download(mv.p, mv.m, mv.v);
  master.set_adam_step(adam_step);
}

double apply_device_update(model::DeviceTraining& dt, AdamWConfig& acfg, const Schedule& sched, double clip,
                           int64_t s) {
  const double lr = sched.at(s);
  acfg.lr = lr;
  dt.clip_and_step(acfg, clip, s);
  return lr;
}

}  // namespace olmosft::train

namespace olmosft::train {

std::optional<double> GradNormGuard::spike(double gnorm) const {
  if (factor_ <= 0 || norms_.empty()) return std::nullopt;
  std::vector<double> v = norms_;
  const size_t mid = v.size() / 2;
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(mid), v.end());
  double median = v[mid];
  if (v.size() % 2 == 0)
    median = 0.5 * (median + *std::max_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(mid)));
  if (gnorm > factor_ * median) return median;
  return std::nullopt;
}

void GradNormGuard::add(double gnorm) {
  norms_.push_back(gnorm);
  if (norms_.size() > kWindow) norms_.erase(norms_.begin());
}

nlohmann::json GradNormGuard::to_json() const { return nlohmann::json(norms_); }

void GradNormGuard::load(const nlohmann::json& carried, const std::string& where) {
  norms_.clear();
  if (!carried.is_object() || !carried.contains("grad_norms")) return;  // a checkpoint from before the guard
  const nlohmann::json& a = carried["grad_norms"];
  OLMO_CHECK(a.is_array() && a.size() <= kWindow, where, ": carried.grad_norms must be a list of at most ",
             kWindow, " numbers, got ", a.dump());
  for (const auto& x : a) {
    OLMO_CHECK(x.is_number() && std::isfinite(x.get<double>()) && x.get<double>() >= 0, where,
               ": carried.grad_norms holds ", x.dump(), ", expected finite gradient norms >= 0");
    norms_.push_back(x.get<double>());
  }
}

}  // namespace olmosft::train
