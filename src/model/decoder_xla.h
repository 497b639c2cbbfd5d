// The decoder on XLA (recipe `device: xla`, docs/xla.md "The decoder on XLA"): the same layer list and the
// same units as Decoder (model/decoder_units.h), each EMITTING its forward and backward as StableHLO
// (model/unit_emit.h) into one program per batch shape, compiled once by a PJRT plugin (xla/pjrt.h: XLA's
// CPU plugin in `make test`, its CUDA plugin, libtpu) and run on every call. Parameters are fp32 masters in
// registry order, as for the CPU backend, so checkpoints and the export are the same files (the programs take
// them as model/xla_params.h's list: a MoE layer's experts stacked per projection). The trainer keeps
// parameters, gradient sums and AdamW moments on the device between steps (DeviceTraining, below); used on
// its own, each call copies the parameters in and adds the program's gradients into Param::grad.
//
// Emitted today: every layer of Olmo 3 (softmax attention with RoPE / YaRN, sliding windows, GQA, q/k norms,
// SwiGLU, post-norm) and the hybrid's attention features (per-head q/k norms, scalable softmax, the output
// gate, peri-LN, the embedding norm) and the latent MoE FFN (dense form: every expert on every token,
// weighted by its routing weight; dropless only, a moe.buffer_factor capacity is refused) and KDA (the
// token-by-token recurrence): every layer of the hybrid. A unit without an Emitted type would be refused
// at construction, naming the layer (Block::check_emits).
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "model/decoder.h"
#include "model/memory_policy.h"
#include "model/model.h"
#include "xla/mesh.h"

namespace olmosft::xla {
class Buffer;
class Executable;
}  // namespace olmosft::xla

namespace olmosft::model {

enum class XlaAttention { kBlockwise, kCudnn };
// "blockwise" | "cudnn"; WHERE names the key or flag in the error.
XlaAttention parse_xla_attention(const std::string& text, const std::string& where);
const char* xla_attention_name(XlaAttention a);

struct XlaOptions {
  std::string plugin = "cpu";  // xla.plugin: cpu | cuda | tpu | a plugin path (xla/pjrt.h Plugin::load)
  int64_t cpu_devices = 1;     // devices XLA's CPU plugin creates (at least `devices`); CPU only
  // The device mesh every program runs on as one SPMD program (XLA's partitioner; recipe mesh.*, or
  // xla.devices / xla.shard_params as {data: N} / {fsdp: N}; xla/mesh.h, docs/xla.md "The device mesh"):
  // each micro-batch's rows split over data x fsdp, each row's tokens over expert x context (context
  // parallelism: attention gathers a row's keys and values from its pieces), parameters, gradient sums and
  // moments split over fsdp x expert x context along their first evenly dividing dimension (replicated over
  // data). One device: {}. Sums are not bit-identical to one device's.
  xla::Mesh mesh;
  int64_t devices() const { return mesh.devices(); }
  // model.remat (none | attn | full; unit_emit.h Emit::remat): what the backward re-emits instead of
  // reading the forward's values. XlaDecoder::set_memory_policy sets it.
  Remat remat = Remat::None;
  // xla.scan_layers: the layers emitted once per repeating group as a loop over stacked weights (program
  // size and compile time flat in depth; model/layer_pass.h); needs remat full.
  bool scan_layers = false;
  bool bf16 = false;             // bf16 operands in every GEMM with f32 accumulation (compute.dtype bf16)
  int64_t attention_block = 64;  // queries / keys per block of the blockwise attention
  // xla.delta_chunk: KDA / Gated DeltaNet's chunked delta rule, tokens per chunk (unit_emit.h
  // Emit::delta_chunk); 0: the token-by-token recurrence.
  int64_t delta_chunk = 64;
  // xla.attention: the blockwise attention every plugin runs (segments, padding, windows), or cuDNN's fused
  // attention (xla/ops_attention_cudnn.h: CUDA plugin only, bf16 operands; rows of several documents take its
  // packed form, cudnn_segments).
  XlaAttention attention = XlaAttention::kBlockwise;
  // RoPE's cos / sin evaluated in f64 and rounded once, as the CPU kernels (bit-exact tables); false for
  // devices without f64 (TPU): f32 trigonometry, about 1e-7 relative.
  bool f64_trig = true;
  // xla.memory_limit_gib: the bytes per device each compiled program plus the AdamW moments resident beside
  // it must fit; a program that does not is refused after its compile, before it runs (the compiled figure
  // is the truth, not the planner's). 0: the device's limit (xla::Client::device_memory_limit; none on
  // XLA's CPU plugin: no check).
  int64_t memory_limit_bytes = 0;
};

// The StableHLO text of one step for a [B, T] batch of config C: what XlaDecoder compiles (forward, and the
// backward when BACKWARD; logits [N, V] and log-probs [N] outputs when asked). Needs no plugin: the
// ahead-of-time compile for a topology (xla/pjrt.h) and the tests read it. Arguments and results:
// docs/xla.md "The decoder on XLA". Throws like XlaDecoder's constructor for a layer it does not emit.
// CUDNN_SEGMENTS: cuDNN's packed attention form with that M (cudnn_segments of the batch; xla.attention
// cudnn).
std::string xla_step_module(const ModelConfig& c, const XlaOptions& xo, int64_t B, int64_t T,
                            const LossConfig& loss, bool backward, bool logits = false, bool logprobs = false,
                            int64_t cudnn_segments = 0);

// What the run's MoE capacity needs of XO's mesh, refused before anything is loaded (the trainer's build
// step): with moe.buffer_factor BF > 0 over several devices the experts split over them (moe_mesh_emit.h),
// so no data replicas and E a multiple of the devices. A dense model or one device: nothing to check.
void check_moe_capacity_mesh(const ModelConfig& c, const XlaOptions& xo, double bf);

// What the backend did so far (tests, logs).
struct XlaRunStats {
  int64_t compiles = 0;  // programs compiled (per batch shape and kind of call; the norm and update ones)
  double compile_seconds = 0;
  int64_t executions = 0;
  size_t module_bytes = 0;  // StableHLO text of the last program compiled
  // Where the executions' time went (seconds, summed over the calls; bench_train --backend xla): the batch
  // arrays and the parameters copied to the device, the program run (execute and wait), the results copied
  // back and the gradients added into Param::grad.
  double upload_seconds = 0, execute_seconds = 0, download_seconds = 0;
};

// One program the backend compiled (XlaDecoder::on_compile): what for (kind "step" (forward + backward) or
// "forward" with its batch shape, "norm" or "update"), the compile seconds and XLA's memory statistics per
// device (xla::MemoryStats; all 0 where the plugin reports none).
struct XlaCompiled {
  std::string kind;
  int64_t B = 0, T = 0;
  double seconds = 0;
  int64_t argument_bytes = 0, output_bytes = 0, alias_bytes = 0, temp_bytes = 0, total_bytes = 0;
};

struct StepKey;  // decoder_xla.cpp: what one compiled step program is for

// A step program with the names and types of its arguments and results, in order: the parameters
// (model/xla_params.h: HF names in registry order, a MoE layer's experts one stack per projection), tokens,
// segments, positions, [logpos], targets, mask, [cudnn_seqlen, cudnn_offsets: cuDNN's packed form,
// xla::ops::cudnn_packed_rows], grad_scale, [aux_scale: MoE models]; results ce_sum, z_sum, count,
// [moe_stats.<layer> per MoE layer], grad.<HF name>... For running the exact program elsewhere
// (scripts/accel-check.sh).
struct XlaStepTensor {
  std::string name;
  std::string dtype;  // "f32" or "s32"
  std::vector<int64_t> dims;
};
struct XlaStepProgram {
  std::string text;
  std::vector<XlaStepTensor> arguments, results;
};
// The forward + backward step (no logits, no gradient sums as arguments).
XlaStepProgram xla_step_program(const ModelConfig& c, const XlaOptions& xo, int64_t B, int64_t T,
                                const LossConfig& loss, int64_t cudnn_segments = 0);

// The batch arguments of a step program (tokens, segments, positions, logpos, targets, mask), derived from a
// batch as on the CPU backend: batch_token_arrays' segments, positions and log-positions and
// LmHeadUnit::trained_targets' mask, with the targets 0 where untrained (the program gathers the target's
// row: an id in range, masked). Throws as they do on a bad batch (token ids, segment layout, targets).
struct XlaStepBatch {
  std::vector<int32_t> tokens, seg, pos, targets, mask;
  std::vector<float> logpos;
};
XlaStepBatch xla_step_batch(const ModelConfig& c, const DecoderOptions& o, const Batch& b);
// Which form of cuDNN's fused attention (XlaAttention::kCudnn) a batch's SEG ([B, T], -1 = padding) takes:
// 0 when every row is one document from its first token then padding (or only padding): the plain causal
// form; otherwise the packed form's M, the most documents in a row rounded up to a power of two (>= 2), so
// that few programs are compiled. Throws naming the row and token where a document id starts a second run.
int64_t cudnn_segments(const std::vector<int32_t>& seg, int64_t B, int64_t T);

class XlaDecoder : public CausalLM, public DeviceTraining {
 public:
  // Loads the plugin and creates its client; throws naming the config field when a layer is not emitted
  // or the decoder does not support the config (layers.h).
  XlaDecoder(const ModelConfig& c, const XlaOptions& xo, const DecoderOptions& opts = {});
  ~XlaDecoder() override;
  const ModelConfig& config() const override { return config_; }
  std::vector<Param>& params() override { return params_; }
  LossParts forward_backward(const Batch& batch, const LossConfig& loss, double grad_scale,
                             double aux_scale) override;
  // logits: a [N, vocab] output of the program (small inputs only, as for the CPU backend).
  LossParts forward(const Batch& batch, const LossConfig& loss, float* logits, float* logprobs) override;
  // model.remat (XlaOptions::remat: a program per policy); model.saved_dtype bf16 is not emitted (false).
  bool set_memory_policy(const MemoryPolicy& policy) override;
  // Parameters, the step's gradient sum and the AdamW moments on the device (model.h DeviceTraining): the
  // trainer's path with one process. Before upload(), every call copies the host's parameters in and adds
  // the gradients into Param::grad.
  DeviceTraining* device_training() override { return this; }
  void upload(const std::vector<const float*>& values, const std::vector<const float*>& exp_avg,
              const std::vector<const float*>& exp_avg_sq) override;
  void download(const std::vector<float*>& values, const std::vector<float*>& exp_avg,
                const std::vector<float*>& exp_avg_sq) override;
  // Downloads each gradient sum, sums it across processes and uploads the result (once per step).
  void all_reduce_grads(const std::function<void(float* data, int64_t n)>& sum) override;
  double grad_norm() override;
  // The update program: clip (ops::clip_grad_norm, the norm in f32) + AdamW (ops::adamw_update) with the
  // parameters and moments donated; compiled once per (betas, eps, max_norm), the LR and step an argument.
  void clip_and_step(const AdamWConfig& cfg, double max_norm, int64_t step) override;
  const XlaRunStats& stats() const { return stats_; }
  // Called after each compile, before the program first runs (the trainer logs an XLA-PROGRAM line).
  void on_compile(std::function<void(const XlaCompiled&)> f) { on_compile_ = std::move(f); }
  const XlaOptions& xla_options() const { return xo_; }
  std::string platform() const;  // the plugin's platform name (cpu, cuda, tpu)
  size_t device_count() const;   // its addressable devices

 private:
  struct Impl;
  xla::Executable& program(const StepKey& key, const LossConfig& loss);  // compiled once per key
  // Counted in stats_, reported to on_compile_ as KIND with its batch shape B x T.
  xla::Executable compile(const std::string& text, const char* kind, int64_t B = 0, int64_t T = 0);
  // Refuses C (throws "DOES NOT FIT (compiled): ...") when its total bytes plus the device's AdamW moments
  // exceed XlaOptions::memory_limit_bytes or the device's limit.
  void check_fits(const XlaCompiled& c) const;
  LossParts run(const Batch& batch, const LossConfig& loss, double grad_scale, double aux_scale,
                bool backward, float* logits, float* logprobs);
  std::vector<std::vector<xla::Buffer>> batch_buffers(const XlaStepBatch& hb, int64_t B, int64_t T, int64_t M,
                                                      bool backward, double grad_scale,
                                                      double aux_scale) const;
  ModelConfig config_;
  DecoderOptions opts_;
  XlaOptions xo_;
  std::vector<Param> params_;
  XlaRunStats stats_;
  std::function<void(const XlaCompiled&)> on_compile_;
  std::unique_ptr<Impl> impl_;
};

// An XlaDecoder with make_decoder's initialisation (init_params).
std::unique_ptr<CausalLM> make_xla_decoder(const ModelConfig& c, const XlaOptions& xo, uint64_t seed = 0,
                                           const DecoderOptions& opts = {});

}  // namespace olmosft::model
