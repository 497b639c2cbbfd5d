#include "train/recipe.h"

#include <gtest/gtest.h>

#include <sstream>

#include "core/error.h"
#include "train/schedule.h"

using namespace olmosft;

namespace {
std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}
}  // namespace

TEST(Recipe, RunbookRecipeDerivesTheRunbookNumbers) {
  Recipe r = Recipe::load(std::string(OLMOSFT_SOURCE_DIR) + "/recipes/olmo35-small-sft.yaml");
  Derived d = derive(r);
  EXPECT_EQ(d.slots, 16);
  EXPECT_EQ(d.grad_accum, 1);
  EXPECT_EQ(d.tokens_per_step, 16 * 65536);
  EXPECT_EQ(d.steps, 600);
  EXPECT_EQ(d.schedule_steps, 11768);
  EXPECT_EQ(d.warmup_steps, 353);
  EXPECT_DOUBLE_EQ(r.f64("optimizer.beta2"), 0.95);
  EXPECT_DOUBLE_EQ(r.f64("moe.buffer_factor"), 2.5);
}

TEST(Recipe, OverridesWinAndAreValidated) {
  Recipe r =
      Recipe::parse("steps: 10\noptimizer:\n  lr: 1e-4\n", "t.yaml", {"optimizer.lr=3e-4", "global_batch=8"});
  EXPECT_DOUBLE_EQ(r.f64("optimizer.lr"), 3e-4);
  EXPECT_EQ(r.i64("global_batch"), 8);
  EXPECT_TRUE(r.is_set("steps"));
  EXPECT_FALSE(r.is_set("seq_len"));
  EXPECT_EQ(r.i64("seq_len"), 4096);  // documented default
  std::string e = error_of([] { Recipe::parse("steps: 10\n", "t.yaml", {"optimizer.lr=fast"}); });
  EXPECT_NE(e.find("optimizer.lr"), std::string::npos) << e;
  EXPECT_NE(e.find("expects a number"), std::string::npos) << e;
  e = error_of([] { Recipe::parse("steps: 10\n", "t.yaml", {"lr=1e-4"}); });
  EXPECT_NE(e.find("unknown recipe key 'lr'"), std::string::npos) << e;
  EXPECT_NE(e.find("optimizer.lr"), std::string::npos) << e;  // the suggestion
  e = error_of([] { Recipe::parse("stepz: 10\n", "my.yaml"); });
  EXPECT_NE(e.find("my.yaml"), std::string::npos) << e;
  EXPECT_NE(e.find("'steps'"), std::string::npos) << e;
  e = error_of([] { Recipe::parse("steps: [1, 2]\n", "my.yaml"); });
  EXPECT_NE(e.find("single value"), std::string::npos) << e;
  e = error_of([] { Recipe::parse("steps: 10\n", "my.yaml", {"noequals"}); });
  EXPECT_NE(e.find("key=value"), std::string::npos) << e;
  e = error_of([] { Recipe::parse("steps: 10\n  bad: [\n", "my.yaml"); });
  EXPECT_NE(e.find("not valid YAML"), std::string::npos) << e;
}

TEST(Recipe, BatchArithmeticRefusesWhatDoesNotDivide) {
  auto d = derive(Recipe::parse("steps: 5\nglobal_batch: 16\ndevices: 2\nper_device_batch: 2\n", "t"));
  EXPECT_EQ(d.grad_accum, 4);
  std::string e = error_of([] { derive(Recipe::parse("steps: 5\nglobal_batch: 16\ndevices: 3\n", "t")); });
  EXPECT_NE(e.find("global_batch=16 is not divisible"), std::string::npos) << e;
  e = error_of([] { derive(Recipe::parse("steps: 5\ndevices: 3\nper_device_batch: 0.5\n", "t")); });
  EXPECT_NE(e.find("not a whole number"), std::string::npos) << e;
  e = error_of([] { derive(Recipe::parse("global_batch: 16\n", "t")); });
  EXPECT_NE(e.find("zero steps"), std::string::npos) << e;
}

TEST(Schedule, MatchesTheOlmoCoreLinearWithWarmup) {
  Schedule s{"linear", 5e-5, 353, 11768, 0.0};
  EXPECT_NEAR(s.at(1), 5e-5 / 353, 1e-15);  // 1.4164e-7: warmup starts from step one
  EXPECT_DOUBLE_EQ(s.at(353), 5e-5);
  EXPECT_NEAR(s.at(600), 4.8918e-5, 5e-10);  // the runbook's parity window end (OLMo-core value)
  EXPECT_DOUBLE_EQ(s.at(11768), 0.0);
  EXPECT_DOUBLE_EQ(s.at(20000), 0.0);
  for (int64_t i = 354; i < 11768; ++i) ASSERT_LT(s.at(i + 1), s.at(i));
  Schedule c{"constant", 1e-3, 10, 100, 0.0};
  EXPECT_DOUBLE_EQ(c.at(5), 5e-4);
  EXPECT_DOUBLE_EQ(c.at(50), 1e-3);
  Schedule f{"linear", 1.0, 0, 10, 0.1};
  EXPECT_DOUBLE_EQ(f.at(10), 0.1);
  EXPECT_NEAR(f.at(5), 0.1 + 0.9 * 0.5, 1e-12);
  EXPECT_THROW(s.at(0), Error);
}
