// Our KDA delta-rule kernels (recurrent; chunked with chunk 16 and 64) against UPSTREAM: transformers
// 5.23.0's Kimi Linear chunk_kimi_delta_attention / recurrent_kimi_delta_attention (the torch paths of its
// KDA layer; later revisions name them torch_chunk_kda / torch_recurrent_kda), torch 2.15.0, run by
// tests/reference/kda_upstream.py one document per call (the torch path has no cu_seqlens). Here the same
// five documents (23, 1, 5, 40, 8 tokens) and 3 padding tokens are PACKED in one row of 80 tokens with
// segment ids, so the boundaries at 23, 24, 29 and 69 fall inside chunks of 16 and of 64. Compared: o and
// the gradients of sum(o * do) w.r.t. q, k, v, g, beta, in two cases:
// - l2norm: use_qk_l2norm_in_kernel=True on raw q, k; ours = l2norm_forward, delta rule, l2norm_backward;
// - prenorm: use_qk_l2norm_in_kernel=False on unit q, k; ours = the delta-rule kernel alone.
// References in the fixture (tests/golden/kda/kda_upstream.{bin,json}):
// - up32_chunk, up32_rec: the upstream functions as they run (float32 inside, whatever the input dtype);
// - up64_chunk: the chunk function's own source with its float32 casts made float64 (its float64 twin).
// Error = max |ours - ref| / max |ref| per tensor (kdatest::rel_err). Measured (printed by the tests; the
// generator's own gaps are in kda_upstream.json "measured_rel_gaps"):
//   upstream float32 vs its float64 twin (up32_* vs up64_chunk): <= 4.6e-7 over all tensors and both cases;
//   ours float64 vs up64_chunk <= 1.2e-15; ours float64 vs up32_* <= 4.6e-7 (= upstream's own float32 error);
//   ours float32 vs up64_chunk <= 4.9e-7; ours float32 vs up32_* <= 6.6e-7.
// Tolerances: 1e-12 for float64 vs the float64 twin (same math, different association: rounding only); 5e-6,
// about 10x the measured float32 gaps, for everything involving float32. A real discrepancy is far larger: a
// missed document boundary gives 0.93 (IgnoringSegmentsIsDetected).
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "kda_test_util.h"
#include "kernels/kda.h"

using namespace olmosft::kda;

namespace {

struct Fixture {
  nlohmann::json cfg;
  std::map<std::string, std::vector<double>> t;
  const std::vector<double>& at(const std::string& n) const {
    auto it = t.find(n);
    if (it == t.end()) throw std::runtime_error("kda_upstream tensor missing: " + n);
    return it->second;
  }
};

const Fixture& fixture() {
  static const Fixture F = [] {
    const std::string dir = std::string(OLMOSFT_GOLDEN_DIR) + "/kda/";
    Fixture f;
    std::ifstream js(dir + "kda_upstream.json");
    if (!js) throw std::runtime_error("cannot open " + dir + "kda_upstream.json");
    f.cfg = nlohmann::json::parse(js);
    std::ifstream bin(dir + "kda_upstream.bin", std::ios::binary);
    std::vector<char> raw((std::istreambuf_iterator<char>(bin)), std::istreambuf_iterator<char>());
    for (auto& [name, info] : f.cfg["tensors"].items()) {
      int64_t n = 1;
      for (auto sz : info["shape"]) n *= sz.get<int64_t>();
      const size_t off = info["byte_offset"].get<size_t>();
      const bool f4 = info["dtype"].get<std::string>() == "f4";
      const size_t bytes = size_t(n) * (f4 ? 4 : 8);
      if (off + bytes > raw.size()) throw std::runtime_error("kda_upstream.bin too short for " + name);
      std::vector<double> v(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) {  // little-endian host (x86-64)
        if (f4) {
          float x;
          std::memcpy(&x, raw.data() + off + size_t(i) * 4, 4);
          v[size_t(i)] = x;
        } else {
          std::memcpy(&v[size_t(i)], raw.data() + off + size_t(i) * 8, 8);
        }
      }
      f.t[name] = std::move(v);
    }
    return f;
  }();
  return F;
}

const char* const kNames[] = {"o", "dq", "dk", "dv", "dg", "dbeta"};

// Our forward + backward on the packed row; returns {o, dq, dk, dv, dg, dbeta} as double.
// chunk = 0: the recurrent kernel. use_seg = false drops the segment ids (one document per row: what
// upstream's torch path computes on a packed row), for the sensitivity check.
template <typename T>
std::vector<std::vector<double>> ours(const std::string& c, int64_t chunk, bool use_seg = true,
                                      bool saved_vn = false) {
  const Fixture& F = fixture();
  const int64_t L = F.cfg["L"], H = F.cfg["H"], K = F.cfg["K"], V = F.cfg["V"];
  const bool l2 = F.cfg["cases"][c]["use_qk_l2norm_in_kernel"].get<bool>();
  const T scale = T(F.cfg["scale"].get<double>());
  const std::vector<int32_t> seg = F.cfg["segments"].get<std::vector<int32_t>>();
  auto in = [&](const char* n) {
    const auto& v = F.at(c + "/" + n);
    return std::vector<T>(v.begin(), v.end());
  };
  auto q = in("q"), k = in("k"), v = in("v"), g = in("g"), beta = in("beta"), dout = in("do");
  const int64_t NH = L * H;
  std::vector<T> qn = q, kn = k;
  const T eps = T(kL2NormEps);
  if (l2) {
    l2norm_forward(q.data(), NH, K, eps, qn.data());
    l2norm_forward(k.data(), NH, K, eps, kn.data());
  }
  const KdaDims d{1, L, H, K, V};
  const int32_t* s = use_seg ? seg.data() : nullptr;
  std::vector<T> o(L * H * V), dqn(L * H * K), dkn(L * H * K), dv(L * H * V), dg(L * H * K), db(NH);
  if (chunk > 0) {
    std::vector<T> vn(saved_vn ? L * H * V : 0);  // the forward's Vn handed to the backward (the model's way)
    T* vnp = saved_vn ? vn.data() : nullptr;
    kda_chunk_forward(qn.data(), kn.data(), v.data(), g.data(), beta.data(), s, d, scale, o.data(), chunk,
                      vnp);
    kda_chunk_backward(qn.data(), kn.data(), v.data(), g.data(), beta.data(), s, d, scale, dout.data(),
                       dqn.data(), dkn.data(), dv.data(), dg.data(), db.data(), chunk, vnp);
  } else {
    kda_recurrent_forward(qn.data(), kn.data(), v.data(), g.data(), beta.data(), s, d, scale, o.data());
    kda_recurrent_backward(qn.data(), kn.data(), v.data(), g.data(), beta.data(), s, d, scale, dout.data(),
                           dqn.data(), dkn.data(), dv.data(), dg.data(), db.data());
  }
  std::vector<T> dq = dqn, dk = dkn;
  if (l2) {
    l2norm_backward(q.data(), dqn.data(), NH, K, eps, dq.data());
    l2norm_backward(k.data(), dkn.data(), NH, K, eps, dk.data());
  }
  std::vector<std::vector<double>> r;
  for (const auto* x : {&o, &dq, &dk, &dv, &dg, &db}) r.emplace_back(x->begin(), x->end());
  return r;
}

// Worst rel_err over the six tensors against reference `ref` (e.g. "up64_chunk"); each checked against tol.
double compare(const std::string& c, const std::vector<std::vector<double>>& mine, const std::string& ref,
               double tol, const std::string& what) {
  double worst = 0;
  std::string wn;
  for (size_t i = 0; i < 6; ++i) {
    const auto& r = fixture().at(c + "/" + kNames[i] + "_" + ref);
    EXPECT_EQ(mine[i].size(), r.size()) << what << " " << kNames[i];
    if (mine[i].size() != r.size()) return 1;
    const double e = kdatest::rel_err(mine[i], r);
    EXPECT_LE(e, tol) << what << " " << kNames[i] << " vs " << ref;
    if (e > worst) worst = e, wn = kNames[i];
  }
  std::printf("%-28s vs %-10s worst rel err %.2e (%s), tol %.0e\n", what.c_str(), ref.c_str(), worst,
              wn.c_str(), tol);
  return worst;
}

template <typename T>
void check_case(const std::string& c, double tol_up64, double tol_up32) {
  const std::pair<int64_t, bool> runs[] = {{0, false}, {16, false}, {64, false}, {16, true}, {64, true}};
  for (const auto& [chunk, saved_vn] : runs) {
    const auto mine = ours<T>(c, chunk, true, saved_vn);
    const std::string what = c + (sizeof(T) == 8 ? " f64 " : " f32 ") +
                             (chunk ? "chunk=" + std::to_string(chunk) : std::string("recurrent")) +
                             (saved_vn ? " saved vn" : "");
    compare(c, mine, "up64_chunk", tol_up64, what);
    compare(c, mine, "up32_chunk", tol_up32, what);
    compare(c, mine, "up32_rec", tol_up32, what);
    // Padding tokens: zero output and zero gradient (ours; upstream never sees them).
    const auto seg = fixture().cfg["segments"].get<std::vector<int32_t>>();
    const size_t L = seg.size();
    for (size_t i = 0; i < 6; ++i) {
      const size_t per = mine[i].size() / L;
      for (size_t t = 0; t < L; ++t) {
        if (seg[t] >= 0) continue;
        for (size_t j = 0; j < per; ++j) ASSERT_EQ(mine[i][t * per + j], 0.0) << what << " " << kNames[i];
      }
    }
  }
}

}  // namespace

TEST(KdaUpstream, FixtureIsTheUpstreamOne) {
  const auto& cfg = fixture().cfg;
  EXPECT_NE(cfg["generator"].get<std::string>().find("transformers 5.23.0 chunk_kimi_delta_attention"),
            std::string::npos);
  EXPECT_NE(cfg["generator"].get<std::string>().find("torch 2.15.0"), std::string::npos);
  EXPECT_EQ(cfg["scale"].get<double>(), 0.25);  // 1/sqrt(K), K = 16: upstream always scales q by it
  EXPECT_EQ(cfg["segments"].size(), cfg["L"].get<size_t>());
}

TEST(KdaUpstream, Float64MatchesPerDocumentUpstream) {
  check_case<double>("l2norm", 1e-12, 5e-6);
  check_case<double>("prenorm", 1e-12, 5e-6);
}

TEST(KdaUpstream, Float32MatchesPerDocumentUpstream) {
  check_case<float>("l2norm", 5e-6, 5e-6);
  check_case<float>("prenorm", 5e-6, 5e-6);
}

// The comparison sees document boundaries: without segment ids (state carried across documents, as upstream's
// torch path does on a packed row) our output on the documents' tokens (padding excluded) is far from the
// per-document references.
TEST(KdaUpstream, IgnoringSegmentsIsDetected) {
  const auto seg = fixture().cfg["segments"].get<std::vector<int32_t>>();
  const auto& ref = fixture().at("prenorm/o_up64_chunk");
  const size_t per = ref.size() / seg.size();
  for (int64_t chunk : {int64_t(0), int64_t(16)}) {
    const auto o = ours<double>("prenorm", chunk, /*use_seg=*/false)[0];
    std::vector<double> a, b;
    for (size_t t = 0; t < seg.size(); ++t)
      if (seg[t] >= 0) {
        a.insert(a.end(), o.begin() + long(t * per), o.begin() + long((t + 1) * per));
        b.insert(b.end(), ref.begin() + long(t * per), ref.begin() + long((t + 1) * per));
      }
    const double e = kdatest::rel_err(a, b);
    std::printf("prenorm f64 %s without segments: o rel err %.2e on the documents' tokens\n",
                chunk ? "chunk=16" : "recurrent", e);
    EXPECT_GT(e, 1e-2);
  }
}
