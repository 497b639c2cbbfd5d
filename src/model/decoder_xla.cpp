// The decoder on XLA (see decoder_xla.h): the layer list emitted as one StableHLO program per batch shape.
#include "model/decoder_xla.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstring>
#include <iterator>
#include <map>
#include <tuple>

#include "core/error.h"
#include "core/units.h"
#include "model/decoder_units.h"
#include "model/layer_pass.h"
#include "model/layers.h"
#include "model/moe_mesh_emit.h"
#include "model/params.h"
#include "model/unit_emit.h"
#include "model/xla_layout.h"
#include "model/xla_params.h"
#include "xla/cuda_target.h"
#include "xla/hlo_builder.h"
#include "xla/ops_adamw.h"
#include "xla/ops_attention_cudnn.h"
#include "xla/ops_dense.h"
#include "xla/pjrt.h"

namespace olmosft::model {

// What one compiled program is for: the batch shape, the kind of call and the loss settings that are
// constants of the graph (grad_scale is an argument).
struct StepKey {
  int64_t B = 0, T = 0;
  bool backward = false, logits = false, logprobs = false;
  bool accumulate = false;  // the gradient sums so far are arguments, donated into the results (device state)
  double lm_z = 0, moe_lb = 0, router_z = 0;  // the loss weights (the MoE ones read by its backward)
  double moe_buffer_factor = -1;              // the MoE's capacity (<= 0: dropless, dense experts)
  int64_t vocab_tile = 0;
  int64_t cudnn_segments = 0;  // cuDNN's packed attention form with this M (cudnn_segments); 0: not packed
  xla::Mesh mesh;              // the devices of the SPMD program and how the batch and parameters split
  Remat remat = Remat::None;   // what the backward re-emits (XlaOptions::remat)
  bool scan = false;           // the layers as a loop over their repeating group (XlaOptions::scan_layers)
  auto operator<=>(const StepKey&) const = default;
};

// The program for a [B, T] batch under LOSS, laid out over XO's mesh.
static StepKey step_key(int64_t B, int64_t T, const LossConfig& loss, const XlaOptions& xo, bool backward,
                        bool logits, bool logprobs, bool accumulate = false, int64_t cudnn_segments = 0) {
  StepKey k;
  k.B = B, k.T = T, k.backward = backward, k.logits = logits, k.logprobs = logprobs,
  k.accumulate = accumulate;
  k.cudnn_segments = cudnn_segments;
  k.mesh = xo.mesh;
  k.remat = xo.remat;
  k.scan = xo.scan_layers;
  k.lm_z = loss.weight[kLossLmZ];
  k.moe_lb = loss.weight[kLossMoeLb];
  k.router_z = loss.weight[kLossRouterZ];
  k.moe_buffer_factor = loss.moe_buffer_factor;
  k.vocab_tile = loss.vocab_tile;
  return k;
}

namespace {

using xla::ElementType;
using xla::TensorType;
using xla::Value;

bool uses_ssmax(const ModelConfig& c) { return c.scalable_softmax; }

// The MoE layers' indices, in layer order (one statistics result each; the aux_scale argument if any).
std::vector<int64_t> moe_layers(const ModelConfig& c) {
  std::vector<int64_t> l;
  for (const LayerSpec& s : layer_specs(c))
    if (s.ffn == FfnKind::Moe) l.push_back(s.index);
  return l;
}

// The config runs on the decoder and every layer is emitted (names the field / layer otherwise).
void check_emitted(const ModelConfig& c) {
  check_supported(c);
  for (const LayerSpec& s : layer_specs(c)) unit::Block::check_emits(c, s);
}

// What a mesh needs of the model (names the axis): every axis >= 1; cuDNN's custom calls on one device; the
// delta-rule mixers (KDA, Gated DeltaNet) run over whole rows, so no sequence split with them yet.
void check_mesh(const ModelConfig& c, const XlaOptions& xo) {
  for (xla::MeshAxis a : xla::kMeshAxes)
    OLMO_CHECK(xo.mesh.size(a) >= 1, "mesh.", xla::mesh_axis_name(a), " must be >= 1, got ", xo.mesh.size(a));
  OLMO_CHECK(xo.devices() == 1 || xo.attention != XlaAttention::kCudnn, "xla.attention cudnn on a mesh of ",
             xo.devices(),
             " devices: cuDNN's custom calls are not partitioned over devices yet (use one device, or "
             "xla.attention blockwise)");
  if (xo.mesh.seq_shards() == 1) return;
  // the delta-rule mixers run whole rows with their heads split over the row's pieces (delta_rule_emit.h)
  for (const LayerSpec& s : layer_specs(c)) {
    if (s.mixer == unit::kMixer<unit::AttentionUnit>) continue;
    const int64_t H =
        s.mixer == unit::kMixer<unit::KdaUnit> ? c.linear_num_key_heads : c.linear_num_value_heads;
    OLMO_CHECK(H % xo.mesh.seq_shards() == 0, c.model_type_name, ": mesh ", xo.mesh.text(),
               " splits each row's tokens over expert x context = ", xo.mesh.seq_shards(),
               " devices, but layer ", s.index, " is a delta-rule mixer (KDA / Gated DeltaNet) with ", H,
               " heads, which must split evenly over them (its loop runs whole rows, heads split)");
  }
}

}  // namespace

void check_moe_capacity_mesh(const ModelConfig& c, const XlaOptions& xo, double bf) {
  if (!unit::moe_emit::experts_over_mesh(&xo.mesh, bf) || c.n_routed_experts <= 0) return;
  unit::moe_emit::check_mesh_experts(xo.mesh, c.n_routed_experts, 0);
}

namespace {

// The program's arguments after the parameters (xla_params.h), in this order.
struct BatchArgs {
  std::optional<Value> tokens, seg, pos, logpos, targets, mask, cudnn_seqlen, cudnn_offsets, scale, aux;
};

XlaStepTensor step_tensor(std::string name, const TensorType& t) {
  return {std::move(name), t.type == ElementType::kS32 ? "s32" : "f32", t.dims};
}

// The step's arguments as they are made, named for XlaStepProgram (sig null: not recorded); over a mesh of
// several devices each gets its layout.
struct StepArgs {
  xla::HloBuilder& b;
  XlaStepProgram* sig;
  const xla::Mesh& mesh;
  Value add(const std::string& name, const TensorType& t, std::optional<int> alias = std::nullopt,
            Split split = Split::kReplicated) {
    if (sig != nullptr) sig->arguments.push_back(step_tensor(name, t));
    Value v = b.argument(t, alias);
    if (mesh.devices() > 1) b.shard_argument(v, layout(mesh, t, split));
    return v;
  }
};

// The layouts of a program over MESH: each argument and result split as its ARG_SPLIT / RESULT_SPLIT entry.
void lay_out(xla::HloBuilder& b, const std::vector<Value>& args, const std::vector<Split>& arg_split,
             const std::vector<Value>& results, const std::vector<Split>& result_split,
             const xla::Mesh& mesh) {
  if (mesh.devices() <= 1) return;
  b.partitions(mesh.devices());
  for (size_t i = 0; i < args.size(); ++i)
    b.shard_argument(args[i], layout(mesh, args[i].type(), arg_split[i]));
  for (size_t i = 0; i < results.size(); ++i)
    b.shard_result(i, layout(mesh, results[i].type(), result_split[i]));
}

BatchArgs batch_arguments(StepArgs& args, const ModelConfig& c, const StepKey& k) {
  const int64_t N = k.B * k.T, C = k.mesh.seq_shards();
  BatchArgs a;
  // the batch's arrays in the mesh's blocked token order (xla/mesh.h; the batch's own order on one device or
  // without context parallelism), each device's tile on it; the segments as row tiles [B * C, T / C]
  const auto flat = [&](const char* name, ElementType t) {
    return args.add(name, TensorType{t, {N}}, std::nullopt, Split::kTokens);
  };
  a.tokens = flat("tokens", ElementType::kS32);
  a.seg =
      args.add("segments", TensorType{ElementType::kS32, {k.B * C, k.T / C}}, std::nullopt, Split::kRowTiles);
  a.pos = flat("positions", ElementType::kS32);
  if (uses_ssmax(c)) a.logpos = flat("logpos", ElementType::kF32);
  a.targets = flat("targets", ElementType::kS32);
  a.mask = flat("mask", ElementType::kS32);
  if (const int64_t M = k.cudnn_segments; M > 0) {  // xla::ops::cudnn_packed_rows' arrays
    a.cudnn_seqlen = args.add("cudnn_seqlen", TensorType{ElementType::kS32, {k.B, M}});
    a.cudnn_offsets = args.add("cudnn_offsets", TensorType{ElementType::kS32, {k.B, M + 1}});
  }
  if (k.backward) a.scale = args.add("grad_scale", TensorType{ElementType::kF32, {}});
  if (k.backward && !moe_layers(c).empty()) a.aux = args.add("aux_scale", TensorType{ElementType::kF32, {}});
  return a;
}

// The whole step as one program: results ce_sum, z_sum, count, per MoE layer its statistics (f32 [4]: lb,
// router_z, required_buffer_factor, dropped), [logits], [logprobs], then with the backward one gradient per
// program parameter (xla_params.h: registry order, the experts stacked).
std::string emit_step(const ModelConfig& c, const DecoderUnits& u, const XlaOptions& xo,
                      const LossConfig& loss, const StepKey& k, XlaStepProgram* sig = nullptr) {
  xla::HloBuilder b("olmosft_step");
  if (k.mesh.devices() > 1) b.partitions(k.mesh.devices());
  StepArgs args{b, sig, k.mesh};
  const XlaParams xp = xla_params(c);  // the registry's tensors, the experts stacked
  const std::vector<XlaParam>& reg = xp.list;
  std::vector<Value> w;
  for (const XlaParam& p : reg)
    w.push_back(args.add(p.name, TensorType{ElementType::kF32, p.shape}, std::nullopt, Split::kParam));
  const BatchArgs a = batch_arguments(args, c, k);
  const int64_t C = k.mesh.seq_shards();  // the units see the token array as rows of [B * C, T / C]
  unit::Emit e(b, c, loss, w, k.B * C, k.T / C);
  e.arg = xp.of;
  if (k.mesh.devices() > 1) e.mesh = &k.mesh;
  e.remat = k.remat;
  if (k.backward) e.g.resize(reg.size());
  e.tokens = a.tokens;
  e.seg = a.seg;
  e.logpos = a.logpos;
  e.aux_scale = a.aux;
  e.operands = xo.bf16 ? xla::ops::Operands::kBF16 : xla::ops::Operands::kF32;
  e.attention_block = xo.attention_block;
  e.delta_chunk = xo.delta_chunk;
  e.attention_cudnn = xo.attention == XlaAttention::kCudnn;
  if (a.cudnn_seqlen) e.cudnn_packed = xla::ops::CudnnPacking{*a.cudnn_seqlen, *a.cudnn_offsets, *a.seg};
  if (uses_rope(u.layers))
    for (int r : {static_cast<int>(RopeKind::Full), static_cast<int>(RopeKind::Sliding)})
      e.rope[r] = xla::ops::rope_tables(b, *a.pos, xla::ops::rope_inv_freq_constant(b, u.rope[r].inv_freq),
                                        u.rope[r].attention_scaling, xo.f64_trig);
  const PassLayout lay = mesh_layout(b, k.mesh);
  // each weight gathered where used; a scanned pass stacks its layers' own, the MoE unit lays out its experts
  for (size_t i = 0; i < e.w.size(); ++i)
    if ((!k.scan || reg[i].layer < 0) && !reg[i].experts()) e.w[i] = lay.gather(w[i]);
  LayerPass layers(e, u, k.scan, lay);
  unit::EmbeddingUnit::Emitted se;
  const Value h = layers.forward(lay.tokens(u.embed.emit_forward(e, se)));  // the final norm's input
  unit::LmHeadUnit::Emitted sh;
  const xla::ops::XentForward xf = u.head.emit_forward(e, h, *a.targets, *a.mask, sh);
  std::vector<std::pair<std::string, Value>> results{
      {"ce_sum", xf.ce_sum}, {"z_sum", xf.z_sum}, {"count", xf.count}};
  const std::vector<int64_t> moe = moe_layers(c);  // e.moe_stats: one per MoE layer, in layer order
  for (size_t i = 0; i < moe.size(); ++i)
    results.push_back({"moe_stats." + std::to_string(moe[i]), e.moe_stats[i]});
  if (k.logits) results.push_back({"logits", u.head.emit_logits(e, sh)});
  if (k.logprobs) results.push_back({"logprobs", u.head.emit_logprobs(e, sh)});
  if (k.backward) {
    // the sums so far, each donated into its result (argument i -> result first_grad + i)
    std::vector<Value> sums;
    const int first_grad = static_cast<int>(results.size());
    if (k.accumulate)
      for (size_t i = 0; i < reg.size(); ++i)
        sums.push_back(args.add("grad_sum." + reg[i].name, w[i].type(), first_grad + int(i), Split::kParam));
    const Value dh = layers.backward(u.head.emit_backward(e, h, sh, *a.scale));
    u.embed.emit_backward(e, se, dh);
    for (size_t i = 0; i < reg.size(); ++i) {
      const Value g = e.g[i] ? *e.g[i] : b.constant(w[i].type(), 0.0);
      results.push_back({"grad." + reg[i].name, k.accumulate ? b.add(sums[i], g) : g});
    }
  }
  std::vector<Value> values;
  for (const auto& [name, v] : results) {
    values.push_back(v);
    if (sig != nullptr) sig->results.push_back(step_tensor(name, v.type()));
  }
  b.returns(values);
  if (k.mesh.devices() > 1) {  // logits and log-probs split as the tokens, gradients as their parameters
    const size_t first_grad = results.size() - (k.backward ? reg.size() : 0);
    for (size_t i = 0; i < results.size(); ++i) {
      const std::string& name = results[i].first;
      const Split sp = name == "logits" || name == "logprobs" ? Split::kTokens
                       : i >= first_grad                      ? Split::kParam
                                                              : Split::kReplicated;
      b.shard_result(i, layout(k.mesh, values[i].type(), sp));
    }
  }
  return b.module();
}

// The global norm of the gradient sums: one f32 scalar (the CPU sums its squares in double).
std::string emit_grad_norm(const std::vector<XlaParam>& reg, const xla::Mesh& mesh) {
  xla::HloBuilder b("olmosft_grad_norm");
  std::vector<Value> g;
  for (const XlaParam& p : reg) g.push_back(b.argument(TensorType{ElementType::kF32, p.shape}));
  const Value norm = xla::ops::clip_grad_norm(b, g, 0.0).norm;
  b.returns({norm});
  lay_out(b, g, std::vector<Split>(g.size(), Split::kParam), {norm}, {Split::kReplicated}, mesh);
  return b.module();
}

// What an update program is for: AdamW's constants and the clip threshold (the LR and step are an argument).
struct UpdateKey {
  double beta1 = 0, beta2 = 0, eps = 0, max_norm = 0;
  auto operator<=>(const UpdateKey&) const = default;
};

// Clip + AdamW over every parameter: arguments p_i (donated into result i), g_i, m_i (-> result P + i), v_i
// (-> 2P + i), then the f32 [3] scalars of ops::adamw_scalars; results the new p, m and v.
std::string emit_update(const std::vector<XlaParam>& reg, const UpdateKey& k, const xla::Mesh& mesh) {
  xla::HloBuilder b("olmosft_update");
  const int P = static_cast<int>(reg.size());
  std::vector<Value> p, g, m, v;
  auto type = [&](int i) { return TensorType{ElementType::kF32, reg[size_t(i)].shape}; };
  for (int i = 0; i < P; ++i) p.push_back(b.argument(type(i), i));
  for (int i = 0; i < P; ++i) g.push_back(b.argument(type(i)));
  for (int i = 0; i < P; ++i) m.push_back(b.argument(type(i), P + i));
  for (int i = 0; i < P; ++i) v.push_back(b.argument(type(i), 2 * P + i));
  const Value scalars = b.argument(TensorType{ElementType::kF32, {3}});
  const xla::ops::ClipResult clipped = xla::ops::clip_grad_norm(b, g, k.max_norm);
  std::vector<xla::ops::AdamWParam> ap;
  for (int i = 0; i < P; ++i)
    ap.push_back({p[size_t(i)], clipped.grads[size_t(i)], m[size_t(i)], v[size_t(i)], reg[size_t(i)].decay});
  xla::ops::AdamWOptions o;
  o.beta1 = k.beta1;
  o.beta2 = k.beta2;
  o.eps = k.eps;
  const std::vector<xla::ops::AdamWState> next = xla::ops::adamw_update(b, ap, scalars, o);
  std::vector<Value> results;
  for (const auto& n : next) results.push_back(n.p);
  for (const auto& n : next) results.push_back(n.m);
  for (const auto& n : next) results.push_back(n.v);
  b.returns(results);
  std::vector<Value> all = p;
  for (const auto* group : {&g, &m, &v}) all.insert(all.end(), group->begin(), group->end());
  all.push_back(scalars);
  // p, g, m, v each as the parameter; the scalars replicated
  std::vector<Split> arg_split(all.size(), Split::kParam), result_split(results.size(), Split::kParam);
  arg_split.back() = Split::kReplicated;
  lay_out(b, all, arg_split, results, result_split, mesh);
  return b.module();
}

// Adds the seconds from its construction to its destruction to *acc (XlaRunStats' timing fields).
struct AddSeconds {
  double* acc;
  std::chrono::steady_clock::time_point t0 = std::chrono::steady_clock::now();
  ~AddSeconds() { *acc += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); }
};

}  // namespace

XlaStepBatch xla_step_batch(const ModelConfig& c, const DecoderOptions& o, const Batch& b) {
  const size_t N = static_cast<size_t>(b.B * b.T);
  XlaStepBatch h;
  h.tokens.assign(b.tokens, b.tokens + N);
  h.seg.resize(N);
  h.pos.resize(N);
  h.logpos.resize(N);
  std::vector<uint8_t> valid(N), mask(N);
  batch_token_arrays(c, o, b, h.seg.data(), valid.data(), h.pos.data(), h.logpos.data());
  h.targets.resize(N);
  unit::LmHeadUnit::trained_targets(c, b, valid.data(), h.targets.data(), mask.data());
  h.mask.assign(mask.begin(), mask.end());
  for (size_t i = 0; i < N; ++i)
    if (h.mask[i] == 0) h.targets[i] = 0;
  return h;
}

XlaAttention parse_xla_attention(const std::string& text, const std::string& where) {
  if (text == "blockwise") return XlaAttention::kBlockwise;
  if (text == "cudnn") return XlaAttention::kCudnn;
  fail(where, ": expected blockwise or cudnn, got '", text, "'");
}

const char* xla_attention_name(XlaAttention a) { return a == XlaAttention::kCudnn ? "cudnn" : "blockwise"; }

int64_t cudnn_segments(const std::vector<int32_t>& seg, int64_t B, int64_t T) {
  OLMO_CHECK(static_cast<int64_t>(seg.size()) == B * T, "cudnn_segments: ", seg.size(), " segment ids for [",
             B, ", ", T, "]");
  const int64_t docs = xla::ops::cudnn_documents_per_row(seg.data(), B, T);
  bool plain = docs <= 1;  // every row: one document from its first token, then padding (or only padding)
  for (int64_t r = 0; plain && r < B; ++r) {
    const int32_t* s = seg.data() + r * T;
    plain = s[0] >= 0 || std::all_of(s, s + T, [](int32_t x) { return x < 0; });
  }
  if (plain) return 0;
  int64_t M = 2;
  while (M < docs) M *= 2;
  return M;
}

struct XlaDecoder::Impl {
  DecoderUnits units;
  xla::Client client;
  std::map<StepKey, xla::Executable> programs;
  std::optional<xla::Executable> norm;
  std::map<UpdateKey, xla::Executable> updates;
  // Device training state (DeviceTraining), [device][tensor] (each device's copy, or part: `split`):
  // empty until upload(); g empty while no step has a gradient sum.
  std::vector<std::vector<xla::Buffer>> p, m, v, g;
  const xla::Mesh& mesh;  // the decoder's (XlaOptions::mesh)
  Impl(const ModelConfig& c, const DecoderOptions& o, const XlaOptions& xo)
      : units(c, o), client(xla::Client::create(xo.plugin, client_options(xo))), mesh(xo.mesh) {}
  static xla::ClientOptions client_options(const XlaOptions& xo) {
    xla::ClientOptions co;
    if (xo.plugin == "cpu") co.cpu_device_count = std::max(xo.cpu_devices, xo.devices());
    // The share of each GPU XLA's allocator takes (the budget plan --compile checks against).
    if (xo.plugin == "cuda") co.extra.push_back({"memory_fraction", float(xla::kCudaMemoryFraction)});
    return co;
  }
  XlaParams xp;            // the programs' parameters (the experts stacked); the device state holds these
  std::vector<int> split;  // per program parameter: its dimension split over the mesh, or -1
  // Program parameter I on every device from the host's registry tensors SRC (registry order).
  std::vector<xla::Buffer> place_param(size_t i, const std::vector<const float*>& src) const {
    const XlaParam& p = xp.list[i];
    if (!p.experts())
      return place(std::span<const float>(src[size_t(p.members[0])], size_t(numel(p))), p.shape, split[i]);
    std::vector<const float*> parts;
    for (int r : p.members) parts.push_back(src[size_t(r)]);
    std::vector<float> packed(size_t(numel(p)));
    pack(p, parts, packed);
    return place(packed, p.shape, split[i]);
  }
  // Program parameter I from BUFS (one per device, Impl::of) back into the host's registry tensors DST
  // (registry order).
  void fetch_param(const std::vector<const xla::Buffer*>& bufs, size_t i,
                   const std::vector<float*>& dst) const {
    const XlaParam& p = xp.list[i];
    if (!p.experts()) return fetch(bufs, dst[size_t(p.members[0])], split[i]);
    std::vector<float> packed(size_t(numel(p)));
    fetch(bufs, packed.data(), split[i]);
    std::vector<float*> parts;
    for (int r : p.members) parts.push_back(dst[size_t(r)]);
    unpack(p, packed, parts);
  }
  // HOST (row-major DIMS) on each device of the mesh: all of it on every one (DIM < 0), or device d's part
  // (xla::param_part) of dimension DIM split into the mesh's parameter shards.
  std::vector<xla::Buffer> place(std::span<const float> host, const std::vector<int64_t>& dims,
                                 int dim = -1) const {
    std::vector<xla::Buffer> out;
    const int64_t D = mesh.devices(), S = mesh.param_shards();
    if (dim < 0) {
      for (int64_t d = 0; d < D; ++d) out.push_back(client.to_device(host, dims, size_t(d)));
      return out;
    }
    const Blocks k = blocks(dims, dim, S);
    std::vector<int64_t> part = dims;
    part[size_t(dim)] /= S;
    std::vector<float> buf(k.outer * k.chunk);
    for (int64_t d = 0; d < D; ++d) {
      const size_t at = size_t(xla::param_part(mesh, d)) * k.chunk;
      for (size_t o = 0; o < k.outer; ++o)
        std::copy_n(host.data() + o * k.row + at, k.chunk, buf.data() + o * k.chunk);
      out.push_back(client.to_device(std::span<const float>(buf), part, size_t(d)));
    }
    return out;
  }
  // The whole array back into DST from BUFS (one per device): device 0's copy (DIM < 0), or the parts of
  // dimension DIM, part p on device p (xla::param_part).
  void fetch(const std::vector<const xla::Buffer*>& all, float* dst, int dim) const {
    if (dim < 0) return all[0]->to_host(dst, all[0]->type().bytes());
    const std::vector<const xla::Buffer*> bufs(all.begin(), all.begin() + mesh.param_shards());
    std::vector<int64_t> dims = bufs[0]->type().dims;
    dims[size_t(dim)] *= static_cast<int64_t>(bufs.size());
    const Blocks k = blocks(dims, dim, static_cast<int64_t>(bufs.size()));
    std::vector<float> buf;
    for (size_t d = 0; d < bufs.size(); ++d) {
      buf = bufs[d]->to_host<float>();
      for (size_t o = 0; o < k.outer; ++o)
        std::copy_n(buf.data() + o * k.chunk, k.chunk, dst + o * k.row + d * k.chunk);
    }
  }
  // A row-major array of DIMS seen as [outer][DEVICES parts of `chunk` contiguous elements] along DIM.
  struct Blocks {
    size_t outer = 1, chunk = 1, row = 1;
  };
  static Blocks blocks(const std::vector<int64_t>& dims, int dim, int64_t devices) {
    Blocks k;
    for (size_t i = 0; i < size_t(dim); ++i) k.outer *= size_t(dims[i]);
    for (size_t i = size_t(dim); i < dims.size(); ++i) k.row *= size_t(dims[i]);
    k.chunk = k.row / size_t(devices);
    return k;
  }
  // Tensor I of STATE ([device][tensor]) from every device.
  static std::vector<const xla::Buffer*> of(const std::vector<std::vector<xla::Buffer>>& state, size_t i) {
    std::vector<const xla::Buffer*> out;
    for (const auto& dev : state) out.push_back(&dev[i]);
    return out;
  }
};

XlaDecoder::XlaDecoder(const ModelConfig& c, const XlaOptions& xo, const DecoderOptions& opts)
    : config_(c), opts_(opts), xo_(xo) {
  check_emitted(c);
  OLMO_CHECK(xo.attention_block > 0, "xla: attention_block must be > 0, got ", xo.attention_block);
  OLMO_CHECK(xo.delta_chunk >= 0, "xla: delta_chunk must be >= 0 (0: the recurrence), got ", xo.delta_chunk);
  OLMO_CHECK(xo.cpu_devices > 0, "xla.cpu_devices must be > 0, got ", xo.cpu_devices);
  check_mesh(c, xo);
  params_ = allocate_params(c);
  impl_ = std::make_unique<Impl>(c, opts, xo_);
  OLMO_CHECK(size_t(xo.devices()) <= impl_->client.device_count(), "mesh ", xo.mesh.text(), ": ",
             xo.devices(), " devices, but the plugin ", xo.plugin, " has ", impl_->client.device_count(),
             " addressable devices");
  impl_->xp = xla_params(c);
  for (const XlaParam& p : impl_->xp.list) impl_->split.push_back(xla::param_split_dim(xo.mesh, p.shape));
  const std::string platform = impl_->client.platform_name();
  OLMO_CHECK(xo.attention != XlaAttention::kCudnn || (platform != "cpu" && platform != "tpu"),
             "xla.attention cudnn: cuDNN's fused attention runs on XLA's CUDA plugin only; xla.plugin ",
             xo.plugin, " is platform ", platform, " (use xla.attention blockwise)");
}

XlaDecoder::~XlaDecoder() = default;

bool XlaDecoder::set_memory_policy(const MemoryPolicy& policy) {
  if (policy.saved != SavedDtype::F32) return false;
  xo_.remat = policy.remat;
  return true;
}

std::string XlaDecoder::platform() const { return impl_->client.platform_name(); }
size_t XlaDecoder::device_count() const { return impl_->client.device_count(); }

namespace {

// What xla_step_module / xla_step_program check before emitting (what XlaDecoder checks when built).
void check_step(const ModelConfig& c, const LossConfig& loss, int64_t B, int64_t T, const XlaOptions& xo,
                int64_t cudnn_segments) {
  check_emitted(c);
  OLMO_CHECK(B > 0 && T > 0, c.model_type_name, ": batch must have B > 0 and T > 0 (got B=", B, ", T=", T,
             ")");
  OLMO_CHECK(cudnn_segments == 0 || (xo.attention == XlaAttention::kCudnn && cudnn_segments >= 2),
             "cuDNN's packed attention form: cudnn_segments must be 0 or >= 2 with xla.attention cudnn, got ",
             cudnn_segments, " with ", xla_attention_name(xo.attention));
  check_mesh(c, xo);
  const xla::Mesh& m = xo.mesh;
  OLMO_CHECK(B % m.batch_shards() == 0, c.model_type_name, ": mesh ", m.text(),
             " splits each micro-batch's rows evenly over data x fsdp = ", m.batch_shards(),
             " devices; B=", B, " rows is not a multiple");
  OLMO_CHECK(T % m.seq_shards() == 0, c.model_type_name, ": mesh ", m.text(),
             " splits each row's tokens evenly over expert x context = ", m.seq_shards(), " devices; T=", T,
             " is not a multiple");
}

}  // namespace

std::string xla_step_module(const ModelConfig& c, const XlaOptions& xo, int64_t B, int64_t T,
                            const LossConfig& loss, bool backward, bool logits, bool logprobs,
                            int64_t cudnn_segments) {
  check_step(c, loss, B, T, xo, cudnn_segments);
  const DecoderUnits units(c, DecoderOptions{});
  return emit_step(c, units, xo, loss,
                   step_key(B, T, loss, xo, backward, logits, logprobs, false, cudnn_segments));
}

XlaStepProgram xla_step_program(const ModelConfig& c, const XlaOptions& xo, int64_t B, int64_t T,
                                const LossConfig& loss, int64_t cudnn_segments) {
  check_step(c, loss, B, T, xo, cudnn_segments);
  const DecoderUnits units(c, DecoderOptions{});
  XlaStepProgram p;
  p.text =
      emit_step(c, units, xo, loss, step_key(B, T, loss, xo, true, false, false, false, cudnn_segments), &p);
  return p;
}

xla::Executable XlaDecoder::compile(const std::string& text, const char* kind, int64_t B, int64_t T) {
  const auto t0 = std::chrono::steady_clock::now();
  xla::CompileOptions co;  // every program is one SPMD program over the mesh's devices
  co.num_partitions = xo_.devices();
  co.use_spmd_partitioning = xo_.devices() > 1;
  xla::Executable exe = impl_->client.compile(text, co);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  stats_.compile_seconds += seconds;
  stats_.module_bytes = text.size();
  ++stats_.compiles;
  XlaCompiled c{kind, B, T, seconds};
  try {
    const xla::MemoryStats m = exe.memory_stats();
    c.argument_bytes = m.argument_bytes, c.output_bytes = m.output_bytes, c.alias_bytes = m.alias_bytes;
    c.temp_bytes = m.temp_bytes, c.total_bytes = m.total_bytes();
  } catch (const Error&) {  // a plugin without the statistics: reported as 0
  }
  if (on_compile_) on_compile_(c);
  check_fits(c);
  return exe;
}

void XlaDecoder::check_fits(const XlaCompiled& c) const {
  const int64_t limit =
      xo_.memory_limit_bytes > 0 ? xo_.memory_limit_bytes : impl_->client.device_memory_limit(0);
  if (limit <= 0 || c.total_bytes <= 0) return;  // no limit known, or no statistics: nothing to compare
  int64_t moments = 0;  // AdamW's moments on device 0 (DeviceTraining), resident beside every program
  if (!impl_->m.empty())
    for (size_t i = 0; i < impl_->m[0].size(); ++i)
      moments += int64_t(impl_->m[0][i].type().bytes() + impl_->v[0][i].type().bytes());
  OLMO_CHECK(
      c.total_bytes + moments <= limit, "DOES NOT FIT (compiled): the ", c.kind, " program for ", c.B, " x ",
      c.T, " needs ", gib(double(c.total_bytes + moments)), " GiB per device (arguments ",
      gib(double(c.argument_bytes)), ", outputs ", gib(double(c.output_bytes)), ", aliased ",
      gib(double(c.alias_bytes)), ", temporaries ", gib(double(c.temp_bytes)), ", AdamW moments ",
      gib(double(moments)), ") but the device allows ", gib(double(limit)), " GiB (",
      xo_.memory_limit_bytes > 0 ? "xla.memory_limit_gib" : "its plugin's limit",
      "); XLA's compiled figure wins over the planner's estimate. Fewer rows a device "
      "(per_device_batch), model.remat=full with xla.scan_layers, or a larger mesh; "
      "`olmosft plan --compile TOPOLOGY RECIPE` checks a slice before a launch (docs/xla.md \"Memory\")");
}

xla::Executable& XlaDecoder::program(const StepKey& key, const LossConfig& loss) {
  auto it = impl_->programs.find(key);
  if (it != impl_->programs.end()) return it->second;
  return impl_->programs
      .emplace(key, compile(emit_step(config_, impl_->units, xo_, loss, key),
                            key.backward ? "step" : "forward", key.B, key.T))
      .first->second;
}

namespace {

// Rows of padding (token 0, segment -1: no document, untrained) after the B rows of HB, up to TO rows.
void pad_rows(XlaStepBatch& hb, int64_t T, int64_t to) {
  const size_t n = static_cast<size_t>(to * T);
  hb.tokens.resize(n, 0);
  hb.seg.resize(n, -1);
  hb.pos.resize(n, 0);
  if (!hb.logpos.empty()) hb.logpos.resize(n, 0.0f);
  hb.targets.resize(n, 0);
  hb.mask.resize(n, 0);
}

// Device D's tile of a row-major [B, T] array over mesh M (its rows' pieces, row-major: xla/mesh.h's
// blocked order), and its inverse: a tile's WIDTH values per token put back into ALL ([B * T, WIDTH]).
template <typename X>
std::vector<X> tile_of(const std::vector<X>& a, const xla::Mesh& m, int64_t d, int64_t B, int64_t T) {
  const int64_t Bl = B / m.batch_shards(), Tl = T / m.seq_shards();
  const int64_t r0 = xla::tile_row0(m, d, B), c0 = xla::tile_col0(m, d, T);
  std::vector<X> t;
  t.reserve(size_t(Bl * Tl));
  for (int64_t r = 0; r < Bl; ++r) {
    const auto from = a.begin() + (r0 + r) * T + c0;
    t.insert(t.end(), from, from + Tl);
  }
  return t;
}
void untile(const std::vector<float>& tile, const xla::Mesh& m, int64_t d, int64_t B, int64_t T,
            int64_t width, std::vector<float>& all) {
  const int64_t Bl = B / m.batch_shards(), Tl = T / m.seq_shards();
  const int64_t r0 = xla::tile_row0(m, d, B), c0 = xla::tile_col0(m, d, T);
  for (int64_t r = 0; r < Bl; ++r)
    std::copy_n(tile.begin() + r * Tl * width, Tl * width, all.begin() + ((r0 + r) * T + c0) * width);
}

}  // namespace

// The step's arguments after the parameters, for each device (its rows of the batch; the scalars on each).
std::vector<std::vector<xla::Buffer>> XlaDecoder::batch_buffers(const XlaStepBatch& hb, int64_t B, int64_t T,
                                                                int64_t M, bool backward, double grad_scale,
                                                                double aux_scale) const {
  const xla::Mesh& m = xo_.mesh;
  const int64_t D = m.devices(), Bl = B / m.batch_shards(), Tl = T / m.seq_shards(), Nd = Bl * Tl;
  const xla::Client& cl = impl_->client;
  std::vector<std::vector<xla::Buffer>> out(static_cast<size_t>(D));
  for (int64_t d = 0; d < D; ++d) {
    std::vector<xla::Buffer>& a = out[size_t(d)];
    const size_t dev = size_t(d);
    auto put = [&](const auto& v, std::vector<int64_t> dims) {
      const auto t = tile_of(v, m, d, B, T);
      a.push_back(cl.to_device(std::span(t), dims, dev));
    };
    put(hb.tokens, {Nd});
    put(hb.seg, {Bl, Tl});
    put(hb.pos, {Nd});
    if (uses_ssmax(config_)) put(hb.logpos, {Nd});
    put(hb.targets, {Nd});
    put(hb.mask, {Nd});
    if (M > 0) {  // one device (check_mesh refuses cuDNN's attention on several)
      const xla::ops::CudnnPackedRows rows = xla::ops::cudnn_packed_rows(hb.seg.data(), B, T, M);
      a.push_back(cl.to_device(std::span<const int32_t>(rows.seqlen), {B, M}, dev));
      a.push_back(cl.to_device(std::span<const int32_t>(rows.offsets), {B, M + 1}, dev));
    }
    const float scale = static_cast<float>(grad_scale), aux = static_cast<float>(aux_scale);
    if (backward) a.push_back(cl.to_device(std::span<const float>(&scale, 1), {}, dev));
    if (backward && !moe_layers(config_).empty())
      a.push_back(cl.to_device(std::span<const float>(&aux, 1), {}, dev));
  }
  return out;
}

LossParts XlaDecoder::run(const Batch& batch, const LossConfig& loss, double grad_scale, double aux_scale,
                          bool backward, float* logits, float* logprobs) {
  const std::string& who = config_.model_type_name;
  const std::vector<int64_t> moe = moe_layers(config_);
  OLMO_CHECK(batch.B > 0 && batch.T > 0, who, ": batch must have B > 0 and T > 0 (got B=", batch.B,
             ", T=", batch.T, ")");
  OLMO_CHECK(batch.tokens != nullptr, who, ": batch has no tokens");
  // The mesh splits the rows evenly over data x fsdp: a batch of another row count (an evaluation's single
  // row) is padded with rows of padding, which add nothing to the loss parts and whose outputs are dropped.
  const int64_t D = xo_.devices(), R = xo_.mesh.batch_shards(), B = (batch.B + R - 1) / R * R, T = batch.T;
  XlaStepBatch hb = xla_step_batch(config_, opts_, batch);
  if (B != batch.B) pad_rows(hb, T, B);
  const int64_t M = xo_.attention == XlaAttention::kCudnn ? cudnn_segments(hb.seg, B, T) : 0;
  Impl& im = *impl_;
  const bool on_device = !im.p.empty(), accumulate = backward && !im.g.empty();
  xla::Executable& exe = program(
      step_key(B, T, loss, xo_, backward, logits != nullptr, logprobs != nullptr, accumulate, M), loss);
  std::optional<AddSeconds> phase{std::in_place, &stats_.upload_seconds};     // upload, execute, download
  std::vector<std::vector<xla::Buffer>> host_params(static_cast<size_t>(D));  // the host's (no device state)
  if (!on_device) {
    std::vector<const float*> values;
    for (const Param& p : params_) {
      OLMO_CHECK(p.value.defined(), who, ": the XLA backend needs every parameter on this process; ", p.name,
                 " is not (dist.mode zero3 is not supported with device: xla)");
      values.push_back(p.value.data<float>());
    }
    for (size_t i = 0; i < im.xp.list.size(); ++i) {
      std::vector<xla::Buffer> r = im.place_param(i, values);
      for (int64_t d = 0; d < D; ++d) host_params[size_t(d)].push_back(std::move(r[size_t(d)]));
    }
  }
  std::vector<std::vector<xla::Buffer>> args = batch_buffers(hb, B, T, M, backward, grad_scale, aux_scale);
  std::vector<std::vector<xla::Buffer*>> ptrs(static_cast<size_t>(D));
  std::vector<size_t> donate;
  for (size_t d = 0; d < size_t(D); ++d) {
    for (auto& b : on_device ? im.p[d] : host_params[d]) ptrs[d].push_back(&b);
    for (auto& a : args[d]) ptrs[d].push_back(&a);
    if (!accumulate) continue;
    for (auto& g : im.g[d]) {
      if (d == 0) donate.push_back(ptrs[d].size());
      ptrs[d].push_back(&g);
    }
  }
  phase.emplace(&stats_.execute_seconds);
  std::vector<std::vector<xla::Buffer>> out = exe.execute_partitioned(ptrs, donate);
  phase.emplace(&stats_.download_seconds);
  ++stats_.executions;
  LossParts lp;
  const std::vector<xla::Buffer>& o0 = out[0];  // replicated results: device 0's copy
  lp.sum[kLossCe] = o0[0].to_host<float>()[0];
  lp.sum[kLossLmZ] = o0[1].to_host<float>()[0];
  lp.tokens = o0[2].to_host<int32_t>()[0];
  size_t r = 3;
  for (int64_t l : moe) {  // as Block::ffn_forward on the CPU
    const std::vector<float> st = o0[r++].to_host<float>();
    MoeLayerStats ms;
    ms.layer = l;
    ms.lb_loss = st[0];
    ms.router_z = st[1];
    ms.required_buffer_factor = st[2];
    ms.dropped_tokens = static_cast<int64_t>(std::lround(st[3]));  // 0 dropless
    lp.sum[kLossMoeLb] += loss.weight[kLossMoeLb] * ms.lb_loss;
    lp.sum[kLossRouterZ] += loss.weight[kLossRouterZ] * ms.router_z;
    lp.moe_layers.push_back(ms);
  }
  // split results: each device's tile back in its place, without the padding rows
  const int64_t keep = batch.B * T;
  auto gather = [&](size_t result, float* dst, int64_t width) {
    std::vector<float> all(static_cast<size_t>(B * T * width));
    for (int64_t d = 0; d < D; ++d)
      untile(out[size_t(d)][result].to_host<float>(), xo_.mesh, d, B, T, width, all);
    std::copy(all.begin(), all.begin() + keep * width, dst);
  };
  if (logits != nullptr) gather(r++, logits, config_.vocab_size);
  if (logprobs != nullptr) gather(r++, logprobs, 1);
  if (!backward) return lp;
  if (on_device) {  // the sum stays on the devices (DeviceTraining)
    im.g.clear();
    im.g.resize(size_t(D));
    for (size_t d = 0; d < size_t(D); ++d)
      im.g[d].assign(std::make_move_iterator(out[d].begin() + long(r)),
                     std::make_move_iterator(out[d].end()));
    return lp;
  }
  std::vector<std::vector<float>> g(params_.size());  // this call's gradients, added to the host's
  std::vector<float*> to;
  for (size_t i = 0; i < params_.size(); ++i) {
    g[i].resize(static_cast<size_t>(params_[i].grad.numel()));
    to.push_back(g[i].data());
  }
  for (size_t i = 0; i < im.xp.list.size(); ++i) im.fetch_param(Impl::of(out, r + i), i, to);
  for (size_t i = 0; i < params_.size(); ++i) {
    float* dst = params_[i].grad.data<float>();
    for (size_t j = 0; j < g[i].size(); ++j) dst[j] += g[i][j];
  }
  return lp;
}

// ---- DeviceTraining --------------------------------------------------------------------------------------

void XlaDecoder::upload(const std::vector<const float*>& values, const std::vector<const float*>& exp_avg,
                        const std::vector<const float*>& exp_avg_sq) {
  const size_t P = params_.size();
  OLMO_CHECK(values.size() == P && exp_avg.size() == P && exp_avg_sq.size() == P, config_.model_type_name,
             ": upload needs ", P, " tensors of values and of each moment");
  Impl& im = *impl_;
  const size_t D = size_t(xo_.devices());
  for (auto* state : {&im.p, &im.m, &im.v}) {
    state->clear();
    state->resize(D);
  }
  im.g.clear();
  for (size_t i = 0; i < im.xp.list.size(); ++i)
    for (auto [host, state] : {std::pair{&values, &im.p}, {&exp_avg, &im.m}, {&exp_avg_sq, &im.v}}) {
      std::vector<xla::Buffer> r = im.place_param(i, *host);
      for (size_t d = 0; d < D; ++d) (*state)[d].push_back(std::move(r[d]));
    }
}

void XlaDecoder::download(const std::vector<float*>& values, const std::vector<float*>& exp_avg,
                          const std::vector<float*>& exp_avg_sq) {
  Impl& im = *impl_;
  const size_t P = params_.size();
  OLMO_CHECK(!im.p.empty(), config_.model_type_name, ": download before upload (no device state)");
  OLMO_CHECK(values.size() == P && exp_avg.size() == P && exp_avg_sq.size() == P, config_.model_type_name,
             ": download needs ", P, " tensors of values and of each moment");
  for (size_t i = 0; i < im.xp.list.size(); ++i) {  // replicated: device 0's copy; split: the parts in order
    im.fetch_param(Impl::of(im.p, i), i, values);
    im.fetch_param(Impl::of(im.m, i), i, exp_avg);
    im.fetch_param(Impl::of(im.v, i), i, exp_avg_sq);
  }
}

void XlaDecoder::all_reduce_grads(const std::function<void(float* data, int64_t n)>& sum) {
  Impl& im = *impl_;
  OLMO_CHECK(!im.g.empty(), config_.model_type_name, ": all_reduce_grads with no gradient sum on the device");
  std::vector<float> host;
  for (size_t i = 0; i < im.xp.list.size(); ++i) {  // a program parameter's sum at a time (a stack whole)
    const XlaParam& p = im.xp.list[i];
    host.resize(static_cast<size_t>(numel(p)));
    im.fetch(Impl::of(im.g, i), host.data(), im.split[i]);
    sum(host.data(), static_cast<int64_t>(host.size()));
    std::vector<xla::Buffer> r = im.place(std::span<const float>(host), p.shape, im.split[i]);
    for (size_t d = 0; d < im.g.size(); ++d) im.g[d][i] = std::move(r[d]);
  }
}

double XlaDecoder::grad_norm() {
  Impl& im = *impl_;
  OLMO_CHECK(!im.g.empty(), config_.model_type_name, ": grad_norm with no gradient sum on the device");
  if (!im.norm) im.norm = compile(emit_grad_norm(im.xp.list, xo_.mesh), "norm");
  std::vector<std::vector<xla::Buffer*>> ptrs(im.g.size());
  for (size_t d = 0; d < im.g.size(); ++d)
    for (auto& g : im.g[d]) ptrs[d].push_back(&g);
  return im.norm->execute_partitioned(ptrs)[0][0].to_host<float>()[0];
}

void XlaDecoder::clip_and_step(const AdamWConfig& cfg, double max_norm, int64_t step) {
  Impl& im = *impl_;
  OLMO_CHECK(!im.g.empty(), config_.model_type_name, ": clip_and_step with no gradient sum on the device");
  const UpdateKey key{cfg.beta1, cfg.beta2, cfg.eps, max_norm};
  auto it = im.updates.find(key);
  if (it == im.updates.end()) {
    it = im.updates.emplace(key, compile(emit_update(im.xp.list, key, xo_.mesh), "update")).first;
  }
  xla::ops::AdamWOptions o;
  o.lr = cfg.lr;
  o.beta1 = cfg.beta1, o.beta2 = cfg.beta2, o.eps = cfg.eps, o.weight_decay = cfg.weight_decay;
  const std::array<float, 3> sc = xla::ops::adamw_scalars(o, step);
  const size_t P = im.xp.list.size(), D = im.p.size();
  std::vector<xla::Buffer> scalars = im.place(std::span<const float>(sc.data(), 3), {3});
  std::vector<std::vector<xla::Buffer*>> ptrs(D);
  std::vector<size_t> donate;
  for (size_t d = 0; d < D; ++d) {
    for (auto* group : {&im.p[d], &im.g[d], &im.m[d], &im.v[d]})
      for (auto& b : *group) {
        if (d == 0 && group != &im.g[d]) donate.push_back(ptrs[d].size());
        ptrs[d].push_back(&b);
      }
    ptrs[d].push_back(&scalars[d]);
  }
  std::vector<std::vector<xla::Buffer>> out = it->second.execute_partitioned(ptrs, donate);
  im.g.clear();  // consumed: the next step starts a new sum
  for (size_t d = 0; d < D; ++d)
    for (size_t i = 0; i < P; ++i) {
      im.p[d][i] = std::move(out[d][i]);
      im.m[d][i] = std::move(out[d][P + i]);
      im.v[d][i] = std::move(out[d][2 * P + i]);
    }
}

LossParts XlaDecoder::forward_backward(const Batch& batch, const LossConfig& loss, double grad_scale,
                                       double aux_scale) {
  OLMO_CHECK(batch.targets != nullptr, config_.model_type_name, ": forward_backward needs targets");
  OLMO_CHECK(std::isfinite(grad_scale), config_.model_type_name, ": grad_scale must be finite, got ",
             grad_scale);
  OLMO_CHECK(std::isfinite(aux_scale), config_.model_type_name, ": aux_scale must be finite, got ",
             aux_scale);
  return run(batch, loss, grad_scale, aux_scale, true, nullptr, nullptr);
}

LossParts XlaDecoder::forward(const Batch& batch, const LossConfig& loss, float* logits, float* logprobs) {
  return run(batch, loss, 1.0, 1.0, false, logits, logprobs);
}

std::unique_ptr<CausalLM> make_xla_decoder(const ModelConfig& c, const XlaOptions& xo, uint64_t seed,
                                           const DecoderOptions& opts) {
  auto m = std::make_unique<XlaDecoder>(c, xo, opts);
  init_params(m->params(), c, seed);
  return m;
}

}  // namespace olmosft::model
