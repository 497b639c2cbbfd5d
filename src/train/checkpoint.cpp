#include "train/checkpoint.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <map>

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

void copy_into(const Tensor& src, Tensor& dst, const std::string& what) {
  OLMO_CHECK(src.dtype() == DType::F32, what, ": expected F32, got another dtype");
  OLMO_CHECK(src.shape() == dst.shape(), what, ": shape ", shape_str(src.shape()),
             " does not match the model's ", shape_str(dst.shape()));
  Tensor c = src.contiguous();
  std::copy(c.data<float>(), c.data<float>() + c.numel(), dst.data<float>());
}
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

CheckpointState load_checkpoint(const std::string& dir, std::vector<model::Param>& params,
                                std::vector<Tensor>& exp_avg, std::vector<Tensor>& exp_avg_sq) {
  CheckpointState s = verify_checkpoint(dir);
  auto w = safetensors::Reader::open(dir + "/" + kModelFile);
  auto o = safetensors::Reader::open(dir + "/" + kOptimFile);
  OLMO_CHECK(w->tensors().size() == params.size(), "checkpoint ", dir, "/", kModelFile, ": ",
             w->tensors().size(), " tensors, the model has ", params.size());
  OLMO_CHECK(o->tensors().size() == 2 * params.size(), "checkpoint ", dir, "/", kOptimFile, ": ",
             o->tensors().size(), " tensors, expected ", 2 * params.size());
  exp_avg.resize(params.size());
  exp_avg_sq.resize(params.size());
  for (size_t i = 0; i < params.size(); ++i) {
    const std::string& n = params[i].name;
    copy_into(w->view(n), params[i].value, dir + "/" + kModelFile + " tensor " + n);
    exp_avg[i] = Tensor::zeros(params[i].value.shape());
    exp_avg_sq[i] = Tensor::zeros(params[i].value.shape());
    copy_into(o->view("exp_avg." + n), exp_avg[i], dir + "/" + kOptimFile + " tensor exp_avg." + n);
    copy_into(o->view("exp_avg_sq." + n), exp_avg_sq[i], dir + "/" + kOptimFile + " tensor exp_avg_sq." + n);
  }
  return s;
}

}  // namespace olmosft::train
