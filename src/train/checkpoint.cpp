#include "train/checkpoint.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>

#include "core/error.h"
#include "io/atomic_file.h"
#include "io/hash.h"
#include "io/safetensors.h"

namespace fs = std::filesystem;

namespace olmosft::train {

namespace {
constexpr const char* kModelFile = "model.safetensors";
constexpr const char* kOptimFile = "optimizer.safetensors";
constexpr const char* kStateFile = "state.json";
constexpr const char* kRecipeFile = "recipe.yaml";
constexpr const char* kSums = "SHA256SUMS";
}  // namespace

std::string checkpoint_dir_name(int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "step-%08lld", static_cast<long long>(step));
  return buf;
}

std::vector<std::pair<int64_t, std::string>> list_checkpoints(const std::string& root) {
  std::vector<std::pair<int64_t, std::string>> out;
  std::error_code ec;
  if (!fs::is_directory(root, ec)) return out;
  for (const auto& e : fs::directory_iterator(root)) {
    std::string name = e.path().filename().string();
    if (!e.is_directory() || name.size() != 13 || name.rfind("step-", 0) != 0) continue;
    std::string digits = name.substr(5);
    if (!std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; })) continue;
    out.emplace_back(std::stoll(digits), e.path().string());
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  return out;
}

std::string save_checkpoint(const std::string& root, const std::vector<model::Param>& params,
                            const std::vector<Tensor>& exp_avg, const std::vector<Tensor>& exp_avg_sq,
                            const CheckpointState& state, const std::string& recipe_yaml, int64_t keep_last) {
  OLMO_CHECK(exp_avg.size() == params.size() && exp_avg_sq.size() == params.size(),
             "save_checkpoint: one pair of moments per parameter expected");
  fs::create_directories(root);
  std::string final_dir = root + "/" + checkpoint_dir_name(state.step);
  if (fs::exists(final_dir)) fs::remove_all(final_dir);  // a stale or damaged save of the same step
  {
    io::AtomicDir dir(final_dir);
    std::vector<safetensors::NamedTensor> w, o;
    for (size_t i = 0; i < params.size(); ++i) {
      w.push_back({params[i].name, params[i].value});
      o.push_back({"exp_avg." + params[i].name, exp_avg[i]});
      o.push_back({"exp_avg_sq." + params[i].name, exp_avg_sq[i]});
    }
    safetensors::write(dir.file(kModelFile), w, {{"format", "pt"}});
    safetensors::write(dir.file(kOptimFile), o, {{"format", "pt"}});
    nlohmann::json st = state.info;
    st["step"] = state.step;
    st["format"] = "olmosft-checkpoint";
    st["format_version"] = 1;
    io::write_file_atomic(dir.file(kStateFile), st.dump(2) + "\n");
    io::write_file_atomic(dir.file(kRecipeFile), recipe_yaml);
    io::write_sha256_manifest(dir.staging(), kSums);
    io::fsync_tree(dir.staging());
    dir.commit();
  }
  auto all = list_checkpoints(root);
  for (size_t i = static_cast<size_t>(std::max<int64_t>(keep_last, 1)); i < all.size(); ++i) {
    fs::remove_all(all[i].second);
  }
  io::fsync_dir(root);
  return final_dir;
}

namespace {

// The safetensors layout safetensors::write produces for fp32 tensors: names sorted, offsets in that order,
// "__metadata__" {"format": "pt"} first, JSON padded with spaces to a multiple of 8.
struct StLayout {
  std::string header;                   // padded JSON
  std::map<std::string, uint64_t> off;  // data offset of each tensor (bytes, relative to the data start)
  uint64_t data_bytes = 0;
  uint64_t data_start() const { return 8 + header.size(); }
  uint64_t file_bytes() const { return data_start() + data_bytes; }
};

StLayout st_layout(std::vector<std::pair<std::string, Shape>> tensors) {
  std::sort(tensors.begin(), tensors.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  nlohmann::ordered_json j = nlohmann::ordered_json::object();
  j["__metadata__"] = nlohmann::ordered_json::object({{"format", "pt"}});
  StLayout L;
  for (const auto& [name, shape] : tensors) {
    const uint64_t nb = uint64_t(shape_numel(shape)) * 4;
    nlohmann::ordered_json e = nlohmann::ordered_json::object();
    e["dtype"] = dtype_name(DType::F32);
    e["shape"] = shape;
    e["data_offsets"] = {L.data_bytes, L.data_bytes + nb};
    L.off[name] = L.data_bytes;
    L.data_bytes += nb;
    j[name] = e;
  }
  L.header = j.dump();
  while (L.header.size() % 8 != 0) L.header.push_back(' ');
  return L;
}

struct Fd {
  int fd = -1;
  Fd(const std::string& path, int flags) : fd(::open(path.c_str(), flags | O_CLOEXEC, 0644)) {
    OLMO_CHECK(fd >= 0, "checkpoint file ", path, ": cannot open: ", std::strerror(errno));
  }
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
};

void pwrite_all(int fd, const std::string& path, const void* data, size_t n, uint64_t off) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::pwrite(fd, p, n, off_t(off));
    if (w < 0 && errno == EINTR) continue;
    OLMO_CHECK(w > 0, "checkpoint file ", path, ": write failed at byte ", off, ": ", std::strerror(errno));
    p += w;
    n -= size_t(w);
    off += uint64_t(w);
  }
}

// Runs f on rank 0 (or every rank when all_ranks), then agrees: every rank throws if any failed.
template <typename F>
void agreed(dist::Comm& c, const std::string& what, bool all_ranks, F&& f) {
  std::string err;
  if (all_ranks || c.rank() == 0) {
    try {
      f();
    } catch (const std::exception& e) {
      err = e.what();
    }
  }
  if (!c.all_ok(err.empty())) fail(what, err.empty() ? std::string(" failed on another rank") : ": " + err);
}

}  // namespace

std::string save_checkpoint_sharded(const std::string& root, dist::ShardedParams& sp,
                                    const CheckpointState& state, const std::string& recipe_yaml,
                                    int64_t keep_last) {
  dist::Comm& comm = sp.comm();
  const auto& specs = sp.specs();
  std::vector<std::string> names;
  for (const auto& s : specs) names.push_back(s.name);
  std::vector<std::pair<std::string, Shape>> wt, ot;
  for (size_t t = 0; t < specs.size(); ++t) {
    wt.emplace_back(names[t], specs[t].shape);
    ot.emplace_back("exp_avg." + names[t], specs[t].shape);
    ot.emplace_back("exp_avg_sq." + names[t], specs[t].shape);
  }
  const StLayout WL = st_layout(wt), OL = st_layout(ot);
  const std::string final_dir = root + "/" + checkpoint_dir_name(state.step);
  const std::string what = "checkpoint save to " + final_dir;

  std::unique_ptr<io::AtomicDir> dir;
  std::string staging;
  agreed(comm, what, false, [&] {
    fs::create_directories(root);
    if (fs::exists(final_dir)) fs::remove_all(final_dir);  // a stale or damaged save of the same step
    dir = std::make_unique<io::AtomicDir>(final_dir);
    staging = dir->staging();
    for (const auto* L : {&WL, &OL}) {
      const std::string path = dir->file(L == &WL ? kModelFile : kOptimFile);
      Fd fd(path, O_WRONLY | O_CREAT | O_TRUNC);
      const uint64_t n = L->header.size();
      pwrite_all(fd.fd, path, &n, 8, 0);
      pwrite_all(fd.fd, path, L->header.data(), L->header.size(), 8);
      OLMO_CHECK(::ftruncate(fd.fd, off_t(L->file_bytes())) == 0, "checkpoint file ", path,
                 ": cannot size it: ", std::strerror(errno));
    }
  });
  staging = comm.broadcast_string(staging);

  // Which elements this rank writes: zero3 = what it owns; dp = an equal slice of the parameter-order
  // concatenation of all tensors (every rank owns everything).
  std::vector<int64_t> tlog(specs.size());
  int64_t total = 0;
  for (size_t t = 0; t < specs.size(); ++t) tlog[t] = total, total += specs[t].numel();
  const bool split = sp.mode() == dist::ShardMode::Replicated;
  const int64_t wb = split ? dist::split_begin(total, comm.size(), comm.rank()) : 0;
  const int64_t we = split ? dist::split_begin(total, comm.size(), comm.rank() + 1) : total;
  agreed(comm, what, true, [&] {
    const auto ranges = sp.owned_ranges();
    Fd wf(staging + "/" + kModelFile, O_WRONLY), of(staging + "/" + kOptimFile, O_WRONLY);
    for (const auto& r : ranges) {
      const int64_t lo = std::max(r.begin, wb - tlog[size_t(r.tensor)]);
      const int64_t hi = std::min(r.begin + r.n, we - tlog[size_t(r.tensor)]);
      if (lo >= hi) continue;
      const std::string& n = names[size_t(r.tensor)];
      const size_t bytes = size_t(hi - lo) * 4;
      const uint64_t eoff = uint64_t(lo) * 4;
      pwrite_all(wf.fd, kModelFile, r.p + (lo - r.begin), bytes, WL.data_start() + WL.off.at(n) + eoff);
      pwrite_all(of.fd, kOptimFile, r.m + (lo - r.begin), bytes,
                 OL.data_start() + OL.off.at("exp_avg." + n) + eoff);
      pwrite_all(of.fd, kOptimFile, r.v + (lo - r.begin), bytes,
                 OL.data_start() + OL.off.at("exp_avg_sq." + n) + eoff);
    }
    OLMO_CHECK(::fsync(wf.fd) == 0 && ::fsync(of.fd) == 0, "checkpoint ", staging,
               ": fsync failed: ", std::strerror(errno));
  });

  agreed(comm, what, false, [&] {
    nlohmann::json st = state.info;
    st["step"] = state.step;
    st["format"] = "olmosft-checkpoint";
    st["format_version"] = 1;
    io::write_file_atomic(dir->file(kStateFile), st.dump(2) + "\n");
    io::write_file_atomic(dir->file(kRecipeFile), recipe_yaml);
    io::write_sha256_manifest(dir->staging(), kSums);
    io::fsync_tree(dir->staging());
    dir->commit();
    auto all = list_checkpoints(root);
    for (size_t i = static_cast<size_t>(std::max<int64_t>(keep_last, 1)); i < all.size(); ++i) {
      fs::remove_all(all[i].second);
    }
    io::fsync_dir(root);
  });
  return final_dir;
}

CheckpointState read_checkpoint_state(const std::string& dir) {
  nlohmann::json st;
  try {
    st = nlohmann::json::parse(io::read_file(dir + "/" + kStateFile));
  } catch (const nlohmann::json::exception& e) {
    fail("checkpoint ", dir, "/", kStateFile, ": not valid JSON: ", e.what());
  }
  OLMO_CHECK(st.is_object() && st.value("format", "") == "olmosft-checkpoint" && st.contains("step") &&
                 st["step"].is_number_integer() && st["step"].get<int64_t>() >= 0,
             "checkpoint ", dir, "/", kStateFile,
             ": expected an olmosft-checkpoint object with an integer step");
  CheckpointState s;
  s.step = st["step"].get<int64_t>();
  s.info = st;
  return s;
}

CheckpointState load_checkpoint_sharded(const std::string& dir, dist::ShardedParams& sp) {
  dist::Comm& comm = sp.comm();
  CheckpointState s;
  agreed(comm, "checkpoint load from " + dir, true, [&] {
    s = read_checkpoint_state(dir);
    auto w = safetensors::Reader::open(dir + "/" + kModelFile);
    auto o = safetensors::Reader::open(dir + "/" + kOptimFile);
    const auto& specs = sp.specs();
    OLMO_CHECK(w->tensors().size() == specs.size(), "checkpoint ", dir, "/", kModelFile, ": ",
               w->tensors().size(), " tensors, the model has ", specs.size());
    OLMO_CHECK(o->tensors().size() == 2 * specs.size(), "checkpoint ", dir, "/", kOptimFile, ": ",
               o->tensors().size(), " tensors, expected ", 2 * specs.size());
    auto src = [&](const safetensors::Reader& r, const std::string& n, const Shape& shape) {
      const safetensors::TensorInfo& ti = r.at(n);
      OLMO_CHECK(ti.dtype == DType::F32, r.path(), " tensor ", n, ": expected F32");
      OLMO_CHECK(ti.shape == shape, r.path(), " tensor ", n, ": shape ", shape_str(ti.shape),
                 " does not match the model's ", shape_str(shape));
      return reinterpret_cast<const float*>(r.data(ti));  // memcpy'd below: alignment does not matter
    };
    for (const auto& r : sp.owned_ranges()) {
      const auto& spec = specs[size_t(r.tensor)];
      const std::string& n = spec.name;
      const size_t bytes = size_t(r.n) * 4;
      std::memcpy(r.p, reinterpret_cast<const char*>(src(*w, n, spec.shape)) + r.begin * 4, bytes);
      std::memcpy(r.m, reinterpret_cast<const char*>(src(*o, "exp_avg." + n, spec.shape)) + r.begin * 4,
                  bytes);
      std::memcpy(r.v, reinterpret_cast<const char*>(src(*o, "exp_avg_sq." + n, spec.shape)) + r.begin * 4,
                  bytes);
    }
  });
  sp.set_adam_step(s.step);
  return s;
}

CheckpointState verify_checkpoint(const std::string& dir) {
  for (const char* f : {kModelFile, kOptimFile, kStateFile, kRecipeFile, kSums}) {
    OLMO_CHECK(fs::is_regular_file(dir + "/" + f), "checkpoint ", dir, ": missing ", f);
  }
  std::string sums = io::read_file(dir + "/" + kSums);
  for (const char* f : {kModelFile, kOptimFile, kStateFile, kRecipeFile}) {
    OLMO_CHECK(sums.find(std::string("  ") + f + "\n") != std::string::npos, "checkpoint ", dir, ": ", kSums,
               " does not list ", f);
  }
  io::verify_sha256_manifest(dir, kSums);
  return read_checkpoint_state(dir);
}

std::string latest_valid_checkpoint(const std::string& root, std::ostream& warn) {
  for (const auto& [step, dir] : list_checkpoints(root)) {
    try {
      CheckpointState s = verify_checkpoint(dir);
      OLMO_CHECK(s.step == step, "checkpoint ", dir, ": state.json says step ", s.step);
      return dir;
    } catch (const Error& e) {
      warn << "WARNING: skipping corrupt checkpoint " << dir << ": " << e.what() << "\n";
    }
  }
  return "";
}

}  // namespace olmosft::train
