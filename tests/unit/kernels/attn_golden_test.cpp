// (d) The attention kernel against a PyTorch fixture (tests/reference/attn_reference.py: explicit masks,
// autograd, fp32). Tolerance 1e-5 norm-wise relative (max |a-b| / max(max |ref|, 0.1)): both sides are
// fp32 with different summation orders and exp implementations; measured ~1e-6.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "attn_util.h"
#include "kernels/attention.h"

using namespace olmosft;
using namespace attn_test;

namespace {
std::vector<float> floats(const nlohmann::json& j, const std::string& key, size_t n,
                          const std::string& name) {
  const auto& a = j.at(key);
  EXPECT_EQ(a.size(), n) << name << "." << key;
  std::vector<float> out;
  for (const auto& x : a) out.push_back(x.is_null() ? -INFINITY : x.get<float>());
  return out;
}
}  // namespace

TEST(AttnGolden, MatchesPyTorch) {
  const std::string path = std::string(OLMOSFT_GOLDEN_DIR) + "/attn/attn_reference.json";
  std::ifstream f(path);
  ASSERT_TRUE(f.good()) << "missing fixture " << path
                        << " (run /usr/bin/python3 tests/reference/attn_reference.py)";
  const nlohmann::json doc = nlohmann::json::parse(f);
  ASSERT_GE(doc.at("cases").size(), 3u);
  for (const auto& jc : doc.at("cases")) {
    const std::string name = jc.at("name");
    AttentionConfig c;
    c.batch = jc.at("B");
    c.seq = jc.at("T");
    c.heads = jc.at("H");
    c.kv_heads = jc.at("Hkv");
    c.head_dim = jc.at("D");
    c.v_head_dim = jc.at("Dv");
    c.window = jc.at("window");
    c.scale = jc.at("scale");
    const size_t N = c.batch * c.seq;
    const std::vector<int32_t> seg = jc.at("seg").get<std::vector<int32_t>>();
    ASSERT_EQ(seg.size(), N) << name;
    const auto q = floats(jc, "q", N * c.heads * c.head_dim, name);
    const auto k = floats(jc, "k", N * c.kv_heads * c.head_dim, name);
    const auto v = floats(jc, "v", N * c.kv_heads * c.v_head_dim, name);
    const auto dout = floats(jc, "dout", N * c.heads * c.v_head_dim, name);
    for (int threads : {1, 2}) {
      for (auto backend : {AttentionTileBackend::kBlas, AttentionTileBackend::kLoops}) {
        set_attention_tile_backend(backend);
        c.threads = threads;
        const Grads<float> g = run_kernel<float>(c, q, k, v, seg, dout);
        const std::string where = name + " threads=" + std::to_string(threads) +
                                  (backend == AttentionTileBackend::kBlas ? " blas" : " loops");
        const double eo = rel_err(g.o, floats(jc, "o", g.o.size(), name)),
                     el = rel_err(g.lse, floats(jc, "lse", g.lse.size(), name)),
                     eq = rel_err(g.dq, floats(jc, "dq", g.dq.size(), name)),
                     ek = rel_err(g.dk, floats(jc, "dk", g.dk.size(), name)),
                     ev = rel_err(g.dv, floats(jc, "dv", g.dv.size(), name));
        std::printf("%-40s o %.1e lse %.1e dq %.1e dk %.1e dv %.1e\n", where.c_str(), eo, el, eq, ek, ev);
        EXPECT_LT(eo, 1e-5) << where << " o";
        EXPECT_LT(el, 1e-5) << where << " lse";
        EXPECT_LT(eq, 1e-5) << where << " dq";
        EXPECT_LT(ek, 1e-5) << where << " dk";
        EXPECT_LT(ev, 1e-5) << where << " dv";
      }
    }
    set_attention_tile_backend(AttentionTileBackend::kBlas);
  }
}
