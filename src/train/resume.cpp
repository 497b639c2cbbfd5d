#include "train/resume.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <iomanip>
#include <ostream>
#include <vector>

#include "core/error.h"
#include "io/atomic_file.h"
#include "io/hash.h"
#include "train/checkpoint.h"
#include "train/perf.h"

namespace fs = std::filesystem;

namespace olmosft::train {

namespace {

// A resume with a recipe that differs from the checkpoint's (RUN_DIR/checkpoints/step-N/recipe.yaml):
// operational changes (train/recipe.h recipe_key_operational) are listed in a RESUME-RECIPE line; any other
// change is an error unless checkpoint.allow_recipe_change=true (then a WARNING lists it). Every rank reads
// the same files and decides alike.
void check_recipe_change(const TrainConfig& cfg, const std::string& dir, std::ostream& out,
                         std::ostream& err) {
  const std::string path = dir + "/recipe.yaml";
  const bool allow = cfg.checkpoint.allow_recipe_change;
  std::vector<Recipe::Change> changes;
  try {
    changes =
        Recipe::diff(Recipe::parse(io::read_file(path), path), Recipe::parse(cfg.resolved_yaml, cfg.source));
  } catch (const Error& e) {
    OLMO_CHECK(allow, path, ": cannot compare the checkpoint's recipe with ", cfg.source, " (", e.what(),
               "); set checkpoint.allow_recipe_change=true to resume anyway");
    err << "WARNING: checkpoint.allow_recipe_change=true: resuming without comparing recipes (" << e.what()
        << ")\n";
    return;
  }
  std::string ops, math;
  for (const auto& c : changes)
    (recipe_key_operational(c.key) ? ops : math) += " " + c.key + "=" + c.before + "->" + c.after;
  if (!ops.empty()) out << "RESUME-RECIPE operational changes:" << ops << "\n";
  if (math.empty()) return;
  OLMO_CHECK(allow, cfg.source, ": resuming from ", dir, " with a recipe that changes the run:", math,
             " (the checkpoint's recipe is ", path,
             "); restore these values, use a new run_name, or set checkpoint.allow_recipe_change=true");
  err << "WARNING: checkpoint.allow_recipe_change=true: resuming with changed keys:" << math << "\n";
}

}  // namespace

RunDirLock::RunDirLock(dist::Comm& comm, const std::string& run_dir) {
  std::string error;
  if (comm.rank() == 0) {
    const std::string path = run_dir + "/run.lock";
    std::error_code ec;
    fs::create_directories(run_dir, ec);
    fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd_ < 0) {
      error = "cannot open " + path + ": " + std::strerror(errno);
    } else if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
      std::string holder = io::read_file(path);
      while (!holder.empty() && (holder.back() == '\n' || holder.back() == ' ')) holder.pop_back();
      error = "run directory " + run_dir + " is in use by another olmosft train (" +
              (holder.empty() ? std::string("holder unknown") : holder) + ", lock " + path +
              "); two runs in one directory would overwrite each other's checkpoints and metrics: stop the "
              "other run or use another run_name";
      ::close(fd_);
      fd_ = -1;
    } else {
      char host[256] = {0};
      ::gethostname(host, sizeof(host) - 1);
      const std::string who = "host " + std::string(host) + ", pid " + std::to_string(::getpid()) +
                              ", started " + std::to_string(static_cast<long long>(::time(nullptr))) +
                              " (unix time)\n";
      if (::ftruncate(fd_, 0) != 0 || ::pwrite(fd_, who.data(), who.size(), 0) < 0) {
        // The lock is what matters; the text only helps the message of a second run.
      }
    }
  }
  error = comm.broadcast_string(error);
  OLMO_CHECK(error.empty(), error);
}

RunDirLock::~RunDirLock() {
  if (fd_ >= 0) ::close(fd_);
}

void prepare_checkpoint_root(dist::Comm& comm, const std::string& ckpt_root) {
  if (comm.rank() == 0) {
    fs::create_directories(ckpt_root);
    std::vector<fs::path> stale;  // staging dirs of interrupted saves
    for (const auto& e : fs::directory_iterator(ckpt_root)) {
      if (e.path().filename().string().find(".tmp-") != std::string::npos) stale.push_back(e.path());
    }
    for (const auto& p : stale) fs::remove_all(p);
  }
  comm.barrier();
}

Resumed resume(const TrainConfig& cfg, dist::Comm& comm, dist::ShardedParams& master,
               const std::string& ckpt_root, const std::string& dataset_dir, const std::string& manifest_sha,
               std::ostream& out, std::ostream& err) {
  Resumed r;
  const Derived& d = cfg.batch;
  if (!cfg.checkpoint.resume) {
    if (comm.rank() == 0 && !list_checkpoints(ckpt_root).empty())
      err << "WARNING: checkpoint.resume=false: ignoring the checkpoints in " << ckpt_root << "\n";
    return r;
  }
  std::string dir, refuse;
  if (comm.rank() == 0) {
    dir = latest_valid_checkpoint(ckpt_root, err);  // verifies every checksum
    const size_t found = list_checkpoints(ckpt_root).size();
    if (dir.empty() && found > 0)
      refuse =
          "all " + std::to_string(found) + " checkpoint(s) in " + ckpt_root +
          " are corrupt (see the WARNING lines); refusing to start over at step 1 and overwrite them: move "
          "them away to start afresh, or use a new run_name";
  }
  dir = comm.broadcast_string(dir);
  refuse = comm.broadcast_string(refuse);
  OLMO_CHECK(refuse.empty(), refuse);
  if (dir.empty()) return r;
  CheckpointState st = read_checkpoint_state(dir);
  const std::string ck_man = st.info.value("dataset_manifest_sha256", "");
  OLMO_CHECK(ck_man == manifest_sha, "checkpoint ", dir, " was written for dataset manifest sha256 ", ck_man,
             " but ", dataset_dir, "/manifest.json has sha256 ", manifest_sha,
             "; the data position would be meaningless (use a new run_name or checkpoint.resume=false)");
  OLMO_CHECK(st.info.value("global_batch", int64_t{0}) == d.global_batch, "checkpoint ", dir,
             " was written with global_batch ", st.info.value("global_batch", int64_t{0}), ", recipe has ",
             d.global_batch, "; the data position would differ (use a new run_name)");
  OLMO_CHECK(st.step <= d.steps, "checkpoint ", dir, " is at step ", st.step, ", past steps=", d.steps);
  check_recipe_change(cfg, dir, out, err);
  st = load_checkpoint_sharded(dir, master);
  r.start = st.step;
  r.carried = st.info.value("carried", nlohmann::json::object());
  out << "RESUME from=" << dir << " step=" << r.start << " next_global_row=" << r.start * d.global_batch
      << "\n";
  return r;
}

Checkpointer::Checkpointer(const TrainConfig& cfg, dist::ShardedParams& master, std::string ckpt_root,
                           std::string dataset_dir, std::string manifest_sha, std::ostream& out)
    : cfg_(cfg),
      master_(master),
      ckpt_root_(std::move(ckpt_root)),
      dataset_dir_(std::move(dataset_dir)),
      manifest_sha_(std::move(manifest_sha)),
      out_(out) {}

nlohmann::json Checkpointer::state_info(int64_t step, const nlohmann::json& carried) const {
  const Derived& d = cfg_.batch;
  nlohmann::json j;
  j["data_position"] = {
      {"step", step},
      {"next_global_row", step * d.global_batch},
      {"rule", "row r of step s = global row (s-1)*global_batch + r over the epochs in order"}};
  j["global_batch"] = d.global_batch;
  j["seq_len"] = d.seq_len;
  j["dataset_dir"] = dataset_dir_;
  j["dataset_manifest_sha256"] = manifest_sha_;
  j["recipe_sha256"] = io::sha256_hex(cfg_.resolved_yaml);
  j["rng"] = {{"kind", "philox"},
              {"seed", cfg_.seed},
              {"note", "training draws no random numbers; the seed only initialises a fresh model"}};
  j["carried"] = carried;
  return j;
}

std::string Checkpointer::save(int64_t step, const nlohmann::json& carried) {
  auto t0 = Clock::now();
  CheckpointState st;
  st.step = step;
  st.info = state_info(step, carried);
  std::string dir =
      save_checkpoint_sharded(ckpt_root_, master_, st, cfg_.resolved_yaml, cfg_.checkpoint.keep_last);
  out_ << "CHECKPOINT step=" << step << " dir=" << dir << " seconds=" << std::setprecision(3)
       << seconds_since(t0) << std::setprecision(6) << "\n";
  return dir;
}

}  // namespace olmosft::train
