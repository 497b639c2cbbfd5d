// Trainer: data order, the global token-mean over gradient accumulation, SIGTERM + resume bit-identity,
// corrupt/truncated checkpoints, guards (zero steps, too few rows, NaN, mid-run data error), preflight
// refusals (seq_len, tokenizer, vocab) and the end-of-run checks. The model is a test-local bigram
// softmax-regression LM with exact gradients (logits = W[token] + b), so these tests do not depend on the
// dense/hybrid implementations; the dataset is built by the data library with the byte-level test encoder.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/error.h"
#include "core/rng.h"
#include "data/build.h"
#include "data/build_bytes_encoder.h"
#include "data/dataset.h"
#include "io/safetensors.h"
#include "train/checkpoint.h"
#include "train/log_lines.h"
#include "train/resume.h"
#include "train/step.h"
#include "train/trainer.h"

namespace fs = std::filesystem;
using namespace olmosft;
using namespace olmosft::train;

namespace {

class BigramLM : public model::CausalLM {
 public:
  BigramLM(int64_t vocab, uint64_t seed) : V_(vocab) {
    cfg_.vocab_size = vocab;
    cfg_.model_type_name = "test-bigram";
    model::Param w{"bigram.weight", Tensor::zeros({vocab, vocab}), Tensor::zeros({vocab, vocab}), true};
    fill_normal(w.value, Rng{seed, 0}, 0.0f, 0.5f);
    model::Param b{"bigram.bias", Tensor::zeros({vocab}), Tensor::zeros({vocab}), false};
    fill_normal(b.value, Rng{seed, 1}, 0.0f, 0.1f);
    params_ = {std::move(w), std::move(b)};
  }
  const model::ModelConfig& config() const override { return cfg_; }
  std::vector<model::Param>& params() override { return params_; }
  model::LossParts forward_backward(const model::Batch& b, const model::LossConfig& lc, double gs,
                                    double aux) override {
    return run(b, lc, gs, aux, true, nullptr);
  }
  model::LossParts forward(const model::Batch& b, const model::LossConfig& lc, float*, float* lp) override {
    return run(b, lc, 0, 0, false, lp);
  }
  int64_t calls = 0, nan_on_call = -1;
  // The n-th forward_backward of this model writes a finite garbage gradient (as corrupted memory did).
  int64_t bwd_calls = 0, garbage_on_bwd_call = -1;

 private:
  model::LossParts run(const model::Batch& b, const model::LossConfig& lc, double gs, double aux, bool bwd,
                       float* logprobs) {
    ++calls;
    const float* W = params_[0].value.data<float>();
    const float* bias = params_[1].value.data<float>();
    float* gW = params_[0].grad.data<float>();
    float* gb = params_[1].grad.data<float>();
    model::LossParts lp;
    std::vector<double> z(static_cast<size_t>(V_));
    for (int64_t n = 0; n < b.B * b.T; ++n) {
      if (logprobs) logprobs[n] = 0;
      if (!b.trained[n]) continue;
      int32_t tok = b.tokens[n], y = b.targets[n];
      EXPECT_TRUE(tok >= 0 && tok < V_ && y >= 0 && y < V_);
      double mx = -1e300;
      for (int64_t v = 0; v < V_; ++v) mx = std::max(mx, z[v] = double(W[tok * V_ + v]) + bias[v]);
      double se = 0;
      for (int64_t v = 0; v < V_; ++v) se += std::exp(z[v] - mx);
      double lse = mx + std::log(se);
      lp.sum[model::kLossCe] += lse - z[y];
      lp.sum[model::kLossLmZ] += lse * lse;
      ++lp.tokens;
      if (logprobs) logprobs[n] = static_cast<float>(z[y] - lse);
      if (bwd) {
        for (int64_t v = 0; v < V_; ++v) {
          double p = std::exp(z[v] - lse);
          float g = static_cast<float>(
              gs * (p - (v == y ? 1.0 : 0.0) + lc.weight[model::kLossLmZ] * 2.0 * lse * p));
          gW[tok * V_ + v] += g;
          gb[v] += g;
        }
      }
    }
    // A stand-in MoE term that does not depend on the split into micro-batches: moe_lb x sum(b^2).
    double sq = 0;
    for (int64_t v = 0; v < V_; ++v) sq += double(bias[v]) * bias[v];
    lp.sum[model::kLossMoeLb] = lc.weight[model::kLossMoeLb] * sq;
    if (bwd) {
      for (int64_t v = 0; v < V_; ++v)
        gb[v] += static_cast<float>(aux * lc.weight[model::kLossMoeLb] * 2.0 * bias[v]);
    }
    lp.moe_layers.push_back({0, lp.sum[model::kLossMoeLb], 0.0, 1.0 + 0.01 * double(b.B), 0});
    if (calls == nan_on_call) lp.sum[model::kLossCe] = std::nan("");
    if (bwd && ++bwd_calls == garbage_on_bwd_call) gb[0] += 3.4e29f;
    return lp;
  }
  int64_t V_;
  model::ModelConfig cfg_;
  std::vector<model::Param> params_;
};

struct TmpDir {
  std::string path;
  TmpDir() {
    std::string t = (fs::temp_directory_path() / "olmosft-train-XXXXXX").string();
    path = mkdtemp(t.data());
  }
  ~TmpDir() { fs::remove_all(path); }
};

// One small packed dataset (2 epochs, seq_len 128) shared by the tests.
class TrainTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    tmp_ = new TmpDir;
    std::ofstream f(tmp_->path + "/convs.jsonl");
    const char* words[] = {"alpha", "beta", "gamma", "delta", "eps", "zeta", "eta", "theta"};
    for (int i = 0; i < 120; ++i) {
      std::string q = std::string("q") + std::to_string(i) + " " + words[i % 8];
      std::string a =
          std::string(words[(i * 3) % 8]) + " " + words[(i * 5 + 1) % 8] + " " + std::to_string(i % 7);
      f << R"({"messages":[{"role":"user","content":")" << q << R"("},{"role":"assistant","content":")" << a
        << R"("}]})"
        << "\n";
    }
    f.close();
    BuildOptions o;
    o.inputs = {tmp_->path + "/convs.jsonl"};
    o.out_dir = tmp_->path + "/data";
    o.seq_len = 128;
    o.seed = 3;
    o.epochs = 2;
    o.tokenizer_spec = "builtin:bytes";
    BytesChatEncoder enc;
    build_dataset(o, enc);
  }
  static void TearDownTestSuite() {
    delete tmp_;
    tmp_ = nullptr;
  }
  static std::string data() { return tmp_->path + "/data"; }

  Recipe recipe(const std::string& run, const std::vector<std::string>& extra = {}) {
    std::vector<std::string> ov = {"data.path=" + data(),
                                   "output_dir=" + dir_.path,
                                   "run_name=" + run,
                                   "tokenizer=builtin:bytes",
                                   "seq_len=128",
                                   "global_batch=4",
                                   "per_device_batch=1",
                                   "steps=6",
                                   "data.epochs=2",
                                   "optimizer.lr=0.05",
                                   "optimizer.warmup_frac=0.2",
                                   "optimizer.weight_decay=0.01",
                                   "loss.moe_lb=0.01",
                                   "perf.peak_tflops=1",
                                   "export.hf=false",
                                   "eval.heldout=4"};
    ov.insert(ov.end(), extra.begin(), extra.end());
    return Recipe::parse("", "test.yaml", ov);
  }
  TrainResult train(const Recipe& r, BigramLM& m, std::function<void(int64_t)> after = {}) {
    clear_sigterm();
    TrainOptions o;
    out_.str("");
    err_.str("");
    o.out = &out_;
    o.err = &err_;
    o.after_step = std::move(after);
    TrainResult res = run_training(r.config(), m, o);
    clear_sigterm();
    return res;
  }
  std::string run_dir(const std::string& run) { return dir_.path + "/" + run; }

  static TmpDir* tmp_;
  TmpDir dir_;
  std::ostringstream out_, err_;
};
TmpDir* TrainTest::tmp_ = nullptr;

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

std::vector<float> flat(BigramLM& m) {
  std::vector<float> v;
  for (auto& p : m.params())
    v.insert(v.end(), p.value.data<float>(), p.value.data<float>() + p.value.numel());
  return v;
}

}  // namespace

TEST(TrainDataOrder, RowsArePureFunctionsOfTheStepWhateverTheProcessCount) {
  DataOrder o({5, 0, 7}, 4);  // uneven epochs, one empty
  EXPECT_EQ(o.total_rows(), 12);
  EXPECT_EQ(o.max_steps(), 3);
  auto r3 = o.step_rows(2);  // global rows 4..7: epoch 0 row 4, epoch 2 rows 0..2
  ASSERT_EQ(r3.size(), 4u);
  EXPECT_EQ(r3[0].epoch, 0);
  EXPECT_EQ(r3[0].index, 4);
  EXPECT_EQ(r3[1].epoch, 2);
  EXPECT_EQ(r3[1].index, 0);
  EXPECT_EQ(r3[3].index, 2);
  for (int world : {1, 2, 4}) {
    std::vector<RowRef> all;
    for (int p = 0; p < world; ++p) {
      auto part = o.step_rows(3, p, world);
      all.insert(all.end(), part.begin(), part.end());
    }
    auto ref = o.step_rows(3);
    ASSERT_EQ(all.size(), ref.size());
    for (size_t i = 0; i < ref.size(); ++i) {
      EXPECT_EQ(all[i].epoch, ref[i].epoch);
      EXPECT_EQ(all[i].index, ref[i].index);
    }
  }
  EXPECT_NE(error_of([&] { o.step_rows(4); }).find("outside"), std::string::npos);
  EXPECT_NE(error_of([&] { o.step_rows(1, 0, 3); }).find("not divisible"), std::string::npos);
}

TEST_F(TrainTest, RunsLogsChecksAndStepOneCeMatchesAReferenceForward) {
  BigramLM m(260, 7);
  // Reference forward of step 1's rows with the initial weights.
  PackedDataset ds = PackedDataset::open(data());
  std::vector<RowRef> rows;
  for (int64_t i = 0; i < 4; ++i) rows.push_back({0, i});
  HostBatch hb = make_batch(ds, rows);
  model::LossConfig lc;
  model::LossParts ref = m.forward(hb.view(), lc, nullptr, nullptr);
  double ref_ce = ref.sum[model::kLossCe] / double(ref.tokens);

  Recipe r = recipe("basic", {"export.hf=true"});
  bool exported = false;
  TrainOptions o;
  o.out = &out_;
  o.err = &err_;
  o.export_hf = [&](const std::string& dir, model::CausalLM&, const std::string& side) {
    exported = true;
    EXPECT_EQ(dir, run_dir("basic") + "/hf");
    EXPECT_EQ(side, "");  // builtin:bytes has no tokenizer files
  };
  TrainResult res = run_training(r.config(), m, o);
  std::string log = out_.str();
  ASSERT_EQ(res.exit_code, kExitOk) << res.reason << "\n" << log << err_.str();
  EXPECT_TRUE(exported);
  ASSERT_EQ(res.step_ce.size(), 6u);
  EXPECT_NEAR(res.step_ce[0], ref_ce, 1e-12);  // same sums in the same order: only the division differs
  EXPECT_LT(res.step_ce[5], res.step_ce[0]);   // it learns
  EXPECT_NE(log.find("PREFLIGHT global_batch=4"), std::string::npos);
  EXPECT_NE(log.find("LOSS-PARTS step=1 ce="), std::string::npos) << log;
  EXPECT_NE(log.find("LOSS-PARTS step=6 ce="), std::string::npos);
  EXPECT_NE(log.find(" lm_z="), std::string::npos);
  EXPECT_NE(log.find(" moe_lb="), std::string::npos);
  EXPECT_NE(log.find("PROGRESS step=6/6"), std::string::npos);
  EXPECT_NE(log.find("STEP-GUARD: reached step 6"), std::string::npos);
  {
    // Every typed line the trainer printed parses back (train/log_lines.h). BigramLM reports one stand-in MoE
    // layer with required buffer factor 1 + 0.01 x rows per micro-batch (1 here): one REQUIRED_RBF line per
    // step.
    std::istringstream in(log);
    int loss = 0, progress = 0, dist = 0, checks = 0, rbf = 0;
    for (std::string l; std::getline(in, l);) {
      auto starts = [&](const char* tag) { return l.rfind(tag, 0) == 0; };
      // parse, then format again: the very line (the trainer prints with the same formatters)
      if (starts("REQUIRED_RBF ")) {
        ++rbf;
        EXPECT_EQ(l, format_required_rbf({rbf, 1.01}));
        EXPECT_EQ(parse_required_rbf_line(l), (RequiredRbfLine{rbf, 1.01}));
      }
      if (starts("LOSS-PARTS ")) {
        ++loss;
        auto p = parse_loss_parts_line(l);
        EXPECT_EQ(p ? format_loss_parts(*p) : "(no parse)", l);
      }
      if (starts("PROGRESS ")) {
        ++progress;
        auto p = parse_progress_line(l);
        EXPECT_EQ(p ? format_progress(*p) : "(no parse)", l);
      }
      if (starts("DIST ")) {
        ++dist;
        auto p = parse_dist_line(l);
        EXPECT_EQ(p ? format_dist(*p) : "(no parse)", l);
      }
      if (starts("CHECK ")) {
        ++checks;
        EXPECT_TRUE(parse_check_trained_eos_line(l) || parse_check_p_eos_line(l) ||
                    parse_check_eval_ce_line(l) || parse_check_step1_ce_line(l))
            << l;
      }
    }
    EXPECT_GE(loss, 2);
    EXPECT_EQ(progress, loss);
    EXPECT_EQ(dist, 1);
    EXPECT_GE(checks, 2);
    EXPECT_EQ(rbf, 6);
  }
  EXPECT_NE(log.find("CHECK trained_eos count="), std::string::npos);
  EXPECT_NE(log.find("PASS"), std::string::npos);
  EXPECT_NE(log.find("CHECK p_eos rows=4 (held out)"), std::string::npos) << log;
  char buf[64];
  std::snprintf(buf, sizeof buf, "CHECK step1_ce=%.6f", ref_ce);
  EXPECT_NE(log.find(buf), std::string::npos) << log;
  // The LOSS-PARTS ce of step 1 is the reference forward's CE.
  std::snprintf(buf, sizeof buf, "LOSS-PARTS step=1 ce=%.6f", ref_ce);
  EXPECT_NE(log.find(buf), std::string::npos) << log;

  // metrics.jsonl: one object per step with the documented fields.
  std::ifstream mf(run_dir("basic") + "/metrics.jsonl");
  std::string line;
  int n = 0;
  while (std::getline(mf, line)) {
    auto j = nlohmann::json::parse(line);
    ++n;
    EXPECT_EQ(j["step"].get<int>(), n);
    for (const char* k :
         {"lr", "loss", "ce", "lm_z", "moe_lb", "router_z", "grad_norm", "tokens", "tokens_per_s",
          "step_time", "mfu", "stalled", "moe_dropped_tokens", "moe_required_buffer_factor"})
      EXPECT_TRUE(j.contains(k)) << k;
    EXPECT_DOUBLE_EQ(j["moe_required_buffer_factor"][0].get<double>(), 1.01);  // max over 1-row micro-batches
    EXPECT_NEAR(j["ce"].get<double>(), res.step_ce[n - 1], 1e-15);
  }
  EXPECT_EQ(n, 6);
  EXPECT_FALSE(fs::is_empty(run_dir("basic") + "/tensorboard"));
  // The final checkpoint holds the trained weights.
  auto cks = list_checkpoints(run_dir("basic") + "/checkpoints");
  ASSERT_EQ(cks.size(), 1u);
  EXPECT_EQ(cks[0].first, 6);
  auto rd = safetensors::Reader::open(cks[0].second + "/model.safetensors");
  Tensor w = rd->copy("bigram.weight");
  EXPECT_EQ(std::memcmp(w.data<float>(), m.params()[0].value.data<float>(), w.nbytes()), 0);
}

TEST_F(TrainTest, GradAccumulationOneVsFourGivesTheSameLossAndUpdate) {
  BigramLM a(260, 11), b(260, 11);
  TrainResult ra = train(recipe("ga1", {"per_device_batch=4"}), a);
  ASSERT_EQ(ra.exit_code, 0) << ra.reason;
  EXPECT_NE(out_.str().find("grad_accum=1"), std::string::npos);
  TrainResult rb = train(recipe("ga4", {"per_device_batch=1"}), b);
  ASSERT_EQ(rb.exit_code, 0) << rb.reason;
  EXPECT_NE(out_.str().find("grad_accum=4"), std::string::npos);
  ASSERT_EQ(ra.step_loss.size(), rb.step_loss.size());
  double max_rel = 0;
  for (size_t i = 0; i < ra.step_loss.size(); ++i)
    max_rel = std::max(max_rel, std::fabs(ra.step_loss[i] - rb.step_loss[i]) / std::fabs(ra.step_loss[i]));
  // Step 1 (same weights): only the grouping of the double loss sums differs, a few ulps of double. Later
  // steps see weights that differ by fp32 rounding (the aux-term gradient is added once vs 4 x 1/4), which
  // moves the loss by ~1e-9 relative (measured 7.4e-10); bound 1e-8.
  EXPECT_LT(std::fabs(ra.step_loss[0] - rb.step_loss[0]) / ra.step_loss[0], 1e-12);
  EXPECT_LT(max_rel, 1e-8);
  // The same gradient (global token-mean, not a mean of per-micro-batch means): pre-clip norms agree.
  auto norms = [&](const std::string& run) {
    std::vector<double> v;
    std::ifstream mf(run_dir(run) + "/metrics.jsonl");
    std::string line;
    while (std::getline(mf, line)) v.push_back(nlohmann::json::parse(line)["grad_norm"].get<double>());
    return v;
  };
  auto na = norms("ga1"), nb = norms("ga4");
  ASSERT_EQ(na.size(), 6u);
  ASSERT_EQ(nb.size(), 6u);
  for (size_t i = 0; i < na.size(); ++i) EXPECT_NEAR(na[i], nb[i], 1e-6 * na[i]) << "step " << i + 1;
  auto fa = flat(a), fb = flat(b);
  float max_diff = 0;
  for (size_t i = 0; i < fa.size(); ++i) max_diff = std::max(max_diff, std::fabs(fa[i] - fb[i]));
  // Gradients are accumulated into fp32 in the same element order either way; the parameters after 6
  // steps agree to fp32 rounding (|param| <~ 2, ulp 2.4e-7; measured max 2.1e-7).
  EXPECT_LT(max_diff, 1e-6f);
  std::cout << "GA1 vs GA4: max rel loss diff " << max_rel << ", max param diff " << max_diff << "\n";
}

TEST_F(TrainTest, SigtermThenResumeIsBitIdenticalAndCorruptCheckpointsAreSkipped) {
  BigramLM ref(260, 5);
  TrainResult rr = train(recipe("ref", {"checkpoint.every=2"}), ref);
  ASSERT_EQ(rr.exit_code, 0) << rr.reason;
  ASSERT_EQ(rr.step_loss.size(), 6u);
  auto want = flat(ref);

  for (int variant = 0; variant < 3;
       ++variant) {  // 0: clean resume, 1: truncated latest, 2: corrupted latest
    std::string run = "pre" + std::to_string(variant);
    BigramLM m1(260, 5);
    TrainResult r1 = train(recipe(run, {"checkpoint.every=2"}), m1, [](int64_t s) {
      if (s == 3) std::raise(SIGTERM);
    });
    ASSERT_EQ(r1.exit_code, kExitPreempted) << r1.reason << out_.str();
    EXPECT_EQ(r1.last_step, 3);
    EXPECT_NE(out_.str().find("PREEMPTED: SIGTERM; checkpoint of step 3 written"), std::string::npos);
    for (size_t i = 0; i < 3; ++i) EXPECT_EQ(r1.step_loss[i], rr.step_loss[i]) << i;
    auto cks = list_checkpoints(run_dir(run) + "/checkpoints");
    ASSERT_EQ(cks.size(), 2u);  // step 2 (periodic) and step 3 (preemption)
    std::string latest = cks[0].second;
    if (variant == 1) fs::resize_file(latest + "/optimizer.safetensors", 100);
    if (variant == 2) {
      std::fstream f(latest + "/model.safetensors", std::ios::in | std::ios::out | std::ios::binary);
      f.seekg(-5, std::ios::end);
      char c = 0;
      f.get(c);
      f.seekp(-5, std::ios::end);
      f.put(static_cast<char>(c ^ 0x5a));
    }
    BigramLM m2(260, 5);  // a fresh process: initial weights again, then the checkpoint
    TrainResult r2 = train(recipe(run, {"checkpoint.every=2"}), m2);
    ASSERT_EQ(r2.exit_code, 0) << r2.reason << out_.str() << err_.str();
    int64_t from = variant == 0 ? 3 : 2;
    EXPECT_EQ(r2.start_step, from);
    if (variant > 0) {
      EXPECT_NE(err_.str().find("skipping corrupt checkpoint " + latest), std::string::npos) << err_.str();
    }
    ASSERT_EQ(r2.step_loss.size(), size_t(6 - from));
    for (int64_t s = from; s < 6; ++s) EXPECT_EQ(r2.step_loss[s - from], rr.step_loss[s]) << "step " << s + 1;
    auto got = flat(m2);
    EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0);
    // metrics.jsonl has each step exactly once, with the uninterrupted run's losses.
    std::ifstream mf(run_dir(run) + "/metrics.jsonl");
    std::string line;
    int n = 0;
    while (std::getline(mf, line)) {
      auto j = nlohmann::json::parse(line);
      EXPECT_EQ(j["step"].get<int>(), ++n);
      EXPECT_EQ(j["loss"].get<double>(), rr.step_loss[n - 1]);
    }
    EXPECT_EQ(n, 6);
  }
}

// Issue #17: a resume compares the recipe with the checkpoint's snapshot. Operational keys may change (a
// RESUME-RECIPE line lists them); a key that changes the run's numbers is refused unless
// checkpoint.allow_recipe_change=true; and when every checkpoint is corrupt the run does not silently start
// over at step 1 on top of them.
TEST_F(TrainTest, ResumeComparesTheRecipeAndRefusesWhenEveryCheckpointIsCorrupt) {
  BigramLM m1(260, 5);
  TrainResult r1 = train(recipe("chg", {"checkpoint.every=2"}), m1, [](int64_t s) {
    if (s == 2) std::raise(SIGTERM);
  });
  ASSERT_EQ(r1.exit_code, kExitPreempted) << r1.reason;
  const std::string ck = list_checkpoints(run_dir("chg") + "/checkpoints")[0].second;

  BigramLM m2(260, 5);
  std::string e = error_of([&] { train(recipe("chg", {"checkpoint.every=2", "optimizer.lr=0.07"}), m2); });
  EXPECT_NE(e.find("resuming from " + ck + " with a recipe that changes the run: optimizer.lr=0.05->0.07"),
            std::string::npos)
      << e;
  EXPECT_NE(e.find("checkpoint.allow_recipe_change=true"), std::string::npos) << e;

  BigramLM m3(260, 5);  // operational keys only: resumes, and says what changed
  TrainResult r3 = train(recipe("chg", {"checkpoint.every=3", "log.every=2"}), m3, [](int64_t s) {
    if (s == 3) std::raise(SIGTERM);
  });
  ASSERT_EQ(r3.exit_code, kExitPreempted) << r3.reason << err_.str();
  EXPECT_EQ(r3.start_step, 2);
  EXPECT_NE(out_.str().find("RESUME-RECIPE operational changes: checkpoint.every=2->3 log.every=1->2"),
            std::string::npos)
      << out_.str();

  BigramLM m4(260, 5);  // allowed: resumes with a WARNING naming the key
  TrainResult r4 = train(recipe("chg", {"checkpoint.every=3", "log.every=2", "optimizer.lr=0.07",
                                        "checkpoint.allow_recipe_change=true"}),
                         m4);
  ASSERT_EQ(r4.exit_code, 0) << r4.reason;
  EXPECT_EQ(r4.start_step, 3);
  EXPECT_NE(err_.str().find("WARNING: checkpoint.allow_recipe_change=true: resuming with changed keys: "
                            "optimizer.lr=0.05->0.07"),
            std::string::npos)
      << err_.str();

  for (const auto& [step, dir] : list_checkpoints(run_dir("chg") + "/checkpoints"))
    fs::resize_file(dir + "/model.safetensors", 10);
  BigramLM m5(260, 5);
  e = error_of([&] { train(recipe("chg", {"checkpoint.every=3", "log.every=2"}), m5); });
  EXPECT_NE(e.find("checkpoint(s) in " + run_dir("chg") + "/checkpoints are corrupt"), std::string::npos)
      << e;
  EXPECT_NE(e.find("refusing to start over at step 1"), std::string::npos) << e;
}

// Issue #17: Ctrl-C (SIGINT) stops like a preemption, with a checkpoint and exit 130; and a second run on a
// run directory that a live run holds fails before touching it.
TEST_F(TrainTest, SigintCheckpointsAndARunDirectoryHasOneRun) {
  BigramLM m1(260, 5);
  TrainResult r1 = train(recipe("int"), m1, [](int64_t s) {
    if (s == 2) std::raise(SIGINT);
  });
  ASSERT_EQ(r1.exit_code, kExitInterrupted) << r1.reason;
  EXPECT_EQ(r1.last_step, 2);
  EXPECT_NE(out_.str().find("PREEMPTED: SIGINT; checkpoint of step 2 written; exit 130"), std::string::npos)
      << out_.str();
  ASSERT_EQ(list_checkpoints(run_dir("int") + "/checkpoints").size(), 1u);

  auto comm = dist::make_single_comm();
  {
    RunDirLock held(*comm, run_dir("int"));  // a live run in the directory
    BigramLM m2(260, 5);
    const std::string e = error_of([&] { train(recipe("int"), m2); });
    EXPECT_NE(e.find("run directory " + run_dir("int") + " is in use by another olmosft train (host "),
              std::string::npos)
        << e;
    EXPECT_NE(e.find("pid " + std::to_string(::getpid())), std::string::npos) << e;
    EXPECT_EQ(list_checkpoints(run_dir("int") + "/checkpoints").size(), 1u);  // untouched
  }
  BigramLM m3(260, 5);  // released: resumes
  TrainResult r3 = train(recipe("int"), m3);
  ASSERT_EQ(r3.exit_code, 0) << r3.reason;
  EXPECT_EQ(r3.start_step, 2);
}

TEST_F(TrainTest, KeepLastPrunesOldCheckpoints) {
  BigramLM m(260, 1);
  TrainResult r = train(recipe("keep", {"checkpoint.every=1", "checkpoint.keep_last=2"}), m);
  ASSERT_EQ(r.exit_code, 0);
  auto cks = list_checkpoints(run_dir("keep") + "/checkpoints");
  ASSERT_EQ(cks.size(), 2u);
  EXPECT_EQ(cks[0].first, 6);
  EXPECT_EQ(cks[1].first, 5);
  CheckpointState st = verify_checkpoint(cks[0].second);
  EXPECT_EQ(st.info["data_position"]["next_global_row"].get<int64_t>(), 24);
  EXPECT_EQ(st.info["global_batch"].get<int64_t>(), 4);
  // A finished run restarted with the same settings does nothing and still passes the step guard.
  BigramLM m2(260, 1);
  TrainResult r2 = train(recipe("keep", {"checkpoint.every=1", "checkpoint.keep_last=2"}), m2);
  EXPECT_EQ(r2.exit_code, 0);
  EXPECT_TRUE(r2.step_loss.empty());
  EXPECT_NE(out_.str().find("STEP-GUARD: reached step 6 (already, in the checkpoint)"), std::string::npos);
}

// guard.grad_norm_spike: a finite garbage gradient (3.4e+29, what a signal frame in oneDNN's heap workspace
// made) is not applied; the last good step is checkpointed. Off (0), the same run trains on to the end.
TEST_F(TrainTest, GradGuardStopsAFiniteGarbageGradient) {
  BigramLM ref(260, 2);
  ASSERT_EQ(train(recipe("gref", {"steps=2", "lr_schedule_steps=6"}), ref).exit_code, 0);
  auto after2 = flat(ref);
  BigramLM m(260, 2);
  m.garbage_on_bwd_call = 4 * 2 + 2;  // second micro-batch of step 3 (4 per step)
  TrainResult r = train(recipe("garbage"), m);
  EXPECT_EQ(r.exit_code, kExitNonFinite) << r.reason;
  EXPECT_EQ(r.last_step, 2);
  EXPECT_NE(out_.str().find("GRAD-GUARD step=3 grad_norm=3.4"), std::string::npos) << out_.str();
  EXPECT_NE(r.reason.find("guard.grad_norm_spike"), std::string::npos) << r.reason;
  auto got = flat(m);
  EXPECT_EQ(std::memcmp(got.data(), after2.data(), got.size() * sizeof(float)), 0);  // not applied
  auto cks = list_checkpoints(run_dir("garbage") + "/checkpoints");
  ASSERT_EQ(cks.size(), 1u);
  EXPECT_EQ(cks[0].first, 2);
  CheckpointState st = verify_checkpoint(cks[0].second);
  EXPECT_EQ(st.info["carried"]["grad_norms"].size(), 2u);  // steps 1 and 2, for a resume

  BigramLM off(260, 2);
  off.garbage_on_bwd_call = 4 * 2 + 2;
  EXPECT_EQ(train(recipe("garbage_off", {"guard.grad_norm_spike=0"}), off).exit_code, 0);
  EXPECT_EQ(out_.str().find("GRAD-GUARD"), std::string::npos);
}

// The norms of the steps before a resume travel in the checkpoint: the first step after it is guarded too.
TEST_F(TrainTest, GradGuardKeepsItsHistoryAcrossAResume) {
  BigramLM m1(260, 2);
  TrainResult r1 = train(recipe("gres"), m1, [](int64_t s) {
    if (s == 2) std::raise(SIGTERM);
  });
  ASSERT_EQ(r1.exit_code, kExitPreempted) << r1.reason;
  BigramLM m2(260, 2);
  m2.garbage_on_bwd_call = 1;  // the resumed process's first micro-batch: step 3
  TrainResult r2 = train(recipe("gres"), m2);
  EXPECT_EQ(r2.start_step, 2);
  EXPECT_EQ(r2.exit_code, kExitNonFinite) << r2.reason << out_.str();
  EXPECT_NE(out_.str().find("GRAD-GUARD step=3"), std::string::npos) << out_.str();

  // A checkpoint whose carried norms are not numbers is refused, naming it.
  const std::string ck = list_checkpoints(run_dir("gres") + "/checkpoints")[0].second;
  GradNormGuard g(1000);
  std::string e = error_of([&] { g.load(nlohmann::json{{"grad_norms", {1.0, "x"}}}, ck); });
  EXPECT_NE(e.find(ck + ": carried.grad_norms holds \"x\""), std::string::npos) << e;
  g.load(nlohmann::json{{"grad_norms", {1.0, 3.0, 2.0, 100.0}}}, ck);  // median 2.5
  EXPECT_FALSE(g.spike(2500.0).has_value());
  ASSERT_TRUE(g.spike(2500.1).has_value());
  EXPECT_DOUBLE_EQ(*g.spike(2500.1), 2.5);
  g.load(nlohmann::json::object(), ck);  // a checkpoint from before the guard: no history
  EXPECT_FALSE(g.spike(1e30).has_value());
}

TEST_F(TrainTest, NanGuardStopsWithoutApplyingTheBadUpdate) {
  BigramLM ref(260, 2);  // two steps of the same 6-step schedule
  ASSERT_EQ(train(recipe("nanref", {"steps=2", "lr_schedule_steps=6"}), ref).exit_code, 0);
  auto after2 = flat(ref);
  BigramLM m(260, 2);
  // P(EOS) "before" uses forward() on 4 rows (4 calls); step s uses calls 4+4(s-1)+1 .. 4+4s.
  m.nan_on_call = 4 + 4 * 2 + 2;  // second micro-batch of step 3
  TrainResult r = train(recipe("nan"), m);
  EXPECT_EQ(r.exit_code, kExitNonFinite) << r.reason;
  EXPECT_EQ(r.last_step, 2);
  EXPECT_NE(out_.str().find("NAN-GUARD step=3"), std::string::npos) << out_.str();
  auto got = flat(m);
  EXPECT_EQ(std::memcmp(got.data(), after2.data(), got.size() * sizeof(float)), 0);  // not applied
  auto cks = list_checkpoints(run_dir("nan") + "/checkpoints");
  ASSERT_EQ(cks.size(), 1u);
  EXPECT_EQ(cks[0].first, 2);
  auto rd = safetensors::Reader::open(cks[0].second + "/model.safetensors");
  Tensor w = rd->copy("bigram.weight");
  EXPECT_EQ(std::memcmp(w.data<float>(), after2.data(), w.nbytes()), 0);
}

TEST_F(TrainTest, PreflightRefusesBadRecipesAndMismatchedDatasets) {
  BigramLM m(260, 0);
  auto err = [&](const Recipe& r) { return error_of([&] { train(r, m); }); };
  EXPECT_NE(error_of([&] {
              recipe("z", {"steps=0"});
              (void)recipe("z", {"steps=0"}).config();
            }).find("zero steps"),
            std::string::npos);
  std::string e = err(recipe("many", {"steps=1000"}));
  EXPECT_NE(e.find("steps=1000 needs 4000 rows"), std::string::npos) << e;
  e = err(recipe("epochs", {"data.epochs=3"}));
  EXPECT_NE(e.find("data.epochs=3 but dataset"), std::string::npos) << e;
  e = err(recipe("seq", {"seq_len=256"}));
  EXPECT_NE(e.find("was built with seq_len 128"), std::string::npos) << e;
  e = err(recipe("gb", {"global_batch=6", "per_device_batch=4"}));
  EXPECT_NE(e.find("not divisible"), std::string::npos) << e;
  e = err(recipe("nodata", {"data.path="}));
  EXPECT_NE(e.find("data.path is required"), std::string::npos) << e;
  BigramLM small(200, 0);
  e = error_of([&] { train(recipe("vocab"), small); });
  EXPECT_NE(e.find("model's vocab_size is 200"), std::string::npos) << e;
  // A dataset whose manifest names another tokenizer.
  TmpDir t;
  fs::copy(data(), t.path + "/d", fs::copy_options::recursive);
  auto man = nlohmann::json::parse(std::ifstream(t.path + "/d/manifest.json"));
  man["tokenizer"]["tokenizer_sha256"] = std::string(64, '0');
  std::ofstream(t.path + "/d/manifest.json") << man.dump();
  e = err(recipe("tok", {"data.path=" + t.path + "/d"}));
  EXPECT_NE(e.find("is not the tokenizer dataset"), std::string::npos) << e;
  // Resuming with another global batch is refused (the data position would mean other rows).
  ASSERT_EQ(train(recipe("gbres", {"steps=2"}), m).exit_code, 0);
  e = err(recipe("gbres", {"steps=2", "global_batch=8"}));
  EXPECT_NE(e.find("global_batch"), std::string::npos) << e;
}

TEST_F(TrainTest, DataErrorMidRunTripsTheStepGuard) {
  TmpDir t;
  fs::copy(data(), t.path + "/d", fs::copy_options::recursive);
  // Corrupt row 8 of epoch 0 (the first row of step 3): its checksum fails when step 3 reads it.
  int64_t off = kRowsHeaderBytes + 8 * row_record_bytes(128) + 5;
  {
    std::fstream f(t.path + "/d/" + epoch_file_name(0), std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(off);
    f.put('\x55');
  }
  BigramLM m(260, 0);
  TrainResult r = train(recipe("guard", {"data.path=" + t.path + "/d", "eval.heldout=0"}), m);
  EXPECT_EQ(r.exit_code, kExitStepGuard);
  EXPECT_EQ(r.last_step, 2);
  EXPECT_NE(out_.str().find("STEP-GUARD: step 6 never completed (last completed step 2): error at step 3"),
            std::string::npos)
      << out_.str() << err_.str();
}

TEST(TrainLossParts, PackUnpackRoundTripsAndAddsLeavesInOrder) {
  model::LossParts a;
  a.sum[model::kLossCe] = 12.345678901234567, a.sum[model::kLossLmZ] = 0.1 + 0.2,
  a.sum[model::kLossMoeLb] = 1e-3 / 3, a.sum[model::kLossRouterZ] = 7e-7, a.tokens = 812345;
  a.moe_layers = {{3, 1.25, 0.5, 1.875, 17}, {7, 1.0 / 3, 2e-5, 2.5, 0}};
  std::vector<double> buf(packed_loss_parts_size(2), -1.0);
  ASSERT_EQ(buf.size(), 15u);
  pack_loss_parts(a, buf.data());
  model::LossParts b = unpack_loss_parts(buf.data(), 2);
  EXPECT_EQ(std::memcmp(&a.sum[model::kLossCe], &b.sum[model::kLossCe], sizeof(double)), 0);
  EXPECT_EQ(b.sum[model::kLossLmZ], a.sum[model::kLossLmZ]);
  EXPECT_EQ(b.sum[model::kLossMoeLb], a.sum[model::kLossMoeLb]);
  EXPECT_EQ(b.sum[model::kLossRouterZ], a.sum[model::kLossRouterZ]);
  EXPECT_EQ(b.tokens, a.tokens);
  ASSERT_EQ(b.moe_layers.size(), 2u);
  for (size_t k = 0; k < 2; ++k) {
    EXPECT_EQ(b.moe_layers[k].layer, a.moe_layers[k].layer);
    EXPECT_EQ(b.moe_layers[k].lb_loss, a.moe_layers[k].lb_loss);
    EXPECT_EQ(b.moe_layers[k].router_z, a.moe_layers[k].router_z);
    EXPECT_EQ(b.moe_layers[k].required_buffer_factor, a.moe_layers[k].required_buffer_factor);
    EXPECT_EQ(b.moe_layers[k].dropped_tokens, a.moe_layers[k].dropped_tokens);
  }
  // A dense leaf packs to the 5 head values only.
  model::LossParts dense;
  dense.sum[model::kLossCe] = 2, dense.tokens = 3;
  std::vector<double> d(packed_loss_parts_size(0));
  pack_loss_parts(dense, d.data());
  EXPECT_EQ(d, (std::vector<double>{2, 0, 0, 0, 3}));
  EXPECT_TRUE(unpack_loss_parts(d.data(), 0).moe_layers.empty());

  // Two leaves: sums in order, dropped tokens summed, buffer factor max, layer losses averaged.
  model::LossParts c = a;
  c.moe_layers[0].required_buffer_factor = 3.0, c.moe_layers[0].dropped_tokens = 5;
  StepParts sp;
  sp.add_leaf(a, 2);
  sp.add_leaf(c, 2);
  EXPECT_EQ(sp.sum[model::kLossCe], a.sum[model::kLossCe] + c.sum[model::kLossCe]);
  EXPECT_EQ(sp.tokens, 2 * a.tokens);
  EXPECT_EQ(sp.moe.at(3).dropped_tokens, 22);
  EXPECT_EQ(sp.moe.at(3).required_buffer_factor, 3.0);
  EXPECT_EQ(sp.moe.at(3).lb_loss, 1.25 / 2 + 1.25 / 2);
  EXPECT_EQ(sp.moe.at(7).required_buffer_factor, 2.5);

  // One process: the gather is the leaves themselves.
  auto comm = dist::make_single_comm();
  StepParts g = gather_loss_parts(*comm, {a, c}, 2, 1);
  EXPECT_EQ(g.sum[model::kLossCe], sp.sum[model::kLossCe]);
  EXPECT_EQ(g.moe.at(3).lb_loss, sp.moe.at(3).lb_loss);
  const StepLosses l = step_losses(g, g.tokens, 2, {1.0, 1e-5, 1.0, 1.0});
  EXPECT_EQ(l.value[model::kLossCe], g.sum[model::kLossCe] / static_cast<double>(g.tokens));
  EXPECT_EQ(l.value[model::kLossLmZ], 1e-5 * g.sum[model::kLossLmZ] / static_cast<double>(g.tokens));
  EXPECT_EQ(l.value[model::kLossMoeLb], g.sum[model::kLossMoeLb] / 2);
  EXPECT_EQ(l.loss, l.value[0] + l.value[1] + l.value[2] + l.value[3]);
}
