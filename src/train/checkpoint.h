// Training checkpoints: atomic, checksummed, resumable in O(1).
//
// Layout (one directory per saved step, under RUN_DIR/checkpoints/):
//   step-00000012/
//     model.safetensors      fp32 master weights, HF tensor names
//     optimizer.safetensors  AdamW moments: "exp_avg.<name>" and "exp_avg_sq.<name>" (fp32)
//     state.json             step, data position, RNG state, dataset manifest hash, recipe hash, run facts
//     recipe.yaml            the fully resolved recipe (snapshot)
//     SHA256SUMS             sha256sum-format checksums of every other file (`sha256sum -c` verifies them)
// A checkpoint is built in a staging directory next to its final name (io::AtomicDir), fsynced, and
// published with one rename, so a directory named step-N is complete unless it was damaged afterwards;
// verify_checkpoint() re-verifies every checksum anyway (latest_valid_checkpoint calls it before a resume).
// After a save, all but the newest keep_last step directories are deleted.
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <ostream>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "dist/sharded.h"
#include "model/model.h"

namespace olmosft::train {

struct CheckpointState {
  int64_t step = 0;  // optimizer steps completed; also the data position (rows are a pure function of it)
  nlohmann::json info = nlohmann::json::object();  // everything else recorded in state.json
};

std::string checkpoint_dir_name(int64_t step);  // "step-00000012"

// Writes RUN_DIR/checkpoints/step-N atomically (replacing nothing: an existing step-N is an error unless
// `overwrite`), then prunes to keep_last. `moments` holds 2 tensors per parameter (exp_avg, exp_avg_sq) in
// parameter order. Returns the final directory.
std::string save_checkpoint(const std::string& ckpt_root, const std::vector<model::Param>& params,
                            const std::vector<Tensor>& exp_avg, const std::vector<Tensor>& exp_avg_sq,
                            const CheckpointState& state, const std::string& recipe_yaml, int64_t keep_last);

// Step directories under ckpt_root, newest first (by step number; malformed names ignored).
std::vector<std::pair<int64_t, std::string>> list_checkpoints(const std::string& ckpt_root);

// Verifies SHA256SUMS (every file listed and matching, the required files present) and parses state.json.
// Throws olmosft::Error naming the directory and the problem.
CheckpointState verify_checkpoint(const std::string& dir);

// The newest checkpoint that verifies; each invalid newer one is reported on `warn` ("WARNING: skipping
// corrupt checkpoint DIR: reason"). Returns "" when none is valid.
std::string latest_valid_checkpoint(const std::string& ckpt_root, std::ostream& warn);

// The same layout written by every rank of a job at once (a collective over sp.comm()): rank 0 creates the
// staging directory and the two safetensors files (header written, data sized), every rank pwrite()s the
// elements it owns (zero3: its shard; dp: an equal slice of the elements, in parameter order) and fsyncs,
// then rank 0 writes state.json, recipe.yaml and SHA256SUMS, fsyncs, publishes with one rename and
// prunes to keep_last. The files are byte-identical to save_checkpoint's whatever the rank count and
// mode (same header, same data), so load_checkpoint_sharded reads either. Errors on any rank throw on every
// rank. Tensor names are sp.specs() names (the model's HF names).
std::string save_checkpoint_sharded(const std::string& ckpt_root, dist::ShardedParams& sp,
                                    const CheckpointState& state, const std::string& recipe_yaml,
                                    int64_t keep_last);

// state.json of a checkpoint directory, parsed and checked (format, step) without hashing the files.
CheckpointState read_checkpoint_state(const std::string& dir);

// Collective: every rank reads the elements it owns from `dir` (any rank count or mode wrote it); names
// and shapes must match sp.specs(). Checksums are NOT re-verified here (latest_valid_checkpoint on rank 0
// did that); the files' sizes and headers are validated on every rank.
CheckpointState load_checkpoint_sharded(const std::string& dir, dist::ShardedParams& sp);

}  // namespace olmosft::train
