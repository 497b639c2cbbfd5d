// Latent MoE FFN kernel: float64 finite differences of every input and weight (including the router
// through the L1-normalised top-k weights, the load-balance loss and the router z-loss), capacity
// semantics (dropless == large capacity, drops counted and deterministic), float vs double.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <stdexcept>

#include "core/error.h"
#include "kernels/gradcheck.h"
#include "kernels/moe.h"

using namespace olmosft;
using namespace olmosft::moe;

namespace {

template <typename T>
struct MoeSetup {
  MoeDims dims;
  int64_t N = 0;
  std::vector<T> x, router, ldown, lup, sg, su, sd, R;
  std::vector<std::vector<T>> eg, eu, ed;
  std::vector<uint8_t> valid;

  MoeSetup(int64_t N_, uint32_t seed, double router_std) : N(N_) {
    dims.d = 8;
    dims.experts = 6;
    dims.top_k = 2;
    dims.expert_hidden = 5;
    dims.latent = 4;
    dims.shared_hidden = 6;
    std::mt19937 gen(seed);
    std::normal_distribution<double> nd(0.0, 1.0);
    auto fill = [&](std::vector<T>& v, int64_t n, double std) {
      v.resize(static_cast<size_t>(n));
      for (auto& e : v) e = static_cast<T>(nd(gen) * std);
    };
    const int64_t d = dims.d, E = dims.experts, F = dims.expert_hidden, Lt = dims.latent,
                  S = dims.shared_hidden;
    fill(x, N * d, 1.0);
    fill(router, E * d, router_std);
    fill(ldown, Lt * d, 0.5);
    fill(lup, d * Lt, 0.5);
    fill(sg, S * d, 0.4);
    fill(su, S * d, 0.4);
    fill(sd, d * S, 0.4);
    fill(R, N * d, 1.0);
    eg.resize(static_cast<size_t>(E));
    eu.resize(eg.size());
    ed.resize(eg.size());
    for (int64_t e = 0; e < E; ++e) {
      fill(eg[static_cast<size_t>(e)], F * Lt, 0.6);
      fill(eu[static_cast<size_t>(e)], F * Lt, 0.6);
      fill(ed[static_cast<size_t>(e)], Lt * F, 0.6);
    }
    valid.assign(static_cast<size_t>(N), 1);
  }
  MoeWeights<T> weights() const {
    MoeWeights<T> w;
    w.router = router.data();
    w.latent_down = ldown.data();
    w.latent_up = lup.data();
    for (size_t e = 0; e < eg.size(); ++e) {
      w.gate.push_back(eg[e].data());
      w.up.push_back(eu[e].data());
      w.down.push_back(ed[e].data());
    }
    w.shared_gate = sg.data();
    w.shared_up = su.data();
    w.shared_down = sd.data();
    return w;
  }
};

// Smallest gap between the k-th and (k+1)-th router probability over tokens.
template <typename T>
double min_margin(const MoeCache<T>& c, int64_t E, int64_t k) {
  double m = 1e30;
  for (int64_t t = 0; t < c.N; ++t) {
    if (c.topk[static_cast<size_t>(t * k)] < 0) continue;
    std::vector<double> p(c.probs.begin() + t * E, c.probs.begin() + (t + 1) * E);
    std::sort(p.rbegin(), p.rend());
    m = std::min(m, p[static_cast<size_t>(k - 1)] - p[static_cast<size_t>(k)]);
  }
  return m;
}

// The first seed >= seed0 whose routing has a top-k probability margin >= 1e-3 for every token, so that
// finite-difference steps and float rounding never change the expert choice (deterministic search).
template <typename T>
MoeSetup<T> no_tie_setup(int64_t N, uint32_t seed0, double router_std) {
  for (uint32_t seed = seed0; seed < seed0 + 1000; ++seed) {
    MoeSetup<double> s(N, seed, router_std);
    MoeCache<double> c;
    std::vector<double> out(s.x.size());
    moe_forward(s.dims, s.weights(), s.x.data(), nullptr, s.N, out.data(), c);
    if (min_margin(c, s.dims.experts, s.dims.top_k) >= 1e-3) return MoeSetup<T>(N, seed, router_std);
  }
  throw std::runtime_error("no seed without near-ties");
}

void run_fd(double buffer_factor, bool with_padding) {
  MoeSetup<double> s = no_tie_setup<double>(24, 17, 1.5);
  s.dims.buffer_factor = buffer_factor;
  if (with_padding) s.valid[3] = s.valid[10] = 0;
  const double lb = 0.7, zc = 0.3;
  auto loss = [&]() {
    MoeCache<double> c;
    std::vector<double> out(s.x.size());
    MoeStats st = moe_forward(s.dims, s.weights(), s.x.data(), s.valid.data(), s.N, out.data(), c);
    double L = lb * st.lb + zc * st.router_z;
    for (size_t i = 0; i < out.size(); ++i) L += out[i] * s.R[i];
    return L;
  };
  MoeCache<double> c;
  std::vector<double> out(s.x.size());
  MoeStats st = moe_forward(s.dims, s.weights(), s.x.data(), s.valid.data(), s.N, out.data(), c);
  ASSERT_GE(min_margin(c, s.dims.experts, s.dims.top_k), 1e-3);
  if (buffer_factor > 0) {
    EXPECT_GT(st.dropped, 0) << "capacity test should drop something";
  }
  MoeGrads<double> g;
  std::vector<double> dx(s.x.size()), drouter(s.router.size(), 0), dld(s.ldown.size(), 0),
      dlu(s.lup.size(), 0), dsg(s.sg.size(), 0), dsu(s.su.size(), 0), dsd(s.sd.size(), 0);
  std::vector<std::vector<double>> deg, deu, ded;
  for (size_t e = 0; e < s.eg.size(); ++e) {
    deg.emplace_back(s.eg[e].size(), 0.0);
    deu.emplace_back(s.eu[e].size(), 0.0);
    ded.emplace_back(s.ed[e].size(), 0.0);
  }
  g.router = drouter.data();
  g.latent_down = dld.data();
  g.latent_up = dlu.data();
  for (size_t e = 0; e < s.eg.size(); ++e) {
    g.gate.push_back(deg[e].data());
    g.up.push_back(deu[e].data());
    g.down.push_back(ded[e].data());
  }
  g.shared_gate = dsg.data();
  g.shared_up = dsu.data();
  g.shared_down = dsd.data();
  moe_backward(s.dims, s.weights(), g, s.x.data(), c, s.R.data(), lb, zc, dx.data());
  struct Item {
    const char* name;
    std::vector<double>* x;
    std::vector<double>* g;
  };
  std::vector<Item> items = {{"x", &s.x, &dx},
                             {"router", &s.router, &drouter},
                             {"latent_down", &s.ldown, &dld},
                             {"latent_up", &s.lup, &dlu},
                             {"shared_gate", &s.sg, &dsg},
                             {"shared_up", &s.su, &dsu},
                             {"shared_down", &s.sd, &dsd}};
  for (size_t e = 0; e < s.eg.size(); ++e) {
    items.push_back({"expert_gate", &s.eg[e], &deg[e]});
    items.push_back({"expert_up", &s.eu[e], &deu[e]});
    items.push_back({"expert_down", &s.ed[e], &ded[e]});
  }
  for (auto& it : items) {
    const double err =
        fd_max_rel_err(loss, it.x->data(), static_cast<int64_t>(it.x->size()), it.g->data(), 1e-6);
    EXPECT_LT(err, 1e-6) << it.name;
  }
  // Padding tokens are not routed and do not count in the aux losses.
  if (with_padding) {
    EXPECT_EQ(st.routed_tokens, s.N - 2);
    EXPECT_EQ(c.topk[static_cast<size_t>(3 * s.dims.top_k)], -1);
    EXPECT_EQ(c.topk[static_cast<size_t>(10 * s.dims.top_k)], -1);
  }
}

}  // namespace

TEST(MoeKernel, FiniteDifferencesDropless) { run_fd(-1, false); }
TEST(MoeKernel, FiniteDifferencesWithCapacityDrops) { run_fd(1.0, false); }
TEST(MoeKernel, FiniteDifferencesWithPaddingTokens) { run_fd(-1, true); }

TEST(MoeKernel, WeightsSumToTopKAndLossesAtBalance) {
  MoeSetup<double> s(40, 5, 1.0);
  MoeCache<double> c;
  std::vector<double> out(s.x.size());
  MoeStats st = moe_forward(s.dims, s.weights(), s.x.data(), nullptr, s.N, out.data(), c);
  for (int64_t t = 0; t < s.N; ++t) {
    double sum = 0;
    for (int64_t j = 0; j < s.dims.top_k; ++j) sum += c.weights[static_cast<size_t>(t * s.dims.top_k + j)];
    EXPECT_NEAR(sum, static_cast<double>(s.dims.top_k), 1e-12);
    // Sorted by descending probability.
    EXPECT_GE(c.probs[static_cast<size_t>(t * s.dims.experts + c.topk[static_cast<size_t>(t * 2)])],
              c.probs[static_cast<size_t>(t * s.dims.experts + c.topk[static_cast<size_t>(t * 2 + 1)])]);
  }
  EXPECT_EQ(std::accumulate(st.loads.begin(), st.loads.end(), int64_t{0}), s.N * s.dims.top_k);
  // A zero router gives uniform p: LB = 1 exactly whatever the loads, and Z = log(E)^2.
  std::fill(s.router.begin(), s.router.end(), 0.0);
  st = moe_forward(s.dims, s.weights(), s.x.data(), nullptr, s.N, out.data(), c);
  EXPECT_NEAR(st.lb, 1.0, 1e-12);
  EXPECT_NEAR(st.router_z, std::pow(std::log(6.0), 2), 1e-12);
}

TEST(MoeKernel, DroplessEqualsLargeCapacity) {
  MoeSetup<double> s(30, 9, 1.5);
  MoeCache<double> c1, c2;
  std::vector<double> o1(s.x.size()), o2(s.x.size());
  MoeStats a = moe_forward(s.dims, s.weights(), s.x.data(), nullptr, s.N, o1.data(), c1);
  s.dims.buffer_factor =
      static_cast<double>(s.dims.experts) / static_cast<double>(s.dims.top_k);  // capacity N
  MoeStats b = moe_forward(s.dims, s.weights(), s.x.data(), nullptr, s.N, o2.data(), c2);
  EXPECT_EQ(a.dropped, 0);
  EXPECT_EQ(b.dropped, 0);
  EXPECT_EQ(o1, o2);
  // required factor = max load / balanced load; with that factor nothing drops, slightly below it drops.
  s.dims.buffer_factor = a.required_buffer_factor;
  EXPECT_EQ(moe_forward(s.dims, s.weights(), s.x.data(), nullptr, s.N, o2.data(), c2).dropped, 0);
  const int64_t maxload = *std::max_element(a.loads.begin(), a.loads.end());
  s.dims.buffer_factor =
      static_cast<double>(maxload - 1) / (static_cast<double>(s.N * s.dims.top_k) / s.dims.experts);
  EXPECT_GT(moe_forward(s.dims, s.weights(), s.x.data(), nullptr, s.N, o2.data(), c2).dropped, 0);
}

TEST(MoeKernel, CapacityDropsAreCountedInTokenOrder) {
  MoeSetup<double> s(30, 9, 1.5);
  s.dims.buffer_factor = 0.75;
  MoeCache<double> c;
  std::vector<double> out(s.x.size());
  MoeStats st = moe_forward(s.dims, s.weights(), s.x.data(), nullptr, s.N, out.data(), c);
  const int64_t cap =
      static_cast<int64_t>(std::ceil(0.75 * static_cast<double>(s.N * s.dims.top_k) / s.dims.experts));
  int64_t expect_dropped = 0;
  for (int64_t l : st.loads) expect_dropped += std::max<int64_t>(0, l - cap);
  EXPECT_GT(expect_dropped, 0);
  EXPECT_EQ(st.dropped, expect_dropped);
  // Token order: for each expert the first `cap` choices are kept, later ones dropped.
  std::vector<int64_t> seen(static_cast<size_t>(s.dims.experts), 0);
  for (int64_t slot = 0; slot < s.N * s.dims.top_k; ++slot) {
    const int32_t e = c.topk[static_cast<size_t>(slot)];
    EXPECT_EQ(c.kept[static_cast<size_t>(slot)] != 0, seen[static_cast<size_t>(e)] < cap) << "slot " << slot;
    ++seen[static_cast<size_t>(e)];
  }
  // Loads and the required factor do not depend on the capacity.
  const int64_t maxload = *std::max_element(st.loads.begin(), st.loads.end());
  EXPECT_DOUBLE_EQ(st.required_buffer_factor,
                   static_cast<double>(maxload) / (static_cast<double>(s.N * s.dims.top_k) / s.dims.experts));
}

TEST(MoeKernel, FloatMatchesDouble) {
  MoeSetup<double> sd = no_tie_setup<double>(32, 21, 1.5);
  MoeSetup<float> sf = no_tie_setup<float>(32, 21, 1.5);
  MoeCache<double> cd;
  MoeCache<float> cf;
  std::vector<double> od(sd.x.size());
  std::vector<float> of(sf.x.size());
  moe_forward(sd.dims, sd.weights(), sd.x.data(), nullptr, sd.N, od.data(), cd);
  moe_forward(sf.dims, sf.weights(), sf.x.data(), nullptr, sf.N, of.data(), cf);
  ASSERT_GT(min_margin(cd, 6, 2), 1e-3);
  double md = 0;
  for (size_t i = 0; i < od.size(); ++i) md = std::max(md, std::fabs(od[i] - of[i]));
  EXPECT_LT(md, 1e-4);
}

TEST(MoeKernel, InvalidDimsAreRejected) {
  MoeDims d;
  d.d = 8;
  d.experts = 4;
  d.top_k = 5;
  d.expert_hidden = 3;
  EXPECT_THROW(validate(d), Error);
  d.top_k = 2;
  d.buffer_factor = std::nan("");
  EXPECT_THROW(validate(d), Error);
}
