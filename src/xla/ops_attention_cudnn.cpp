#include "xla/ops_attention_cudnn.h"

#include <charconv>
#include <cmath>
#include <limits>
#include <set>

#include "core/error.h"

namespace olmosft::xla::ops {

namespace {

constexpr const char* kForward = "__cudnn$fmhaSoftmax";
constexpr const char* kBackward = "__cudnn$fmhaSoftmaxBackward";

// A double as Python's repr writes it (shortest round trip, "1.0" not "1"): JAX's spelling of fmha_scale.
std::string py_float(double x) {
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof buf, x);
  std::string s(buf, r.ptr);
  if (s.find_first_of(".en") == std::string::npos) s += ".0";
  return s;
}

// {"lhs_contracting_dimensions": ["3"], ...}: XLA's DotDimensionNumbers, int64 fields as JSON strings.
std::string dot_dims(int lc, int rc, int lb0, int lb1, int rb0, int rb1) {
  auto one = [](int x) { return "[\"" + std::to_string(x) + "\"]"; };
  auto two = [](int x, int y) { return "[\"" + std::to_string(x) + "\", \"" + std::to_string(y) + "\"]"; };
  return "{\"lhs_contracting_dimensions\": " + one(lc) + ", \"rhs_contracting_dimensions\": " + one(rc) +
         ", \"lhs_batch_dimensions\": " + two(lb0, lb1) + ", \"rhs_batch_dimensions\": " + two(rb0, rb1) +
         "}";
}

struct Dims {
  int64_t B, T, H, Hkv, D;
};

Dims check_dims(const Value& q, const Value& k, const Value& v, const char* what) {
  const auto &qd = q.type().dims, &kd = k.type().dims, &vd = v.type().dims;
  OLMO_CHECK(qd.size() == 4 && kd.size() == 4 && vd.size() == 4, what,
             ": q, k, v must be [B, T, heads, D], got ", dims_string(qd), ", ", dims_string(kd), ", ",
             dims_string(vd));
  const Dims d{qd[0], qd[1], qd[2], kd[2], qd[3]};
  OLMO_CHECK(kd == vd && kd[0] == d.B && kd[1] == d.T && kd[3] == d.D, what, ": k and v must be [", d.B, ", ",
             d.T, ", Hkv, ", d.D, "] like q ", dims_string(qd), ", got ", dims_string(kd), " and ",
             dims_string(vd));
  OLMO_CHECK(d.Hkv > 0 && d.H % d.Hkv == 0, what, ": query heads ", d.H, " must be a multiple of key heads ",
             d.Hkv);
  OLMO_CHECK(d.D % 8 == 0 && d.D <= 256, what,
             ": cuDNN's flash attention needs a head dim that is a multiple "
             "of 8 and at most 256, got ",
             d.D);
  return d;
}

void check_options(const AttentionOptions& o, const char* what) {
  OLMO_CHECK(std::isfinite(o.scale) && o.scale > 0, what, ": the softmax scale must be finite and > 0, got ",
             o.scale);
  OLMO_CHECK(o.window >= 0, what, ": the sliding window must be >= 0 (0: none), got ", o.window);
}

Value to_bf16(HloBuilder& b, const Value& x) {
  return x.type().type == ElementType::kBF16 ? x : b.convert(x, ElementType::kBF16);
}

// [B, heads, T, D] (cuDNN's result, laid out as [B, T, heads, D] in memory) -> [B, T, heads, D] f32.
Value from_result(HloBuilder& b, const Value& r) {
  return b.convert(b.transpose(r, {0, 2, 1, 3}), ElementType::kF32);
}

const std::vector<int64_t> kRowMajor4{3, 2, 1, 0}, kRowMajor3{2, 1, 0}, kRowMajor2{1, 0},
    kBthdAsBhtd{3, 1, 2, 0}, kBytes{0};

// The packed form's M (0: rows of one document), checking its arrays' shapes and cuDNN's int32 offsets.
int64_t check_packing(const CudnnPacking* p, const Dims& d, const char* what) {
  if (p == nullptr) return 0;
  const auto &sl = p->seqlen.type(), &of = p->offsets.type(), &sg = p->seg.type();
  const int64_t M = sl.dims.size() == 2 ? sl.dims[1] : 0;
  const std::vector<int64_t> of_dims{d.B, M + 1}, seg_dims{d.B, d.T};
  OLMO_CHECK(sl.type == ElementType::kS32 && of.type == ElementType::kS32 && sg.type == ElementType::kS32 &&
                 M >= 2 && sl.dims[0] == d.B && of.dims == of_dims && sg.dims == seg_dims,
             what, ": the packed form needs s32 seqlen [", d.B, ", M >= 2], offsets [", d.B,
             ", M + 1], seg [", d.B, ", ", d.T, "], got ", sl.mlir(), ", ", of.mlir(), ", ", sg.mlir());
  OLMO_CHECK(d.B * d.T * d.H * d.D <= std::numeric_limits<int32_t>::max(), what,
             ": the packed form's element offsets are int32 in cuDNN; B x T x heads x head_dim = ", d.B,
             " x ", d.T, " x ", d.H, " x ", d.D, " exceeds 2^31 - 1 (fewer rows per device)");
  return M;
}

// The packed form's four operands after q, k, v (JAX's order: q_seqlen, kv_seqlen, q_offsets, kv_offsets).
void append_packing(HloBuilder& b, const CudnnPacking& p, const Dims& d, std::vector<Value>& operands,
                    std::vector<std::vector<int64_t>>& layouts) {
  const CudnnElementOffsets e = cudnn_element_offsets(b, p.offsets, d.H, d.Hkv, d.D);
  operands.insert(operands.end(), {p.seqlen, p.seqlen, e.q, e.kv});
  layouts.insert(layouts.end(), 4, kRowMajor2);
}

// X [B, T, heads, D] with the rows of padding tokens (SEG < 0) set to 0.
Value zero_padding(HloBuilder& b, const Value& x, const Value& seg) {
  const Value valid = b.compare(seg, b.constant(seg.type(), 0), Compare::kGe);
  return b.select(b.broadcast_in_dim(valid, x.type().dims, {0, 1}), x, b.constant(x.type(), 0));
}

}  // namespace

int64_t cudnn_documents_per_row(const int32_t* seg, int64_t B, int64_t T) {
  int64_t most = 0;
  for (int64_t r = 0; r < B; ++r) {
    const int32_t* s = seg + r * T;
    std::set<int32_t> seen;
    for (int64_t t = 0; t < T; ++t) {
      if (s[t] < 0 || (t > 0 && s[t] == s[t - 1])) continue;
      OLMO_CHECK(seen.insert(s[t]).second, "cuDNN attention: row ", r, " token ", t, ": document ", s[t],
                 " starts a second time (a document must be one run of tokens; the blockwise attention "
                 "would join the two runs, cuDNN's packed form would not)");
    }
    most = std::max(most, static_cast<int64_t>(seen.size()));
  }
  return most;
}

CudnnPackedRows cudnn_packed_rows(const int32_t* seg, int64_t B, int64_t T, int64_t max_segments) {
  const int64_t docs = cudnn_documents_per_row(seg, B, T);
  OLMO_CHECK(max_segments >= 2 && docs <= max_segments, "cuDNN attention: a row holds ", docs,
             " documents, more than the program's packed form takes (max_seg_per_batch ", max_segments, ")");
  OLMO_CHECK(B * T <= std::numeric_limits<int32_t>::max(), "cuDNN attention: B x T = ", B * T,
             " tokens exceed int32");
  CudnnPackedRows p;
  p.max_segments = max_segments;
  for (int64_t r = 0; r < B; ++r) {
    const int32_t* s = seg + r * T;
    for (int64_t t = 0; t < T; ++t) {
      if (s[t] < 0 || (t > 0 && s[t] == s[t - 1])) continue;
      int64_t e = t;
      while (e < T && s[e] == s[t]) ++e;
      p.seqlen.push_back(static_cast<int32_t>(e - t));
      p.offsets.push_back(static_cast<int32_t>(r * T + t));
    }
  }
  p.seqlen.resize(static_cast<size_t>(B * max_segments), 0);
  p.offsets.resize(static_cast<size_t>(B * (max_segments + 1)), static_cast<int32_t>(B * T));
  return p;
}

CudnnElementOffsets cudnn_element_offsets(HloBuilder& b, const Value& offsets, int64_t H, int64_t Hkv,
                                          int64_t D) {
  // k and v have their own heads: JAX 0.10.2 scales both by H (wrong under GQA; jax-ml/jax PR #39521).
  return {b.mul(offsets, b.constant(offsets.type(), static_cast<double>(H * D))),
          b.mul(offsets, b.constant(offsets.type(), static_cast<double>(Hkv * D)))};
}

std::string cudnn_fmha_config(int64_t B, int64_t H, int64_t T, const AttentionOptions& o, bool backward,
                              int64_t max_segments) {
  auto q = [](int64_t x) { return "\"" + std::to_string(x) + "\""; };  // an int64 field: a JSON string
  std::string c =
      "{\"operation_queue_id\": \"0\", \"cudnn_fmha_backend_config\": {\"algorithm\": {\"algo_id\": "
      "\"0\", \"math_type\": \"TENSOR_OP_MATH\", \"tuning_knobs\": {\"17\": \"1\", \"24\": \"0\"}, "
      "\"is_cudnn_frontend\": true, \"workspace_size\": \"0\"}, \"fmha_scale\": " +
      py_float(o.scale) + ", \"intermediate_tensor_shape\": {\"element_type\": \"BF16\", \"dimensions\": [" +
      q(B) + ", " + q(H) + ", " + q(T) + ", " + q(T) +
      "], \"tuple_shapes\": [], \"layout\": {\"dim_level_types\": [], \"dim_unique\": [], "
      "\"dim_ordered\": [], \"minor_to_major\": [\"3\", \"2\", \"1\", \"0\"], \"tiles\": [], "
      "\"element_size_in_bits\": \"0\", \"memory_space\": \"0\", \"index_primitive_type\": "
      "\"PRIMITIVE_TYPE_INVALID\", \"pointer_primitive_type\": \"PRIMITIVE_TYPE_INVALID\", "
      "\"dynamic_shape_metadata_prefix_bytes\": \"0\"}, \"is_dynamic_dimension\": [false, false, "
      "false, false]}, \"is_flash_attention\": true, \"mask_type\": " +
      std::string(max_segments > 0 ? "\"PADDING_CAUSAL\", " : "\"CAUSAL\", ");
  // The products in the BTNH layout: forward S = Q K^T (contract D, batch B and heads), O = P V; backward the
  // four gradient products, as JAX states them.
  if (!backward)
    c += "\"bmm1_dot_dimension_numbers\": " + dot_dims(3, 3, 0, 2, 0, 2) +
         ", \"bmm2_dot_dimension_numbers\": " + dot_dims(3, 1, 0, 1, 0, 2);
  else
    c += "\"bmm1_grad_gemm1_dot_dimension_numbers\": " + dot_dims(2, 1, 0, 1, 0, 2) +
         ", \"bmm1_grad_gemm2_dot_dimension_numbers\": " + dot_dims(3, 1, 0, 1, 0, 2) +
         ", \"bmm2_grad_gemm1_dot_dimension_numbers\": " + dot_dims(2, 1, 0, 1, 0, 2) +
         ", \"bmm2_grad_gemm2_dot_dimension_numbers\": " + dot_dims(3, 3, 0, 2, 0, 2);
  c += ", \"dropout_rate\": 0.0, \"seed\": 42, \"sliding_window_length\": " + std::to_string(o.window) +
       ", \"max_seg_per_batch\": " + std::to_string(std::max<int64_t>(max_segments, 1)) +
       ", \"is_paged_attention\": false}}";
  return c;
}

AttentionForward attention_forward_cudnn(HloBuilder& b, const Value& q, const Value& k, const Value& v,
                                         const AttentionOptions& o, const CudnnPacking* packed) {
  const Dims d = check_dims(q, k, v, "attention_forward_cudnn");
  check_options(o, "attention_forward_cudnn");
  const int64_t M = check_packing(packed, d, "attention_forward_cudnn");
  CustomCallOptions cc;
  cc.backend_config = cudnn_fmha_config(d.B, d.H, d.T, o, false, M);
  cc.operand_layouts = {kRowMajor4, kRowMajor4, kRowMajor4};
  cc.result_layouts = {kBthdAsBhtd, kRowMajor3, kBytes};
  std::vector<Value> operands{to_bf16(b, q), to_bf16(b, k), to_bf16(b, v)};
  if (packed) append_packing(b, *packed, d, operands, cc.operand_layouts);
  const std::vector<Value> r =
      b.custom_call(kForward, operands,
                    {TensorType{ElementType::kBF16, {d.B, d.H, d.T, d.D}},
                     TensorType{ElementType::kF32, {d.B * std::max<int64_t>(M, 1), d.H, d.T}},
                     TensorType{ElementType::kU8, {0}}},
                    cc);
  const Value out = from_result(b, r[0]);
  return {packed ? zero_padding(b, out, packed->seg) : out, r[1]};
}

AttentionBackward attention_backward_cudnn(HloBuilder& b, const Value& q, const Value& k, const Value& v,
                                           const Value& out, const Value& lse, const Value& dout,
                                           const AttentionOptions& o, const CudnnPacking* packed) {
  const Dims d = check_dims(q, k, v, "attention_backward_cudnn");
  check_options(o, "attention_backward_cudnn");
  const int64_t M = check_packing(packed, d, "attention_backward_cudnn");
  const std::vector<int64_t> qdims{d.B, d.T, d.H, d.D}, sdims{d.B * std::max<int64_t>(M, 1), d.H, d.T};
  OLMO_CHECK(out.type().dims == qdims && dout.type().dims == qdims && lse.type().dims == sdims &&
                 lse.type().type == ElementType::kF32,
             "attention_backward_cudnn: out and dout must be ", dims_string(qdims), " and lse f32 ",
             dims_string(sdims), ", got ", out.type().mlir(), ", ", dout.type().mlir(), ", ",
             lse.type().mlir());
  CustomCallOptions cc;
  cc.backend_config = cudnn_fmha_config(d.B, d.H, d.T, o, true, M);
  cc.operand_layouts = {kRowMajor4, kRowMajor4, kRowMajor4, kRowMajor3, kRowMajor4, kRowMajor4};
  cc.result_layouts = {kBthdAsBhtd, kBthdAsBhtd, kBthdAsBhtd, kBytes};
  const TensorType dq{ElementType::kBF16, {d.B, d.H, d.T, d.D}},
      dkv{ElementType::kBF16, {d.B, d.Hkv, d.T, d.D}};
  std::vector<Value> operands{to_bf16(b, q), to_bf16(b, k),    to_bf16(b, v),
                              lse,           to_bf16(b, dout), to_bf16(b, out)};
  if (packed) append_packing(b, *packed, d, operands, cc.operand_layouts);
  const std::vector<Value> r =
      b.custom_call(kBackward, operands, {dq, dkv, dkv, TensorType{ElementType::kU8, {0}}}, cc);
  AttentionBackward g{from_result(b, r[0]), from_result(b, r[1]), from_result(b, r[2])};
  if (packed)
    g = {zero_padding(b, g.dq, packed->seg), zero_padding(b, g.dk, packed->seg),
         zero_padding(b, g.dv, packed->seg)};
  return g;
}

}  // namespace olmosft::xla::ops
