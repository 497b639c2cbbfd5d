// Fused LM-head softmax cross-entropy with z-loss: PyTorch fixture (F.cross_entropy + z-loss, padded
// vocabulary, mask and ignore_index), tiled == untiled, float64 finite differences, the padded-vocab
// trap, and input validation.
#include <gtest/gtest.h>

#include "core/threads.h"
#include "kernels/cross_entropy.h"
#include "kernels/gradcheck.h"
#include "kernels/vexp.h"
#include "kernels_util.h"

using namespace olmosft;

namespace {
struct Fx {
  int64_t N, d, V_rows;
  XentConfig cfg;
  double scale;
  nlohmann::json j;
};
Fx load() {
  Fx f;
  f.j = kt::load_fixture("xent.json");
  f.N = f.j["N"];
  f.d = f.j["d"];
  f.V_rows = f.j["V_rows"];
  f.cfg.valid_vocab = f.j["valid_vocab"];
  f.cfg.z_loss = f.j["z_loss"];
  f.scale = f.j["scale"];
  return f;
}

template <typename T>
void vs_torch(int64_t chunk, int64_t block, double tol) {
  Fx f = load();
  f.cfg.vocab_chunk = chunk;
  f.cfg.row_block = block;
  auto h = kt::vec<T>(f.j["h"]), W = kt::vec<T>(f.j["W"]);
  auto tgt = kt::vec<int32_t>(f.j["targets"]);
  auto mask = kt::vec<uint8_t>(f.j["mask"]);
  std::vector<T> lse(static_cast<size_t>(f.N)), dh(static_cast<size_t>(f.N * f.d), T(7));
  std::vector<T> dW(static_cast<size_t>(f.V_rows * f.d), T(0));
  XentStats s =
      xent_forward<T>(h.data(), W.data(), tgt.data(), mask.data(), f.N, f.d, f.V_rows, f.cfg, lse.data());
  xent_backward<T>(h.data(), W.data(), tgt.data(), mask.data(), lse.data(), f.N, f.d, f.V_rows, f.cfg,
                   f.scale, dh.data(), dW.data());
  EXPECT_EQ(s.count, f.j["count"].get<int64_t>());
  const double ce = f.j["ce_sum"], z = f.j["z_sum"];
  EXPECT_NEAR(s.ce_sum / ce, 1.0, tol);
  EXPECT_NEAR(s.z_sum / z, 1.0, tol);
  const double e_lse = kt::max_rel(lse, kt::vec<double>(f.j["lse"]));
  const double e_dh = kt::max_rel(dh, kt::vec<double>(f.j["dh"]));
  const double e_dW = kt::max_rel(dW, kt::vec<double>(f.j["dW"]));
  EXPECT_LT(e_lse, tol);
  EXPECT_LT(e_dh, tol);
  EXPECT_LT(e_dW, tol);
  std::printf("[measured] %s chunk=%lld block=%lld: ce rel %.1e, z rel %.1e, lse %.1e, dh %.1e, dW %.1e\n",
              std::is_same_v<T, float> ? "float" : "double", (long long)chunk, (long long)block,
              std::abs(s.ce_sum / ce - 1), std::abs(s.z_sum / z - 1), e_lse, e_dh, e_dW);
  // Padded rows of W (>= valid_vocab) get no gradient; untrained tokens get dh = 0.
  for (int64_t r = f.cfg.valid_vocab; r < f.V_rows; ++r)
    for (int64_t k = 0; k < f.d; ++k) EXPECT_EQ(dW[static_cast<size_t>(r * f.d + k)], T(0));
  for (int64_t k = 0; k < f.d; ++k) EXPECT_EQ(dh[static_cast<size_t>(0 * f.d + k)], T(0));  // mask[0] = 0
}
}  // namespace

// Tolerances vs the float64 torch reference on the same float32 inputs: the float path's logits are
// sgemm sums over d=16 (~1e-7 relative), exp/log in float with double accumulation; 2e-6. double: 1e-12.
TEST(KernelsXent, VsTorchUntiledFloat) { vs_torch<float>(0, 0, 2e-6); }
TEST(KernelsXent, VsTorchTiledFloat) { vs_torch<float>(5, 2, 2e-6); }
TEST(KernelsXent, VsTorchUntiledDouble) { vs_torch<double>(0, 0, 1e-12); }
TEST(KernelsXent, VsTorchTiledDouble) { vs_torch<double>(8, 4, 1e-12); }

// The same fixture and tolerance on every exp path this CPU runs (vexp.h: AVX-512, AVX2, scalar, and libm,
// the glibc expf arithmetic the kernel used before vexp).
TEST(KernelsXent, VsTorchFloatEveryExpPath) {
  for (VexpPath p : {VexpPath::kLibm, VexpPath::kScalar, VexpPath::kAvx2, VexpPath::kAvx512}) {
    if (!vexp_path_supported(p)) continue;
    const VexpPath saved = vexp_set_path(p);
    std::printf("[measured] exp path %s:\n", vexp_path_name(p));
    vs_torch<float>(0, 0, 2e-6);
    vs_torch<float>(5, 2, 2e-6);
    vexp_set_path(saved);
  }
}

TEST(KernelsXent, PaddedVocabTrap) {
  Fx f = load();
  auto h = kt::vec<double>(f.j["h"]), W = kt::vec<double>(f.j["W"]);
  auto tgt = kt::vec<int32_t>(f.j["targets"]);
  auto mask = kt::vec<uint8_t>(f.j["mask"]);
  std::vector<double> lse(static_cast<size_t>(f.N));
  XentStats good = xent_forward<double>(h.data(), W.data(), tgt.data(), mask.data(), f.N, f.d, f.V_rows,
                                        f.cfg, lse.data());
  // With valid_vocab = V_rows the zero rows enter the softmax, which is what torch gives for the padded head.
  XentConfig bad = f.cfg;
  bad.valid_vocab = f.V_rows;
  XentStats padded =
      xent_forward<double>(h.data(), W.data(), tgt.data(), mask.data(), f.N, f.d, f.V_rows, bad, lse.data());
  EXPECT_NEAR(padded.ce_sum, f.j["ce_sum_if_padded_rows_in_softmax"].get<double>(), 1e-10);
  EXPECT_GT(padded.ce_sum, good.ce_sum + 1e-3) << "zero-padded rows must raise the loss when not excluded";
}

TEST(KernelsXent, TiledEqualsUntiledLarge) {
  // N=70 tokens, d=48, V_rows=1031 with 1000 valid (31 padded rows), chunk 128 (8 chunks, last partial),
  // row block 16; 1/3 of the tokens masked. Compare float tiled with float untiled.
  const int64_t N = 70, d = 48, V_rows = 1031;
  auto h = kt::randn<float>(static_cast<size_t>(N * d), 1),
       W = kt::randn<float>(static_cast<size_t>(V_rows * d), 2, 0.3);
  std::vector<int32_t> tgt(static_cast<size_t>(N));
  std::vector<uint8_t> mask(static_cast<size_t>(N));
  for (int64_t i = 0; i < N; ++i) {
    tgt[size_t(i)] = int32_t((i * 7919) % 1000);
    mask[size_t(i)] = i % 3 != 0;
  }
  XentConfig untiled;
  untiled.valid_vocab = 1000;
  untiled.z_loss = 1e-4;
  untiled.vocab_chunk = 0;
  untiled.row_block = 0;
  XentConfig tiled = untiled;
  tiled.vocab_chunk = 128;
  tiled.row_block = 16;
  auto run = [&](const XentConfig& c, std::vector<float>& lse, std::vector<float>& dh,
                 std::vector<float>& dW) {
    lse.assign(static_cast<size_t>(N), 0.f);
    dh.assign(static_cast<size_t>(N * d), 0.f);
    dW.assign(static_cast<size_t>(V_rows * d), 0.f);
    XentStats s =
        xent_forward<float>(h.data(), W.data(), tgt.data(), mask.data(), N, d, V_rows, c, lse.data());
    xent_backward<float>(h.data(), W.data(), tgt.data(), mask.data(), lse.data(), N, d, V_rows, c, 1.0 / 46,
                         dh.data(), dW.data());
    return s;
  };
  std::vector<float> l1, dh1, dW1, l2, dh2, dW2;
  XentStats a = run(untiled, l1, dh1, dW1), b = run(tiled, l2, dh2, dW2);
  EXPECT_EQ(a.count, 46);
  EXPECT_EQ(b.count, 46);
  // Different summation order only (online max/rescale vs one pass): float rounding, ~1e-7 relative.
  EXPECT_NEAR(a.ce_sum / b.ce_sum, 1.0, 1e-6);
  EXPECT_NEAR(a.z_sum / b.z_sum, 1.0, 1e-6);
  EXPECT_LT(kt::max_rel(l2, l1), 1e-6);
  EXPECT_LT(kt::max_rel(dh2, dh1), 1e-5);
  EXPECT_LT(kt::max_rel(dW2, dW1), 1e-5);
  std::printf("[measured] tiled vs untiled (float): ce %.1e lse %.1e dh %.1e dW %.1e\n",
              std::abs(a.ce_sum / b.ce_sum - 1), kt::max_rel(l2, l1), kt::max_rel(dh2, dh1),
              kt::max_rel(dW2, dW1));
  // And against the double computation through the same code.
  std::vector<double> hd(h.begin(), h.end()), Wd(W.begin(), W.end()), ld(static_cast<size_t>(N));
  XentStats c =
      xent_forward<double>(hd.data(), Wd.data(), tgt.data(), mask.data(), N, d, V_rows, tiled, ld.data());
  EXPECT_NEAR(b.ce_sum / c.ce_sum, 1.0, 1e-6);
  // Thread-count independence of the loss (row-parallel loops, fixed order within a row).
  const int saved = num_threads();
  set_threads(1);
  std::vector<float> l3, dh3, dW3;
  XentStats e = run(tiled, l3, dh3, dW3);
  set_threads(saved);
  EXPECT_EQ(e.ce_sum, b.ce_sum);
}

TEST(KernelsXent, FiniteDifferencesFloat64) {
  const int64_t N = 5, d = 4, V_rows = 13;
  XentConfig cfg;
  cfg.valid_vocab = 11;
  cfg.z_loss = 0.1;
  cfg.vocab_chunk = 4;
  cfg.row_block = 3;
  auto h = kt::randn<double>(static_cast<size_t>(N * d), 3),
       W = kt::randn<double>(static_cast<size_t>(V_rows * d), 4);
  const std::vector<int32_t> tgt = {10, 0, 5, -100, 3};
  const double scale = 0.3;
  std::vector<double> lse(static_cast<size_t>(N)), dh(static_cast<size_t>(N * d)),
      dW(static_cast<size_t>(V_rows * d), 0.0);
  auto loss = [&] {
    XentStats s =
        xent_forward<double>(h.data(), W.data(), tgt.data(), nullptr, N, d, V_rows, cfg, lse.data());
    return scale * (s.ce_sum + cfg.z_loss * s.z_sum);
  };
  loss();
  xent_backward<double>(h.data(), W.data(), tgt.data(), nullptr, lse.data(), N, d, V_rows, cfg, scale,
                        dh.data(), dW.data());
  // float64 central differences, h = 1e-5: ~1e-10 relative; 1e-7 threshold.
  const double eh = fd_max_rel_err(loss, h.data(), N * d, dh.data());
  const double ew = fd_max_rel_err(loss, W.data(), V_rows * d, dW.data());
  EXPECT_LT(eh, 1e-7);
  EXPECT_LT(ew, 1e-7);
  std::printf("[measured] FD float64: dh %.1e dW %.1e\n", eh, ew);
}

TEST(KernelsXent, Validation) {
  std::vector<float> h(8, 0.f), W(12, 0.f), lse(2);
  std::vector<int32_t> tgt = {0, 5};
  XentConfig cfg;
  cfg.valid_vocab = 3;
  try {
    xent_forward<float>(h.data(), W.data(), tgt.data(), nullptr, 2, 4, 3, cfg, lse.data());
    ADD_FAILURE() << "target 5 >= valid_vocab 3 must throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("token 1"), std::string::npos) << e.what();
  }
  std::vector<uint8_t> mask = {1, 0};  // the bad target is masked: fine
  XentStats s = xent_forward<float>(h.data(), W.data(), tgt.data(), mask.data(), 2, 4, 3, cfg, lse.data());
  EXPECT_EQ(s.count, 1);
  EXPECT_NEAR(s.ce_sum, std::log(3.0), 1e-6);  // all-zero logits: uniform over the 3 valid rows
  cfg.valid_vocab = 4;
  EXPECT_THROW(xent_forward<float>(h.data(), W.data(), tgt.data(), mask.data(), 2, 4, 3, cfg, lse.data()),
               Error);
  cfg.valid_vocab = 3;
  tgt[0] = -7;  // negative but not ignore_index
  EXPECT_THROW(xent_forward<float>(h.data(), W.data(), tgt.data(), mask.data(), 2, 4, 3, cfg, lse.data()),
               Error);
  // No trained tokens: zero sums, dh zeroed.
  std::vector<uint8_t> none = {0, 0};
  std::vector<float> dh(8, 1.f), dW(12, 0.f);
  s = xent_forward<float>(h.data(), W.data(), tgt.data(), none.data(), 2, 4, 3, cfg, lse.data());
  EXPECT_EQ(s.count, 0);
  xent_backward<float>(h.data(), W.data(), tgt.data(), none.data(), lse.data(), 2, 4, 3, cfg, 1.0, dh.data(),
                       dW.data());
  for (float v : dh) EXPECT_EQ(v, 0.f);
  // Tensor overload shape checks.
  Tensor th = Tensor::zeros({2, 4}), tW = Tensor::zeros({3, 5}),
         tt = Tensor::from(std::vector<int32_t>{0, 1}, {2}), tl = Tensor::zeros({2}), nomask;
  EXPECT_THROW(xent_forward(th, tW, tt, nomask, cfg, tl), Error);
}
