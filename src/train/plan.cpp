// The memory and compute plan (see plan.h; formulas in docs/plan.md).
#include "train/plan.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <sstream>

#include "core/error.h"
#include "core/threads.h"
#include "core/units.h"
#include "kernels/cross_entropy.h"
#include "kernels/moe.h"
#include "model/layers.h"
#include "model/model.h"
#include "model/params.h"
#include "model/unit_block.h"
#include "train/flops.h"

namespace olmosft::train {

namespace {

// The recipe's parameter groups as dist::ModelShards gathers them (docs/dist.md): the tensors before the
// first block, one per block, the tensors after the last block. Sizes in elements.
struct Units {
  int64_t largest = 0;  // the largest group
  int64_t first = 0;    // before the first block (embedding)
};

Units param_units(const model::ModelConfig& m) {
  std::vector<int64_t> layer(size_t(m.num_hidden_layers), 0);
  int64_t before = 0, after = 0;
  bool seen_layer = false;
  for (const model::ParamSpec& s : model::param_registry(m)) {
    const int64_t l = model::hf::layer_of(s.name);
    int64_t n = 1;
    for (int64_t e : s.shape) n *= e;
    if (l >= 0 && l < m.num_hidden_layers) {
      layer[size_t(l)] += n;
      seen_layer = true;
    } else {
      (seen_layer ? after : before) += n;
    }
  }
  Units u;
  u.first = before;
  u.largest = std::max(before, after);
  for (int64_t n : layer) u.largest = std::max(u.largest, n);
  return u;
}

std::string num(double v) {
  std::ostringstream os;
  os << v;
  return os.str();
}

// The mesh checks a plan needs beyond derive_batch (which has divided global_batch already).
void check_mesh(const TrainConfig& cfg, const PlanDevice& dev) {
  const Derived& d = cfg.batch;
  const std::string& src = cfg.source;
  const double pdb = d.per_device_batch;
  if (dev.kind == DeviceKind::Cpu &&
      cfg.device != "xla") {  // device: xla's mesh may split rows (docs/xla.md)
    OLMO_CHECK(pdb >= 1 && pdb == std::floor(pdb), src, ": per_device_batch=", pdb,
               " on a CPU device: each process runs whole rows (expected an integer >= 1)");
    return;
  }
  if (pdb >= 1) {
    OLMO_CHECK(pdb == std::floor(pdb), src, ": per_device_batch=", pdb,
               " must be a whole number of rows when >= 1");
    return;
  }
  const double split = 1.0 / pdb;
  OLMO_CHECK(std::fabs(split - std::round(split)) < 1e-9, src, ": per_device_batch=", pdb,
             " spreads a row over 1/", pdb, " devices, which is not a whole number");
  OLMO_CHECK(d.devices % int64_t(std::llround(split)) == 0, src, ": per_device_batch=", pdb,
             " spreads a row over ", std::llround(split),
             " devices, which does not divide devices=", d.devices);
}

moe::MoeDims moe_dims_of(const model::ModelConfig& m, double buffer_factor) {
  return {.d = m.hidden_size,
          .experts = m.n_routed_experts,
          .top_k = m.num_experts_per_tok,
          .expert_hidden = m.moe_intermediate_size,
          .latent = m.latent_moe_dim,
          .shared_hidden = m.shared_expert_intermediate_size,
          .buffer_factor = buffer_factor};  // weight_mult does not change sizes
}

// compute.dtype=bf16 on CPU: every thread keeps the bf16 copies of the largest two operands it has rounded
// (kernels/gemm.cpp, reused from step to step). The main thread's come from the projections over N tokens
// (activations N x the widest projection side, or a weight) and the LM head's tiles; each other thread's from
// the MoE experts it runs (`rows` tokens at most, the dispatch buffers' bound).
double bf16_operand_bytes(const model::ModelConfig& m, int64_t N, const XentConfig& xc, int64_t threads,
                          int64_t rows) {
  // the widest projection side over the layer list's units
  const std::vector<model::LayerSpec> layers = model::layer_specs(m);
  const bool moe = model::has_ffn(layers, model::FfnKind::Moe);
  int64_t widest = std::max({m.hidden_size, m.num_attention_heads * m.head_dim, m.attention_hidden_size});
  for (const model::LayerSpec& s : layers)
    widest = std::max(widest, model::unit::Block::widest_projection(m, s));
  const int64_t chunk = xc.vocab_chunk == 0 ? xc.valid_vocab : std::min(xc.vocab_chunk, xc.valid_vocab);
  const int64_t block = xc.row_block == 0 ? N : std::min(xc.row_block, N), d = m.hidden_size;
  const double a = double(std::max(N * widest, block * std::max(d, chunk)));
  const double b = std::max({double(N * widest), double(widest) * double(widest), double(chunk * d)});
  double workers = 0;
  if (moe && threads > 1) {
    const int64_t F = std::max(m.moe_intermediate_size, m.latent_moe_dim > 0 ? m.latent_moe_dim : d);
    workers = double(threads - 1) * (double(rows * F) + std::max(double(rows * F), double(F * F)));
  }
  return 2.0 * (a + b + workers);
}

// The activation-side parts: the model's planned block and attention workspace, MoE dispatch buffers and
// cross-entropy tiles, for `rows` rows of T tokens (rows < 1: a row spread over 1/rows devices).
void activation_parts(const model::ModelConfig& m, const TrainConfig& cfg, const PlanOptions& o, double rows,
                      std::vector<PlanPart>& parts) {
  const int64_t T = cfg.batch.seq_len, B = std::max<int64_t>(1, int64_t(std::llround(rows)));
  const double share = rows < 1 ? rows : 1.0;  // of one row's activations held per device
  const model::MemoryPolicy& pol = cfg.model.memory;
  const model::ActivationBytes a = model::activation_bytes(m, B, T, pol);
  const std::string remat = std::string("model.remat=") + model::remat_name(pol.remat) +
                            ", model.saved_dtype=" + model::saved_dtype_name(pol.saved);
  parts.push_back({"saved activations", double(a.saved) * share,
                   remat + ": kept from the forward for the backward, all layers (model::activation_bytes)"});
  parts.push_back({"working set", double(a.working) * share,
                   "residual streams, batch arrays, the largest unit's shared scratch (the planned block)"});
  parts.push_back({"attention workspace", double(a.kernels) * share, "the attention kernel's tiles"});
  const int64_t N = int64_t(std::ceil(double(B * T) * share));
  const std::vector<model::LayerSpec> layers = model::layer_specs(m);
  if (model::has_ffn(layers, model::FfnKind::Moe)) {
    // remat full keeps one Saved per layer kind (model/decoder.cpp DecoderWork): one MoE cache for each
    // mixer kind (KDA, softmax attention) among the MoE layers.
    int64_t moe_layers = 0, moe_kinds = 0;
    bool kind_seen[model::unit::kLayerKinds] = {};
    for (const model::LayerSpec& s : layers) {
      if (s.ffn != model::FfnKind::Moe) continue;
      ++moe_layers;
      if (!kind_seen[s.kind()]) ++moe_kinds;
      kind_seen[s.kind()] = true;
    }
    const bool cpu = o.device.kind == DeviceKind::Cpu;
    const int64_t parallel = cpu ? (o.threads > 0 ? o.threads : num_threads()) : m.n_routed_experts;
    const double bf = cfg.moe.buffer_factor;
    const moe::MoeWorkspace w = moe::moe_workspace_bytes(moe_dims_of(m, bf), N, parallel);
    const int64_t cached = pol.remat == model::Remat::Full ? moe_kinds : moe_layers;
    parts.push_back({"MoE dispatch caches", double(w.cache) * double(cached),
                     "router probabilities, routes, latent in/out per MoE layer; " + std::to_string(cached) +
                         " of " + std::to_string(moe_layers) + " layers held at once"});
    const std::string bound = bf > 0
                                  ? "capacity ceil(" + num(bf) + " x N x k / E) rows per expert"
                                  : "dropless worst case: N rows per expert (a token picks an expert once)";
    parts.push_back({"MoE dispatch buffers", double(w.transient()),
                     "one layer's expert scratch at moe.buffer_factor=" + num(bf) + ": " + bound + ", " +
                         std::to_string(parallel) + " experts at once",
                     true});
  }
  XentConfig xc;
  xc.valid_vocab = m.vocab_size;
  xc.vocab_chunk = cfg.compute.vocab_tile;
  parts.push_back({"cross-entropy tiles", double(xent_workspace_bytes(N, m.hidden_size, xc)),
                   "compute.vocab_tile=" + std::to_string(cfg.compute.vocab_tile) +
                       " columns x 1,024 rows (every target trained: upper bound)",
                   true});
  if (o.device.kind == DeviceKind::Cpu && cfg.compute.gemm.compute == ComputeDtype::BF16) {
    const int64_t threads = o.threads > 0 ? o.threads : num_threads();
    const double bf = cfg.moe.buffer_factor;
    const int64_t rows =
        model::has_ffn(layers, model::FfnKind::Moe) && bf > 0
            ? int64_t(std::ceil(bf * double(N * m.num_experts_per_tok) / double(m.n_routed_experts)))
            : N;
    parts.push_back(
        {"bf16 GEMM operands", bf16_operand_bytes(m, N, xc, threads, rows),
         "compute.dtype=bf16: each thread's bf16 copies of its largest GEMM operands (kept between "
         "steps)"});
  }
}

// device: xla on an accelerator (docs/xla.md "The device mesh"): the weights, the step's gradient sums and
// the moments split over the mesh's parameter shards (fsdp x expert x context), each layer's weights gathered
// where the program uses them (model/xla_layout.h); the partitioner's collectives work in that gathered copy.
void xla_state_parts(const model::ModelConfig& m, const TrainConfig& cfg, int64_t P,
                     std::vector<PlanPart>& parts) {
  const xla::Mesh mesh = xla_mesh(cfg);
  const double S = double(mesh.param_shards());
  const std::string split =
      "1/" + std::to_string(mesh.param_shards()) + " over the mesh's fsdp x expert x context";
  const Units u = param_units(m);
  const bool bf16 = cfg.compute.gemm.compute == ComputeDtype::BF16;
  parts.push_back({"weights: fp32 master", 4.0 * double(P) / S, split + " (the program's arguments)"});
  parts.push_back(
      {"weights: gathered layer", (bf16 ? 6.0 : 4.0) * double(u.largest),
       std::string("the largest unit gathered where used: fp32") + (bf16 ? " + its bf16 copy" : "")});
  parts.push_back({"gradients", 4.0 * double(P) / S * (cfg.batch.grad_accum > 1 ? 2.0 : 1.0),
                   "fp32, split as the weights: the step's sums" +
                       std::string(cfg.batch.grad_accum > 1 ? " + the accumulated ones" : "")});
  parts.push_back({"AdamW moments", 8.0 * double(P) / S, "fp32 m and v, " + split});
  if (mesh.devices() > 1)  // ops::XentOptions::mesh: each device's partial dW, summed once after the tiles
    parts.push_back({"LM head gradient (partial)", 4.0 * double(m.vocab_size) * double(m.hidden_size),
                     "fp32 [vocab, hidden]: each device's sum over its tokens, reduce-scattered after the "
                     "cross-entropy's tiles"});
}

// The state parts: weights, gradients, moments, leaf accumulation and communication buffers.
void state_parts(const model::ModelConfig& m, const TrainConfig& cfg, const PlanOptions& o, int64_t P,
                 std::vector<PlanPart>& parts) {
  if (cfg.device == "xla" && o.device.kind != DeviceKind::Cpu) return xla_state_parts(m, cfg, P, parts);
  const bool zero3 = cfg.dist.mode == "zero3", cpu = o.device.kind == DeviceKind::Cpu;
  const int64_t N = cfg.batch.devices, shard = zero3 ? N : 1;
  const Units u = param_units(m);
  const int64_t gathered = u.largest + (m.tie_word_embeddings ? u.first : 0);
  parts.push_back({"weights: fp32 master", 4.0 * double(P) / double(shard),
                   zero3 ? "1/" + std::to_string(N) + " shard per rank (zero3)" : "replicated (dp)"});
  if (cpu) {
    parts.push_back(
        {"weights: compute copy", zero3 ? 4.0 * double(gathered) : 0.0,
         zero3 ? "the gathered layer group (largest unit), fp32: on CPU the compute copy is the fp32 "
                 "tensor"
               : "none: on CPU the model computes on the fp32 master itself"});
    if (cfg.compute.gemm.compute == ComputeDtype::BF16)  // kernels/gemm.h Bf16Weights
      parts.push_back({"weights: bf16 copies (compute.dtype=bf16)",
                       zero3 ? 2.0 * double(gathered) : 2.0 * double(P),
                       zero3 ? "the resident group's matrices rounded once per call, from need to done"
                             : "every matrix rounded once per call, kept between calls (upper bound: all "
                               "parameters; a matrix no GEMM reads is never touched)"});
  } else
    parts.push_back({"weights: compute copy", zero3 ? 2.0 * double(gathered) : 2.0 * double(P),
                     zero3 ? "bf16, the gathered layer group (largest unit)" : "bf16, the whole model"});
  parts.push_back({"gradients", gradient_bytes(P, N, zero3, u.largest),
                   !zero3 ? "fp32: the accumulator + the reduced copy"
                          : "fp32: 1/N shard + one unit's full-size gradient (reduce-scattered per unit)"});
  parts.push_back(
      {"AdamW moments", 8.0 * double(P) / double(shard), "fp32 m and v" + std::string(zero3 ? ", 1/N" : "")});
  const int64_t leaves = cfg.batch.grad_accum;
  if (leaves > 1 && zero3)  // per-unit reduce-scatter: shard-sized round accumulators (docs/dist.md)
    parts.push_back({"gradient accumulation",
                     4.0 * double(P) / double(N) * (std::floor(std::log2(double(leaves))) + 1.0) +
                         4.0 * double(u.largest) / double(N),
                     "shard-sized pairwise partial sums of " + std::to_string(leaves) + " leaves per rank"});
  else if (leaves > 1)
    parts.push_back({"gradient accumulation", 4.0 * double(P) * (2.0 + std::ceil(std::log2(double(leaves)))),
                     "a leaf buffer and the pairwise partial sums of " + std::to_string(leaves) + " leaves"});
  if (zero3 && cpu)  // counted as held: the model's workspace is still allocated when it arrives
    parts.push_back({"final weights (rank 0)", 4.0 * double(P),
                     "rank 0 gathers the fp32 weights for the end-of-run checks and the HF export"});
  double comm = 0;
  std::string comm_note = "one process: none";
  if (N > 1 && zero3) {
    comm = 4.0 * double(u.largest);
    comm_note = "reduce-scatter receive buffers of the largest unit ((N-1)/N) and the tree sum's 1/N";
  } else if (N > 1) {
    comm = 4.0 * double(u.largest) * (2.0 + double(N - 1) / double(N));
    comm_note = "all-reduce of the largest unit: padded in/out copies and (N-1)/N receive buffers";
  }
  parts.push_back({"communication buffers", comm, comm_note});
}

double step_flops(const model::ModelConfig& m, const Derived& d) {
  return one_document_rows_flops(m, d.global_batch, d.seq_len);
}

// The CPU runtime's own resident memory (binary, libraries, OpenBLAS/OpenMP and MPI buffers, dataset
// pages), measured with the tiny configs (bench/RESULTS.md "Memory plan").
double runtime_bytes(const TrainConfig& cfg) { return cfg.batch.devices > 1 ? 45e6 : 40e6; }

// A changed recipe re-derived, or false when the change makes an impossible mesh.
bool rederive(TrainConfig& c, const PlanDevice& dev) {
  try {
    derive_batch(c);
    check_mesh(c, dev);
    return true;
  } catch (const Error&) {
    return false;
  }
}

// Recomputation from the least to the most: none -> attn -> full.
int remat_rank(model::Remat r) { return r == model::Remat::None ? 0 : r == model::Remat::Attn ? 1 : 2; }

struct Candidate {
  TrainConfig cfg;
  std::string change;
};

std::vector<Candidate> candidates(const model::ModelConfig& m, const TrainConfig& cfg,
                                  const PlanDevice& dev) {
  std::vector<Candidate> out;
  auto add = [&](TrainConfig c, const std::string& change) {
    if (rederive(c, dev)) out.push_back({std::move(c), change});
  };
  for (int64_t f = 1; f <= 64; f *= 2) {  // more devices (sharded state shrinks only under zero3)
    if (f == 1 && cfg.dist.mode == "zero3") continue;
    TrainConfig c = cfg;
    c.dist.mode = "zero3";
    c.batch.devices = cfg.batch.devices * f;
    std::string change = f > 1 ? "devices=" + std::to_string(c.batch.devices) + " " : std::string();
    if (!rederive(c, dev)) {  // the same rows per micro-step over more devices: fewer rows per device
      c.batch.per_device_batch = cfg.batch.per_device_batch / double(f);
      change += "per_device_batch=" + num(c.batch.per_device_batch) + " ";
    }
    if (c.batch.per_device_batch >= 1.0 / 64) add(c, change + "dist.mode=zero3");  // a row over <= 64 devices
  }
  for (model::Remat r : {model::Remat::Attn, model::Remat::Full}) {
    if (remat_rank(r) <= remat_rank(cfg.model.memory.remat)) continue;
    TrainConfig c = cfg;
    c.model.memory.remat = r;
    add(c, std::string("model.remat=") + model::remat_name(r));
  }
  for (double pdb = cfg.batch.per_device_batch / 2; pdb >= 1.0 / 64; pdb /= 2) {
    TrainConfig c = cfg;
    c.batch.per_device_batch = pdb;
    add(c, "per_device_batch=" + num(pdb));
  }
  if (model::has_ffn(model::layer_specs(m), model::FfnKind::Moe))
    for (double bf : {2.0, 1.5, 1.25, 1.0}) {
      if (cfg.moe.buffer_factor > 0 && bf >= cfg.moe.buffer_factor) continue;
      TrainConfig c = cfg;
      c.moe.buffer_factor = bf;
      add(c, "moe.buffer_factor=" + num(bf) + " (tokens beyond capacity are dropped)");
    }
  return out;
}

}  // namespace

const std::vector<PlanDevice>& accelerator_devices() {
  // Memory as nvidia-smi reports it (MiB) for the GPUs, HBM per chip for TPU v4; dense bf16 peak FLOP/s.
  constexpr double kMiB = 1024.0 * 1024.0;
  static const std::vector<PlanDevice> devices = {
      {"h100-80gb", DeviceKind::Gpu, 81559 * kMiB, 989e12, "H100 SXM, 81,559 MiB"},
      {"h200-141gb", DeviceKind::Gpu, 143771 * kMiB, 989e12, "H200 SXM, 143,771 MiB"},
      {"b200-192gb", DeviceKind::Gpu, 182644 * kMiB, 2250e12, "B200, 182,644 MiB (XLA's spec)"},
      {"a100-80gb", DeviceKind::Gpu, 81920 * kMiB, 312e12, "A100 SXM 80 GB, 81,920 MiB"},
      {"tpu-v4", DeviceKind::Tpu, 32 * kGiB, 275e12, "TPU v4 chip, 32 GiB HBM"},
  };
  return devices;
}

double local_memory_bytes() {
  double total = 0;
  std::ifstream mi("/proc/meminfo");
  std::string key;
  double kb = 0;
  while (mi >> key >> kb) {
    if (key == "MemTotal:") {
      total = kb * 1024.0;
      break;
    }
    mi.ignore(1 << 10, '\n');
  }
  std::ifstream cg("/sys/fs/cgroup/memory.max");
  std::string lim;
  if (cg >> lim && lim != "max") {
    char* end = nullptr;
    const double v = std::strtod(lim.c_str(), &end);
    if (end != lim.c_str() && v > 0 && (total == 0 || v < total)) total = v;
  }
  return total;
}

PlanDevice parse_device(const std::string& spec, int64_t local_processes, const std::string& where) {
  for (const PlanDevice& d : accelerator_devices())
    if (d.name == spec) return d;
  std::string names = "cpu, cpu-<N>gib";
  for (const PlanDevice& d : accelerator_devices()) names += ", " + d.name;
  PlanDevice d;
  d.kind = DeviceKind::Cpu;
  d.name = spec;
  if (spec == "cpu") {
    const int64_t n = std::max<int64_t>(1, local_processes);
    const double mem = local_memory_bytes();
    OLMO_CHECK(mem > 0, where,
               ": cannot read this machine's memory (/proc/meminfo MemTotal); give --device "
               "cpu-<N>gib");
    d.memory = mem / double(n);
    d.origin = "this machine's " + gib(mem) + " GiB (MemTotal or cgroup memory.max) / " + std::to_string(n) +
               " local process" + (n > 1 ? "es" : "");
    return d;
  }
  const std::string pre = "cpu-", suf = "gib";
  if (spec.size() > pre.size() + suf.size() && spec.rfind(pre, 0) == 0 &&
      spec.compare(spec.size() - suf.size(), suf.size(), suf) == 0) {
    const std::string n = spec.substr(pre.size(), spec.size() - pre.size() - suf.size());
    char* end = nullptr;
    const double g = std::strtod(n.c_str(), &end);
    OLMO_CHECK(end == n.c_str() + n.size() && std::isfinite(g) && g > 0, where, ": device '", spec,
               "': expected cpu-<N>gib with N > 0 GiB per process");
    d.memory = g * kGiB;
    d.origin = n + " GiB per process (given)";
    return d;
  }
  fail(where, ": unknown device '", spec, "' (expected one of ", names, ")");
}

double gradient_bytes(int64_t params, int64_t ranks, bool zero3, int64_t largest_unit) {
  const double P = double(params), N = double(ranks);
  if (!zero3) return 2.0 * 4.0 * P;
  return 4.0 * P / N + 4.0 * double(largest_unit);
}

double load_bytes(int64_t params, int64_t shard, int64_t largest_tensor) {
  return 16.0 * double(params) / double(shard) + 4.0 * double(largest_tensor);
}

MemoryPlan plan_memory(const model::ModelConfig& m, const TrainConfig& cfg, const PlanOptions& opt) {
  check_mesh(cfg, opt.device);
  OLMO_CHECK(opt.headroom > 0 && opt.headroom <= 1, "plan: headroom must be in (0, 1], got ", opt.headroom);
  OLMO_CHECK(opt.mfu > 0 && opt.mfu <= 1, "plan: mfu must be in (0, 1], got ", opt.mfu);
  OLMO_CHECK(cfg.dist.mode == "dp" || cfg.dist.mode == "zero3", cfg.source, ": dist.mode '", cfg.dist.mode,
             "' (expected dp or zero3)");
  MemoryPlan p;
  p.opt = opt;
  p.cfg = cfg;
  p.params = model::count_params(m).total;
  p.rows = cfg.batch.per_device_batch;
  state_parts(m, cfg, opt, p.params, p.parts);
  activation_parts(m, cfg, opt, p.rows, p.parts);
  if (opt.device.kind == DeviceKind::Cpu)
    p.parts.push_back({"runtime", runtime_bytes(cfg),
                       "binary, libraries, OpenBLAS/OpenMP" +
                           std::string(cfg.batch.devices > 1 ? ", MPI" : "") + " (measured, tiny configs)"});
  double transient = 0;  // one layer's kernel call at a time: the largest of them
  for (const PlanPart& part : p.parts) {
    if (part.transient)
      transient = std::max(transient, part.bytes);
    else
      p.step_peak += part.bytes;
  }
  p.step_peak += transient;
  const int64_t shard = cfg.dist.mode == "zero3" ? cfg.batch.devices : 1;
  int64_t largest_tensor = 0;
  for (const auto& spec : model::param_registry(m)) {
    int64_t n = 1;
    for (int64_t s : spec.shape) n *= s;
    largest_tensor = std::max(largest_tensor, n);
  }
  if (opt.device.kind == DeviceKind::Cpu)
    p.load_peak = load_bytes(p.params, shard, largest_tensor) + runtime_bytes(cfg);
  p.budget = opt.headroom * opt.device.memory;
  p.fits = p.peak() <= p.budget;
  p.flops_per_step = step_flops(m, cfg.batch);
  const double peak = opt.device.peak_flops;
  if (peak > 0) p.seconds_per_step = p.flops_per_step / (double(cfg.batch.devices) * peak * opt.mfu);
  return p;
}

MemoryPlan make_plan(const model::ModelConfig& m, const TrainConfig& cfg, const PlanOptions& opt) {
  MemoryPlan p = plan_memory(m, cfg, opt);
  if (p.fits) return p;
  const std::vector<Candidate> cands = candidates(m, cfg, opt.device);
  for (const Candidate& c : cands) {
    const MemoryPlan q = plan_memory(m, c.cfg, opt);
    if (!q.fits) continue;
    p.change = c.change;
    p.change_note = "peak " + gib(q.peak()) + " GiB per device";
    return p;
  }
  // Nothing alone: every change at once (the most devices, full recomputation, the smallest batch).
  TrainConfig all = cfg;
  std::string change;
  for (const Candidate& c : cands) {
    TrainConfig t = all;
    if (c.cfg.dist.mode == "zero3") t.dist.mode = "zero3";
    t.batch.devices = std::max(t.batch.devices, c.cfg.batch.devices);
    if (remat_rank(c.cfg.model.memory.remat) > remat_rank(t.model.memory.remat))
      t.model.memory.remat = c.cfg.model.memory.remat;
    t.batch.per_device_batch = std::min(t.batch.per_device_batch, c.cfg.batch.per_device_batch);
    if (c.cfg.moe.buffer_factor != cfg.moe.buffer_factor) t.moe.buffer_factor = c.cfg.moe.buffer_factor;
    if (rederive(t, opt.device)) all = t;
  }
  const MemoryPlan q = plan_memory(m, all, opt);
  std::ostringstream os;
  os << "dist.mode=" << all.dist.mode << " devices=" << all.batch.devices
     << " model.remat=" << model::remat_name(all.model.memory.remat)
     << " per_device_batch=" << all.batch.per_device_batch;
  if (model::has_ffn(model::layer_specs(m), model::FfnKind::Moe))
    os << " moe.buffer_factor=" << all.moe.buffer_factor;
  if (q.fits) {
    p.change = os.str();
    p.change_note = "no single change fits; together: peak " + gib(q.peak()) + " GiB per device";
  } else {
    p.change_note = "no change fits: even " + os.str() + " needs " + gib(q.peak()) + " GiB per device of " +
                    gib(q.budget) + " GiB";
  }
  return p;
}

std::string format_plan(const MemoryPlan& p) {
  const TrainConfig& c = p.cfg;
  const Derived& d = c.batch;
  std::ostringstream os;
  os << "plan: " << c.source << "\n  model " << p.params << " parameters; device " << p.opt.device.name
     << " (" << gib(p.opt.device.memory) << " GiB: " << p.opt.device.origin << ") x " << d.devices
     << "; dist.mode=" << c.dist.mode << "\n  per device: " << p.rows << " row(s) of " << d.seq_len
     << " tokens per micro-step, gradient accumulation " << d.grad_accum
     << ", model.remat=" << model::remat_name(c.model.memory.remat)
     << ", model.saved_dtype=" << model::saved_dtype_name(c.model.memory.saved) << "\n\n";
  os << "  " << std::left << std::setw(26) << "part" << std::right << std::setw(12) << "GiB/device"
     << "  note\n";
  for (const PlanPart& part : p.parts)
    os << "  " << std::left << std::setw(26) << part.name << std::right << std::setw(12) << gib(part.bytes)
       << "  " << (part.transient ? "[transient] " : "") << part.note << "\n";
  os << "  " << std::left << std::setw(26) << "step peak" << std::right << std::setw(12) << gib(p.step_peak)
     << "  the parts held through the step + the largest [transient] one\n";
  if (p.load_peak > 0)
    os << "  " << std::left << std::setw(26) << "load peak" << std::right << std::setw(12) << gib(p.load_peak)
       << "  this rank's shard (params, gradients, m, v: 16P/N) + one fp32 tensor\n";
  os << "  " << std::left << std::setw(26) << "budget" << std::right << std::setw(12) << gib(p.budget) << "  "
     << num(p.opt.headroom * 100) << "% of " << gib(p.opt.device.memory) << " GiB\n\n";
  os << "  FLOPs per step " << num(p.flops_per_step) << " (" << d.global_batch << " rows of " << d.seq_len
     << " tokens, each one document, every target trained)";
  if (p.seconds_per_step > 0)
    os << "; at MFU " << num(p.opt.mfu) << " of " << num(p.opt.device.peak_flops / 1e12) << " TFLOP/s x "
       << d.devices << " devices: " << num(p.seconds_per_step) << " s per step";
  else
    os << "; no peak FLOP/s known for this device (give --peak-tflops or perf.peak_tflops)";
  os << "\n\n";
  if (p.fits)
    os << "FITS: peak " << gib(p.peak()) << " GiB of " << gib(p.budget) << " GiB per device\n";
  else
    os << refusal(p) << "\n";
  os << "PLAN fits=" << (p.fits ? "yes" : "no") << " peak_bytes=" << std::llround(p.peak())
     << " step_bytes=" << std::llround(p.step_peak) << " load_bytes=" << std::llround(p.load_peak)
     << " budget_bytes=" << std::llround(p.budget) << " flops_per_step=" << num(p.flops_per_step)
     << " seconds_per_step=" << num(p.seconds_per_step) << "\n";
  return os.str();
}

std::string refusal(const MemoryPlan& p) {
  std::ostringstream os;
  os << "DOES NOT FIT: " << p.cfg.source << " needs " << gib(p.peak()) << " GiB per device ("
     << (p.load_peak > p.step_peak ? "load" : "step") << " peak) but " << p.opt.device.name << " allows "
     << gib(p.budget) << " GiB (" << num(p.opt.headroom * 100) << "% of " << gib(p.opt.device.memory)
     << " GiB); ";
  if (!p.change.empty())
    os << "smallest change that fits: " << p.change << " (" << p.change_note << ")";
  else
    os << p.change_note;
  return os.str();
}

std::string preflight_line(const MemoryPlan& p) {
  return "PREFLIGHT memory_plan peak_gib=" + gib(p.peak()) + " budget_gib=" + gib(p.budget) +
         " per process (" + p.opt.device.origin + "; `olmosft plan` prints the parts)\n";
}

int64_t local_processes(int64_t world) {
  const char* v = std::getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
  if (v != nullptr) {
    const long n = std::strtol(v, nullptr, 10);
    if (n >= 1) return n;
  }
  return std::max<int64_t>(1, world);
}

namespace {

// device: xla on an accelerator: the host holds what checkpoints, resume and the export read (the fp32
// master, its gradients, the AdamW moments) and the runtime; the step's activations and workspaces are on
// the device, sized by XLA when it compiles the step (`olmosft xla compile` prints them). P keeps only the
// host's parts.
MemoryPlan host_state_plan(MemoryPlan p) {
  std::vector<PlanPart> kept;
  p.step_peak = 0;
  for (const PlanPart& part : p.parts)
    if (part.name == "weights: fp32 master" || part.name == "gradients" || part.name == "AdamW moments" ||
        part.name == "runtime") {
      kept.push_back(part);
      p.step_peak += part.bytes;
    }
  p.parts = kept;
  p.fits = p.peak() <= p.budget;
  p.change.clear();
  p.change_note =
      "device: xla keeps only the fp32 master, its gradients and the AdamW moments in host "
      "memory (the step runs on the plugin's devices, sized by XLA: `olmosft xla compile`)";
  return p;
}

}  // namespace

MemoryPlan require_fit(const model::ModelConfig& m, const TrainConfig& cfg, int64_t local) {
  PlanOptions o;
  o.device = parse_device("cpu", local, cfg.source);
  o.threads = cfg.compute.threads;
  MemoryPlan p = make_plan(m, cfg, o);
  if (cfg.device == "xla" && cfg.xla.plugin != "cpu") p = host_state_plan(p);
  OLMO_CHECK(p.fits, refusal(p), "\n(`olmosft plan ", cfg.source, "` prints the plan by part)");
  return p;
}

model::ModelConfig recipe_model_config(const TrainConfig& cfg) {
  if (!cfg.model.init.empty()) return model::load_init_config(cfg.model.init);
  OLMO_CHECK(!cfg.model.config.empty(), cfg.source,
             ": one of model.init (HF directory) or model.config "
             "(config.json) is required to plan the run");
  return model::load_config(cfg.model.config);
}

std::string preset_for_model_name(const std::string& dir) {
  std::string n = dir;
  while (!n.empty() && n.back() == '/') n.pop_back();
  n = n.substr(n.find_last_of('/') == std::string::npos ? 0 : n.find_last_of('/') + 1);
  std::string k;  // lower case, letters and digits only
  for (char ch : n)
    if (std::isalnum(static_cast<unsigned char>(ch))) k += char(std::tolower(static_cast<unsigned char>(ch)));
  const auto has = [&](const char* x) { return k.find(x) != std::string::npos; };
  if (has("olmo35small") || has("olmo3moesmall")) return "olmo3moe-small";
  if (has("olmohybrid") && has("7b")) return "olmo-hybrid-7b";
  if (has("olmo3") && has("7b") && !has("hybrid") && !has("moe")) return "olmo3-7b";
  return "";
}

model::ModelConfig recipe_model_config_or_preset(const TrainConfig& cfg, std::string* note) {
  try {
    return recipe_model_config(cfg);
  } catch (const Error& e) {
    const std::string& init = cfg.model.init;
    std::error_code ec;
    if (init.empty() || std::filesystem::exists(init + "/config.json", ec)) throw;
    const std::string preset = preset_for_model_name(init);
    OLMO_CHECK(!preset.empty(), e.what(), " (no preset matches its name: give --model PRESET|config.json)");
    if (note != nullptr)
      *note = "plan: " + init + "/config.json cannot be read here; planning from the preset " + preset +
              " (matched by its name; --model to choose another)";
    return model::parse_config(model::preset_config_json(preset), "preset " + preset);
  }
}

}  // namespace olmosft::train
