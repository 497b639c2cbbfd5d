// Shared by the XLA tests: the plugin they run on and one client per test binary. `make test` runs them on
// XLA's CPU plugin (installed by scripts/install-deps.sh); scripts/accel-check.sh runs the runtime and
// builder tests on an accelerator's plugin with OLMOSFT_XLA_TEST_PLUGIN=cuda|tpu|PATH.
#pragma once
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "core/error.h"
#include "xla/pjrt.h"

namespace olmosft::xla::testutil {

inline std::string test_plugin() {
  const char* p = std::getenv("OLMOSFT_XLA_TEST_PLUGIN");
  return p != nullptr && *p != '\0' ? p : "cpu";
}
inline bool on_cpu_plugin() { return test_plugin() == "cpu"; }

// The binary's client: on the CPU plugin with `cpu_devices` devices, elsewhere with the plugin's defaults.
inline Client& test_client(int64_t cpu_devices) {
  static Client c = Client::create(
      test_plugin(), on_cpu_plugin() ? ClientOptions{.cpu_device_count = cpu_devices} : ClientOptions{});
  return c;
}

// Runs F and returns the message of the olmosft::Error it throws (fails the test if it throws nothing).
template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected an olmosft::Error";
  return "";
}

// The ahead-of-time tests' module (xla_aot_test, tests/xla-accel/xla_libtpu_test): [64, 32] x [32, 16] ->
// [64, 16] f32 plus the first argument's [64, 32] doubled and returned in place of it (aliased to output 1):
// 10,240 argument bytes, 12,288 output bytes of which 8,192 may reuse argument 0.
inline const char* kDotModule = R"(module @dot {
  func.func public @main(%arg0: tensor<64x32xf32> {tf.aliasing_output = 1 : i32}, %arg1: tensor<32x16xf32>) -> (tensor<64x16xf32>, tensor<64x32xf32>) {
    %0 = "stablehlo.dot_general"(%arg0, %arg1) {dot_dimension_numbers = #stablehlo.dot<lhs_contracting_dimensions = [1], rhs_contracting_dimensions = [0]>} : (tensor<64x32xf32>, tensor<32x16xf32>) -> tensor<64x16xf32>
    %1 = "stablehlo.add"(%arg0, %arg0) : (tensor<64x32xf32>, tensor<64x32xf32>) -> tensor<64x32xf32>
    "func.return"(%0, %1) : (tensor<64x16xf32>, tensor<64x32xf32>) -> ()
  }
})";
constexpr int64_t kArgBytes = (64 * 32 + 32 * 16) * 4, kOutBytes = (64 * 16 + 64 * 32) * 4,
                  kAlias = 64 * 32 * 4;

}  // namespace olmosft::xla::testutil

// A check that only XLA's CPU plugin can answer (its device names, its option, the stand-in plugins).
#define OLMOSFT_CPU_PLUGIN_ONLY()                                         \
  if (!::olmosft::xla::testutil::on_cpu_plugin())                         \
  GTEST_SKIP() << "skipped: a check of XLA's CPU plugin (this run is on " \
               << ::olmosft::xla::testutil::test_plugin() << ")"
