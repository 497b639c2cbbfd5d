// cuDNN's fused attention as custom calls (src/xla/ops_attention_cudnn.h).
//   - Everywhere: the emitted `__cudnn$fmhaSoftmax` / `__cudnn$fmhaSoftmaxBackward` calls equal, byte for
//   byte
//     in their backend_config and exactly in operand / result types and layouts, what JAX 0.10.2 lowers
//     `jax.nn.dot_product_attention(..., implementation="cudnn")` to for the cuda platform
//     (tests/golden/xla/cudnn_fmha, made by tests/reference/jax_cudnn_attention.py); shapes cuDNN cannot run
//     are refused by name; XLA's CPU plugin parses the module and refuses it only for want of a cuDNN
//     handler.
//   - On XLA's CUDA plugin (scripts/accel-check.sh, OLMOSFT_XLA_TEST_PLUGIN=cuda): forward and backward
//     against the blockwise f32 attention of ops_attention.h on the same bf16-rounded operands.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <iostream>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "core/bf16.h"
#include "xla/ops_attention.h"
#include "xla/ops_attention_cudnn.h"
#include "xla/pjrt.h"
#include "xla_test_util.h"

using namespace olmosft;
using namespace olmosft::xla;

namespace {

constexpr const char* kFwd = "__cudnn$fmhaSoftmax";
constexpr const char* kBwd = "__cudnn$fmhaSoftmaxBackward";
constexpr ElementType F32 = ElementType::kF32;
// The fixture's case (tests/reference/jax_cudnn_attention.py).
constexpr int64_t B = 2, T = 256, H = 4, Hkv = 2, D = 64;
constexpr double kScale = 0.125;

// What one custom call states: backend_config text, layouts, operand and result types.
struct Call {
  std::string config;
  std::vector<std::vector<int64_t>> operand_layouts, result_layouts;
  std::vector<std::string> operand_types, result_types;
};

std::vector<int64_t> ints(const std::string& s) {
  std::vector<int64_t> out;
  for (size_t i = 0; i < s.size();) {
    if (s[i] == '-' || (s[i] >= '0' && s[i] <= '9')) {
      size_t n = 0;
      out.push_back(std::stoll(s.substr(i), &n));
      i += n;
    } else {
      ++i;
    }
  }
  return out;
}

// The JSON string starting at s[i] == '"' (escapes \" and \\ only, as the fixture uses).
std::string json_string(const std::string& s, size_t i) {
  std::string out;
  for (++i; i < s.size() && s[i] != '"'; ++i) out += s[i] == '\\' ? s[++i] : s[i];
  return out;
}

// The bracketed list after `"key": ` in s[from, to): nested int lists or strings.
std::string list_after(const std::string& s, const std::string& key, size_t from, size_t to) {
  const size_t k = s.find("\"" + key + "\": [", from);
  if (k == std::string::npos || k >= to) return "";
  size_t i = s.find('[', k), depth = 0, j = i;
  for (; j < s.size(); ++j) {
    depth += s[j] == '[';
    depth -= s[j] == ']';
    if (depth == 0) break;
  }
  return s.substr(i, j - i + 1);
}

std::vector<std::vector<int64_t>> int_lists(
    const std::string& list) {  // [[3, 2], [0]] (fixture) or dense<...>
  std::vector<std::vector<int64_t>> out;
  size_t i = 0;
  while ((i = list.find_first_of("[<", i + 1)) != std::string::npos) {
    const size_t end = list.find_first_of("]>", i);
    const std::string inner = list.substr(i + 1, end - i - 1);
    if (inner.find('[') == std::string::npos && inner.find('<') == std::string::npos) {
      if (list[i] == '<' && inner.find("index") != std::string::npos) {
        i = end;
        continue;  // the `tensor<4xindex>` of a dense attribute
      }
      out.push_back(ints(inner));
      i = end;
    }
  }
  return out;
}

std::vector<std::string> tensor_types(const std::string& s) {
  std::vector<std::string> out;
  for (size_t i = 0; (i = s.find("tensor<", i)) != std::string::npos;) {
    const size_t end = s.find('>', i);
    out.push_back(s.substr(i, end - i + 1));
    i = end;
  }
  return out;
}

Call fixture_call(const std::string& json, const std::string& target) {
  const size_t from = json.find("\"" + target + "\": {"), to = target == kFwd ? json.find(kBwd) : json.size();
  EXPECT_NE(from, std::string::npos) << target;
  Call c;
  c.config = json_string(json, json.find('"', json.find("\"backend_config_text\": ", from) + 23));
  c.operand_layouts = int_lists(list_after(json, "operand_layouts", from, to));
  c.result_layouts = int_lists(list_after(json, "result_layouts", from, to));
  c.operand_types = tensor_types(list_after(json, "operand_types", from, to));
  c.result_types = tensor_types(list_after(json, "result_types", from, to));
  return c;
}

// The MLIR string attribute at s[i] == '"', unescaped (mlir::quoted writes other bytes as \XX hex).
std::string mlir_string(const std::string& s, size_t i) {
  std::string out;
  for (++i; s[i] != '"'; ++i) {
    if (s[i] == '\\') {
      out += static_cast<char>(std::stoi(s.substr(i + 1, 2), nullptr, 16));
      i += 2;
    } else {
      out += s[i];
    }
  }
  return out;
}

Call emitted_call(const std::string& module, const std::string& target) {
  const size_t at = module.find("call_target_name = \"" + target + "\"");
  EXPECT_NE(at, std::string::npos) << target << " not emitted";
  const size_t start = module.rfind('\n', at) + 1, end = module.find('\n', at);
  const std::string line = module.substr(start, end - start);
  Call c;
  c.config = mlir_string(line, line.find('"', line.find("backend_config = ")));
  const size_t ol = line.find("operand_layouts = "), rl = line.find("result_layouts = ");
  const size_t sig = line.find("} : (");
  c.operand_layouts = int_lists(line.substr(ol + 17, rl - ol - 17));
  c.result_layouts = int_lists(line.substr(rl + 16, sig - rl - 16));
  const size_t arrow = line.find(") -> (", sig);
  c.operand_types = tensor_types(line.substr(sig, arrow - sig));
  c.result_types = tensor_types(line.substr(arrow));
  return c;
}

std::string read(const std::string& path) {
  std::ifstream f(path);
  EXPECT_TRUE(f.good()) << "cannot read " << path;
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// The packed fixture's M (tests/reference/jax_cudnn_attention.py) and its batch's documents per row.
constexpr int64_t kM = 4;
const std::vector<std::vector<int32_t>> kPackedRows{{100, 60, 90}, {200}};

// q, k, v, dout (f32) [, seqlen, offsets, seg when M > 0: the packed form] -> cuDNN's out, dq, dk, dv (and
// the module's text).
std::string cudnn_module(int64_t window, int64_t M = 0) {
  HloBuilder b;
  const Value q = b.argument({F32, {B, T, H, D}}), k = b.argument({F32, {B, T, Hkv, D}}),
              v = b.argument({F32, {B, T, Hkv, D}}), dout = b.argument({F32, {B, T, H, D}});
  std::optional<ops::CudnnPacking> p;
  if (M > 0)
    p = ops::CudnnPacking{b.argument({ElementType::kS32, {B, M}}),
                          b.argument({ElementType::kS32, {B, M + 1}}),
                          b.argument({ElementType::kS32, {B, T}})};
  const ops::AttentionOptions o{kScale, window, 64};
  const auto f = ops::attention_forward_cudnn(b, q, k, v, o, p ? &*p : nullptr);
  const auto g = ops::attention_backward_cudnn(b, q, k, v, f.out, f.lse, dout, o, p ? &*p : nullptr);
  b.returns({f.out, g.dq, g.dk, g.dv});
  return b.module();
}

// Segment ids [B, T] of rows holding these documents (ids 0, 1, ... per row), then padding (-1).
std::vector<int32_t> packed_segments(const std::vector<std::vector<int32_t>>& rows) {
  std::vector<int32_t> seg(static_cast<size_t>(B * T), -1);
  for (size_t r = 0; r < rows.size(); ++r) {
    int64_t t = 0;
    for (size_t doc = 0; doc < rows[r].size(); ++doc)
      for (int32_t i = 0; i < rows[r][doc]; ++i) seg[size_t(int64_t(r) * T + t++)] = int32_t(doc);
  }
  return seg;
}

void expect_same(const Call& got, const Call& want, const std::string& what) {
  EXPECT_EQ(got.config, want.config) << what << ": backend_config";
  EXPECT_EQ(got.operand_layouts, want.operand_layouts) << what << ": operand layouts";
  EXPECT_EQ(got.result_layouts, want.result_layouts) << what << ": result layouts";
  EXPECT_EQ(got.operand_types, want.operand_types) << what << ": operand types";
  EXPECT_EQ(got.result_types, want.result_types) << what << ": result types";
}

}  // namespace

TEST(XlaCudnnAttention, EmitsTheCallsJaxLowersTo) {
  for (int64_t window : {int64_t(0), int64_t(128)}) {
    const std::string json =
        read(std::string(OLMOSFT_GOLDEN_DIR) + "/xla/cudnn_fmha/causal_w" + std::to_string(window) + ".json");
    const std::string module = cudnn_module(window);
    for (const char* target : {kFwd, kBwd}) {
      const Call want = fixture_call(json, target), got = emitted_call(module, target);
      ASSERT_FALSE(want.config.empty() || want.operand_types.empty() || want.result_layouts.empty())
          << target;
      expect_same(got, want, std::string(target) + " window " + std::to_string(window));
    }
  }
  // fmha_scale is written as Python writes a float (JAX's spelling): repr(1 / math.sqrt(128)) and 1.0.
  const std::string c128 = ops::cudnn_fmha_config(1, 1, 8, {1.0 / std::sqrt(128.0), 0, 64}, false);
  EXPECT_NE(c128.find("\"fmha_scale\": 0.08838834764831843,"), std::string::npos) << c128;
  EXPECT_NE(ops::cudnn_fmha_config(1, 1, 8, {1.0, 0, 64}, false).find("\"fmha_scale\": 1.0,"),
            std::string::npos);
}

// Packed rows: the calls JAX's cuDNN dot_product_attention lowers to with segment lengths and offsets (mask
// PADDING_CAUSAL, max_seg_per_batch 4, four s32 operands more, statistics [B * M, H, T]).
TEST(XlaCudnnAttention, EmitsThePackedCallsJaxLowersTo) {
  for (int64_t window : {int64_t(0), int64_t(128)}) {
    const std::string json =
        read(std::string(OLMOSFT_GOLDEN_DIR) + "/xla/cudnn_fmha/packed_w" + std::to_string(window) + ".json");
    const std::string module = cudnn_module(window, kM);
    for (const char* target : {kFwd, kBwd}) {
      const Call want = fixture_call(json, target), got = emitted_call(module, target);
      ASSERT_NE(want.config.find("PADDING_CAUSAL"), std::string::npos) << target;
      expect_same(got, want, std::string(target) + " packed, window " + std::to_string(window));
    }
  }
}

// The host's lengths and offsets are what JAX's _fix_seqlen_offsets gives cuDNN for the same batch (the
// key/value offsets with the upstream GQA fix: the key heads' stride), and the graph's multiplication by a
// token's stride, run on the test's plugin, gives JAX's element offsets.
TEST(XlaCudnnAttention, PackedRowsAreJaxsSegmentsAndOffsets) {
  const std::string json = read(std::string(OLMOSFT_GOLDEN_DIR) + "/xla/cudnn_fmha/packed_offsets.json");
  auto want = [&](const char* key) {
    std::vector<int64_t> flat;
    for (const auto& row : int_lists(list_after(json, key, 0, json.size())))
      flat.insert(flat.end(), row.begin(), row.end());
    return flat;
  };
  const std::vector<int32_t> seg = packed_segments(kPackedRows);
  EXPECT_EQ(ops::cudnn_documents_per_row(seg.data(), B, T), 3);
  const ops::CudnnPackedRows p = ops::cudnn_packed_rows(seg.data(), B, T, kM);
  const std::vector<int64_t> seqlen(p.seqlen.begin(), p.seqlen.end()),
      tokens(p.offsets.begin(), p.offsets.end());
  EXPECT_EQ(seqlen, want("q_seqlen"));
  EXPECT_EQ(seqlen, want("kv_seqlen"));
  std::vector<int64_t> q_elements, kv_elements;
  for (int64_t x : tokens) {
    q_elements.push_back(x * H * D);
    kv_elements.push_back(x * Hkv * D);
  }
  EXPECT_EQ(q_elements, want("q_offsets"));
  EXPECT_EQ(kv_elements, want("kv_offsets"));
  HloBuilder b;
  const Value off = b.argument({ElementType::kS32, {B, kM + 1}});
  const ops::CudnnElementOffsets e = ops::cudnn_element_offsets(b, off, H, Hkv, D);
  b.returns({e.q, e.kv});
  Client& c = testutil::test_client(1);
  Executable exe = c.compile(b.module());
  Buffer in = c.to_device(p.offsets.data(), {ElementType::kS32, {B, kM + 1}});
  std::vector<Buffer*> ptrs{&in};
  const std::vector<Buffer> out = exe.execute(ptrs);
  const auto gq = out[0].to_host<int32_t>(), gkv = out[1].to_host<int32_t>();
  EXPECT_EQ(std::vector<int64_t>(gq.begin(), gq.end()), want("q_offsets"));
  EXPECT_EQ(std::vector<int64_t>(gkv.begin(), gkv.end()), want("kv_offsets"));
}

TEST(XlaCudnnAttention, RefusesBatchesThePackedFormCannotExpress) {
  std::vector<int32_t> seg = packed_segments({{10, 10, 10}, {5}});
  seg[25] = 0;  // row 0: document 0 again inside document 2
  EXPECT_NE(testutil::error_of([&] {
              ops::cudnn_documents_per_row(seg.data(), B, T);
            }).find("row 0 token 25: document 0 starts a second time"),
            std::string::npos);
  seg = packed_segments({{10, 10, 10, 10, 10}, {5}});
  EXPECT_NE(
      testutil::error_of([&] {
        ops::cudnn_packed_rows(seg.data(), B, T, 4);
      }).find("a row holds 5 documents, more than the program's packed form takes (max_seg_per_batch 4)"),
      std::string::npos);
  auto build = [](std::vector<int64_t> qd, int64_t M, int64_t seg_T) {
    HloBuilder b;
    std::vector<int64_t> kd = qd;
    kd[2] = 1;
    const Value q = b.argument({F32, qd}), k = b.argument({F32, kd}), v = b.argument({F32, kd});
    const ops::CudnnPacking p{b.argument({ElementType::kS32, {qd[0], M}}),
                              b.argument({ElementType::kS32, {qd[0], M + 1}}),
                              b.argument({ElementType::kS32, {qd[0], seg_T}})};
    ops::attention_forward_cudnn(b, q, k, v, {0.1, 0, 64}, &p);
  };
  auto emit = [&](std::vector<int64_t> qd, int64_t M, int64_t seg_T) {
    return testutil::error_of([&] { build(qd, M, seg_T); });
  };
  EXPECT_NO_THROW(build({2, 8, 4, 64}, 2, 8));
  EXPECT_NO_THROW(build({1, 65536, 32, 128}, 8, 65536));  // the runbook's row per device: 2^28 elements
  EXPECT_NE(emit({2, 8, 4, 64}, 1, 8).find("M >= 2"), std::string::npos);
  EXPECT_NE(emit({2, 8, 4, 64}, 2, 9).find("seg [2, 8]"), std::string::npos);
  EXPECT_NE(emit({16, 65536, 32, 128}, 8, 65536).find("exceeds 2^31 - 1"), std::string::npos);
}

TEST(XlaCudnnAttention, RefusesShapesCudnnDoesNotRun) {
  auto err = [](std::vector<int64_t> qd, std::vector<int64_t> kd, int64_t window, double scale) {
    return testutil::error_of([&] {
      HloBuilder b;
      const Value q = b.argument({F32, qd}), k = b.argument({F32, kd}), v = b.argument({F32, kd});
      ops::attention_forward_cudnn(b, q, k, v, {scale, window, 64});
    });
  };
  EXPECT_NE(err({2, 8, 4, 12}, {2, 8, 2, 12}, 0, 0.3).find("multiple of 8 and at most 256, got 12"),
            std::string::npos);
  EXPECT_NE(err({2, 8, 4, 512}, {2, 8, 2, 512}, 0, 0.3).find("at most 256, got 512"), std::string::npos);
  EXPECT_NE(err({2, 8, 3, 64}, {2, 8, 2, 64}, 0, 0.3).find("query heads 3 must be a multiple of key heads 2"),
            std::string::npos);
  EXPECT_NE(err({8, 4, 64}, {8, 2, 64}, 0, 0.3).find("must be [B, T, heads, D]"), std::string::npos);
  EXPECT_NE(err({2, 8, 4, 64}, {2, 9, 2, 64}, 0, 0.3).find("k and v must be [2, 8, Hkv, 64]"),
            std::string::npos);
  EXPECT_NE(err({2, 8, 4, 64}, {2, 8, 2, 64}, -1, 0.3).find("sliding window must be >= 0"),
            std::string::npos);
  EXPECT_NE(err({2, 8, 4, 64}, {2, 8, 2, 64}, 0, NAN).find("softmax scale must be finite"),
            std::string::npos);
}

// The module is valid StableHLO (XLA's CPU plugin parses it), refused only because the CPU has no handler for
// cuDNN's call: the failure names the call's target, not a parse error.
TEST(XlaCudnnAttention, CpuPluginParsesTheModuleAndRefusesTheCall) {
  OLMOSFT_CPU_PLUGIN_ONLY();
  const std::string msg = testutil::error_of([] { testutil::test_client(1).compile(cudnn_module(128)); });
  std::cout << "CPU plugin: " << msg.substr(0, 400) << "\n";
  EXPECT_NE(msg.find("fmhaSoftmax"), std::string::npos) << msg;
  EXPECT_EQ(msg.find("parse"), std::string::npos) << msg;
}

// On a GPU: cuDNN against the blockwise f32 attention on the same bf16-rounded q, k, v and dout, rows of one
// document (the plain form) and packed rows with padding (the packed form, M 4). Tolerance 2e-2 of each
// tensor's scale: cuDNN returns bf16 (half an ulp, 2^-9 relative, per element) and rounds the probabilities
// to bf16 before the P V and dS products (2^-9 each, summed over up to T keys with a random sign). Padding
// tokens: 0 in both (set by the packed form, computed by the blockwise attention).
TEST(XlaCudnnAttention, MatchesBlockwiseAttentionOnTheGpu) {
  const std::string plugin = testutil::test_plugin();
  if (plugin != "cuda" && plugin.find("cuda") == std::string::npos)
    GTEST_SKIP() << "skipped: no CUDA device (cuDNN's attention runs on XLA's CUDA plugin; this run is on "
                 << plugin << ")";
  Client& c = testutil::test_client(1);
  std::mt19937 g(7);
  std::normal_distribution<float> n(0.f, 1.f);
  auto rounded = [&](int64_t count) {
    std::vector<float> x(static_cast<size_t>(count));
    for (float& e : x) e = bf16_to_f32(f32_to_bf16(n(g)));
    return x;
  };
  const auto q = rounded(B * T * H * D), k = rounded(B * T * Hkv * D), v = rounded(B * T * Hkv * D),
             dout = rounded(B * T * H * D);
  for (const int64_t M : {int64_t(0), kM})
    for (const int64_t window : {int64_t(0), int64_t(128)}) {
      const std::vector<int32_t> seg =
          M == 0 ? std::vector<int32_t>(static_cast<size_t>(B * T), 0) : packed_segments(kPackedRows);
      const ops::AttentionOptions o{kScale, window, 64};
      HloBuilder b;
      const Value aq = b.argument({F32, {B, T, H, D}}), ak = b.argument({F32, {B, T, Hkv, D}}),
                  av = b.argument({F32, {B, T, Hkv, D}}), ado = b.argument({F32, {B, T, H, D}}),
                  as = b.argument({ElementType::kS32, {B, T}});
      std::optional<ops::CudnnPacking> p;
      ops::CudnnPackedRows rows;
      if (M > 0) {
        p = ops::CudnnPacking{b.argument({ElementType::kS32, {B, M}}),
                              b.argument({ElementType::kS32, {B, M + 1}}), as};
        rows = ops::cudnn_packed_rows(seg.data(), B, T, M);
      }
      const auto cf = ops::attention_forward_cudnn(b, aq, ak, av, o, p ? &*p : nullptr);
      const auto cb = ops::attention_backward_cudnn(b, aq, ak, av, cf.out, cf.lse, ado, o, p ? &*p : nullptr);
      const auto rf = ops::attention_forward(b, aq, ak, av, as, o);
      const auto rb = ops::attention_backward(b, aq, ak, av, as, rf.out, rf.lse, ado, o);
      b.returns({cf.out, cb.dq, cb.dk, cb.dv, rf.out, rb.dq, rb.dk, rb.dv});
      Executable exe = c.compile(b.module());
      std::vector<Buffer> in;
      in.push_back(c.to_device(q.data(), {F32, {B, T, H, D}}));
      in.push_back(c.to_device(k.data(), {F32, {B, T, Hkv, D}}));
      in.push_back(c.to_device(v.data(), {F32, {B, T, Hkv, D}}));
      in.push_back(c.to_device(dout.data(), {F32, {B, T, H, D}}));
      in.push_back(c.to_device(seg.data(), {ElementType::kS32, {B, T}}));
      if (M > 0) {
        in.push_back(c.to_device(rows.seqlen.data(), {ElementType::kS32, {B, M}}));
        in.push_back(c.to_device(rows.offsets.data(), {ElementType::kS32, {B, M + 1}}));
      }
      std::vector<Buffer*> ptrs;
      for (Buffer& x : in) ptrs.push_back(&x);
      std::vector<Buffer> out = exe.execute(ptrs);
      const char* names[] = {"out", "dq", "dk", "dv"};
      for (size_t i = 0; i < 4; ++i) {
        const auto got = out[i].to_host<float>(), want = out[i + 4].to_host<float>();
        double scale = 1e-30, err = 0;
        for (float w : want) scale = std::max(scale, double(std::fabs(w)));
        for (size_t j = 0; j < got.size(); ++j)
          err = std::max(err, std::fabs(double(got[j]) - want[j]) / scale);
        std::cout << "cuDNN vs blockwise " << names[i] << " (" << (M ? "packed" : "one document per row")
                  << ", window " << window << "): max error " << err << " of the scale " << scale << "\n";
        EXPECT_LE(err, 2e-2) << names[i] << " packed " << M << " window " << window;
      }
    }
}
