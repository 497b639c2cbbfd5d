// One optimizer step of the trainer: this rank's rows cut into leaves (micro-batches), forward + backward of
// each leaf, the loss parts of every leaf gathered across ranks and added in leaf order, the gradient
// reduce, then the update (clip + AdamW at the schedule's LR). Per-step losses and updates do not depend on
// the process count (docs/dist.md).
#pragma once
#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "data/dataset.h"
#include "dist/comm.h"
#include "dist/model_shards.h"
#include "kernels/adamw.h"
#include "model/model.h"
#include "train/batch.h"
#include "train/flops.h"
#include "train/perf.h"
#include "train/schedule.h"

namespace olmosft::train {

// True on every rank iff `local` is true on some rank (a collective when world > 1).
bool any_rank(dist::Comm& c, bool local);

// One leaf's model::LossParts as doubles for the all-gather (exact: counts and layer ids are integers
// < 2^53). Layout: the loss terms' sums (model/loss_terms.h order), tokens, then per MoE layer: layer lb_loss
// router_z required_buffer_factor dropped_tokens.
size_t packed_loss_parts_size(size_t moe_layers);
void pack_loss_parts(const model::LossParts& lp, double* out);  // writes packed_loss_parts_size(...) doubles
model::LossParts unpack_loss_parts(const double* in, size_t moe_layers);

// The loss parts of a step: the leaves' sums added in leaf order; per MoE layer the dropped tokens summed,
// the required buffer factor the max, the layer losses averaged over the leaves.
struct StepParts {
  model::LossValues sum{};  // per loss term, the leaves' LossParts::sum added in leaf order
  int64_t tokens = 0;
  std::map<int64_t, model::MoeLayerStats> moe;  // by layer
  void add_leaf(const model::LossParts& lp, int64_t leaves);
};

// Collective: every rank's leaves' parts (rank p's m-th is leaf dist::leaf_of(mode, leaves, N, p, m)),
// gathered and added in leaf order (`step` names it in errors).
StepParts gather_loss_parts(dist::Comm& comm, const std::vector<model::LossParts>& mine, int64_t leaves,
                            int64_t step, dist::ShardMode mode = dist::ShardMode::Replicated);

// The step's loss terms (model/loss_terms.h), each by its reduction: TokenMean = weight x sum / `total`
// trained targets, LeafMean = sum / leaves; `loss` is their sum in term order.
struct StepLosses {
  model::LossValues value{};
  double loss = 0;
};
StepLosses step_losses(const StepParts& sp, int64_t total, int64_t leaves, const model::LossValues& weight);

// What a step needs, fixed for the run.
struct StepContext {
  dist::Comm& comm;
  dist::ModelShards& shards;
  model::CausalLM& model;
  const PackedDataset& ds;
  const DataOrder& order;
  const model::LossConfig& lc;
  int64_t global_batch = 0;
  int64_t mb_rows = 0;               // rows of one leaf
  int64_t ga = 0;                    // leaves per rank per step
  int64_t leaves = 0;                // leaves per step (ga x processes)
  double grace = 0;                  // checkpoint.grace_seconds
  const FlopModel* flops = nullptr;  // counts each leaf's model FLOPs (MFU); nullptr = not counted
  // The model sums the leaves' gradients on its device (model::DeviceTraining): the shards' gradient
  // buffers, leaf accumulation and reduce are skipped.
  bool device_grads = false;
};

struct StepOutcome {
  std::string error;       // a data or model error on some rank (every rank stops)
  bool abandoned = false;  // SIGTERM: finishing the step would exceed half the grace period
  int64_t total = 0;       // trained targets of the global step
  double flops = 0;        // model FLOPs of the global step (train/flops.h), summed over ranks
  StepParts parts;         // valid when error is empty and the step was not abandoned
};

// Collective: data, forward + backward of each leaf, loss parts, gradient reduce for step s (started at t0).
StepOutcome run_step(const StepContext& c, int64_t s, Clock::time_point t0);

// Clip (global norm `gnorm`) and AdamW with the LR of step s; returns that LR.
double apply_update(dist::ShardedParams& master, AdamWConfig& acfg, const Schedule& sched, double clip,
                    int64_t s, double gnorm);

// The training state on the model's device (model.h DeviceTraining; one process, every tensor whole):
// upload_state copies the master's parameters and moments in, download_state writes them back (and the
// AdamW step count `adam_step`); apply_device_update is apply_update on the device (returns the LR).
void upload_state(model::DeviceTraining& dt, dist::ShardedParams& master, model::CausalLM& model);
void download_state(model::DeviceTraining& dt, dist::ShardedParams& master, model::CausalLM& model,
                    int64_t adam_step);
double apply_device_update(model::DeviceTraining& dt, AdamWConfig& acfg, const Schedule& sched, double clip,
                           int64_t s);

// The gradient-norm spike guard (recipe key guard.grad_norm_spike, docs/train.md's key table): a step whose
// global gradient norm is finite but more than `factor` times the median of the last kWindow applied steps'
// norms is stopped like a non-finite one. Corrupted memory (a signal frame written into oneDNN's heap
// workspace gave a norm of 3.4e+29 where 2.85 was right) is finite: the NaN guard let it through, AdamW
// applied it and the checkpoint kept it. The history travels in the checkpoint (state.json "carried"), so a
// resumed run keeps it.
class GradNormGuard {
 public:
  static constexpr size_t kWindow = 64;
  explicit GradNormGuard(double factor) : factor_(factor) {}
  // The median `gnorm` exceeded `factor` times, or nullopt (within bounds, guard off, or no history yet).
  std::optional<double> spike(double gnorm) const;
  void add(double gnorm);  // an applied step's norm
  double factor() const { return factor_; }
  nlohmann::json to_json() const;
  // From a checkpoint's carried facts (`where` names it in errors): a list of finite norms >= 0, or absent.
  void load(const nlohmann::json& carried, const std::string& where);

 private:
  double factor_;
  std::vector<double> norms_;  // oldest first, at most kWindow
};

}  // namespace olmosft::train
