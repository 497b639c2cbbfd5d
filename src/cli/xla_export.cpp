// `olmosft xla export --config CONFIG|--model HF_DIR --seq T --out DIR [...]`: writes one training step of a
// model as the exact StableHLO program the XLA backend compiles (model::xla_step_program), with a manifest
// of its arguments and results, so that a machine without this build's libraries (a lent GPU, a TPU VM) can
// compile and time the same program with the runtime alone (tests/xla-accel: xla_step_run; docs/xla.md
// "Running an exported step"). With --model the parameters are the directory's weights (files), with
// --batch-file the batch is the file's; with --expect the step is run here on XLA's CPU plugin and its
// results are written as the expected ones.
//
// DIR/step.mlir, DIR/config.json (the model's), DIR/manifest.txt, DIR/data/*.bin (raw little-endian f32 /
// s32, row-major). Manifest lines:
//   olmosft-xla-step 1
//   model <model_type> layers <L> hidden <d> vocab <V>      B <B> T <T> bf16 <0|1>
//   flops <model FLOPs of the step, train/flops.h>
//   arg <name> <f32|s32> <dims, comma-separated, or -> file <path> | const <v> |
//       randint <hi> <seed> | iota_mod <T> | uniform_std <std> <seed> (uniform with that standard deviation:
//       random weights for timing, fast to make)
//   result <name> <f32|s32> <dims or -> [expect <path> <tolerance>]
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <sstream>

#include "cli/verb.h"
#include "core/error.h"
#include "io/atomic_file.h"
#include "io/json.h"
#include "io/safetensors.h"
#include "model/config.h"
#include "model/decoder_xla.h"
#include "model/hf_dir.h"
#include "train/flops.h"
#include "xla/ops_attention_cudnn.h"
#include "xla/pjrt.h"

namespace {

namespace fs = std::filesystem;
using olmosft::model::XlaStepProgram;
using olmosft::model::XlaStepTensor;

struct Args {
  std::string config, model, batch_file, out, attention = "blockwise";
  int64_t batch = 1, seq = 0, layers = 0, vocab_tile = 4096, block = 0, docs = 1, delta_chunk = 64;
  double lm_z = 1e-4;
  bool bf16 = false, expect = false, f32_trig = false;
};

std::string dims_text(const std::vector<int64_t>& d) {
  if (d.empty()) return "-";
  std::string s;
  for (size_t i = 0; i < d.size(); ++i) s += (i ? "," : "") + std::to_string(d[i]);
  return s;
}

int64_t numel(const std::vector<int64_t>& d) {
  int64_t n = 1;
  for (int64_t x : d) n *= x;
  return n;
}

// The batch arguments: from the file's arrays (input_ids, segment_ids, position_ids, targets, loss_mask as
// the fixtures write them), derived and checked as XlaDecoder does (model::xla_step_batch); without a file,
// --docs-per-row documents of equal length per row of generated tokens (the manifest's ids; segments and
// positions as files when a row holds several documents), of which only the segments, positions and
// log-positions are computed here. With --attention cudnn, the packed form's arrays when the rows need it.
struct BatchArrays {
  olmosft::model::XlaStepBatch b;
  bool from_file = false;
  int64_t cudnn_segments = 0;  // model::cudnn_segments (0: the plain form or blockwise attention)
  olmosft::xla::ops::CudnnPackedRows cudnn;
};

BatchArrays read_batch(const Args& a, const olmosft::model::ModelConfig& m) {
  const int64_t N = a.batch * a.seq;
  std::vector<int32_t> tokens(size_t(N), 0), seg(size_t(N), 0), pos, targets(size_t(N), 0);
  std::vector<uint8_t> trained(size_t(N), 1);
  BatchArrays out;
  if (!a.batch_file.empty()) {
    auto r = olmosft::safetensors::Reader::open(a.batch_file);
    auto ints = [&](const char* name) {
      olmosft::Tensor t = r->copy(name);
      OLMO_CHECK(t.numel() == N, a.batch_file, ": ", name, " has ", t.numel(),
                 " elements, expected B x T = ", N);
      std::vector<int32_t> v(static_cast<size_t>(N));
      for (int64_t i = 0; i < N; ++i)
        v[size_t(i)] = t.dtype() == olmosft::DType::U8 ? t.data<uint8_t>()[i] : t.data<int32_t>()[i];
      return v;
    };
    tokens = ints("input_ids");
    seg = ints("segment_ids");
    pos = ints("position_ids");
    targets = ints("targets");
    const std::vector<int32_t> mask = ints("loss_mask");
    trained.assign(mask.begin(), mask.end());
    out.from_file = true;
  } else {
    for (int64_t i = 0; i < N; ++i) seg[size_t(i)] = int32_t((i % a.seq) / (a.seq / a.docs));
  }
  const olmosft::model::Batch b{
      a.batch,        a.seq,         tokens.data(), seg.data(), pos.empty() ? nullptr : pos.data(),
      targets.data(), trained.data()};
  try {
    out.b = olmosft::model::xla_step_batch(m, olmosft::model::DecoderOptions{}, b);
  } catch (const olmosft::Error& e) {  // a bad batch file: name it
    throw olmosft::Error(a.batch_file + ": " + e.what());
  }
  if (a.attention == "cudnn") {
    out.cudnn_segments = olmosft::model::cudnn_segments(out.b.seg, a.batch, a.seq);
    if (out.cudnn_segments > 0)
      out.cudnn = olmosft::xla::ops::cudnn_packed_rows(out.b.seg.data(), a.batch, a.seq, out.cudnn_segments);
  }
  return out;
}

template <typename T>
void write_raw(const fs::path& p, const T* data, int64_t n) {
  olmosft::io::write_file_atomic(p.string(),
                                 std::string(reinterpret_cast<const char*>(data), size_t(n) * sizeof(T)));
}

// The manifest's `arg` lines and data files; `host` receives every argument's bytes when the step is also run
// here (--expect).
std::string argument_lines(const Args& a, const olmosft::model::ModelConfig& m, const XlaStepProgram& p,
                           const BatchArrays& ba, const fs::path& dir, std::vector<std::vector<char>>* host) {
  std::ostringstream os;
  const olmosft::model::XlaStepBatch& hb = ba.b;
  std::unique_ptr<olmosft::model::HfModel> weights;
  if (!a.model.empty())
    weights = std::make_unique<olmosft::model::HfModel>(olmosft::model::load_hf_dir(a.model));
  const int64_t N = a.batch * a.seq;
  int seed = 0;
  for (const XlaStepTensor& t : p.arguments) {
    os << "arg " << t.name << " " << t.dtype << " " << dims_text(t.dims) << " ";
    const std::string file = "data/arg." + t.name + ".bin";
    auto store = [&](const auto* v, int64_t n) {
      write_raw(dir / file, v, n);
      os << "file " << file;
      if (host) host->emplace_back(reinterpret_cast<const char*>(v), reinterpret_cast<const char*>(v + n));
    };
    const std::map<std::string, const std::vector<int32_t>*> batch{{"tokens", &hb.tokens},
                                                                   {"segments", &hb.seg},
                                                                   {"positions", &hb.pos},
                                                                   {"targets", &hb.targets},
                                                                   {"mask", &hb.mask}};
    ++seed;
    if (weights && weights->tensors.count(t.name) != 0) {
      std::vector<float> w(size_t(numel(t.dims)));
      weights->read_f32(t.name, 0, int64_t(w.size()), w.data());  // fp32 whatever the stored dtype
      store(w.data(), int64_t(w.size()));
    } else if (auto it = batch.find(t.name);
               it != batch.end() && (ba.from_file || (a.docs > 1 && it->second != &hb.tokens &&
                                                      it->second != &hb.targets && it->second != &hb.mask))) {
      store(it->second->data(), N);
    } else if (t.name == "cudnn_seqlen") {
      store(ba.cudnn.seqlen.data(), int64_t(ba.cudnn.seqlen.size()));
    } else if (t.name == "cudnn_offsets") {
      store(ba.cudnn.offsets.data(), int64_t(ba.cudnn.offsets.size()));
    } else if (t.name == "logpos") {  // from the file's batch, or the generated one's positions
      store(hb.logpos.data(), N);
    } else if (t.name == "grad_scale") {
      int64_t trained = 0;
      for (int32_t x : hb.mask) trained += x;
      const float s = 1.0f / float(ba.from_file ? std::max<int64_t>(trained, 1) : N);
      store(&s, 1);
    } else if (t.name == "aux_scale") {  // MoE models: the auxiliary losses' gradients unscaled
      const float s = 1.0f;
      store(&s, 1);
    } else if (t.name == "tokens" || t.name == "targets") {
      os << "randint " << m.vocab_size << " " << seed;
    } else if (t.name == "segments") {
      os << "const 0";
    } else if (t.name == "positions") {
      os << "iota_mod " << a.seq;
    } else if (t.name == "mask") {
      os << "const 1";
    } else if (t.name.ends_with("norm.weight") || t.name.ends_with("ssmax_scale")) {
      os << "const 1";
    } else {
      OLMO_CHECK(!host, "xla export: --expect needs every argument from files (--model and --batch-file); ",
                 t.name, " would be random");
      os << "uniform_std " << m.initializer_range << " " << seed;
    }
    os << "\n";
  }
  return os.str();
}

// Runs the program here on XLA's CPU plugin and writes its results as the expected ones.
std::string expected_lines(const XlaStepProgram& p, const std::vector<std::vector<char>>& host,
                           const fs::path& dir) {
  auto client = olmosft::xla::Client::create("cpu", olmosft::xla::ClientOptions{.cpu_device_count = 1});
  auto exe = client.compile(p.text);
  std::vector<olmosft::xla::Buffer> args;
  for (size_t i = 0; i < p.arguments.size(); ++i) {
    const auto& t = p.arguments[i];
    const olmosft::xla::TensorType type{
        t.dtype == "s32" ? olmosft::xla::ElementType::kS32 : olmosft::xla::ElementType::kF32, t.dims};
    args.push_back(client.to_device(host[i].data(), type));
  }
  std::vector<olmosft::xla::Buffer*> ptrs;
  for (auto& b : args) ptrs.push_back(&b);
  std::vector<olmosft::xla::Buffer> out = exe.execute(ptrs);
  std::ostringstream os;
  for (size_t i = 0; i < p.results.size(); ++i) {
    const auto& t = p.results[i];
    const std::string file = "data/expect." + t.name + ".bin";
    std::string bytes(out[i].type().bytes(), '\0');
    out[i].to_host(bytes.data(), bytes.size());
    olmosft::io::write_file_atomic((dir / file).string(), bytes);
    // counts exactly; sums and gradients within 1e-5 of the tensor's largest value: two devices running the
    // same f32 program in their own summation orders (docs/numerics.md "Two fp32 backends")
    os << "result " << t.name << " " << t.dtype << " " << dims_text(t.dims) << " expect " << file << " "
       << (t.dtype == "s32" ? "0" : "1e-5") << "\n";
  }
  return os.str();
}

int xla_export_main(int argc, char** argv) {
  CLI::App app{
      "Write one training step as the StableHLO program the XLA backend runs, with a manifest of its "
      "arguments, for running it where this build's libraries are absent (docs/xla.md)",
      "xla export"};
  Args a;
  app.add_option("--config", a.config, "the model's config.json or a preset name (olmo3-7b, ...)");
  app.add_option("--model", a.model, "an HF directory: its config and its weights (written as files)");
  app.add_option("--layers", a.layers, "keep only the first N layers (0: all; random weights only)");
  app.add_option("--batch", a.batch, "rows per step (B)")->capture_default_str();
  app.add_option("--seq", a.seq, "tokens per row (T)")->required();
  app.add_option("--batch-file", a.batch_file,
                 "safetensors with input_ids, segment_ids, position_ids, targets, loss_mask ([B, T])");
  app.add_option("--out", a.out, "output directory")->required();
  app.add_flag("--bf16", a.bf16, "bf16 operands in every GEMM, f32 accumulation (compute.dtype bf16)");
  app.add_flag("--f32-trig", a.f32_trig, "RoPE tables in f32 (devices without f64: TPU)");
  app.add_option("--vocab-tile", a.vocab_tile, "vocabulary rows per cross-entropy tile (0: untiled)")
      ->capture_default_str();
  app.add_option("--lm-z", a.lm_z, "z-loss coefficient")->capture_default_str();
  app.add_option("--attention-block", a.block, "queries / keys per attention block (default: the backend's)");
  app.add_option("--delta-chunk", a.delta_chunk,
                 "KDA / Gated DeltaNet: tokens per chunk of the delta rule (xla.delta_chunk; 0: the recurrence)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option("--attention", a.attention,
                 "blockwise (every plugin) or cudnn (cuDNN's fused attention: XLA's CUDA plugin only; its "
                 "packed form for rows of several documents)")
      ->capture_default_str();
  app.add_option("--docs-per-row", a.docs,
                 "without --batch-file: documents of equal length per generated row (dividing --seq)")
      ->capture_default_str();
  app.add_flag("--expect", a.expect,
               "run the step here on XLA's CPU plugin and write its results as expected");
  return olmosft::cli::run_app(app, argc, argv, [&] {
    OLMO_CHECK(a.config.empty() != a.model.empty(), "give one of --config and --model");
    OLMO_CHECK(a.batch >= 1 && a.seq >= 1, "--batch and --seq must be >= 1");
    OLMO_CHECK(a.model.empty() || a.layers == 0, "--layers keeps random weights only (not with --model)");
    OLMO_CHECK(a.block >= 0 && a.vocab_tile >= 0, "--attention-block and --vocab-tile must be >= 0");
    OLMO_CHECK(a.docs >= 1 && a.seq % a.docs == 0, "--docs-per-row must be >= 1 and divide --seq ", a.seq,
               ", got ", a.docs);
    OLMO_CHECK(a.docs == 1 || a.batch_file.empty(), "--docs-per-row is for generated rows, not --batch-file");
    olmosft::model::ModelConfig m;
    if (!a.model.empty()) {
      m = olmosft::model::load_config((fs::path(a.model) / "config.json").string());
    } else {
      m = olmosft::model::config_from_path_or_preset(a.config, a.layers, "--layers");
    }
    olmosft::model::XlaOptions xo;
    xo.bf16 = a.bf16;
    xo.f64_trig = !a.f32_trig;
    if (a.block > 0) xo.attention_block = a.block;
    xo.delta_chunk = a.delta_chunk;
    xo.attention = olmosft::model::parse_xla_attention(a.attention, "--attention");
    OLMO_CHECK(!(a.expect && xo.attention == olmosft::model::XlaAttention::kCudnn),
               "--expect runs the step on XLA's CPU plugin, which cannot run --attention cudnn");
    olmosft::model::LossConfig loss;
    loss.vocab_tile = a.vocab_tile;
    loss.weight[olmosft::model::kLossLmZ] = a.lm_z;
    const BatchArrays ba = read_batch(a, m);
    const XlaStepProgram p = olmosft::model::xla_step_program(m, xo, a.batch, a.seq, loss, ba.cudnn_segments);
    const fs::path dir(a.out);
    fs::create_directories(dir / "data");
    std::vector<std::vector<char>> host;
    const std::string args = argument_lines(a, m, p, ba, dir, a.expect ? &host : nullptr);
    std::string results;
    if (a.expect) {
      results = expected_lines(p, host, dir);
    } else {
      for (const auto& t : p.results)
        results += "result " + t.name + " " + t.dtype + " " + dims_text(t.dims) + "\n";
    }
    // FLOPs as the trainer counts them (the batch's documents; every position trained: the program computes
    // every token's logits)
    std::vector<int32_t> tok(size_t(a.batch * a.seq), 0), seg = ba.b.seg, tgt(tok.size(), 0);
    std::vector<uint8_t> tr(tok.size(), 1);
    olmosft::model::Batch fb{a.batch, a.seq, tok.data(), seg.data(), nullptr, tgt.data(), tr.data()};
    const double flops = olmosft::train::FlopModel(m).count(fb).total();
    std::ostringstream man;
    man << "olmosft-xla-step 1\nmodel " << m.model_type_name << " layers " << m.num_hidden_layers
        << " hidden " << m.hidden_size << " vocab " << m.vocab_size << " B " << a.batch << " T " << a.seq
        << " bf16 " << int(a.bf16) << " attention " << a.attention << "\nflops " << flops << "\n"
        << args << results;
    olmosft::io::write_file_atomic((dir / "step.mlir").string(), p.text);
    olmosft::model::save_config(m, (dir / "config.json").string());  // for a peer (bench/olmo3_step_torch.py)
    olmosft::io::write_file_atomic((dir / "manifest.txt").string(), man.str());
    std::cout << "XLA-EXPORT dir=" << a.out << " model=" << m.model_type_name
              << " layers=" << m.num_hidden_layers << " B=" << a.batch << " T=" << a.seq
              << " bf16=" << int(a.bf16) << " arguments=" << p.arguments.size()
              << " results=" << p.results.size() << " module_bytes=" << p.text.size()
              << " expect=" << int(a.expect) << " flops=" << flops << "\n";
    return 0;
  });
}

}  // namespace

OLMOSFT_VERB("xla export",
             "write a model's training step as the StableHLO program the XLA backend runs, with a manifest, "
             "for running it elsewhere (tests/xla-accel xla_step_run)",
             xla_export_main);
