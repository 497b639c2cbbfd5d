#include "kernels/gemm_onednn.h"

#include <cstring>
#include <dnnl.hpp>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>

#include "core/error.h"

namespace olmosft::onednn {

namespace {
using dt = dnnl::memory::data_type;
constexpr dnnl::memory::dim kRt = DNNL_RUNTIME_DIM_VAL;

dnnl::engine& cpu_engine() {
  static dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  return eng;
}

// Row-major op(X) of rows x cols as a matmul operand: stored [rows, cols] (N) or [cols, rows] (T).
dnnl::memory::desc operand(dt type, bool trans, dnnl::memory::dim rows, dnnl::memory::dim cols,
                           dnnl::memory::dim ld) {
  return dnnl::memory::desc({rows, cols}, type,
                            trans ? dnnl::memory::dims{1, ld} : dnnl::memory::dims{ld, 1});
}

struct Prim {
  dnnl::matmul::primitive_desc pd;
  dnnl::matmul matmul;
};

// (bf16 operands, op(A) transposed, op(B) transposed, beta's bits) -> primitive with run-time sizes.
using Key = std::tuple<bool, bool, bool, uint32_t>;

Prim make_prim(const Key& key) {
  const auto [bf16, ta, tb, beta_bits] = key;
  float beta;
  std::memcpy(&beta, &beta_bits, 4);
  const dt in = bf16 ? dt::bf16 : dt::f32;
  dnnl::primitive_attr attr;
  // alpha, given at each call: oneDNN 2.x's output scale, 3.x's weights scale (both scale the accumulated
  // product before the sum post-op).
#if DNNL_VERSION_MAJOR >= 3
  attr.set_scales_mask(DNNL_ARG_WEIGHTS, 0);
#else
  attr.set_output_scales(0, {DNNL_RUNTIME_F32_VAL});
#endif
  if (beta != 0.0f) {
    dnnl::post_ops po;
    po.append_sum(beta);  // dst = alpha * op(A) op(B) + beta * dst
    attr.set_post_ops(po);
  }
  const auto a = operand(in, ta, kRt, kRt, kRt), b = operand(in, tb, kRt, kRt, kRt),
             c = operand(dt::f32, false, kRt, kRt, kRt);
#if DNNL_VERSION_MAJOR >= 3
  dnnl::matmul::primitive_desc pd(cpu_engine(), a, b, c, attr);
#else
  dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a, b, c), attr, cpu_engine());
#endif
  return {pd, dnnl::matmul(pd)};
}

const Prim& prim_for(const Key& key) {
  static std::mutex mu;
  static std::map<Key, std::unique_ptr<Prim>> cache;
  std::lock_guard<std::mutex> lock(mu);
  auto& slot = cache[key];
  if (!slot) {
    try {
      slot = std::make_unique<Prim>(make_prim(key));
    } catch (const dnnl::error& e) {
      cache.erase(key);
      throw Error(std::string("oneDNN: no ") + (std::get<0>(key) ? "bf16" : "f32") + " matmul on this CPU (" +
                  e.what() + ")");
    }
  }
  return *slot;
}

uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

void run(bool bf16, Trans ta, Trans tb, int64_t M, int64_t N, int64_t K, float alpha, const void* A,
         int64_t lda, const void* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  const bool at = ta == Trans::T, bt = tb == Trans::T;
  const Prim& p = prim_for(Key{bf16, at, bt, bits(beta)});
  const dt in = bf16 ? dt::bf16 : dt::f32;
  auto& eng = cpu_engine();
  thread_local dnnl::stream stream(cpu_engine());
  // oneDNN's memory takes a non-const handle; it only reads SRC and WEIGHTS.
  dnnl::memory a(operand(in, at, M, K, lda), eng, const_cast<void*>(A));
  dnnl::memory b(operand(in, bt, K, N, ldb), eng, const_cast<void*>(B));
  dnnl::memory c(operand(dt::f32, false, M, N, ldc), eng, C);
  dnnl::memory scale(dnnl::memory::desc({1}, dt::f32, dnnl::memory::dims{1}), eng, &alpha);
#if DNNL_VERSION_MAJOR >= 3
  constexpr int kScaleArg = DNNL_ARG_ATTR_SCALES | DNNL_ARG_WEIGHTS;
#else
  constexpr int kScaleArg = DNNL_ARG_ATTR_OUTPUT_SCALES;
#endif
  p.matmul.execute(stream, {{DNNL_ARG_SRC, a}, {DNNL_ARG_WEIGHTS, b}, {DNNL_ARG_DST, c}, {kScaleArg, scale}});
  stream.wait();
}
}  // namespace

void matmul_f32(Trans ta, Trans tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
                const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  run(false, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

void matmul_bf16(Trans ta, Trans tb, int64_t M, int64_t N, int64_t K, float alpha, const uint16_t* A,
                 int64_t lda, const uint16_t* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  run(true, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

bool bf16_supported(std::string* why) {
  // Without AVX512-BF16 oneDNN 2.6 may still offer bf16 matmul by emulation, slower than fp32: refuse it.
  if (!__builtin_cpu_supports("avx512bf16")) {
    if (why) *why = "this CPU has no AVX512-BF16 instructions (bf16 would be emulated, slower than fp32)";
    return false;
  }
  try {
    prim_for(Key{true, false, true, 0});
    return true;
  } catch (const Error& e) {
    if (why) *why = e.what();
    return false;
  }
}

std::string description() {
  const dnnl_version_t* v = dnnl_version();
  std::string s = "oneDNN " + std::to_string(v->major) + "." + std::to_string(v->minor) + "." +
                  std::to_string(v->patch) + " (";
  for (bool bf16 : {false, true}) {
    s += bf16 ? ", bf16: " : "f32: ";
    try {
      s += prim_for(Key{bf16, false, true, 0}).pd.impl_info_str();
    } catch (const Error&) {
      s += "unsupported on this CPU";
    }
  }
  return s + ")";
}

}  // namespace olmosft::onednn
