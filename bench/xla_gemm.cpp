// `make bench` -> build/bench_xla_gemm [N] [reps]: an f32 N x N x N matmul (default 1024) on XLA's CPU PJRT
// plugin (a StableHLO dot_general from xla::HloBuilder, compiled once; operands already on the device, the
// timed part is execute + wait) against olmosft's CPU GEMM (kernels/gemm.h, the `auto` library choice) in the
// same run, with the same operands (and the other fp32 library too). Prints GFLOP/s over wall time and per
// CPU-second, the ratio against the auto choice, and the largest difference between the products. Best of
// `reps` timed runs after one warm-up.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "bench_util.h"
#include "core/rng.h"
#include "kernels/gemm.h"
#include "xla/hlo_builder.h"
#include "xla/pjrt.h"

using namespace olmosft;

int main(int argc, char** argv) {
  const int64_t n = argc > 1 ? std::atoll(argv[1]) : 1024;
  const int reps = argc > 2 ? std::atoi(argv[2]) : 10;
  const double flop = 2.0 * double(n) * double(n) * double(n);
  std::vector<float> a(size_t(n * n)), b(size_t(n * n)), c(size_t(n * n));
  const Rng rng{42};
  for (size_t i = 0; i < a.size(); ++i) a[i] = rng.uniform(i) - 0.5f;
  for (size_t i = 0; i < b.size(); ++i) b[i] = rng.uniform(a.size() + i) - 0.5f;

  xla::Client client = xla::Client::create("cpu", xla::ClientOptions{1});
  xla::HloBuilder hb("gemm");
  const xla::TensorType t{xla::ElementType::kF32, {n, n}};
  xla::Value A = hb.argument(t), B = hb.argument(t);
  hb.returns({hb.dot_general(A, B, {{}, {}, {1}, {0}})});
  const double c0 = bench::now();
  xla::Executable exe = client.compile(hb.module());
  const double compile_s = bench::now() - c0;
  xla::Buffer da = client.to_device(a.data(), t), db = client.to_device(b.data(), t);
  xla::Buffer* args[] = {&da, &db};
  std::vector<float> xla_c;
  const auto [xw, xc] = bench::best_of(reps, [&] { xla_c = exe.execute(args)[0].to_host<float>(); });
  const auto [xw_only, xc_only] = bench::best_of(reps, [&] { exe.execute(args); });

  // olmosft's GEMM with each fp32 library (the first listed is the `auto` choice on this CPU).
  struct Ours {
    GemmLib lib;
    double wall, cpu, max_diff;
  };
  std::vector<Ours> ours;
  for (GemmLib l :
       {auto_gemm_lib(), auto_gemm_lib() == GemmLib::OneDNN ? GemmLib::OpenBLAS : GemmLib::OneDNN}) {
    ScopedCpuGemm lib(CpuGemm{l, ComputeDtype::F32});
    const auto [w, c_s] = bench::best_of(reps, [&] {
      gemm<float>(Trans::N, Trans::N, n, n, n, 1.f, a.data(), n, b.data(), n, 0.f, c.data(), n);
    });
    double d = 0;
    for (size_t i = 0; i < c.size(); ++i) d = std::max(d, double(std::fabs(c[i] - xla_c[i])));
    ours.push_back({l, w, c_s, d});
  }
  std::printf("## f32 matmul %ld^3 (best of %d)\n\n", long(n), reps);
  std::printf("| path | ms (wall) | GFLOP/s (wall) | GFLOP per CPU-s |\n|---|---|---|---|\n");
  std::printf("| XLA CPU plugin, execute + wait | %.2f | %.1f | %.1f |\n", 1e3 * xw_only,
              flop / xw_only / 1e9, flop / xc_only / 1e9);
  std::printf("| XLA CPU plugin, execute + copy to host | %.2f | %.1f | %.1f |\n", 1e3 * xw, flop / xw / 1e9,
              flop / xc / 1e9);
  for (const Ours& o : ours)
    std::printf("| olmosft sgemm (%s%s) | %.2f | %.1f | %.1f |\n", gemm_lib_name(o.lib),
                o.lib == auto_gemm_lib() ? ", the auto choice" : "", 1e3 * o.wall, flop / o.wall / 1e9,
                flop / o.cpu / 1e9);
  const Ours& best = ours[0];
  std::printf(
      "\nXLA / olmosft %s (execute + wait): %.2fx wall, %.2fx per CPU-s; XLA compile %.2f s; max |XLA - "
      "olmosft| %.2e (sums of %ld float products)\n",
      gemm_lib_name(best.lib), best.wall / xw_only, best.cpu / xc_only, compile_s, best.max_diff, long(n));
  std::printf("BENCH xla_gemm n=%ld xla_gflops=%.1f olmosft_gflops=%.1f ratio=%.3f\n", long(n),
              flop / xw_only / 1e9, flop / best.wall / 1e9, best.wall / xw_only);
  return 0;
}
