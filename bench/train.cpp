// End-to-end training-step benchmark: forward + backward + global grad norm + clip (1.0) + AdamW on packed
// rows with several documents per row (SFT-style: only each document's completion part is trained), for a
// tiny and a small Olmo 3 dense config and a tiny and a small Olmo 3.5 hybrid (KDA + MoE) config, against
// the same loop in PyTorch (bench/train_torch.py: the independent references of tests/reference, float32,
// torch.optim.AdamW(0.9, 0.95, eps 1e-8) + clip_grad_norm_) on the same config, initial weights, batch and
// thread count, in the same run. Two PyTorch peers run that script: A = Debian's python3-torch 1.13
// (/usr/bin/python3), B = a current PyPI torch (2.15, CPU) from deps/venv-reference (scripts/install-deps.sh
// --reference); a missing interpreter is reported as "skipped".
//
// Our side runs the trainer's step sequence (src/train/step.cpp, the body of run_training's loop): zero
// grads; per micro-batch CausalLM::forward_backward(batch, loss, 1 / trained targets of the step, 1 /
// grad_accum); global_grad_norm; clip_grad_norm; adamw_step (kernels/adamw.h). Not through run_training
// itself, which needs a dataset on disk; its step time also includes assembling the micro-batches from the
// dataset rows and the log lines, which this bench leaves out.
//
// Each implementation runs in a fresh process (ours: this binary with --child), so its peak RSS (VmHWM,
// reset after set-up where /proc/self/clear_refs allows) is the training loop's. The analytic figure is
// 16 bytes per parameter (fp32 weights, grads, AdamW m and v) + the activations saved for the backward
// (counted from the units' headers, model/unit_*.h, for one micro-batch) + the cross-entropy tile.
// MFU = model FLOPs per step / step time / measured SGEMM peak, with the trainer's FLOP count (train/flops.h
// FlopModel over the step's micro-batches: projections and MLP/active experts, attention per document and
// window, KDA's chunked delta rule, the LM head over trained targets; docs/train.md "MFU accounting").
//
// --backend xla|both (default cpu): the same step with the model on the XLA backend (model/decoder_xla.h,
// XLA's CPU PJRT plugin; the dense cases only, the hybrids' KDA and MoE layers are not emitted and are
// reported as skipped with XlaDecoder's reason): a second table gives, per case, the compile time, XLA's
// step against the CPU backend's measured in the same run (tok/s, CPU s per step, MFU), where the XLA step's
// time goes (parameter and batch upload, execute, download and gradient accumulation, clip + AdamW) and the
// per-step loss gap. `xla` runs the XLA step alone (no CPU backend run, no PyTorch peers).
//
// Usage: bench_train [--threads N] [--steps S] [--cases a,b,...] [--no-torch] [--dir D]
//                    [--gemm auto|openblas|onednn] [--compare-bf16] [--backend cpu|xla|both]
//        bench_train --child CASE [--dir D] --threads N --steps S [--gemm L] [--dtype fp32|bf16]
//                    [--backend cpu|xla]   (internal)
// --gemm: our fp32 GEMM library (recipe key compute.gemm; default auto). --compare-bf16: our step also runs
// with bf16 compute (compute.dtype=bf16) in the same run, and a second table gives its step rate against
// fp32's and the per-step loss difference. Prints a markdown table and one greppable line per case:
//   BENCH train case=... ours_tok_s=... mfu=... ours_peak_mib=... torch_tok_s=... torch_ratio=... ...
//   pypi_torch_tok_s=... pypi_torch_ratio=... ...   (or torch=skipped / pypi_torch=skipped)
//   BENCH train_xla case=... compile_s=... xla_tok_s=... cpu_tok_s=... ratio=... upload_s=... ...
//   (or xla=skipped)
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "bench_util.h"
#include "core/rng.h"
#include "core/threads.h"
#include "io/safetensors.h"
#include "kernels/adamw.h"
#include "kernels/gemm.h"
#include "model/decoder.h"
#include "model/decoder_xla.h"
#include "model/model.h"
#include "model/params.h"
#include "train/flops.h"
#include "train/perf.h"

using namespace olmosft;
using namespace olmosft::model;
using json = nlohmann::json;
namespace fs = std::filesystem;

namespace {

struct Case {
  std::string name;
  json config;
  int64_t rows = 1, T = 256, ga = 1, docs = 4;  // rows per micro-batch, ga micro-batches per step
};

// The demo's tiny Olmo 3 (tests/golden/model/olmo3_tiny with the dolma2 vocabulary, scripts/demo.sh) and
// its batch shape (recipes/tiny-demo.yaml: 8 rows x 256, 4 rows per micro-batch); a small Olmo 3 (hidden
// 512, 4 layers 3:1, 8 heads / 4 kv, head_dim 64, SwiGLU 1536, window 256, dolma2 vocabulary) on one row
// of 1024; the D.2 tiny hybrid preset (= tests/golden/model/olmo3moe_tiny's shapes); and a small hybrid
// (the D.2 small preset cut to one group of 8 layers: 7 KDA + 1 attention, d 256, 64 experts top-8).
std::vector<Case> all_cases() {
  std::vector<Case> cs;
  {
    json j = preset_config_json("olmo3-tiny");
    j["vocab_size"] = 100278;
    j["eos_token_id"] = 100257;
    j["pad_token_id"] = 100277;
    cs.push_back({"tiny-dense", j, 4, 256, 2, 3});
  }
  {
    json j = preset_config_json("olmo3-small");
    j["vocab_size"] = 100278;
    j["eos_token_id"] = 100257;
    j["pad_token_id"] = 100277;
    j["hidden_size"] = 512;
    j["intermediate_size"] = 1536;
    j["num_hidden_layers"] = 4;
    j["num_attention_heads"] = 8;
    j["num_key_value_heads"] = 4;
    j["sliding_window"] = 256;
    j["max_position_embeddings"] = 4096;
    j["rope_scaling"]["original_max_position_embeddings"] = 512;  // factor 8 = 4096 / 512
    j["layer_types"] = {"sliding_attention", "sliding_attention", "sliding_attention", "full_attention"};
    cs.push_back({"small-dense", j, 1, 1024, 1, 4});
    // The same model at 8 micro-batches per step (8,192 tokens): the optimizer's pass over the 100K-vocab
    // embedding and LM head (most of the parameters) is spread over 8x the tokens, as at real batch sizes.
    cs.push_back({"small-dense-8k", j, 1, 1024, 8, 4});
  }
  cs.push_back({"tiny-hybrid", preset_config_json("olmo3moe-tiny"), 2, 256, 1, 3});
  {
    json j = preset_config_json("olmo3moe-d2small");
    j["num_hidden_layers"] = 8;
    json lt = json::array();
    for (int i = 0; i < 7; ++i) lt.push_back("linear_attention");
    lt.push_back("full_attention");
    j["layer_types"] = lt;
    cs.push_back({"small-hybrid", j, 1, 512, 1, 2});
  }
  return cs;
}

LossConfig loss_config(const ModelConfig& c) {
  LossConfig l;  // the runbook's SFT coefficients (recipes/olmo35-small-sft.yaml)
  l.weight[model::kLossLmZ] = 1e-5;
  if (c.is_moe()) {
    l.weight[model::kLossMoeLb] = 0.01;
    l.weight[model::kLossRouterZ] = 1e-5;
  }
  return l;
}
constexpr double kLr = 1e-3;

long vm_kb(const char* key) {
  std::ifstream f("/proc/self/status");
  std::string line;
  const std::string k = std::string(key) + ":";
  while (std::getline(f, line))
    if (line.rfind(k, 0) == 0) return std::atol(line.c_str() + k.size());
  return -1;
}

bool reset_hwm() {
  std::ofstream f("/proc/self/clear_refs");
  if (!f) return false;
  f << "5";
  f.flush();
  return f.good();
}

// ga * rows packed rows of T tokens: `docs` documents per row of varying length (the last fills the row),
// each random ids ending in EOS; a document's first 20-50% is the prompt, the rest is trained (target t is
// trained iff token t+1 is in the same document's completion part), as tests/reference pack_rows.
struct Packed {
  int64_t R = 0, T = 0;
  std::vector<int32_t> tok, seg, pos, tgt;
  std::vector<uint8_t> trained;
  int64_t n_trained = 0;
};

Packed make_rows(const Case& cs, const ModelConfig& c) {
  Packed p;
  p.R = cs.rows * cs.ga;
  p.T = cs.T;
  const size_t n = static_cast<size_t>(p.R * p.T);
  p.tok.assign(n, 0);
  p.seg.assign(n, 0);
  p.pos.assign(n, 0);
  p.tgt.assign(n, -100);
  p.trained.assign(n, 0);
  const Rng rng{20261202, 7};
  uint64_t ctr = 0;
  const int64_t eos = c.eos_token_ids.empty() ? 1 : c.eos_token_ids[0];
  for (int64_t r = 0; r < p.R; ++r) {
    std::vector<int64_t> lens;
    int64_t left = p.T;
    for (int64_t d = 0; d + 1 < cs.docs; ++d) {
      const int64_t mean = p.T / cs.docs;
      const int64_t L = mean / 2 + static_cast<int64_t>(rng.below(ctr++, static_cast<uint64_t>(mean)));
      lens.push_back(std::min(L, left - (cs.docs - 1 - d)));
      left -= lens.back();
    }
    lens.push_back(left);
    int64_t t0 = r * p.T;
    for (size_t d = 0; d < lens.size(); ++d) {
      const int64_t L = lens[d];
      const double frac = 0.2 + 0.3 * static_cast<double>(rng.uniform(ctr++));
      const int64_t n_prompt = std::max<int64_t>(1, std::min<int64_t>(L - 1, std::llround(frac * L)));
      for (int64_t j = 0; j < L; ++j) {
        const size_t i = static_cast<size_t>(t0 + j);
        p.tok[i] = j + 1 == L
                       ? static_cast<int32_t>(eos)
                       : static_cast<int32_t>(2 + rng.below(ctr++, static_cast<uint64_t>(c.vocab_size - 4)));
        p.seg[i] = static_cast<int32_t>(d + 1);
        p.pos[i] = static_cast<int32_t>(j);
      }
      for (int64_t j = 0; j + 1 < L; ++j) {
        const size_t i = static_cast<size_t>(t0 + j);
        p.tgt[i] = p.tok[i + 1];
        if (j + 1 >= n_prompt) {
          p.trained[i] = 1;
          ++p.n_trained;
        }
      }
      t0 += L;
    }
  }
  return p;
}

Batch micro_view(const Packed& p, int64_t rows, int64_t m) {
  const size_t o = static_cast<size_t>(m * rows * p.T);
  Batch b;
  b.B = rows;
  b.T = p.T;
  b.tokens = p.tok.data() + o;
  b.segments = p.seg.data() + o;
  b.positions = p.pos.data() + o;
  b.targets = p.tgt.data() + o;
  b.trained = p.trained.data() + o;
  return b;
}

// Activation bytes kept for the backward of one micro-batch of N tokens, counted by hand from the units'
// headers (model/unit_*.h), both families:
//   residual streams   (L + 1) d
//   every block        a, h_mid, f (3 d) + 2 RMS scales; peri-LN: x1, x2 (2 d) + 2 RMS scales
//   attention          q, o (2 H D), k, v (2 Hkv D), q/k RMS (per head: H + Hkv, else 2), lse (H);
//                      gate: logits and gated o (2 H D)
//   KDA                q/k in, conv, normed (6 KD), v in/conv (2 VD), f, g (2 KD), f/g low rank (2 dv),
//                      beta logit + beta (2 H), o, gate, y (3 VD)
//   dense FFN          gate, up pre-activations (2 F)
//   MoE                probs (E), router lse (1), weights (k), z and r (2 latent), shared expert (3 S)
//   floats,
//                      top-k ids (k int32), kept flags (k bytes); per layer: loads (E int64)
double saved_bytes_analytic(const ModelConfig& c, int64_t N) {
  const int64_t d = c.hidden_size, KD = c.linear_num_key_heads * c.linear_key_head_dim,
                VD = c.linear_num_value_heads * c.linear_value_head_dim, Hk = c.linear_num_key_heads,
                R = c.linear_value_head_dim, H = c.num_attention_heads, Hkv = c.num_key_value_heads,
                D = c.head_dim, E = c.n_routed_experts, k = c.num_experts_per_tok, Lt = c.latent_moe_dim,
                S = c.shared_expert_intermediate_size;
  const bool peri = c.use_peri_ln, gate = c.attention_gate_type == "elementwise";
  double bytes = 4.0 * static_cast<double>((c.num_hidden_layers + 1) * d * N);
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    int64_t f = 3 * d + 2 + (peri ? 2 * d + 2 : 0);
    if (c.layer_types[static_cast<size_t>(l)] == LayerType::LinearAttention)
      f += 8 * KD + 5 * VD + 2 * R + 2 * Hk;
    else
      f += 2 * H * D + 2 * Hkv * D + (c.use_head_qk_norm ? H + Hkv : 2) + H + (gate ? 2 * H * D : 0);
    double per_tok = 4.0 * static_cast<double>(f);
    if (c.is_dense_layer(l)) {
      per_tok +=
          4.0 * 2.0 * static_cast<double>(c.is_moe() ? c.dense_mlp_intermediate_size : c.intermediate_size);
    } else {
      per_tok += 4.0 * static_cast<double>(E + 1 + k + 2 * Lt + 3 * S) + 4.0 * k + 1.0 * k;
      bytes += 8.0 * static_cast<double>(E);
    }
    bytes += per_tok * static_cast<double>(N);
  }
  return bytes;
}

// The tiled cross-entropy's largest buffers (cross_entropy.cpp backward: h block, logit-gradient tile,
// dh block): row_block (1024) x vocab_tile (8192, the trainer's compute.vocab_tile default).
double xent_tile_bytes(const ModelConfig& c, int64_t trained) {
  const double rows = static_cast<double>(std::min<int64_t>(1024, trained));
  return 4.0 * rows * (static_cast<double>(std::min<int64_t>(8192, c.vocab_size)) + 2.0 * c.hidden_size);
}

// --backend xla: the XlaDecoder's figures of a child run. BEFORE: its stats after the warm-up step (which
// compiles the program); AFTER: after the timed steps, so the phases are per timed step.
json xla_fields(const XlaDecoder& x, const XlaRunStats& before, int steps) {
  const XlaRunStats& a = x.stats();
  const double n = static_cast<double>(steps);
  return {{"platform", x.platform()},
          {"devices", x.device_count()},
          {"compiles", a.compiles},
          {"compile_seconds", a.compile_seconds},
          {"module_bytes", a.module_bytes},
          {"executions", a.executions},
          {"upload_sec_per_step", (a.upload_seconds - before.upload_seconds) / n},
          {"execute_sec_per_step", (a.execute_seconds - before.execute_seconds) / n},
          {"download_sec_per_step", (a.download_seconds - before.download_seconds) / n}};
}

// The case's model on BACKEND (cpu: make_model; xla: make_xla_decoder on XLA's CPU plugin), the same
// initial weights (seed 1, init_params) on both.
std::unique_ptr<CausalLM> make_case_model(const ModelConfig& c, const std::string& backend, bool bf16) {
  if (backend != "xla") return make_model(c, 1);
  XlaOptions xo;  // the trainer's defaults for device: xla, xla.plugin cpu (cli/train.cpp)
  xo.bf16 = bf16;
  return make_xla_decoder(c, xo, 1);
}

int child(const std::string& name, const std::string& dir, int steps, const std::string& backend, bool bf16) {
  const long start_kb = vm_kb("VmRSS");
  Case cs;
  bool found = false;
  for (auto& x : all_cases())
    if (x.name == name) cs = x, found = true;
  if (!found) {
    std::fprintf(stderr, "bench_train: unknown case %s\n", name.c_str());
    return 2;
  }
  const ModelConfig c = parse_config(cs.config, "bench_train case " + name);
  auto m = make_case_model(c, backend, bf16);
  const Packed p = make_rows(cs, c);
  const LossConfig lc = loss_config(c);
  if (!dir.empty()) {  // what the PyTorch peer reads: config, our initial weights, the batch
    fs::create_directories(dir);
    std::ofstream(dir + "/config.json") << cs.config.dump(2) << "\n";
    safetensors::write(dir + "/weights.safetensors", export_tensors(*m));
    std::vector<safetensors::NamedTensor> bt;
    const Shape sh{p.R, p.T};
    bt.push_back({"tokens", Tensor::from(p.tok, sh)});
    bt.push_back({"segments", Tensor::from(p.seg, sh)});
    bt.push_back({"positions", Tensor::from(p.pos, sh)});
    bt.push_back({"targets", Tensor::from(p.tgt, sh)});
    bt.push_back({"trained", Tensor::from(p.trained, sh)});
    json lj = {{"lm_z", lc.weight[model::kLossLmZ]},
               {"moe_lb", lc.weight[model::kLossMoeLb]},
               {"router_z", lc.weight[model::kLossRouterZ]},
               {"lr", kLr}};
    safetensors::write(dir + "/batch.safetensors", bt,
                       {{"format", "pt"}, {"ga", std::to_string(cs.ga)}, {"loss", lj.dump()}});
  }
  // Optimizer state as the trainer keeps it.
  std::vector<Param>& params = m->params();
  std::vector<Tensor> m1, m2;
  std::vector<AdamWParam<float>> ap;
  int64_t n_params = 0;
  for (auto& q : params) {
    m1.push_back(Tensor::zeros(q.value.shape()));
    m2.push_back(Tensor::zeros(q.value.shape()));
    n_params += q.value.numel();
  }
  for (size_t i = 0; i < params.size(); ++i)
    ap.push_back({params[i].value.data<float>(), params[i].grad.data<float>(), m1[i].data<float>(),
                  m2[i].data<float>(), params[i].value.numel(), params[i].decay});
  AdamWConfig acfg;
  acfg.lr = kLr;
  acfg.beta1 = 0.9;
  acfg.beta2 = 0.95;
  acfg.eps = 1e-8;
  acfg.weight_decay = 0.0;
  acfg.validate();
  const long model_kb = vm_kb("VmRSS");
  const bool hwm_reset = reset_hwm();

  json losses = json::array();
  size_t saved = 0;
  double opt_sec = 0;  // clip + AdamW on the host, summed over the timed steps
  auto step = [&](int64_t s) {
    for (auto& q : params) std::fill(q.grad.data<float>(), q.grad.data<float>() + q.grad.numel(), 0.0f);
    double ce = 0, z = 0, lb = 0, rz = 0;
    for (int64_t mi = 0; mi < cs.ga; ++mi) {
      LossParts lp =
          m->forward_backward(micro_view(p, cs.rows, mi), lc, 1.0 / static_cast<double>(p.n_trained),
                              1.0 / static_cast<double>(cs.ga));
      ce += lp.sum[model::kLossCe];
      z += lp.sum[model::kLossLmZ];
      lb += lp.sum[model::kLossMoeLb];
      rz += lp.sum[model::kLossRouterZ];
    }
    const double o0 = bench::now();
    // The norm, then AdamW with the clip's coefficient applied as it reads each gradient (as the trainer).
    const double gnorm = global_grad_norm(ap);
    adamw_step(ap, acfg, s, float(clip_coefficient(gnorm, 1.0)));
    opt_sec += bench::now() - o0;
    const double nt = static_cast<double>(p.n_trained), g = static_cast<double>(cs.ga);
    losses.push_back({{"ce", ce / nt},
                      {"lm_z", lc.weight[model::kLossLmZ] * z / nt},
                      {"moe_lb", lb / g},
                      {"router_z", rz / g},
                      {"grad_norm", gnorm}});
    if (auto* h = dynamic_cast<Decoder*>(m.get())) saved = h->last_run().saved_bytes;
  };
  const double warm0 = bench::now();
  step(1);  // warm-up (allocates the workspaces; on XLA compiles the step's program)
  const double warmup_sec = bench::now() - warm0;
  opt_sec = 0;
  const auto* xm = dynamic_cast<const XlaDecoder*>(m.get());
  const XlaRunStats xla_before = xm ? xm->stats() : XlaRunStats{};
  double wall = 0, cpu = 0, best = 1e30;
  for (int s = 2; s <= steps + 1; ++s) {
    const double w0 = bench::now(), c0 = bench::cpu_now();
    step(s);
    const double dw = bench::now() - w0;
    wall += dw;
    best = std::min(best, dw);
    cpu += bench::cpu_now() - c0;
  }
  const int64_t tokens = p.R * p.T;
  const train::FlopModel fm(m->config());
  double step_flops = 0;
  for (int64_t mi = 0; mi < cs.ga; ++mi) step_flops += fm.count(micro_view(p, cs.rows, mi)).total();
  json out = {{"impl", "olmosft"},
              {"backend", backend},
              {"warmup_sec", warmup_sec},
              {"opt_sec_per_step", opt_sec / steps},
              {"model_flops_per_step", step_flops},
              {"threads", num_threads()},
              {"tokens_per_step", tokens},
              {"trained_per_step", p.n_trained},
              {"steps", steps},
              {"sec_per_step", wall / steps},
              {"best_sec_per_step", best},
              {"cpu_sec_per_step", cpu / steps},
              {"tokens_per_s", static_cast<double>(tokens) * steps / wall},
              {"start_rss_kb", start_kb},
              {"base_rss_kb", model_kb},
              {"peak_rss_kb", vm_kb("VmHWM")},
              {"hwm_reset_after_load", hwm_reset},
              {"n_params", n_params},
              {"saved_bytes", saved},
              {"losses", losses}};
  if (xm) out["xla"] = xla_fields(*xm, xla_before, steps);
  std::printf("%s\n", out.dump().c_str());
  return 0;
}

// popen + the last line that parses as a JSON object.
json run_json(const std::string& cmd, std::string* raw) {
  FILE* f = popen(cmd.c_str(), "r");
  if (!f) return json();
  std::string out;
  char buf[8192];
  while (size_t n = fread(buf, 1, sizeof buf, f)) out.append(buf, n);
  const int rc = pclose(f);
  if (raw) *raw = out;
  if (rc != 0) return json();
  json res;
  size_t a = 0;
  while (a < out.size()) {
    size_t b = out.find('\n', a);
    if (b == std::string::npos) b = out.size();
    const std::string line = out.substr(a, b - a);
    if (!line.empty() && line[0] == '{') {
      try {
        res = json::parse(line);
      } catch (const json::exception&) {
      }
    }
    a = b + 1;
  }
  return res;
}

// The 1, 5 and 15 minute load averages.
std::string loadavg3() {
  std::ifstream f("/proc/loadavg");
  std::string a, b, c;
  if (!(f >> a >> b >> c)) return "?";
  return a + " " + b + " " + c;
}

std::string shell_quote(const std::string& s) {
  std::string q = "'";
  for (char ch : s) q += ch == '\'' ? std::string("'\\''") : std::string(1, ch);
  return q + "'";
}

struct Result {
  const Case* cs;
  json ours;                    // null with --backend xla
  std::vector<json> peer;       // per peer; null when skipped or failed
  json bf16;                    // ours with compute.dtype=bf16 (--compare-bf16)
  std::vector<json> peer_bf16;  // per peer under CPU bf16 autocast (--compare-bf16); null when skipped
  json xla;                     // ours on the XLA backend (--backend xla|both); null when refused or failed
  std::string xla_skip;         // why the XLA backend does not run the case (XlaDecoder's refusal)
};

// A PyTorch peer: bench/train_torch.py under one interpreter.
struct Peer {
  std::string name, python, key;  // key: prefix of the BENCH line's fields
  bool present = false;
};

// The step's total loss (CE + z-loss + the MoE's terms) of entry I of a child's "losses".
double loss_at(const json& l, size_t i) {
  return l[i]["ce"].get<double>() + l[i]["lm_z"].get<double>() + l[i]["moe_lb"].get<double>() +
         l[i]["router_z"].get<double>();
}

// Why XlaDecoder refuses the case's config ("" when it emits every layer): its constructor's check, run
// through xla_step_module, which needs no plugin.
std::string xla_refusal(const Case& cs) {
  try {
    (void)xla_step_module(parse_config(cs.config, cs.name), XlaOptions{}, 1, 8, LossConfig{}, false);
    return "";
  } catch (const std::exception& e) {
    return e.what();
  }
}

// The CPU backend against the PyTorch peers: the markdown table and one BENCH train line per case.
void print_peer_table(const std::vector<Result>& results, const std::vector<Peer>& peers, bool torch,
                      int steps, const std::string& load_start, double peak) {
  // Peer labels with the torch version each one reported.
  std::vector<std::string> label(peers.size());
  for (size_t pi = 0; pi < peers.size(); ++pi) {
    label[pi] = peers[pi].name;
    for (const Result& r : results)
      if (r.peer[pi].is_object()) {
        label[pi] = "torch " + r.peer[pi].value("torch", std::string("?")) + " (" + peers[pi].name + ")";
        break;
      }
  }

  const char* wait_policy = std::getenv("OMP_WAIT_POLICY");
  std::printf("## bench_train: training step (fwd + bwd + clip + AdamW), ours vs PyTorch, threads %d\n\n",
              num_threads());
  std::printf(
      "- ours: the trainer's step calls (forward_backward per micro-batch, global_grad_norm, "
      "adamw_step with the clip coefficient for 1.0); PyTorch: bench/train_torch.py (tests/reference models, "
      "torch.optim.AdamW + clip_grad_norm_); same config, initial weights, packed batch and threads\n");
  for (size_t pi = 0; pi < peers.size(); ++pi)
    std::printf("- peer %c: %s, %s%s\n", char('A' + pi), label[pi].c_str(), peers[pi].python.c_str(),
                !torch              ? ": skipped (--no-torch)"
                : peers[pi].present ? ""
                                    : ": skipped (interpreter not found)");
  std::printf(
      "- 1 warm-up step + %d timed steps, each implementation in a fresh process; s/step and tok/s from the "
      "best timed step, CPU s = process CPU time per step (mean); OMP_WAIT_POLICY=%s; load average at start "
      "%s, at end %s\n",
      steps, wait_policy ? wait_policy : "(unset)", load_start.c_str(), loadavg3().c_str());
  std::printf(
      "- MFU = model FLOPs per step (trainer.cpp convention) / best step time / SGEMM peak; SGEMM peak "
      "(1024^3, %d threads, best of 5 before each case, max over the run): %.1f GFLOP/s\n\n",
      num_threads(), peak / 1e9);
  std::printf(
      "| case | tokens/step (trained) | ours s/step | ours tok/s | peer A / B s/step | peer A / B tok/s | "
      "ratio ours / "
      "A, ours / B | CPU s ours / A / B | MFU ours / A / B | step-1 loss ours / A / B | peak RSS MiB ours / "
      "A / B | "
      "analytic MiB (16 B/param + act + CE tile) | ours peak / analytic | saved act MiB counted / model |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  std::vector<std::string> lines;
  const double mib = 1048576.0;
  for (const Result& r : results) {
    if (!r.ours.is_object()) continue;
    const Case& cs = *r.cs;
    const json& o = r.ours;
    const ModelConfig c = parse_config(cs.config, cs.name);
    const double tokens = o["tokens_per_step"].get<double>(), trained = o["trained_per_step"].get<double>();
    const double step_flops = o["model_flops_per_step"].get<double>();
    const double os = o["best_sec_per_step"].get<double>(), ocpu = o["cpu_sec_per_step"].get<double>();
    const double ours_tps = tokens / os, mfu = step_flops / os / peak;
    const double act = saved_bytes_analytic(c, cs.rows * cs.T);
    const double analytic =
        16.0 * o["n_params"].get<double>() + act + xent_tile_bytes(c, static_cast<int64_t>(trained));
    const double ours_peak = o["peak_rss_kb"].get<double>() * 1024.0;
    const double l1o = loss_at(o["losses"], 0);
    // Per peer: the figures, "-" when skipped or failed.
    struct PeerFig {
      bool ok = false;
      double s = 0, tps = 0, cpu = 0, mfu = 0, l1 = 0, peak = 0, base = 0, worst = 0;
    };
    std::vector<PeerFig> pf(peers.size());
    for (size_t pi = 0; pi < peers.size(); ++pi) {
      const json& t = r.peer[pi];
      if (!t.is_object()) continue;
      PeerFig& f = pf[pi];
      f.ok = true;
      f.s = t["best_sec_per_step"].get<double>();
      f.cpu = t["cpu_sec_per_step"].get<double>();
      f.tps = tokens / f.s;
      f.mfu = step_flops / f.s / peak;
      f.l1 = loss_at(t["losses"], 0);
      f.peak = t["peak_rss_kb"].get<double>() * 1024.0;
      f.base = t["base_rss_kb"].get<double>() * 1024.0;
      for (size_t i = 0; i < std::min(o["losses"].size(), t["losses"].size()); ++i)  // same weights and batch
        f.worst = std::max(f.worst, std::fabs(loss_at(o["losses"], i) - loss_at(t["losses"], i)) /
                                        std::fabs(loss_at(t["losses"], i)));
    }
    auto cell = [&](const char* fmt, auto get) {  // "a / b" over the peers
      std::string out;
      for (size_t pi = 0; pi < peers.size(); ++pi) {
        char b[64] = "-";
        if (pf[pi].ok) std::snprintf(b, sizeof b, fmt, get(pf[pi]));
        out += (pi ? " / " : "") + std::string(b);
      }
      return out;
    };
    std::printf(
        "| %s | %.0f (%.0f) | %.3f | %.0f | %s | %s | %s | %.2f / %s | %.3f / %s | %.6f / %s | %.0f / %s | "
        "%.0f | "
        "%.2f | %.1f / %.1f |\n",
        cs.name.c_str(), tokens, trained, os, ours_tps,
        cell("%.3f", [](const PeerFig& f) { return f.s; }).c_str(),
        cell("%.0f", [](const PeerFig& f) { return f.tps; }).c_str(),
        cell("%.2fx", [&](const PeerFig& f) { return ours_tps / f.tps; }).c_str(), ocpu,
        cell("%.2f", [](const PeerFig& f) { return f.cpu; }).c_str(), mfu,
        cell("%.3f", [](const PeerFig& f) { return f.mfu; }).c_str(), l1o,
        cell("%.6f", [](const PeerFig& f) { return f.l1; }).c_str(), ours_peak / mib,
        cell("%.0f", [&](const PeerFig& f) { return f.peak / mib; }).c_str(), analytic / mib,
        ours_peak / analytic, act / mib, o["saved_bytes"].get<double>() / mib);
    char line[1200];
    int n = std::snprintf(line, sizeof line,
                          "BENCH train case=%s ours_tok_s=%.1f mfu=%.4f ours_peak_mib=%.1f analytic_mib=%.1f "
                          "ours_base_mib=%.1f loss1_ours=%.7f steps=%d",
                          cs.name.c_str(), ours_tps, mfu, ours_peak / mib, analytic / mib,
                          o["base_rss_kb"].get<double>() / 1024.0, l1o, steps + 1);
    for (size_t pi = 0; pi < peers.size(); ++pi) {
      const PeerFig& f = pf[pi];
      const char* k = peers[pi].key.c_str();
      if (!f.ok) {
        n += std::snprintf(line + n, sizeof line - size_t(n), " %s=skipped", k);
        continue;
      }
      n += std::snprintf(line + n, sizeof line - size_t(n),
                         " %s_tok_s=%.1f %s_ratio=%.2f %s_cpu_ratio=%.2f %s_mfu=%.4f %s_peak_mib=%.1f "
                         "%s_base_mib=%.1f loss1_%s=%.7f %s_loss_rel_diff_max=%.2g",
                         k, f.tps, k, ours_tps / f.tps, k, f.cpu / ocpu, k, f.mfu, k, f.peak / mib, k,
                         f.base / mib, k, f.l1, k, f.worst);
    }
    lines.push_back(line);
  }
  std::printf("\n");
  for (const auto& l : lines) std::printf("%s\n", l.c_str());
  std::printf(
      "\nratio = ours tok/s / peer tok/s; cpu_ratio = peer CPU s / ours CPU s per step. Peak RSS = VmHWM "
      "after the timed steps, reset to the current RSS after set-up (weights written / read): weights, "
      "grads, "
      "moments, the loop's transient memory and the process's libraries (*_base_mib = RSS before the loop). "
      "loss_rel_diff_max: worst relative gap of the per-step losses over all %d steps (warm-up included).\n",
      steps + 1);
}

// --backend xla|both: the step on XLA's CPU plugin against the CPU backend's step measured in the same run
// (the same case, weights, batch, clip and AdamW on the host), compile time and the XLA step's phases.
void print_xla_table(const std::vector<Result>& results, int steps, const std::string& load_start,
                     double peak) {
  const char* wait_policy = std::getenv("OMP_WAIT_POLICY");
  std::printf(
      "\n## bench_train on XLA's CPU plugin (XlaDecoder) vs the CPU backend (Decoder), same run, "
      "threads %d\n\n",
      num_threads());
  std::printf(
      "- both: the trainer's step calls (forward_backward per micro-batch, global_grad_norm, adamw_step "
      "with the clip coefficient for 1.0, on the host fp32 masters), same config, initial weights and packed "
      "batch, each in a "
      "fresh process; XLA: one StableHLO program per micro-batch shape, compiled in the warm-up step; "
      "--threads sets our OpenMP pool (the CPU backend's kernels, clip + AdamW), XLA's CPU plugin sizes its "
      "own thread pool\n");
  std::printf(
      "- 1 warm-up step + %d timed steps; s/step and tok/s from the best timed step, CPU s = process CPU "
      "time per step (mean); phases per timed step (mean): upload = parameters and batch to the device, "
      "execute = run and wait, download = results to the host + gradients added into Param::grad; "
      "OMP_WAIT_POLICY=%s; load average at start %s, at end %s; MFU against the in-run SGEMM peak "
      "%.1f GFLOP/s\n\n",
      steps, wait_policy ? wait_policy : "(unset)", load_start.c_str(), loadavg3().c_str(), peak / 1e9);
  std::printf(
      "| case | tokens/step (trained) | XLA compile s (programs) | XLA s/step | CPU backend s/step | "
      "XLA tok/s | CPU backend tok/s | XLA / CPU tok/s | CPU s/step XLA / CPU | MFU XLA / CPU | XLA step: "
      "upload / "
      "execute / download / clip+AdamW s | CPU step: clip+AdamW s | warm-up step s XLA / CPU | step-1 loss "
      "XLA / CPU (worst gap) | peak RSS MiB XLA / CPU |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  std::vector<std::string> lines;
  for (const Result& r : results) {
    const std::string& name = r.cs->name;
    if (!r.xla.is_object()) {
      const std::string why = r.xla_skip.empty() ? "the XLA run failed" : "refused: " + r.xla_skip;
      std::printf("| %s | skipped (%s) |||||||||||||\n", name.c_str(), why.c_str());
      lines.push_back("BENCH train_xla case=" + name + " xla=skipped");
      continue;
    }
    const json &x = r.xla, &xs = x["xla"], &o = r.ours;
    const bool cpu = o.is_object();
    const double tokens = x["tokens_per_step"].get<double>(), flops = x["model_flops_per_step"].get<double>();
    const double xs_s = x["best_sec_per_step"].get<double>(), x_tps = tokens / xs_s;
    const double os_s = cpu ? o["best_sec_per_step"].get<double>() : NAN, o_tps = tokens / os_s;
    const double x_cpu = x["cpu_sec_per_step"].get<double>(),
                 o_cpu = cpu ? o["cpu_sec_per_step"].get<double>() : NAN;
    double worst = cpu ? 0 : NAN;
    for (size_t i = 0; cpu && i < std::min(x["losses"].size(), o["losses"].size()); ++i)
      worst = std::max(worst, std::fabs(loss_at(x["losses"], i) - loss_at(o["losses"], i)) /
                                  std::fabs(loss_at(o["losses"], i)));
    const double up = xs["upload_sec_per_step"].get<double>(), ex = xs["execute_sec_per_step"].get<double>(),
                 down = xs["download_sec_per_step"].get<double>(), xopt = x["opt_sec_per_step"].get<double>();
    const double oopt = cpu ? o["opt_sec_per_step"].get<double>() : NAN;
    const double compile = xs["compile_seconds"].get<double>();
    std::printf(
        "| %s | %.0f (%.0f) | %.2f (%d) | %.3f | %.3f | %.0f | %.0f | %.2fx | %.2f / %.2f | %.3f / %.3f | "
        "%.3f / %.3f / %.3f / %.3f | %.3f | %.2f / %.2f | %.6f / %.6f (%.2g) | %.0f / %.0f |\n",
        name.c_str(), tokens, x["trained_per_step"].get<double>(), compile, xs["compiles"].get<int>(), xs_s,
        os_s, x_tps, o_tps, x_tps / o_tps, x_cpu, o_cpu, flops / xs_s / peak, flops / os_s / peak, up, ex,
        down, xopt, oopt, x["warmup_sec"].get<double>(), cpu ? o["warmup_sec"].get<double>() : NAN,
        loss_at(x["losses"], 0), cpu ? loss_at(o["losses"], 0) : NAN, worst,
        x["peak_rss_kb"].get<double>() / 1024.0, cpu ? o["peak_rss_kb"].get<double>() / 1024.0 : NAN);
    char line[800];
    std::snprintf(line, sizeof line,
                  "BENCH train_xla case=%s compile_s=%.3f compiles=%d xla_tok_s=%.1f cpu_tok_s=%.1f "
                  "ratio=%.3f xla_cpu_s=%.3f cpu_cpu_s=%.3f cpu_s_ratio=%.3f xla_mfu=%.4f cpu_mfu=%.4f "
                  "upload_s=%.4f execute_s=%.4f download_s=%.4f xla_opt_s=%.4f cpu_opt_s=%.4f "
                  "loss_rel_diff_max=%.2g",
                  name.c_str(), compile, xs["compiles"].get<int>(), x_tps, o_tps, x_tps / o_tps, x_cpu, o_cpu,
                  x_cpu / o_cpu, flops / xs_s / peak, flops / os_s / peak, up, ex, down, xopt, oopt, worst);
    lines.push_back(line);
  }
  std::printf("\n");
  for (const auto& l : lines) std::printf("%s\n", l.c_str());
  std::printf(
      "\nratio = XLA tok/s / CPU backend tok/s (best timed step each); cpu_s_ratio = XLA CPU s / CPU backend "
      "CPU s per step; loss_rel_diff_max: worst relative gap of the per-step losses over all %d steps.\n",
      steps + 1);
}

// --compare-bf16: our bf16-compute step against our fp32 step, same case, same run, and against each
// PyTorch peer's step under CPU bf16 autocast.
void print_bf16_table(const std::vector<Result>& results, const std::vector<Peer>& peers) {
  std::vector<std::string> lines;
  std::printf(
      "\n## bench_train: bf16 compute (compute.dtype=bf16) against fp32, ours, and against PyTorch's CPU "
      "bf16 "
      "autocast, same run\n\n| case | fp32 s/step | bf16 s/step | bf16 / fp32 step rate | CPU s fp32 / bf16 "
      "| "
      "step-1 CE fp32 / bf16 | worst per-step CE gap (relative) | torch bf16 autocast s/step A / B | ours "
      "bf16 / torch bf16 step rate A / B | CPU s torch bf16 A / B "
      "|\n|---|---|---|---|---|---|---|---|---|---|\n");
  for (const Result& r : results) {
    if (!r.bf16.is_object()) {
      std::printf("| %s | bf16 run failed or skipped | | | | | | | | |\n", r.cs->name.c_str());
      continue;
    }
    const json &a = r.ours, &b = r.bf16;
    const double sa = a["best_sec_per_step"].get<double>(), sb = b["best_sec_per_step"].get<double>();
    double worst = 0;
    for (size_t i = 0; i < std::min(a["losses"].size(), b["losses"].size()); ++i) {
      const double la = a["losses"][i]["ce"].get<double>(), lb = b["losses"][i]["ce"].get<double>();
      worst = std::max(worst, std::fabs(la - lb) / std::fabs(la));
    }
    std::string ts, tr, tc, fields;  // per peer, joined with " / "
    auto num = [](const char* f, double v) {
      char buf[64];
      std::snprintf(buf, sizeof buf, f, v);
      return std::string(buf);
    };
    for (size_t pi = 0; pi < peers.size(); ++pi) {
      const json& t = r.peer_bf16[pi];
      const std::string sep = pi ? " / " : "", key = peers[pi].key;
      if (!t.is_object()) {
        ts += sep + "-", tr += sep + "-", tc += sep + "-";
        fields += " " + key + "_bf16=skipped";
        continue;
      }
      const double st = t["best_sec_per_step"].get<double>();
      ts += sep + num("%.3f", st);
      tr += sep + num("%.2fx", st / sb);
      tc += sep + num("%.2f", t["cpu_sec_per_step"].get<double>());
      fields += " " + key + "_bf16_s=" + num("%.4f", st) + " " + key + "_bf16_ratio=" + num("%.3f", st / sb);
    }
    std::printf("| %s | %.3f | %.3f | %.2fx | %.2f / %.2f | %.6f / %.6f | %.2g | %s | %s | %s |\n",
                r.cs->name.c_str(), sa, sb, sa / sb, a["cpu_sec_per_step"].get<double>(),
                b["cpu_sec_per_step"].get<double>(), a["losses"][0]["ce"].get<double>(),
                b["losses"][0]["ce"].get<double>(), worst, ts.c_str(), tr.c_str(), tc.c_str());
    char line[300];
    std::snprintf(line, sizeof line,
                  "BENCH train_bf16 case=%s fp32_s=%.4f bf16_s=%.4f speedup=%.3f cpu_speedup=%.3f "
                  "loss_rel_diff_max=%.2g",
                  r.cs->name.c_str(), sa, sb, sa / sb,
                  a["cpu_sec_per_step"].get<double>() / b["cpu_sec_per_step"].get<double>(), worst);
    lines.push_back(line + fields);
  }
  std::printf(
      "\nours bf16 / torch bf16 = torch bf16 autocast s/step / ours bf16 s/step (best timed step each); "
      "torch under torch.autocast(\"cpu\", dtype=torch.bfloat16) in its forward (bench/train_torch.py "
      "--dtype bf16).\n\n");
  for (const auto& l : lines) std::printf("%s\n", l.c_str());
}
}  // namespace

int main(int argc, char** argv) {
  olmosft::default_passive_omp_wait(argv);  // as olmosft itself does
  int threads = 2, steps = 2;
  bool torch = true, compare_bf16 = false;
  std::string only, dir, child_case, gemm = "auto", dtype = "fp32", backend = "cpu";
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "bench_train: missing value for %s\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--threads")
      threads = std::max(1, std::atoi(next().c_str()));
    else if (a == "--steps")
      steps = std::max(1, std::atoi(next().c_str()));
    else if (a == "--cases")
      only = next();
    else if (a == "--dir")
      dir = next();
    else if (a == "--child")
      child_case = next();
    else if (a == "--no-torch")
      torch = false;
    else if (a == "--gemm")
      gemm = next();
    else if (a == "--dtype")
      dtype = next();
    else if (a == "--compare-bf16")
      compare_bf16 = true;
    else if (a == "--backend")
      backend = next();
    else {
      std::fprintf(stderr,
                   "usage: %s [--threads N] [--steps S] [--cases a,b] [--no-torch] [--dir D] [--gemm "
                   "auto|openblas|onednn] [--compare-bf16] [--backend cpu|xla|both]\n"
                   "cases: tiny-dense, small-dense, small-dense-8k, tiny-hybrid, small-hybrid\n",
                   argv[0]);
      return 2;
    }
  }
  set_threads(threads);
  const CpuGemm setup{parse_gemm_lib(gemm, "--gemm"), parse_compute_dtype(dtype, "--dtype")};
  set_cpu_gemm(setup);
  if (backend != "cpu" && backend != "xla" && backend != "both") {
    std::fprintf(stderr, "bench_train: --backend must be cpu, xla or both, got '%s'\n", backend.c_str());
    return 2;
  }
  if (!child_case.empty()) return child(child_case, dir, steps, backend, dtype == "bf16");
  // --backend xla: the XLA step alone (no CPU backend run, hence no PyTorch peers, which read its files).
  const bool run_cpu = backend != "xla", run_xla = backend != "cpu";
  if (!run_cpu) torch = compare_bf16 = false;

  const bool own_dir = dir.empty();
  if (own_dir)
    dir = (fs::temp_directory_path() / ("olmosft_bench_train_" + std::to_string(getpid()))).string();
  // The PyTorch peers, each the same bench/train_torch.py: Debian's python3-torch 1.13 and a current PyTorch
  // from PyPI (deps/venv-reference, scripts/install-deps.sh --reference). A missing interpreter is reported
  // as skipped.
  std::vector<Peer> peers = {
      {"Debian python3-torch", "/usr/bin/python3", "torch"},
      {"PyPI, deps/venv-reference", std::string(OLMOSFT_SOURCE_DIR) + "/deps/venv-reference/bin/python",
       "pypi_torch"}};
  for (Peer& p : peers) {
    p.present = torch && ::access(p.python.c_str(), X_OK) == 0;
    if (torch && !p.present)
      std::fprintf(stderr, "bench_train: PyTorch peer '%s' skipped: %s not found\n", p.name.c_str(),
                   p.python.c_str());
  }
  std::vector<Result> results;
  const std::string load_start = loadavg3();
  double peak = 0;  // the best SGEMM rate seen in this run (measured before every case; load only lowers it)
  int status = 0;
  const std::vector<Case> cases = all_cases();
  for (const Case& cs : cases) {
    if (!only.empty() && ("," + only + ",").find("," + cs.name + ",") == std::string::npos) continue;
    peak = std::max(peak, train::measure_peak_flops(5));  // the trainer's SGEMM probe, best of 5
    const std::string cdir = dir + "/" + cs.name;
    std::string raw;
    const std::string ours_cmd = std::string(argv[0]) + " --child " + cs.name + " --dir " +
                                 shell_quote(cdir) + " --threads " + std::to_string(threads) + " --steps " +
                                 std::to_string(steps) + " --gemm " + gemm_lib_name(setup.fp32);
    Result r{&cs,    json(), std::vector<json>(peers.size()), json(), std::vector<json>(peers.size()),
             json(), ""};
    if (run_cpu) {
      r.ours = run_json(ours_cmd, &raw);
      if (compare_bf16 && r.ours.is_object()) r.bf16 = run_json(ours_cmd + " --dtype bf16", nullptr);
      if (!r.ours.is_object()) {
        std::fprintf(stderr, "bench_train: our run of %s failed: %s\n", cs.name.c_str(),
                     raw.substr(0, 500).c_str());
        status = 1;
        continue;
      }
    }
    if (run_xla && !(r.xla_skip = xla_refusal(cs)).empty()) {
      std::fprintf(stderr, "bench_train: case %s skipped on the XLA backend: %s\n", cs.name.c_str(),
                   r.xla_skip.c_str());
    } else if (run_xla) {  // the same child on XlaDecoder; writes no files (the peers read the CPU run's)
      r.xla = run_json(std::string(argv[0]) + " --child " + cs.name + " --backend xla --threads " +
                           std::to_string(threads) + " --steps " + std::to_string(steps) + " --gemm " +
                           gemm_lib_name(setup.fp32) + " 2>&1",
                       &raw);
      if (!r.xla.is_object()) {
        std::fprintf(stderr, "bench_train: the XLA run of %s failed: %s\n", cs.name.c_str(),
                     raw.substr(0, 500).c_str());
        status = 1;
      }
    }
    for (size_t pi = 0; pi < peers.size(); ++pi) {
      if (!peers[pi].present) continue;
      const std::string cmd = shell_quote(peers[pi].python) + " " + std::string(OLMOSFT_SOURCE_DIR) +
                              "/bench/train_torch.py --dir " + shell_quote(cdir) + " --threads " +
                              std::to_string(threads) + " --steps " + std::to_string(steps);
      r.peer[pi] = run_json(cmd + " 2>&1", &raw);
      if (!r.peer[pi].is_object())
        std::fprintf(stderr, "bench_train: PyTorch peer '%s' of %s failed: %s\n", peers[pi].name.c_str(),
                     cs.name.c_str(), raw.substr(0, 500).c_str());
      if (!compare_bf16) continue;
      r.peer_bf16[pi] = run_json(cmd + " --dtype bf16 2>&1", &raw);
      if (!r.peer_bf16[pi].is_object())
        std::fprintf(stderr, "bench_train: PyTorch peer '%s' of %s under bf16 autocast failed: %s\n",
                     peers[pi].name.c_str(), cs.name.c_str(), raw.substr(0, 500).c_str());
    }
    results.push_back(std::move(r));
  }
  if (run_cpu) print_peer_table(results, peers, torch, steps, load_start, peak);
  if (run_xla) print_xla_table(results, steps, load_start, peak);
  if (compare_bf16) print_bf16_table(results, peers);
  if (own_dir) fs::remove_all(dir);
  return status;
}
