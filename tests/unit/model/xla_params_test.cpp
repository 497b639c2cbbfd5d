// The XLA programs' parameters (model/xla_params.h): the registry one for one without MoE; each MoE layer's
// routed experts one stack per projection, at the first expert's place; pack / unpack as exact copies.
#include "model/xla_params.h"

#include <gtest/gtest.h>

#include <numeric>

#include "core/error.h"
#include "model/config.h"

namespace olmosft::model {
namespace {

TEST(XlaParams, DenseModelIsTheRegistry) {
  const ModelConfig c = config_from_path_or_preset("olmo3-tiny", 0, "--config");
  const std::vector<ParamSpec> reg = param_registry(c);
  const XlaParams xp = xla_params(c);
  ASSERT_EQ(xp.list.size(), reg.size());
  for (size_t i = 0; i < reg.size(); ++i) {
    EXPECT_EQ(xp.list[i].name, reg[i].name);
    EXPECT_EQ(xp.list[i].shape, reg[i].shape);
    EXPECT_EQ(xp.of[i], int(i));
    EXPECT_FALSE(xp.list[i].experts());
  }
}

TEST(XlaParams, ExpertsStackPerProjection) {
  const ModelConfig c = config_from_path_or_preset("olmo3moe-tiny", 0, "--config");
  const std::vector<ParamSpec> reg = param_registry(c);
  const XlaParams xp = xla_params(c);
  const int64_t E = c.n_routed_experts, F = c.moe_intermediate_size, Lt = c.latent_moe_dim;
  int64_t routed = 0, moe_layers = 0;
  for (const ParamSpec& s : reg) routed += s.routed_expert;
  for (const XlaParam& p : xp.list) moe_layers += p.name.ends_with("experts.gate_proj.weight");
  ASSERT_GT(moe_layers, 0);
  EXPECT_EQ(routed, 3 * E * moe_layers);
  EXPECT_EQ(xp.list.size(), reg.size() - size_t(routed) + size_t(3 * moe_layers));
  for (const XlaParam& p : xp.list) {
    if (!p.experts()) continue;
    ASSERT_EQ(int64_t(p.members.size()), E) << p.name;
    const std::string prefix = "model.layers." + std::to_string(p.layer) + ".mlp.experts.";
    EXPECT_TRUE(p.name.starts_with(prefix)) << p.name;
    const std::string proj = p.name.substr(prefix.size());
    const std::vector<int64_t> want =
        proj == "down_proj.weight" ? std::vector<int64_t>{E, Lt, F} : std::vector<int64_t>{E, F, Lt};
    EXPECT_EQ(p.shape, want) << p.name;
    for (int64_t e = 0; e < E; ++e) {  // member e is expert e's tensor of that projection
      const ParamSpec& m = reg[size_t(p.members[size_t(e)])];
      EXPECT_EQ(m.name, prefix + std::to_string(e) + "." + proj);
      EXPECT_EQ(xp.of[size_t(p.members[size_t(e)])], int(&p - xp.list.data()));
    }
  }
  // registry order kept: the stacks sit where their first expert was
  for (size_t i = 1; i < xp.list.size(); ++i) EXPECT_LT(xp.list[i - 1].members[0], xp.list[i].members[0]);
}

TEST(XlaParams, PackAndUnpackAreCopies) {
  const ModelConfig c = config_from_path_or_preset("olmo3moe-tiny", 0, "--config");
  const std::vector<ParamSpec> reg = param_registry(c);
  const XlaParams xp = xla_params(c);
  const XlaParam* p = nullptr;
  for (const XlaParam& q : xp.list)
    if (q.experts() && q.name.ends_with("down_proj.weight")) p = &q;
  ASSERT_NE(p, nullptr);
  const size_t n = size_t(shape_numel(reg[size_t(p->members[0])].shape));
  std::vector<std::vector<float>> host(p->members.size(), std::vector<float>(n));
  std::vector<const float*> in;
  for (size_t e = 0; e < host.size(); ++e) {
    std::iota(host[e].begin(), host[e].end(), float(e * n));
    in.push_back(host[e].data());
  }
  std::vector<float> packed(size_t(numel(*p)));
  pack(*p, in, packed);
  for (size_t i = 0; i < packed.size(); ++i) ASSERT_EQ(packed[i], float(i));  // expert e is row e
  std::vector<std::vector<float>> back(host.size(), std::vector<float>(n, -1.0f));
  std::vector<float*> out;
  for (auto& b : back) out.push_back(b.data());
  unpack(*p, packed, out);
  EXPECT_EQ(back, host);
  EXPECT_THROW(pack(*p, std::vector<const float*>(in.begin(), in.end() - 1), packed), Error);
}

}  // namespace
}  // namespace olmosft::model
