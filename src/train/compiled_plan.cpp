#include "train/compiled_plan.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <map>
#include <optional>
#include <set>
#include <sstream>

#include "core/error.h"
#include "core/units.h"
#include "model/decoder_xla.h"
#include "model/params.h"
#include "model/xla_params.h"
#include "train/plan.h"
#include "xla/cuda_target.h"
#include "xla/pjrt.h"

namespace olmosft::train {

namespace {

double since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

[[noreturn]] void unknown_topology(const std::string& topology) {
  fail(
      "plan --compile: topology '", topology,
      "': expected tpu-v4:XxYxZ (a TPU slice, compiled by libtpu) or GPU:HOSTSxGPUS (a GPU cluster, compiled "
      "by XLA's CUDA plugin; GPUs: ",
      xla::gpu_names(), ")");
}

// TOPOLOGY as given: a TPU slice (tpu-v4:4x4x8: libtpu's name v4:4x4x8) or a GPU cluster (h100:2x8);
// anything else refused naming the spellings.
struct Slice {
  std::string tpu;                     // libtpu's topology name, or "" for a GPU cluster
  std::optional<xla::GpuCluster> gpu;  // the cluster, or none for a TPU slice
};

Slice parse_slice(const std::string& topology) {
  const std::string pre = "tpu-";
  if (topology.rfind(pre, 0) == 0) {
    const std::string t = topology.substr(pre.size());
    xla::tpu_topology_bounds(t);  // refuses a generation or shape libtpu's options are not known for
    return {t, std::nullopt};
  }
  const size_t colon = topology.find(':');
  if (colon == std::string::npos) unknown_topology(topology);
  try {  // a known GPU name before the colon; the cluster's own spelling checks follow
    xla::gpu_device_description(topology.substr(0, colon));
  } catch (const Error&) {
    unknown_topology(topology);
  }
  return {"", xla::parse_gpu_cluster(topology)};
}

// The slice or cluster's topology, the plugin it is compiled by and the memory a device may use.
struct Target {
  std::string plugin;
  std::optional<xla::Topology> topo;
  int64_t device_bytes = 0;
  bool f64 = true;
  std::vector<std::pair<std::string, std::string>> flags;  // XLA options for the compile
};

Target make_target(const Slice& slice) {
  Target t;
  if (!slice.gpu) {
    xla::libtpu_deviceless_env();
    t.plugin = "tpu";
    t.topo = xla::Topology::create("tpu", slice.tpu, xla::tpu_topology_options(slice.tpu));
    const auto attrs = t.topo->attributes();
    if (auto it = attrs.find("device_memory_bytes_limit"); it != attrs.end())
      t.device_bytes = std::stoll(it->second);
    t.f64 = false;  // TPUs have no f64
    return t;
  }
  const xla::GpuCluster& c = *slice.gpu;
  const std::shared_ptr<const xla::Plugin> plugin = xla::Plugin::load("cuda");
  const xla::GpuTarget g = xla::cuda_target(plugin->path(), c.gpu);
  t.plugin = "cuda";
  t.topo = xla::Topology::create(plugin, "cuda", xla::cuda_topology_options(g, c));
  // What a run's client may allocate (xla::kCudaMemoryFraction, the create option XlaDecoder passes).
  t.device_bytes = static_cast<int64_t>(double(g.memory_bytes) * xla::kCudaMemoryFraction);
  // The toolkit parts install-deps.sh --cuda unpacks beside the plugin (libcudart and libnvJitLink load by
  // its RPATH; libdevice is looked up under xla_gpu_cuda_data_dir first, else /usr/local/cuda).
  if (const std::string root = xla::cuda_wheel_root(plugin->path()); !root.empty())
    t.flags.push_back({"xla_gpu_cuda_data_dir", root});
  return t;
}

}  // namespace

std::string planner_device(const std::string& topology) {
  const Slice s = parse_slice(topology);
  if (!s.gpu) return "tpu-v4";
  return s.gpu->gpu == "h100" ? "h100-80gb" : s.gpu->gpu == "h200" ? "h200-141gb" : "b200-192gb";
}

int64_t slice_devices(const std::string& topology) {
  const Slice s = parse_slice(topology);
  return s.gpu ? s.gpu->devices() : xla::tpu_topology_chips(s.tpu);
}

model::XlaOptions recipe_xla_options(const TrainConfig& c) {
  model::XlaOptions xo;
  xo.plugin = c.xla.plugin;
  xo.cpu_devices = c.xla.cpu_devices;
  xo.mesh = xla_mesh(c);
  xo.scan_layers = c.xla.scan_layers;
  xo.memory_limit_bytes = static_cast<int64_t>(c.xla.memory_limit_gib * kGiB);
  xo.remat = c.model.memory.remat;  // XlaDecoder::set_memory_policy sets it again (and checks it)
  xo.attention = model::parse_xla_attention(c.xla.attention, "xla.attention");
  xo.delta_chunk = c.xla.delta_chunk;
  xo.bf16 = c.compute.gemm.compute == ComputeDtype::BF16;
  return xo;
}

CompiledPlan compile_plan(const model::ModelConfig& m, const TrainConfig& cfg, const std::string& topology) {
  CompiledPlan p;
  p.topology = topology;
  const Target target = make_target(parse_slice(topology));
  const xla::Topology& topo = *target.topo;
  p.platform = topo.platform_name();
  p.devices = static_cast<int64_t>(topo.device_count());
  const auto kinds = topo.device_kinds();
  p.device_kind = kinds.empty() ? "" : kinds[0];
  p.device_bytes = target.device_bytes;
  model::XlaOptions xo = recipe_xla_options(cfg);
  xo.plugin = target.plugin;
  xo.attention = model::XlaAttention::kBlockwise;  // cuDNN's fused attention needs a device to compile
  xo.f64_trig = target.f64;
  OLMO_CHECK(xo.mesh.devices() == p.devices, cfg.source, ": the mesh (", xo.mesh.text(), ") has ",
             xo.mesh.devices(), " devices, but ", topology, " has ", p.devices,
             " (set mesh.* so that their product is the slice's chips)");
  p.mesh = xo.mesh;
  p.B = cfg.batch.slots;
  p.T = cfg.batch.seq_len;
  const model::LossConfig loss{.weight = cfg.loss.weight,
                               .moe_buffer_factor = cfg.moe.buffer_factor,
                               .vocab_tile = cfg.compute.vocab_tile};
  auto t0 = std::chrono::steady_clock::now();
  const std::string text = model::xla_step_module(m, xo, p.B, p.T, loss, true);
  p.emit_s = since(t0);
  xla::CompileOptions co;
  co.num_partitions = p.devices;
  co.use_spmd_partitioning = p.devices > 1;
  co.env_option_overrides = target.flags;
  const xla::PartitionedDump dump;
  if (p.devices > 1) dump.add_to(co);
  t0 = std::chrono::steady_clock::now();
  const xla::AotExecutable exe = xla::compile_for_topology(topo, text, co);
  p.compile_s = since(t0);
  if (p.devices > 1) p.loop_collectives = xla::collectives_in_loops(dump.text(co));
  const std::vector<int64_t> ids = topo.device_ids(), procs = topo.device_processes();
  p.partition_process.assign(size_t(p.devices), -1);
  for (size_t i = 0; i < ids.size() && i < procs.size(); ++i)
    if (ids[i] >= 0 && ids[i] < p.devices) p.partition_process[size_t(ids[i])] = procs[i];
  const xla::MemoryStats s = exe.memory_stats();
  p.argument_bytes = s.argument_bytes, p.output_bytes = s.output_bytes, p.alias_bytes = s.alias_bytes;
  p.temp_bytes = s.temp_bytes, p.code_bytes = s.generated_code_bytes;
  p.step_bytes = s.total_bytes();
  int64_t moments = 0;  // two fp32 moments per program parameter (the experts stacked), split as it
  for (const model::XlaParam& ps : model::xla_params(m).list) {
    const int64_t n = shape_numel(ps.shape);
    moments += 2 * 4 * (xla::param_split_dim(xo.mesh, ps.shape) >= 0 ? n / xo.mesh.param_shards() : n);
  }
  p.moments_bytes = moments;
  // With gradient accumulation the sums of the earlier micro-steps stay on the device (split as the
  // parameters: half the moments' bytes); the compiled step returns only its own.
  p.sums_bytes = cfg.batch.grad_accum > 1 ? moments / 2 : 0;
  p.need_bytes = p.step_bytes + p.moments_bytes + p.sums_bytes;
  p.fits = p.device_bytes > 0 && p.need_bytes <= p.device_bytes;
  return p;
}

std::string compiled_plan_line(const CompiledPlan& p, int64_t planned_bytes) {
  const std::string mesh = p.mesh.text(',');
  std::ostringstream o;
  o.precision(3);
  o << std::fixed;
  o << "PLAN compiled=yes topology=" << p.topology << " devices=" << p.devices << " mesh=" << mesh
    << " B=" << p.B << " T=" << p.T << " argument_bytes=" << p.argument_bytes
    << " output_bytes=" << p.output_bytes << " alias_bytes=" << p.alias_bytes
    << " temp_bytes=" << p.temp_bytes << " code_bytes=" << p.code_bytes << " step_bytes=" << p.step_bytes
    << " moments_bytes=" << p.moments_bytes << " sums_bytes=" << p.sums_bytes
    << " need_bytes=" << p.need_bytes << " device_bytes=" << p.device_bytes
    << " planned_bytes=" << planned_bytes << " fits=" << (p.fits ? "yes" : "no")
    << " compile_s=" << p.compile_s << "\n";
  return o.str();
}

std::string compiled_plan_loop_lines(const CompiledPlan& p) {
  int64_t scan = 0, unwanted = 0;
  std::ostringstream w;
  for (const xla::LoopCollective& l : p.loop_collectives) {
    scan += l.loop_name == xla::kLayerScanLoop;
    if (!xla::unwanted_loop_collective(l)) continue;
    ++unwanted;
    const size_t indent = l.line.find_first_not_of(' ');
    std::string hlo = indent == std::string::npos ? l.line : l.line.substr(indent);
    if (hlo.size() > 160) hlo = hlo.substr(0, 160) + "...";
    w << "PLAN-WARNING collective_in_loop op=" << l.opcode << " loop=" << l.loop_name
      << " computation=" << l.computation << " hlo=" << hlo << "\n";
  }
  return "PLAN-LOOPS layer_scan_collectives=" + std::to_string(scan) +
         " unwanted_collectives=" + std::to_string(unwanted) + "\n" + w.str();
}

std::string compiled_plan_process_lines(const CompiledPlan& p) {
  std::map<int64_t, int64_t> per_process;
  for (int64_t q : p.partition_process) ++per_process[q];
  const int64_t per = per_process.empty() ? 0 : per_process.begin()->second;  // devices of the first host
  const xla::HloBuilder::DeviceGroups groups = xla::sequence_groups(p.mesh);
  int64_t across = 0;
  for (const auto& g : groups) {
    std::set<int64_t> in;  // the mesh has the topology's devices (compile_plan checks): every d is in range
    for (int64_t d : g) in.insert(p.partition_process[size_t(d)]);
    across += in.size() > 1;
  }
  std::ostringstream o;
  o << "PLAN-PROCESSES processes=" << per_process.size() << " devices_per_process=" << per
    << " row_groups=" << groups.size() << " row_groups_across_processes=" << across << "\n";
  if (across > 0 && p.platform == "cuda")
    o << "PLAN-WARNING rows_across_processes groups=" << across << " of " << groups.size() << ": each row's "
      << p.mesh.seq_shards() << " pieces (mesh expert x context) span hosts, so the context-parallel and "
      << "expert gathers of every layer go over the network between hosts instead of NVLink (make expert x "
      << "context divide the GPUs of a host, " << per << ")\n";
  return o.str();
}

std::string compiled_plan_summary(const CompiledPlan& p, int64_t planned_bytes) {
  std::ostringstream o;
  o.precision(3);
  o << "compiled for " << p.topology << " (" << p.devices << " x " << p.device_kind << ", mesh "
    << p.mesh.text() << "): per device " << gib(double(p.need_bytes)) << " GiB of "
    << gib(double(p.device_bytes)) << " (step " << gib(double(p.step_bytes)) << ": temporaries "
    << gib(double(p.temp_bytes)) << ", arguments " << gib(double(p.argument_bytes)) << ", outputs "
    << gib(double(p.output_bytes)) << "; AdamW moments " << gib(double(p.moments_bytes))
    << (p.sums_bytes > 0 ? "; accumulated gradient sums " + gib(double(p.sums_bytes)) : std::string())
    << "), " << (p.fits ? "fits" : "does not fit") << "; compiled in " << p.compile_s
    << " s; the planner's estimate " << gib(double(planned_bytes)) << " GiB\n";
  return o.str();
}

}  // namespace olmosft::train
