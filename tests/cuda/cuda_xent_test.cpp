// Fused LM head + cross-entropy (src/cuda/xent.h) against a float64 loop on the same bf16 h and W, with a
// trained mask, ignore_index targets, padded vocabulary rows (valid_vocab < V_rows), z-loss, and tiles that
// do not divide the problem (uneven last row block and vocabulary chunk); plus the untiled configuration and
// a determinism check. Tolerances. Logit (d-term fp32 dot of exact bf16 products): B_i = 2 gamma_d max_j
// sum_k |h_ik W_jk|. lse: B_i (every logit within B_i) + 1e-4 (fp32 exp and sums over a chunk of <= 1024
// terms, each <= 1, combined in double). ce = lse - logit_t: 2 (B_i + 1e-4) per token; z = lse^2: 2 |lse|
// (B_i + 1e-4). Gradients: dlogit_ij = scale (p_ij k_i - [j == t]) is rounded to bf16 (2^-8 relative with
// margin) after an fp32 error of p (3 (B_i + 1e-4) relative), so with a_ij = |scale| (p_ij |k_i| + [j == t])
// and e_i = 2^-8 + 3 (B_i + 1e-4) + 2 gamma_V: |dh_ik - exact| <= e_i sum_j a_ij |W_jk| + 2^-8 |dh_ik| (bf16
// out), |dW_jk - exact| <= sum_i e_i a_ij |h_ik| + 2 gamma_N |dW0_jk| (fp32 out, accumulated onto dW0).
#include <gtest/gtest.h>

#include <algorithm>
#include <type_traits>
#include <vector>

#include "cuda/check.h"
#include "cuda/xent.h"
#include "cuda_test_util.h"
#include "kernels/cross_entropy_config.h"

using namespace olmosft::cuda;
using namespace olmosft::cuda::test;

// One definition: the CUDA names are the CPU kernel's types (same fields, same defaults).
static_assert(std::is_same_v<olmosft::cuda::XentConfig, olmosft::XentConfig>);
static_assert(std::is_same_v<olmosft::cuda::XentStats, olmosft::XentStats>);

namespace {

constexpr int64_t kN = 300, kD = 128, kVRows = 1000, kValid = 960;
constexpr float kZ = 1e-4f;

struct Problem {
  std::vector<uint16_t> h, W;
  std::vector<int32_t> targets;
  std::vector<uint8_t> mask;
  std::vector<float> dW0;
};

Problem make_problem() {
  Problem p{random_bf16(size_t(kN * kD), 1.0f, 21), random_bf16(size_t(kVRows * kD), 0.1f, 22), {}, {}, {}};
  std::mt19937 rng(23);
  for (int64_t i = 0; i < kN; ++i) {
    p.targets.push_back(i % 11 == 5 ? -100 : int32_t(rng() % uint32_t(kValid)));
    p.mask.push_back(i % 7 == 3 ? 0 : 1);
  }
  p.targets[0] = int32_t(kValid - 1);  // last valid row (in the last, partial chunk)
  p.targets[1] = 768;                  // first row of a chunk
  p.targets[3] = int32_t(kValid + 5);  // out of range but masked (i % 7 == 3): must be ignored
  p.dW0 = random_f32(size_t(kVRows * kD), 0.01f, 24);
  return p;
}

struct Result {
  XentStats st;
  std::vector<float> lse, dW;
  std::vector<uint16_t> dh;
};

Result run(const Problem& p, int64_t chunk, int64_t row_block, float scale_num) {
  Gemm gemm;
  XentConfig cfg;
  cfg.valid_vocab = kValid, cfg.z_loss = kZ, cfg.vocab_chunk = chunk, cfg.row_block = row_block;
  FusedXent xent(gemm, kN, kD, kVRows, cfg);
  DeviceArray<uint16_t> h(p.h), W(p.W), dh(size_t(kN * kD));
  DeviceArray<int32_t> t(p.targets);
  DeviceArray<uint8_t> m(p.mask);
  DeviceArray<float> lse(static_cast<size_t>(kN)), dW(p.dW0);
  Result r;
  r.st = xent.forward(h.data(), W.data(), t.data(), m.data(), kN, lse.data());
  xent.backward(h.data(), W.data(), t.data(), m.data(), lse.data(), kN, scale_num / float(r.st.count),
                dh.data(), dW.data());
  check(cudaDeviceSynchronize(), "xent test");
  r.lse = lse.download(), r.dW = dW.download(), r.dh = dh.download();
  return r;
}

bool is_trained(const Problem& p, int64_t i) {
  return p.mask[size_t(i)] != 0 && p.targets[size_t(i)] != -100;
}

void check_against_reference(const Problem& p, const Result& r, float scale_num) {
  std::vector<double> L(size_t(kN), 0.0), B(size_t(kN), 0.0), P(size_t(kN * kValid), 0.0);
  double ce = 0, z = 0, ce_tol = 1e-9, z_tol = 1e-9;
  int64_t count = 0;
  for (int64_t i = 0; i < kN; ++i) {
    if (!is_trained(p, i)) continue;
    ++count;
    std::vector<double> l(static_cast<size_t>(kValid));
    double mx = -INFINITY, babs = 0;
    for (int64_t j = 0; j < kValid; ++j) {
      double s = 0, sa = 0;
      for (int64_t k = 0; k < kD; ++k) {
        const double v = bf(p.h[size_t(i * kD + k)]) * bf(p.W[size_t(j * kD + k)]);
        s += v, sa += std::fabs(v);
      }
      l[size_t(j)] = s, mx = std::max(mx, s), babs = std::max(babs, sa);
    }
    double se = 0;
    for (double v : l) se += std::exp(v - mx);
    L[size_t(i)] = mx + std::log(se);
    B[size_t(i)] = 2 * gamma32(kD) * babs;
    for (int64_t j = 0; j < kValid; ++j) P[size_t(i * kValid + j)] = std::exp(l[size_t(j)] - L[size_t(i)]);
    ce += L[size_t(i)] - l[size_t(p.targets[size_t(i)])];
    z += L[size_t(i)] * L[size_t(i)];
    ce_tol += 2 * (B[size_t(i)] + 1e-4);
    z_tol += 2 * std::fabs(L[size_t(i)]) * (B[size_t(i)] + 1e-4);
  }
  ASSERT_EQ(r.st.count, count);
  EXPECT_NEAR(r.st.ce_sum, ce, ce_tol);
  EXPECT_NEAR(r.st.z_sum, z, z_tol);
  std::vector<double> tol_l(static_cast<size_t>(kN));
  for (int64_t i = 0; i < kN; ++i) {
    tol_l[size_t(i)] = is_trained(p, i) ? B[size_t(i)] + 1e-4 + 0x1p-24 * std::fabs(L[size_t(i)]) : 0.0;
    if (!is_trained(p, i)) {
      EXPECT_EQ(r.lse[size_t(i)], 0.0f) << "untrained token " << i << " has lse";
    }
  }
  EXPECT_EQ(count_bad("lse", widen(r.lse), L, tol_l), 0);
  // Gradients.
  const double scale = double(scale_num / float(count));
  std::vector<double> dh(size_t(kN * kD), 0.0), dh_tol(size_t(kN * kD), 1e-30), dW(size_t(kVRows * kD), 0.0),
      dW_tol(size_t(kVRows * kD), 0.0);
  for (int64_t i = 0; i < kN; ++i) {
    if (!is_trained(p, i)) continue;
    const double k = 1.0 + 2.0 * double(kZ) * L[size_t(i)];
    const double e = 0x1p-8 + 3 * (B[size_t(i)] + 1e-4) + 2 * gamma32(kValid);
    for (int64_t j = 0; j < kValid; ++j) {
      const bool tgt = j == p.targets[size_t(i)];
      const double pj = P[size_t(i * kValid + j)];
      const double g = scale * (pj * k - (tgt ? 1.0 : 0.0)),
                   a = std::fabs(scale) * (pj * std::fabs(k) + (tgt ? 1.0 : 0.0));
      for (int64_t c = 0; c < kD; ++c) {
        const double w = bf(p.W[size_t(j * kD + c)]), hv = bf(p.h[size_t(i * kD + c)]);
        dh[size_t(i * kD + c)] += g * w;
        dh_tol[size_t(i * kD + c)] += e * a * std::fabs(w);
        dW[size_t(j * kD + c)] += g * hv;
        dW_tol[size_t(j * kD + c)] += e * a * std::fabs(hv);
      }
    }
  }
  for (size_t q = 0; q < dh.size(); ++q) dh_tol[q] += kBf16Rel * std::fabs(dh[q]);
  for (size_t q = 0; q < dW.size(); ++q) {
    dW[q] += p.dW0[q];
    dW_tol[q] += 2 * gamma32(kN) * std::fabs(p.dW0[q]);
  }
  EXPECT_EQ(count_bad("dh", widen(r.dh), dh, dh_tol), 0);
  // Rows >= valid_vocab: bit for bit untouched.
  std::vector<double> dWv(dW.begin(), dW.begin() + kValid * kD),
      dWt(dW_tol.begin(), dW_tol.begin() + kValid * kD);
  std::vector<double> gotv(r.dW.begin(), r.dW.begin() + kValid * kD);
  EXPECT_EQ(count_bad("dW", gotv, dWv, dWt), 0);
  for (size_t q = size_t(kValid * kD); q < r.dW.size(); ++q)
    ASSERT_EQ(r.dW[q], p.dW0[q]) << "padded vocabulary row " << q / kD << " got a gradient";
  for (int64_t i = 0; i < kN; ++i)
    if (!is_trained(p, i)) {
      for (int64_t c = 0; c < kD; ++c)
        ASSERT_EQ(bf(r.dh[size_t(i * kD + c)]), 0.0) << "untrained token " << i << " has dh";
    }
}

}  // namespace

// Tiled (row blocks of 128: 128 + 128 + 44; vocabulary chunks of 256: 3 x 256 + 192) and untiled.
TEST(CudaXent, MatchesFloat64Reference) {
  OLMOSFT_SKIP_WITHOUT_CUDA_DEVICE();
  const Problem p = make_problem();
  for (const auto& [chunk, block] : {std::pair<int64_t, int64_t>{256, 128}, {1 << 20, 1 << 20}}) {
    SCOPED_TRACE("vocab_chunk=" + std::to_string(chunk) + " row_block=" + std::to_string(block));
    check_against_reference(p, run(p, chunk, block, 1.0f), 1.0f);
  }
}

TEST(CudaXent, Deterministic) {
  OLMOSFT_SKIP_WITHOUT_CUDA_DEVICE();
  const Problem p = make_problem();
  const Result a = run(p, 256, 128, 1.0f), b = run(p, 256, 128, 1.0f);
  EXPECT_EQ(a.st.ce_sum, b.st.ce_sum);
  EXPECT_EQ(a.st.z_sum, b.st.z_sum);
  EXPECT_TRUE(bitwise_equal(a.lse, b.lse));
  EXPECT_TRUE(bitwise_equal(a.dh, b.dh));
  EXPECT_TRUE(bitwise_equal(a.dW, b.dW));
}

// A trained token with a target >= valid_vocab is an error (a masked one, token 3 above, is not).
TEST(CudaXent, RejectsTargetOutsideValidVocab) {
  OLMOSFT_SKIP_WITHOUT_CUDA_DEVICE();
  Problem p = make_problem();
  p.targets[2] = int32_t(kValid);
  EXPECT_THROW(run(p, 256, 128, 1.0f), std::invalid_argument);
}

// Configuration checks happen before any allocation.
TEST(CudaXent, RejectsBadConfig) {
  OLMOSFT_SKIP_WITHOUT_CUDA_DEVICE();
  Gemm gemm;
  XentConfig cfg;
  cfg.valid_vocab = kVRows + 1;
  EXPECT_THROW(FusedXent(gemm, kN, kD, kVRows, cfg), std::invalid_argument);
  cfg.valid_vocab = kValid, cfg.vocab_chunk = 0;
  EXPECT_THROW(FusedXent(gemm, kN, kD, kVRows, cfg), std::invalid_argument);
}
