// The decoder on XLA (see decoder_xla.h): the layer list emitted as one StableHLO program per batch shape.
#include "model/decoder_xla.h"

#include <chrono>
#include <cmath>
#include <cstring>
#include <map>
#include <tuple>

#include "core/error.h"
#include "model/decoder_units.h"
#include "model/layers.h"
#include "model/params.h"
#include "model/unit_emit.h"
#include "xla/hlo_builder.h"
#include "xla/ops_dense.h"
#include "xla/pjrt.h"

namespace olmosft::model {

namespace {

using xla::ElementType;
using xla::TensorType;
using xla::Value;

// What one compiled program is for: the batch shape, the kind of call and the loss settings that are
// constants of the graph (grad_scale is an argument).
struct StepKey {
  int64_t B = 0, T = 0;
  bool backward = false, logits = false, logprobs = false;
  double lm_z = 0;
  int64_t vocab_tile = 0;
  auto operator<=>(const StepKey&) const = default;
};

StepKey step_key(int64_t B, int64_t T, const LossConfig& loss, bool backward, bool logits, bool logprobs) {
  return StepKey{B, T, backward, logits, logprobs, loss.weight[kLossLmZ], loss.vocab_tile};
}

bool uses_ssmax(const ModelConfig& c) { return c.scalable_softmax; }

// The program's arguments after the parameters (registry order), in this order.
struct BatchArgs {
  std::optional<Value> tokens, seg, pos, logpos, targets, mask, scale;
};

BatchArgs batch_arguments(xla::HloBuilder& b, const ModelConfig& c, const StepKey& k) {
  const int64_t N = k.B * k.T;
  BatchArgs a;
  a.tokens = b.argument(TensorType{ElementType::kS32, {N}});
  a.seg = b.argument(TensorType{ElementType::kS32, {k.B, k.T}});
  a.pos = b.argument(TensorType{ElementType::kS32, {N}});
  if (uses_ssmax(c)) a.logpos = b.argument(TensorType{ElementType::kF32, {N}});
  a.targets = b.argument(TensorType{ElementType::kS32, {N}});
  a.mask = b.argument(TensorType{ElementType::kS32, {N}});
  if (k.backward) a.scale = b.argument(TensorType{ElementType::kF32, {}});
  return a;
}

// The whole step as one program: results ce_sum, z_sum, count, [logits], [logprobs], then with the
// backward one gradient per parameter (registry order).
std::string emit_step(const ModelConfig& c, const DecoderUnits& u, const XlaOptions& xo,
                      const LossConfig& loss, const StepKey& k) {
  xla::HloBuilder b("olmosft_step");
  const std::vector<ParamSpec> reg = param_registry(c);
  std::vector<Value> w;
  for (const ParamSpec& p : reg) w.push_back(b.argument(TensorType{ElementType::kF32, p.shape}));
  const BatchArgs a = batch_arguments(b, c, k);
  unit::Emit e(b, c, loss, w, k.B, k.T);
  if (k.backward) e.g.resize(reg.size());
  e.tokens = a.tokens;
  e.seg = a.seg;
  e.logpos = a.logpos;
  e.operands = xo.bf16 ? xla::ops::Operands::kBF16 : xla::ops::Operands::kF32;
  e.attention_block = xo.attention_block;
  if (uses_rope(u.layers))
    for (int r : {static_cast<int>(RopeKind::Full), static_cast<int>(RopeKind::Sliding)})
      e.rope[r] = xla::ops::rope_tables(b, *a.pos, xla::ops::rope_inv_freq_constant(b, u.rope[r].inv_freq),
                                        u.rope[r].attention_scaling, xo.f64_trig);
  unit::EmbeddingUnit::Emitted se;
  std::vector<Value> h{u.embed.emit_forward(e, se)};  // h[l]: layer l's input; h[L]: the final norm's
  std::vector<unit::Block::Emitted> saved(u.blocks.size());
  for (size_t l = 0; l < u.blocks.size(); ++l) h.push_back(u.blocks[l].emit_forward(e, h[l], saved[l]));
  unit::LmHeadUnit::Emitted sh;
  const xla::ops::XentForward xf = u.head.emit_forward(e, h.back(), *a.targets, *a.mask, sh);
  std::vector<Value> results{xf.ce_sum, xf.z_sum, xf.count};
  if (k.logits) results.push_back(u.head.emit_logits(e, sh));
  if (k.logprobs) results.push_back(u.head.emit_logprobs(e, sh));
  if (k.backward) {
    Value dh = u.head.emit_backward(e, h.back(), sh, *a.scale);
    for (size_t l = u.blocks.size(); l-- > 0;) dh = u.blocks[l].emit_backward(e, h[l], saved[l], dh);
    u.embed.emit_backward(e, se, dh);
    for (size_t i = 0; i < reg.size(); ++i)
      results.push_back(e.g[i] ? *e.g[i] : b.constant(w[i].type(), 0.0));
  }
  b.returns(results);
  return b.module();
}

// The host arrays of one call, in BatchArgs order.
struct HostBatch {
  std::vector<int32_t> tokens, seg, pos, targets, mask;
  std::vector<float> logpos;
  std::vector<uint8_t> valid;
};

HostBatch host_batch(const ModelConfig& c, const DecoderOptions& o, const Batch& b) {
  const size_t N = static_cast<size_t>(b.B * b.T);
  HostBatch h;
  h.tokens.assign(b.tokens, b.tokens + N);
  h.seg.resize(N);
  h.pos.resize(N);
  h.valid.resize(N);
  h.logpos.resize(N);
  batch_token_arrays(c, o, b, h.seg.data(), h.valid.data(), h.pos.data(), h.logpos.data());
  std::vector<uint8_t> mask(N);
  h.targets.resize(N);
  unit::LmHeadUnit::trained_targets(c, b, h.valid.data(), h.targets.data(), mask.data());
  h.mask.assign(mask.begin(), mask.end());
  // the graph gathers the target's row (logprobs): an untrained position's id must be in range
  for (size_t i = 0; i < N; ++i)
    if (h.mask[i] == 0) h.targets[i] = 0;
  return h;
}

// Adds the seconds from its construction to its destruction to *acc (XlaRunStats' timing fields).
struct AddSeconds {
  double* acc;
  std::chrono::steady_clock::time_point t0 = std::chrono::steady_clock::now();
  ~AddSeconds() { *acc += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); }
};

}  // namespace

struct XlaDecoder::Impl {
  DecoderUnits units;
  xla::Client client;
  std::map<StepKey, xla::Executable> programs;
  Impl(const ModelConfig& c, const DecoderOptions& o, const XlaOptions& xo)
      : units(c, o), client(xla::Client::create(xo.plugin, client_options(xo))) {}
  static xla::ClientOptions client_options(const XlaOptions& xo) {
    xla::ClientOptions co;
    if (xo.plugin == "cpu") co.cpu_device_count = xo.cpu_devices;
    return co;
  }
};

XlaDecoder::XlaDecoder(const ModelConfig& c, const XlaOptions& xo, const DecoderOptions& opts)
    : config_(c), opts_(opts), xo_(xo) {
  check_supported(c);
  for (const LayerSpec& s : layer_specs(c)) unit::Block::check_emits(c, s);
  OLMO_CHECK(xo.attention_block > 0, "xla: attention_block must be > 0, got ", xo.attention_block);
  OLMO_CHECK(xo.cpu_devices > 0, "xla.cpu_devices must be > 0, got ", xo.cpu_devices);
  params_ = allocate_params(c);
  impl_ = std::make_unique<Impl>(c, opts, xo);
}

XlaDecoder::~XlaDecoder() = default;

std::string XlaDecoder::platform() const { return impl_->client.platform_name(); }
size_t XlaDecoder::device_count() const { return impl_->client.device_count(); }

std::string xla_step_module(const ModelConfig& c, const XlaOptions& xo, int64_t B, int64_t T,
                            const LossConfig& loss, bool backward, bool logits, bool logprobs) {
  check_supported(c);
  for (const LayerSpec& s : layer_specs(c)) unit::Block::check_emits(c, s);
  OLMO_CHECK(B > 0 && T > 0, c.model_type_name, ": batch must have B > 0 and T > 0 (got B=", B, ", T=", T,
             ")");
  const DecoderUnits units(c, DecoderOptions{});
  return emit_step(c, units, xo, loss, step_key(B, T, loss, backward, logits, logprobs));
}

LossParts XlaDecoder::run(const Batch& batch, const LossConfig& loss, double grad_scale, bool backward,
                          float* logits, float* logprobs) {
  const std::string& who = config_.model_type_name;
  OLMO_CHECK(batch.B > 0 && batch.T > 0, who, ": batch must have B > 0 and T > 0 (got B=", batch.B,
             ", T=", batch.T, ")");
  OLMO_CHECK(batch.tokens != nullptr, who, ": batch has no tokens");
  const HostBatch hb = host_batch(config_, opts_, batch);
  const StepKey key = step_key(batch.B, batch.T, loss, backward, logits != nullptr, logprobs != nullptr);
  auto it = impl_->programs.find(key);
  if (it == impl_->programs.end()) {
    const auto t0 = std::chrono::steady_clock::now();
    const std::string text = emit_step(config_, impl_->units, xo_, loss, key);
    it = impl_->programs.emplace(key, impl_->client.compile(text)).first;
    stats_.compile_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    stats_.module_bytes = text.size();
    ++stats_.compiles;
  }
  std::optional<AddSeconds> phase{std::in_place, &stats_.upload_seconds};  // upload, execute, download
  const xla::Client& cl = impl_->client;
  std::vector<xla::Buffer> args;
  for (const Param& p : params_) {
    OLMO_CHECK(p.value.defined(), who, ": the XLA backend needs every parameter on this process; ", p.name,
               " is not (dist.mode zero3 is not supported with device: xla)");
    args.push_back(cl.to_device(std::span<const float>(p.value.data<float>(), size_t(p.value.numel())),
                                p.value.shape()));
  }
  const int64_t N = batch.B * batch.T;
  args.push_back(cl.to_device(std::span<const int32_t>(hb.tokens), {N}));
  args.push_back(cl.to_device(std::span<const int32_t>(hb.seg), {batch.B, batch.T}));
  args.push_back(cl.to_device(std::span<const int32_t>(hb.pos), {N}));
  if (uses_ssmax(config_)) args.push_back(cl.to_device(std::span<const float>(hb.logpos), {N}));
  args.push_back(cl.to_device(std::span<const int32_t>(hb.targets), {N}));
  args.push_back(cl.to_device(std::span<const int32_t>(hb.mask), {N}));
  const float scale = static_cast<float>(grad_scale);
  if (backward) args.push_back(cl.to_device(std::span<const float>(&scale, 1), {}));
  std::vector<xla::Buffer*> ptrs;
  for (auto& a : args) ptrs.push_back(&a);
  phase.emplace(&stats_.execute_seconds);
  std::vector<xla::Buffer> out = it->second.execute(ptrs);
  phase.emplace(&stats_.download_seconds);
  ++stats_.executions;
  LossParts lp;
  lp.sum[kLossCe] = out[0].to_host<float>()[0];
  lp.sum[kLossLmZ] = out[1].to_host<float>()[0];
  lp.tokens = out[2].to_host<int32_t>()[0];
  size_t r = 3;
  if (logits != nullptr) out[r++].to_host(logits, size_t(N * config_.vocab_size) * sizeof(float));
  if (logprobs != nullptr) out[r++].to_host(logprobs, size_t(N) * sizeof(float));
  if (!backward) return lp;
  for (Param& p : params_) {
    const std::vector<float> g = out[r++].to_host<float>();
    float* dst = p.grad.data<float>();
    for (size_t j = 0; j < g.size(); ++j) dst[j] += g[j];
  }
  return lp;
}

LossParts XlaDecoder::forward_backward(const Batch& batch, const LossConfig& loss, double grad_scale,
                                       double /*aux_scale: no MoE layer is emitted*/) {
  OLMO_CHECK(batch.targets != nullptr, config_.model_type_name, ": forward_backward needs targets");
  OLMO_CHECK(std::isfinite(grad_scale), config_.model_type_name, ": grad_scale must be finite, got ",
             grad_scale);
  return run(batch, loss, grad_scale, true, nullptr, nullptr);
}

LossParts XlaDecoder::forward(const Batch& batch, const LossConfig& loss, float* logits, float* logprobs) {
  return run(batch, loss, 1.0, false, logits, logprobs);
}

std::unique_ptr<CausalLM> make_xla_decoder(const ModelConfig& c, const XlaOptions& xo, uint64_t seed,
                                           const DecoderOptions& opts) {
  auto m = std::make_unique<XlaDecoder>(c, xo, opts);
  init_params(m->params(), c, seed);
  return m;
}

}  // namespace olmosft::model
