// `olmosft xla compile --config CONFIG --seq T [...]`: compiles one training step of a model (the StableHLO
// of model::xla_step_module) with a PJRT plugin and prints what the compiled program needs in device memory.
// With a topology (libtpu, `--topology v4:2x2x1`) the compile is ahead of time, on this CPU-only machine, by
// the real TPU compiler: the program is known to be valid for TPU, and its per-chip memory known, before a
// TPU is allocated (docs/xla.md "Ahead-of-time compile for a TPU topology"). Without one (XLA's CPU plugin
// cannot describe a topology) the step is compiled by a client on this machine's devices.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <sstream>

#include "cli/verb.h"
#include "core/error.h"
#include "io/atomic_file.h"
#include "io/json.h"
#include "model/config.h"
#include "model/decoder_xla.h"
#include "train/flops.h"
#include "xla/pjrt.h"

namespace {

using olmosft::xla::MemoryStats;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// libtpu is the plugin whose topologies tpu_topology_options describes.
bool is_libtpu(const std::string& plugin) {
  if (plugin == "tpu") return true;
  const std::string file = std::filesystem::path(olmosft::xla::Plugin::resolve(plugin)).filename().string();
  return file.starts_with("libtpu");
}

// Bytes as GiB (MiB below 1 GiB, where the tiny models are).
std::string gib(int64_t bytes) {
  char s[32];
  const double b = static_cast<double>(bytes);
  if (bytes < (int64_t{1} << 30))
    std::snprintf(s, sizeof s, "%.1f MiB", b / (1024.0 * 1024.0));
  else
    std::snprintf(s, sizeof s, "%.2f GiB", b / (1024.0 * 1024.0 * 1024.0));
  return s;
}

struct Compiled {
  std::string platform, device_kind;
  size_t devices = 0;
  int64_t device_memory = 0;  // per device, from the topology; 0: unknown
  double compile_s = 0;
  MemoryStats stats;
  double flops = -1;  // XLA's cost analysis of the program, per device (loop bodies once); -1: none given
};

// The compiled program's FLOPs as XLA's cost analysis counts them, or -1 where the plugin gives none.
template <typename Exe>
double cost_flops(const Exe& exe) {
  try {
    const olmosft::xla::CostAnalysis c = exe.cost_analysis();
    const auto it = c.find("flops");
    return it == c.end() ? -1 : it->second;
  } catch (const olmosft::Error&) {
    return -1;
  }
}

struct Args {
  std::string config, plugin = "tpu", topology, save_config, mesh, save_module, remat = "none";
  int64_t batch = 1, seq = 0, layers = 0, vocab_tile = 4096, block = 0, spmd = 1, delta_chunk = 64;
  bool bf16 = false, forward_only = false, shard_params = false, scan = false;
  double moe_buffer_factor = -1;
};

// --mesh data=N,fsdp=N,expert=N,context=N (any of them), or the older --spmd N [--shard-params].
olmosft::xla::Mesh mesh_of(const Args& a) {
  olmosft::xla::Mesh m;
  if (a.mesh.empty()) {
    (a.shard_params ? m.fsdp : m.data) = a.spmd;
    return m;
  }
  OLMO_CHECK(a.spmd == 1 && !a.shard_params, "--mesh replaces --spmd and --shard-params: give only --mesh");
  std::stringstream in(a.mesh);
  std::string item;
  while (std::getline(in, item, ',')) {
    const size_t eq = item.find('=');
    const std::optional<olmosft::xla::MeshAxis> axis = olmosft::xla::mesh_axis_named(item.substr(0, eq));
    char* end = nullptr;
    const long long v = eq == std::string::npos ? 0 : std::strtoll(item.c_str() + eq + 1, &end, 10);
    OLMO_CHECK(axis.has_value() && v >= 1 && end != nullptr && *end == '\0',
               "--mesh: expected "
               "AXIS=N[,AXIS=N...] with AXIS data, fsdp, expert or context and N >= 1, got '",
               item, "'");
    m.at(*axis) = v;
  }
  return m;
}

Compiled compile_step(const Args& a, const olmosft::model::ModelConfig& m, size_t* module_bytes,
                      double* emit_s) {
  olmosft::model::XlaOptions xo;
  xo.plugin = a.plugin;
  xo.bf16 = a.bf16;
  xo.mesh = mesh_of(a);
  xo.remat = olmosft::model::parse_remat(a.remat, "--remat");
  xo.scan_layers = a.scan;
  if (a.block > 0) xo.attention_block = a.block;
  xo.delta_chunk = a.delta_chunk;
  olmosft::xla::CompileOptions co;  // one SPMD program over the mesh's devices
  co.num_partitions = xo.devices();
  co.use_spmd_partitioning = xo.devices() > 1;
  olmosft::model::LossConfig loss;
  loss.vocab_tile = a.vocab_tile;
  loss.moe_buffer_factor = a.moe_buffer_factor;
  Compiled c;
  const auto plugin = olmosft::xla::Plugin::load(a.plugin);
  const auto emit = [&] {
    const auto t0 = Clock::now();
    std::string text = olmosft::model::xla_step_module(m, xo, a.batch, a.seq, loss, !a.forward_only);
    *emit_s = seconds_since(t0);
    *module_bytes = text.size();
    if (!a.save_module.empty()) olmosft::io::write_file_atomic(a.save_module, text);
    return text;
  };
  if (!a.topology.empty()) {
    std::vector<olmosft::xla::NamedValue> options;
    if (is_libtpu(a.plugin)) options = olmosft::xla::tpu_topology_options(a.topology);
    const auto topo = olmosft::xla::Topology::create(plugin, a.topology, options);
    c.platform = topo.platform_name();
    c.devices = topo.device_count();
    const auto kinds = topo.device_kinds();
    c.device_kind = kinds.empty() ? "" : kinds[0];
    const auto attrs = topo.attributes();
    if (auto it = attrs.find("device_memory_bytes_limit"); it != attrs.end())
      c.device_memory = std::stoll(it->second);
    xo.f64_trig = c.platform != "tpu";  // TPUs have no f64
    const std::string text = emit();
    const auto t0 = Clock::now();
    const auto exe = olmosft::xla::compile_for_topology(topo, text, co);
    c.compile_s = seconds_since(t0);
    c.stats = exe.memory_stats();
    c.flops = cost_flops(exe);
    return c;
  }
  // XLA's CPU plugin makes 4 devices by default; the step runs on --spmd of them (one by default).
  const auto client = olmosft::xla::Client::create(
      plugin, a.plugin == "cpu" ? olmosft::xla::ClientOptions{.cpu_device_count = xo.devices()}
                                : olmosft::xla::ClientOptions{});
  c.platform = client.platform_name();
  c.devices = client.device_count();
  xo.f64_trig = c.platform != "tpu";
  const std::string text = emit();
  const auto t0 = Clock::now();
  const auto exe = client.compile(text, co);
  c.compile_s = seconds_since(t0);
  c.stats = exe.memory_stats();
  c.flops = cost_flops(exe);
  return c;
}

void print(const Args& a, const olmosft::model::ModelConfig& m, const Compiled& c, size_t module_bytes,
           double emit_s) {
  const MemoryStats& s = c.stats;
  const std::string topology = a.topology.empty() ? "none" : a.topology;
  char secs[64], compile_s[16];
  std::snprintf(secs, sizeof secs, "emit_s=%.2f compile_s=%.2f", emit_s, c.compile_s);
  std::snprintf(compile_s, sizeof compile_s, "%.1f", c.compile_s);
  std::cout << "XLA-AOT plugin=" << a.plugin << " platform=" << c.platform << " topology=" << topology
            << " devices=" << c.devices << " spmd=" << mesh_of(a).devices()
            << " shard_params=" << int(mesh_of(a).param_shards() > 1) << " mesh=" << mesh_of(a).text(',')
            << " layers=" << m.num_hidden_layers << " hidden=" << m.hidden_size << " vocab=" << m.vocab_size
            << " B=" << a.batch << " T=" << a.seq << " bf16=" << int(a.bf16) << " remat=" << a.remat
            << " scan=" << int(a.scan) << " backward=" << int(!a.forward_only)
            << " module_bytes=" << module_bytes << " " << secs << " argument_bytes=" << s.argument_bytes
            << " output_bytes=" << s.output_bytes << " alias_bytes=" << s.alias_bytes
            << " temp_bytes=" << s.temp_bytes << " generated_code_bytes=" << s.generated_code_bytes
            << " host_temp_bytes=" << s.host_temp_bytes << " peak_bytes=" << s.peak_bytes
            << " total_bytes=" << s.total_bytes() << " device_memory_bytes=" << c.device_memory
            << " cost_flops=" << c.flops
            << " model_flops=" << olmosft::train::one_document_rows_flops(m, a.batch, a.seq) << "\n";
  std::cout << "olmosft xla compile: " << m.model_type_name << " " << m.num_hidden_layers << " layers d "
            << m.hidden_size << " vocab " << m.vocab_size << ", "
            << (a.forward_only ? "forward" : "training step") << " B=" << a.batch << " T=" << a.seq
            << (a.bf16 ? " bf16" : " f32") << ", for " << c.platform << " "
            << (a.topology.empty() ? "(a client on this machine)" : a.topology) << " (" << c.devices << " x "
            << (c.device_kind.empty() ? "device" : c.device_kind) << ")"
            << (mesh_of(a).devices() > 1 ? ", one SPMD program over the mesh " + mesh_of(a).text()
                                         : std::string())
            << ": compiled in " << compile_s << " s; per device " << gib(s.total_bytes());
  if (c.device_memory > 0) std::cout << " of " << gib(c.device_memory);
  std::cout << " (arguments " << gib(s.argument_bytes) << ", outputs " << gib(s.output_bytes)
            << ", temporaries " << gib(s.temp_bytes) << ", code " << gib(s.generated_code_bytes) << ")";
  if (c.flops >= 0)
    std::cout << "; XLA's cost analysis " << c.flops << " FLOPs per device (each loop's body once)";
  std::cout << "\n";
}

int xla_compile_main(int argc, char** argv) {
  CLI::App app{
      "Compile one training step of a model with a PJRT plugin (ahead of time for a TPU topology with "
      "libtpu) and print its memory needs (docs/xla.md)",
      "xla compile"};
  Args a;
  app.add_option("--config", a.config,
                 "the model: a config.json or a preset name (olmo3-7b, olmo3-tiny, ...)")
      ->required();
  app.add_option("--batch", a.batch, "rows per step (B)")->capture_default_str();
  app.add_option("--seq", a.seq, "tokens per row (T)")->required();
  app.add_option("--layers", a.layers, "keep only the first N layers of the model (0: all)");
  app.add_option("--plugin", a.plugin,
                 "PJRT plugin: tpu (libtpu: scripts/install-deps.sh --tpu or $OLMOSFT_PJRT_TPU), cpu, cuda "
                 "or a path")
      ->capture_default_str();
  app.add_option("--topology", a.topology,
                 "compile ahead of time for this topology (libtpu: v4:XxYxZ; default v4:2x2x1 for tpu, none "
                 "for other plugins: a client compile on this machine)");
  app.add_flag("--bf16", a.bf16, "bf16 operands in every GEMM, f32 accumulation (compute.dtype bf16)");
  app.add_flag("--forward-only", a.forward_only, "compile the forward (loss) only, no backward");
  app.add_option("--vocab-tile", a.vocab_tile, "vocabulary rows per cross-entropy tile (0: untiled)")
      ->capture_default_str();
  app.add_option("--spmd", a.spmd,
                 "one data-parallel SPMD program over N devices (xla.devices: rows split, parameters "
                 "replicated); the memory printed is per device")
      ->capture_default_str();
  app.add_flag("--shard-params", a.shard_params,
               "with --spmd: parameters, gradients and moments split over the devices (xla.shard_params)");
  app.add_option("--remat", a.remat, "model.remat: none | attn | full (what the backward re-emits)")
      ->capture_default_str();
  app.add_flag("--scan-layers", a.scan,
               "xla.scan_layers: the layers as a loop over their repeating group (needs --remat full)");
  app.add_option("--mesh", a.mesh,
                 "the device mesh as the recipe's mesh.* keys, e.g. fsdp=16,context=8 (docs/xla.md \"The "
                 "device mesh\"); replaces --spmd / --shard-params");
  app.add_option("--attention-block", a.block, "queries / keys per attention block (default: the backend's)");
  app.add_option("--moe-buffer-factor", a.moe_buffer_factor,
                 "MoE layers: moe.buffer_factor (> 0: a capacity, sparse experts; <= 0: dropless, dense)")
      ->capture_default_str();
  app.add_option(
         "--delta-chunk", a.delta_chunk,
         "KDA / Gated DeltaNet: tokens per chunk of the delta rule (xla.delta_chunk; 0: the recurrence)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option("--save-model-config", a.save_config, "also write the compiled model's config.json here");
  app.add_option("--save-module", a.save_module,
                 "also write the step's StableHLO text here (before compiling)");
  return olmosft::cli::run_app(app, argc, argv, [&] {
    OLMO_CHECK(a.batch >= 1, "--batch must be >= 1, got ", a.batch);
    OLMO_CHECK(a.seq >= 1, "--seq must be >= 1, got ", a.seq);
    OLMO_CHECK(a.layers >= 0, "--layers must be >= 0, got ", a.layers);
    OLMO_CHECK(a.vocab_tile >= 0, "--vocab-tile must be >= 0, got ", a.vocab_tile);
    OLMO_CHECK(a.block >= 0, "--attention-block must be >= 0, got ", a.block);
    OLMO_CHECK(a.spmd >= 1, "--spmd must be >= 1, got ", a.spmd);
    mesh_of(a);  // a bad --mesh is refused before any plugin loads; the step refuses what does not split
    const bool tpu = is_libtpu(a.plugin);
    if (tpu && app.count("--topology") == 0) a.topology = "v4:2x2x1";
    if (tpu) {
      OLMO_CHECK(!a.topology.empty(), "--plugin ", a.plugin,
                 " compiles for a topology: give --topology v4:XxYxZ");
      olmosft::xla::tpu_topology_options(a.topology);  // a bad --topology is refused before libtpu loads
      olmosft::xla::libtpu_deviceless_env();
    }
    const olmosft::model::ModelConfig m =
        olmosft::model::config_from_path_or_preset(a.config, a.layers, "--layers");
    if (!a.save_config.empty()) olmosft::model::save_config(m, a.save_config);
    size_t module_bytes = 0;
    double emit_s = 0;
    const Compiled c = compile_step(a, m, &module_bytes, &emit_s);
    print(a, m, c, module_bytes, emit_s);
    return 0;
  });
}

}  // namespace

OLMOSFT_VERB(
    "xla compile",
    "compile a model's training step with a PJRT plugin (ahead of time for a TPU topology) and print "
    "its device memory",
    xla_compile_main);
