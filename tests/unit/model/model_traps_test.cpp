// The config trap checks (model/traps.h): each fires on the config that has the trap and stays quiet on the
// released shape.
#include <gtest/gtest.h>

#include "model/config.h"
#include "model/traps.h"

using namespace olmosft;
using namespace olmosft::model;

namespace {

TrapCheck find(const std::vector<TrapCheck>& v, const std::string& what) {
  for (const auto& t : v)
    if (t.what == what) return t;
  throw std::runtime_error("no check " + what);
}

ModelConfig from(nlohmann::json j) { return parse_config(j, "test config"); }

}  // namespace

TEST(ModelTraps, ReleasedShapesPass) {
  for (const char* p : {"olmo3-7b", "olmo-hybrid-7b", "olmo3moe-small"}) {
    const auto v = config_trap_checks(from(preset_config_json(p)));
    for (const auto& t : v) EXPECT_EQ(t.level, TrapCheck::Ok) << p << " " << t.what << ": " << t.detail;
  }
  const auto h = find(config_trap_checks(from(preset_config_json("olmo-hybrid-7b"))), "rope");
  EXPECT_NE(h.detail.find("8 attention layers without RoPE (NoPE)"), std::string::npos) << h.detail;
  const auto o = find(config_trap_checks(from(preset_config_json("olmo3-7b"))), "rope");
  EXPECT_NE(o.detail.find("8 full_attention layers yarn"), std::string::npos) << o.detail;
  EXPECT_NE(o.detail.find("24 sliding_attention layers default"), std::string::npos) << o.detail;
}

TEST(ModelTraps, OlmoHybridWithRopeOnWarns) {
  nlohmann::json j = preset_config_json("olmo-hybrid-7b");
  j.erase("rope_parameters");  // transformers then turns RoPE on (theta 10000)
  const auto t = find(config_trap_checks(from(j)), "rope");
  EXPECT_EQ(t.level, TrapCheck::Warn);
  EXPECT_NE(t.detail.find("released Olmo Hybrid checkpoints are NoPE"), std::string::npos) << t.detail;
}

TEST(ModelTraps, Olmo3YarnOnSlidingLayersFails) {
  nlohmann::json j = preset_config_json("olmo3-7b");
  j["rope_parameters"] = {{"sliding_attention", j["rope_scaling"]}, {"full_attention", j["rope_scaling"]}};
  j.erase("rope_scaling");
  const auto t = find(config_trap_checks(from(j)), "rope");
  EXPECT_EQ(t.level, TrapCheck::Fail) << t.detail;
}

TEST(ModelTraps, WrongSpecialIdsFail) {
  nlohmann::json j = preset_config_json("olmo-hybrid-7b");
  j["eos_token_id"] = 100265;
  EXPECT_EQ(find(config_trap_checks(from(j)), "special token ids").level, TrapCheck::Fail);
  const ModelConfig c = from(preset_config_json("olmo-hybrid-7b"));
  const auto tv = tokenizer_trap_checks(c, 100257, 100277, 100278);
  for (const auto& t : tv) EXPECT_EQ(t.level, TrapCheck::Ok) << t.what;
  EXPECT_EQ(tokenizer_trap_checks(c, 0, 100277, 100278)[0].level, TrapCheck::Fail);       // eos
  EXPECT_EQ(tokenizer_trap_checks(c, 100257, 1, 100278)[1].level, TrapCheck::Fail);       // pad
  EXPECT_EQ(tokenizer_trap_checks(c, 100257, 100277, 200000)[2].level, TrapCheck::Fail);  // ids outside
}
