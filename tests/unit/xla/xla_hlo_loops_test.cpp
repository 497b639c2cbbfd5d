// Collectives inside loops of the partitioned program (xla/hlo_loops.h), on XLA's CPU plugin: a loop that
// slices a row-sharded array inside its body makes the SPMD partitioner gather the whole array in every
// iteration, and the check finds it (so it can fail); the same loop over a replicated array has none, and
// so do the decoder's programs over a mesh.
#include <gtest/gtest.h>

#include <string>

#include "model/config.h"
#include "model/decoder_xla.h"
#include "model/delta_rule_emit.h"
#include "xla/hlo_loops.h"
#include "xla_test_util.h"

using namespace olmosft;
using namespace olmosft::xla;

namespace {

// Sums the 8 rows of X one per iteration (dynamic_slice of row i inside the loop); X's sharding as given.
std::string row_loop(const std::string& sharding, const std::string& name = "") {
  return R"(module @m attributes {mhlo.num_partitions = 2 : i32} {
  func.func public @main(%x: tensor<8x4xf32> {mhlo.sharding = ")" +
         sharding + R"("}) -> (tensor<4xf32>) {
    %z = stablehlo.constant dense<0.0> : tensor<4xf32>
    %i0 = stablehlo.constant dense<0> : tensor<i32>
    %r:2 = stablehlo.while(%i = %i0, %acc = %z) : tensor<i32>, tensor<4xf32>
      cond {
        %n = stablehlo.constant dense<8> : tensor<i32>
        %c = stablehlo.compare LT, %i, %n : (tensor<i32>, tensor<i32>) -> tensor<i1>
        stablehlo.return %c : tensor<i1>
      } do {
        %zero = stablehlo.constant dense<0> : tensor<i32>
        %row = stablehlo.dynamic_slice %x, %i, %zero, sizes = [1, 4] : (tensor<8x4xf32>, tensor<i32>, tensor<i32>) -> tensor<1x4xf32>
        %v = stablehlo.reshape %row : (tensor<1x4xf32>) -> tensor<4xf32>
        %a = stablehlo.add %acc, %v : tensor<4xf32>
        %one = stablehlo.constant dense<1> : tensor<i32>
        %j = stablehlo.add %i, %one : tensor<i32>
        stablehlo.return %j, %a : tensor<i32>, tensor<4xf32>
      })" +
         (name.empty() ? std::string() : " loc(\"" + name + "\")") + R"(
    return %r#1 : tensor<4xf32>
  }
})";
}

CompileOptions two_way() {
  CompileOptions co;
  co.num_partitions = 2;
  co.use_spmd_partitioning = true;
  return co;
}

}  // namespace

TEST(XlaHloLoops, AGatherInsideALoopIsFoundAndAReplicatedLoopIsClean) {
  OLMOSFT_CPU_PLUGIN_ONLY();
  Client& c = testutil::test_client(4);
  const std::string bad = partitioned_hlo(c, row_loop("{devices=[2,1]<=[2]}"), two_way());
  const std::vector<LoopCollective> found = collectives_in_loops(bad);
  ASSERT_EQ(found.size(), 1u) << bad;
  EXPECT_EQ(found[0].opcode, "all-gather");
  EXPECT_NE(found[0].line.find("f32[8,4]"), std::string::npos) << found[0].line;  // the whole array
  EXPECT_TRUE(collectives_in_loops(partitioned_hlo(c, row_loop("{replicated}"), two_way())).empty());
  // One partition: nothing partitioned, no dump; refused naming why.
  EXPECT_NE(testutil::error_of([&] {
              partitioned_hlo(c, row_loop("{replicated}"), CompileOptions{});
            }).find("no HLO after SPMD partitioning"),
            std::string::npos);
}

// The loop's name (its location, HloBuilder::for_loop's NAME) reaches the partitioned HLO as op_name; a
// collective inside a delta-rule loop is unwanted, inside the layer scan it is the FSDP gather it should be.
TEST(XlaHloLoops, LoopsAreKnownByTheirNames) {
  OLMOSFT_CPU_PLUGIN_ONLY();
  Client& c = testutil::test_client(4);
  for (const char* name : {kDeltaRuleLoop, kLayerScanLoop}) {
    const auto found =
        collectives_in_loops(partitioned_hlo(c, row_loop("{devices=[2,1]<=[2]}", name), two_way()));
    ASSERT_EQ(found.size(), 1u) << name;
    EXPECT_EQ(found[0].loop_name, name);
    EXPECT_EQ(unwanted_loop_collective(found[0]), std::string(name) == kDeltaRuleLoop) << name;
  }
  const auto unnamed = collectives_in_loops(partitioned_hlo(c, row_loop("{devices=[2,1]<=[2]}"), two_way()));
  ASSERT_EQ(unnamed.size(), 1u);
  EXPECT_EQ(unnamed[0].loop_name, "");
  EXPECT_FALSE(unwanted_loop_collective(unnamed[0]));  // XLA's own loops (windowed einsums) are not judged
  // HloBuilder writes the location.
  HloBuilder b;
  const Value x = b.argument({ElementType::kF32, {4}});
  b.returns(b.for_loop(
      3, {x},
      [](HloBuilder& l, const Value&, const std::vector<Value>& s) {
        return std::vector<Value>{l.add(s[0], s[0])};
      },
      kDeltaRuleLoop));
  EXPECT_NE(b.module().find(" loc(\"olmosft.delta_rule\")"), std::string::npos);
}

TEST(XlaHloLoops, NestedCallsAreFollowed) {
  const std::string hlo = R"(HloModule m

%inner (p: f32[4]) -> f32[4] {
  %p = f32[4]{0} parameter(0)
  ROOT %ar = f32[4]{0} all-reduce(%p), channel_id=1, replica_groups=[1,2]<=[2], to_apply=%sum
}

%body (t: (s32[], f32[4])) -> (s32[], f32[4]) {
  %t = (s32[], f32[4]{0}) parameter(0)
  %v = f32[4]{0} get-tuple-element(%t), index=1
  %c = f32[4]{0} call(%v), to_apply=%inner
  ROOT %r = (s32[], f32[4]{0}) tuple(%i, %c)
}

ENTRY %main (x: f32[4]) -> f32[4] {
  %x = f32[4]{0} parameter(0)
  %outside = f32[4]{0} all-gather(%x), dimensions={0}
  %w = (s32[], f32[4]{0}) while(%t0), condition=%cond, body=%body
  ROOT %g = f32[4]{0} get-tuple-element(%w), index=1
}
)";
  const std::vector<LoopCollective> found = collectives_in_loops(hlo);
  ASSERT_EQ(found.size(), 1u);  // the all-gather outside the loop is not reported
  EXPECT_EQ(found[0].opcode, "all-reduce");
  EXPECT_EQ(found[0].computation, "inner");
  EXPECT_EQ(found[0].loop, "w");
}

// The decoder's step over a mesh (rows over fsdp, tokens over context; the hybrid's KDA layers run whole rows
// with their heads over context) has no collective inside any loop: not in the attention's, the chunked
// KDA's (whose carried state and arrays are laid out as its inputs: without that, two all-gathers per chunk
// under fsdp 2), nor the cross-entropy's 4 vocabulary tiles (before
// ops::XentOptions::mesh, each tile gathered the whole [vocab, hidden] gradient accumulator and all-reduced
// its own rows' gradient).
TEST(XlaHloLoops, DecoderProgramsOverAMesh) {
  OLMOSFT_CPU_PLUGIN_ONLY();
  Client& c = testutil::test_client(4);
  for (const char* fixture : {"olmo3_tiny", "olmo3moe_tiny"}) {
    const model::ModelConfig m =
        model::load_config(std::string(OLMOSFT_GOLDEN_DIR) + "/model/" + fixture + "/config.json");
    model::XlaOptions xo;
    xo.mesh.fsdp = 2;
    xo.mesh.context = 2;  // the hybrid's KDA layers: whole rows, their 2 heads split over the pieces
    const std::string text = model::xla_step_module(m, xo, 2, 64, model::LossConfig{.vocab_tile = 128}, true);
    CompileOptions co;
    co.num_partitions = xo.mesh.devices();
    co.use_spmd_partitioning = true;
    for (const LoopCollective& l : collectives_in_loops(partitioned_hlo(c, text, co)))
      ADD_FAILURE() << fixture << ": " << l.opcode << " inside loop " << l.loop << " (" << l.computation
                    << "): " << l.line.substr(0, 200);
  }
}

// The check on the chunked delta rule over context 2 (model/delta_rule_emit.h): laid out as delta_inputs lays
// it out (heads split, rows whole; the loops' arrays laid out the same) the chunk loop has no collective;
// with the time axis split instead and nothing laid out inside (the runbook's mis-sharded KDA: the
// chunk-scan inputs sharded on the chunk axis) the partitioner puts collectives inside the loop, and the
// check finds them in the loop named olmosft.delta_rule.
TEST(XlaHloLoops, AMisShardedDeltaRuleLoopIsCaught) {
  OLMOSFT_CPU_PLUGIN_ONLY();
  namespace de = model::unit::delta_emit;
  Client& c = testutil::test_client(4);
  const Mesh mesh{.context = 2};
  const int64_t T = 32, B = 1, H = 2, Dk = 4, Dv = 4;
  for (const bool heads : {true, false}) {
    SCOPED_TRACE(heads ? "heads split" : "time split");
    HloBuilder b;
    b.partitions(2);
    const de::Rows r{1, 2, B, T / 2, &mesh};
    const std::vector<Logical> lay =
        heads ? std::vector<Logical>{Logical::kNone, Logical::kRows, Logical::kHeads, Logical::kNone}
              : std::vector<Logical>{Logical::kSeq, Logical::kRows, Logical::kNone, Logical::kNone};
    auto arg = [&](std::vector<int64_t> d) {
      const Value v = b.argument({ElementType::kF32, d});
      return d.size() == 4 ? de::lay_out(b, r, v, lay) : v;
    };
    const Value q = arg({T, B, H, Dk}), k = arg({T, B, H, Dk}), v = arg({T, B, H, Dv}),
                lg = arg({T, B, H, Dk});
    const Value beta = arg({T, B, H}), start = arg({T, B});
    // the time split keeps the program from laying the chunks out itself (no mesh in its Rows): the loop then
    // slices chunks that the partitioner holds split over the two devices
    de::Rows inner = r;
    if (!heads) inner.mesh = nullptr;
    const de::DeltaInputs in{q, k, v, lg, beta, lg, start, B, T, H, Dk, Dv, inner};
    b.returns({de::delta_chunk_forward(b, in, 4)});
    CompileOptions co;
    co.num_partitions = 2;
    co.use_spmd_partitioning = true;
    int unwanted = 0;
    for (const LoopCollective& l : collectives_in_loops(partitioned_hlo(c, b.module(), co))) {
      unwanted += unwanted_loop_collective(l);
      if (heads)
        ADD_FAILURE() << l.opcode << " inside loop " << l.loop_name << ": " << l.line.substr(0, 200);
      else
        EXPECT_EQ(l.loop_name, kDeltaRuleLoop) << l.line.substr(0, 200);
    }
    if (!heads) {
      EXPECT_GT(unwanted, 0) << "the time-split delta rule kept its collectives out of the loop";
    }
  }
}
