// The run directory's checkpoints: staging dirs of interrupted saves removed, resume from the newest valid
// checkpoint (its dataset manifest, global batch and step checked against the run), and the saves with the
// state a resume needs (data position, hashes, facts carried across resumes). See docs/train.md.
#pragma once
#include <cstdint>
#include <iosfwd>
#include <nlohmann/json.hpp>
#include <string>

#include "dist/comm.h"
#include "dist/sharded.h"
#include "train/recipe.h"

namespace olmosft::train {

// One run per run directory: rank 0 holds an exclusive flock on RUN_DIR/run.lock (holder's host, pid and
// start time written in it) for the run's life; the kernel releases it however the process ends. A second
// `olmosft train` on the same directory (a restarted pod meeting a lingering one, two launches) fails on
// every rank naming the holder, before it touches checkpoints or metrics. Collective.
class RunDirLock {
 public:
  RunDirLock(dist::Comm& comm, const std::string& run_dir);
  ~RunDirLock();
  RunDirLock(const RunDirLock&) = delete;
  RunDirLock& operator=(const RunDirLock&) = delete;

 private:
  int fd_ = -1;
};

// Collective: rank 0 creates RUN_DIR/checkpoints and removes staging dirs of interrupted saves.
void prepare_checkpoint_root(dist::Comm& comm, const std::string& ckpt_root);

struct Resumed {
  int64_t start = 0;                                  // the step resumed from (0 = fresh)
  nlohmann::json carried = nlohmann::json::object();  // facts carried across resumes (p_eos_before, step1_ce)
};
// Collective: with checkpoint.resume, loads the newest valid checkpoint into `master` (prints RESUME) after
// checking it was written for this dataset manifest (sha256), global batch and no more than the steps.
Resumed resume(const TrainConfig& cfg, dist::Comm& comm, dist::ShardedParams& master,
               const std::string& ckpt_root, const std::string& dataset_dir, const std::string& manifest_sha,
               std::ostream& out, std::ostream& err);

// Saves of one run (collective): every file, the step's state and the recipe snapshot; prints CHECKPOINT.
class Checkpointer {
 public:
  Checkpointer(const TrainConfig& cfg, dist::ShardedParams& master, std::string ckpt_root,
               std::string dataset_dir, std::string manifest_sha, std::ostream& out);
  std::string save(int64_t step, const nlohmann::json& carried);

 private:
  nlohmann::json state_info(int64_t step, const nlohmann::json& carried) const;
  const TrainConfig& cfg_;
  dist::ShardedParams& master_;
  std::string ckpt_root_, dataset_dir_, manifest_sha_;
  std::ostream& out_;
};

}  // namespace olmosft::train
