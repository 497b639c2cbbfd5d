// The whole KDA kernel chain (conv+SiLU -> L2 norm -> gate/beta -> delta rule -> gated output norm) against
// an independent PyTorch float64 reference with autograd (tests/reference/kda_reference.py; fixture in
// tests/golden/kda/): T = 50, 2 heads, dk 16, dv 32, three documents (21, 3, 21 tokens; the 3-token one is
// shorter than the conv kernel) and 5 padding tokens. Run in float64 and float32, with the chunked kernel
// (chunk 16, so document boundaries fall mid-chunk) and the recurrent one.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "kda_test_util.h"
#include "kernels/kda.h"

using namespace olmosft::kda;

namespace {

struct Golden {
  nlohmann::json cfg;
  std::map<std::string, std::vector<double>> t;
  const std::vector<double>& at(const std::string& n) const {
    auto it = t.find(n);
    if (it == t.end()) throw std::runtime_error("golden tensor missing: " + n);
    return it->second;
  }
};

Golden load() {
  const std::string dir = std::string(OLMOSFT_GOLDEN_DIR) + "/kda/";
  Golden g;
  std::ifstream js(dir + "kda_golden.json");
  if (!js) throw std::runtime_error("cannot open " + dir + "kda_golden.json");
  g.cfg = nlohmann::json::parse(js);
  std::ifstream bin(dir + "kda_golden.bin", std::ios::binary);
  std::vector<char> raw((std::istreambuf_iterator<char>(bin)), std::istreambuf_iterator<char>());
  for (auto& [name, info] : g.cfg["tensors"].items()) {
    int64_t n = 1;
    for (auto s : info["shape"]) n *= s.get<int64_t>();
    const int64_t off = info["offset"].get<int64_t>();
    if (size_t((off + n) * 8) > raw.size()) throw std::runtime_error("kda_golden.bin too short for " + name);
    std::vector<double> v(static_cast<size_t>(n));
    std::memcpy(v.data(), raw.data() + off * 8, size_t(n) * 8);  // little-endian host (x86-64)
    g.t[name] = std::move(v);
  }
  return g;
}

template <typename T>
std::vector<T> cast(const std::vector<double>& v) {
  return std::vector<T>(v.begin(), v.end());
}

template <typename T>
void run_chain(const Golden& G, bool chunked, double tol) {
  const int64_t L = G.cfg["T"], H = G.cfg["H"], DK = G.cfg["DK"], DV = G.cfg["DV"], KC = G.cfg["conv_kernel"];
  const T eps_l2 = T(G.cfg["eps_l2"].get<double>()), eps_n = T(G.cfg["eps_norm"].get<double>());
  const T scale = T(G.cfg["scale"].get<double>());
  const std::vector<int32_t> seg = G.cfg["segments"].get<std::vector<int32_t>>();
  ASSERT_EQ(int64_t(seg.size()), L);
  const int64_t CK = H * DK, CV = H * DV, NH = L * H;
  auto in = [&](const char* n) { return cast<T>(G.at(n)); };
  auto q_in = in("q_in"), k_in = in("k_in"), v_in = in("v_in"), wq = in("q_conv_w"), wk = in("k_conv_w"),
       wv = in("v_conv_w"), f = in("f"), A_log = in("A_log"), dtb = in("dt_bias"), b = in("b"), z = in("z"),
       wn = in("o_norm_w"), dy = in("dy");
  // Forward.
  std::vector<T> qc(L * CK), kc(L * CK), vc(L * CV), qn(L * CK), kn(L * CK), g(L * CK), beta(NH), o(L * CV),
      y(L * CV);
  short_conv_silu_forward(q_in.data(), wq.data(), seg.data(), 1, L, CK, KC, qc.data());
  short_conv_silu_forward(k_in.data(), wk.data(), seg.data(), 1, L, CK, KC, kc.data());
  short_conv_silu_forward(v_in.data(), wv.data(), seg.data(), 1, L, CV, KC, vc.data());
  l2norm_forward(qc.data(), NH, DK, eps_l2, qn.data());
  l2norm_forward(kc.data(), NH, DK, eps_l2, kn.data());
  kda_gate_forward(f.data(), A_log.data(), dtb.data(), L, H, DK, g.data());
  kda_beta_forward(b.data(), NH, true, beta.data());
  const KdaDims d{1, L, H, DK, DV};
  if (chunked)
    kda_chunk_forward(qn.data(), kn.data(), vc.data(), g.data(), beta.data(), seg.data(), d, scale, o.data(),
                      16);
  else
    kda_recurrent_forward(qn.data(), kn.data(), vc.data(), g.data(), beta.data(), seg.data(), d, scale,
                          o.data());
  kda_output_norm_forward(o.data(), z.data(), wn.data(), NH, DV, eps_n, y.data());
  // Backward.
  std::vector<T> d_o(L * CV), d_z(L * CV), d_wn(DV, T(0)), d_qn(L * CK), d_kn(L * CK), d_vc(L * CV),
      d_g(L * CK), d_beta(NH), d_qc(L * CK), d_kc(L * CK), d_q_in(L * CK), d_k_in(L * CK), d_v_in(L * CV),
      d_wq(CK * KC, T(0)), d_wk(CK * KC, T(0)), d_wv(CV * KC, T(0)), d_f(L * CK), d_A(H, T(0)),
      d_dtb(CK, T(0)), d_b(NH);
  kda_output_norm_backward(o.data(), z.data(), wn.data(), dy.data(), NH, DV, eps_n, d_o.data(), d_z.data(),
                           d_wn.data());
  if (chunked)
    kda_chunk_backward(qn.data(), kn.data(), vc.data(), g.data(), beta.data(), seg.data(), d, scale,
                       d_o.data(), d_qn.data(), d_kn.data(), d_vc.data(), d_g.data(), d_beta.data(), 16);
  else
    kda_recurrent_backward(qn.data(), kn.data(), vc.data(), g.data(), beta.data(), seg.data(), d, scale,
                           d_o.data(), d_qn.data(), d_kn.data(), d_vc.data(), d_g.data(), d_beta.data());
  l2norm_backward(qc.data(), d_qn.data(), NH, DK, eps_l2, d_qc.data());
  l2norm_backward(kc.data(), d_kn.data(), NH, DK, eps_l2, d_kc.data());
  short_conv_silu_backward(q_in.data(), wq.data(), seg.data(), 1, L, CK, KC, d_qc.data(), d_q_in.data(),
                           d_wq.data());
  short_conv_silu_backward(k_in.data(), wk.data(), seg.data(), 1, L, CK, KC, d_kc.data(), d_k_in.data(),
                           d_wk.data());
  short_conv_silu_backward(v_in.data(), wv.data(), seg.data(), 1, L, CV, KC, d_vc.data(), d_v_in.data(),
                           d_wv.data());
  kda_gate_backward(f.data(), A_log.data(), dtb.data(), d_g.data(), L, H, DK, d_f.data(), d_A.data(),
                    d_dtb.data());
  kda_beta_backward(b.data(), d_beta.data(), NH, true, d_b.data());

  const std::map<std::string, const std::vector<T>*> mine = {{"qc", &qc},
                                                             {"kc", &kc},
                                                             {"vc", &vc},
                                                             {"qn", &qn},
                                                             {"kn", &kn},
                                                             {"g", &g},
                                                             {"beta", &beta},
                                                             {"o", &o},
                                                             {"y", &y},
                                                             {"d_o", &d_o},
                                                             {"d_z", &d_z},
                                                             {"d_o_norm_w", &d_wn},
                                                             {"d_qn", &d_qn},
                                                             {"d_kn", &d_kn},
                                                             {"d_vc", &d_vc},
                                                             {"d_g", &d_g},
                                                             {"d_beta", &d_beta},
                                                             {"d_qc", &d_qc},
                                                             {"d_kc", &d_kc},
                                                             {"d_q_in", &d_q_in},
                                                             {"d_k_in", &d_k_in},
                                                             {"d_v_in", &d_v_in},
                                                             {"d_q_conv_w", &d_wq},
                                                             {"d_k_conv_w", &d_wk},
                                                             {"d_v_conv_w", &d_wv},
                                                             {"d_f", &d_f},
                                                             {"d_A_log", &d_A},
                                                             {"d_dt_bias", &d_dtb},
                                                             {"d_b", &d_b}};
  double worst = 0;
  std::string worst_name;
  for (const auto& [name, v] : mine) {
    const auto& ref = G.at(name);
    ASSERT_EQ(v->size(), ref.size()) << name;
    const double e = kdatest::rel_err(*v, ref);
    EXPECT_LE(e, tol) << name;
    if (e > worst) worst = e, worst_name = name;
  }
  std::printf("%s %s vs torch float64: worst rel err %.2e (%s) over %zu tensors\n",
              sizeof(T) == 8 ? "f64" : "f32", chunked ? "chunked" : "recurrent", worst, worst_name.c_str(),
              mine.size());
}

}  // namespace

// float64: identical math in a different order; 1e-11 relative to each tensor's max (measured <= 7.7e-15).
TEST(KdaGolden, Float64MatchesTorch) {
  const Golden G = load();
  run_chain<double>(G, true, 1e-11);
  run_chain<double>(G, false, 1e-11);
}

// float32 vs the float64 reference: fp32 rounding through ~45 sequential state updates and the norms;
// measured <= 3.5e-6 relative to each tensor's max; tolerance 3e-5.
TEST(KdaGolden, Float32MatchesTorch) {
  const Golden G = load();
  run_chain<float>(G, true, 3e-5);
  run_chain<float>(G, false, 3e-5);
}
