// KDA delta-rule benchmark: chunked (WY/UT) vs recurrent reference, forward + backward, float32.
// Usage: bench_kda [--T 4096,65536] [--K 128] [--V 256] [--H 1] [--chunk 64] [--threads 1]
//                  [--max-recurrent-tokens N] [--reps 3] [--gemm openblas|onednn|auto] [--no-saved-vn]
//        bench_kda --gdn [--T 4096,16384,65536] [--K 96] [--V 192] [--H 2] [--A 8] [--dt-bias -4.6]
//                  [--no-torch] [other flags as above]
// Times are wall-clock and process CPU seconds; tokens/s uses CPU seconds, which on a machine shared with
// other jobs is the stable number (wall time stretches with the load). Each of forward and backward runs
// --reps times on the same inputs and the fastest run counts (the first pays for first-touching the output
// buffers, later ones show the kernel). The child runs with OPENBLAS_NUM_THREADS = --threads: OpenBLAS's
// worker threads, started when the library loads, otherwise spin (sched_yield) for ~0.1 s and that CPU
// time landed in the short T = 4096 runs (measured: 9% of the samples of a T = 16,384 run).
// Each (algorithm, T) runs in a fresh child process (this binary re-invoked with --one) so the reported
// peak RSS (getrusage ru_maxrss) belongs to that configuration alone. The recurrent reference is bounded:
// above --max-recurrent-tokens it runs on the first N tokens only and reports tokens/s from that (both
// algorithms are linear in T, so tokens/s does not depend on T).
//
// --gdn (issue #30 item 4): Olmo Hybrid's Gated DeltaNet delta rule as src/model/unit_gdn.cpp runs it: one
// decay per (token, head) from kda_gate with K = 1, broadcast over the key dimension into the KDA kernels,
// beta in (0, 2) (allow_neg_eigval), and in the timed region also the L2 norms of q and k (forward and
// backward; transformers' kernel does them inside, use_qk_l2norm_in_kernel = True) and the sum of the
// per-channel decay gradient back to one per head. Defaults: the 7B's head shape (dk 96, dv 192), 2 heads
// (so 2 threads have a (row, head) each), T 4096, 16384, 65536.
//
// The decay is g = -A softplus(a + dt_bias), a ~ N(0, 1), the same --A and --dt-bias for every head. The
// defaults 8 and -4.6 are the middle of Olmo Hybrid's init (A ~ U[0, 16], dt log-uniform in [1e-3, 0.1]):
// mean g ~ -0.13 per token. --A 4 --dt-bias 0 is KDA mode's decay (mean g ~ -2.8): in-chunk cumulative
// decays reach e^-180, products of them go subnormal, and subnormal GEMM operands cost Intel CPUs ~4x
// (bench/RESULTS.md "bench_kda --gdn").
//
// A third row per T is the PyTorch peer, bench/gdn_torch.py under deps/venv-reference's python
// (transformers' own torch_chunk_gated_delta_rule, forward + autograd backward, the same shapes and threads;
// documents of 4096 as batch rows since upstream has no packing), in the same run; --no-torch skips it.
// Both modes set OMP_WAIT_POLICY=passive when unset (default_passive_omp_wait, as olmosft train does); the
// children, torch's included, inherit it.
//
// --ftz (diagnostic, either mode): the children run with subnormals flushed to zero (MXCSR FTZ and DAZ;
// torch.set_flush_denormal(True) in the peer). The chunked kernels set FTZ/DAZ in their own threads anyway
// (kernels/kda_chunk.cpp), so it now changes only the recurrent form and the peer.
// The chunked backward is given the forward's pseudo-values Vn, as the model's units run it (kernels/kda.h);
// --no-saved-vn times the backward that recomputes them. --gemm picks the chunk GEMMs' library (default
// OpenBLAS; the trainer's "auto" is oneDNN on AVX-512 CPUs). Every run also prints an in-run single-thread
// sgemm (1024^3) and the chunked kernel's GFLOP per CPU-second against it (train::kda_document_flops).
#include "kernels/kda.h"

#include <cblas.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>
#include <xmmintrin.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "core/threads.h"
#include "kernels/gemm.h"
#include "train/flops.h"

using namespace olmosft::kda;
using Clock = std::chrono::steady_clock;

namespace {

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// CPU seconds of this process (all threads): on a shared machine wall time is inflated by other tenants.
double cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

long peak_rss_kb() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return ru.ru_maxrss;
}

// The GDN delta rule as unit_gdn runs it (see the header comment); prints the same RESULT line.
int run_one_gdn(bool chunked, int64_t T, int64_t H, int64_t K, int64_t V, int64_t chunk, int64_t reps,
                double A, double dt_bias, bool saved_vn) {
  const size_t NH = size_t(T * H);
  std::vector<float> qin(NH * K), kin(NH * K), q(NH * K), k(NH * K), gk(NH * K), v(NH * V), beta(NH);
  std::vector<float> o(NH * V), dout(NH * V), dqn(NH * K), dkn(NH * K), dq(NH * K), dk(NH * K), dgk(NH * K);
  std::vector<float> dv(NH * V), db(NH), gh(NH), dg(NH), vn(saved_vn ? NH * V : 0);
  float* vnp = saved_vn ? vn.data() : nullptr;
  std::mt19937 gen(1);
  std::normal_distribution<float> nd;
  for (auto& x : qin) x = nd(gen);
  for (auto& x : kin) x = nd(gen);
  for (auto& x : v) x = nd(gen);
  for (auto& x : dout) x = nd(gen);
  // a, b as a_proj(x), b_proj(x) ~ N(0, 1); g = -A softplus(a + dt_bias), the same A and dt_bias for every
  // head.
  std::vector<float> a(NH), dtb(size_t(H), static_cast<float>(dt_bias)),
      A_log(size_t(H), static_cast<float>(std::log(A))), b(NH);
  for (auto& x : a) x = nd(gen);
  for (auto& x : b) x = nd(gen);
  kda_gate_forward(a.data(), A_log.data(), dtb.data(), T, H, int64_t{1}, gh.data());
  kda_beta_forward(b.data(), int64_t(NH), true, beta.data());
  std::vector<int32_t> seg(static_cast<size_t>(T));
  for (int64_t t = 0; t < T; ++t) seg[t] = int32_t(t / 4096);
  const long base = peak_rss_kb();
  const KdaDims d{1, T, H, K, V};
  const float scale = 1.0f / std::sqrt(float(K));
  const float eps = float(kL2NormEps);
  const size_t nh = NH;
  auto broadcast = [&] {
    for (size_t i = 0; i < nh; ++i) std::fill(gk.begin() + i * K, gk.begin() + (i + 1) * K, gh[i]);
  };
  double tf = 1e30, tb = 1e30, cf = 1e30, cb = 1e30;
  for (int64_t r = 0; r < reps; ++r) {
    auto t0 = Clock::now();
    double c0 = cpu_seconds();
    l2norm_forward(qin.data(), int64_t(NH), K, eps, q.data());
    l2norm_forward(kin.data(), int64_t(NH), K, eps, k.data());
    broadcast();
    if (chunked)
      kda_chunk_forward(q.data(), k.data(), v.data(), gk.data(), beta.data(), seg.data(), d, scale, o.data(),
                        chunk, vnp);
    else
      kda_recurrent_forward(q.data(), k.data(), v.data(), gk.data(), beta.data(), seg.data(), d, scale,
                            o.data());
    tf = std::min(tf, seconds_since(t0));
    cf = std::min(cf, cpu_seconds() - c0);
    t0 = Clock::now();
    c0 = cpu_seconds();
    broadcast();  // unit_gdn rebuilds the shared scratch in the backward
    if (chunked)
      kda_chunk_backward(q.data(), k.data(), v.data(), gk.data(), beta.data(), seg.data(), d, scale,
                         dout.data(), dqn.data(), dkn.data(), dv.data(), dgk.data(), db.data(), chunk, vnp);
    else
      kda_recurrent_backward(q.data(), k.data(), v.data(), gk.data(), beta.data(), seg.data(), d, scale,
                             dout.data(), dqn.data(), dkn.data(), dv.data(), dgk.data(), db.data());
    for (size_t i = 0; i < nh; ++i) {
      float sum = 0;
      for (int64_t c = 0; c < K; ++c) sum += dgk[i * K + c];
      dg[i] = sum;
    }
    l2norm_backward(qin.data(), dqn.data(), int64_t(NH), K, eps, dq.data());
    l2norm_backward(kin.data(), dkn.data(), int64_t(NH), K, eps, dk.data());
    tb = std::min(tb, seconds_since(t0));
    cb = std::min(cb, cpu_seconds() - c0);
  }
  double cs = 0;
  for (size_t i = 0; i < o.size(); i += 97) cs += o[i];
  for (size_t i = 0; i < dg.size(); i += 89) cs += dg[i];
  std::printf("RESULT %s %ld %.6f %.6f %.6f %.6f %ld %ld %.9e\n", chunked ? "chunked" : "recurrent", long(T),
              tf, tb, cf, cb, peak_rss_kb(), base, cs);
  return 0;
}

// One configuration; prints "RESULT algo T fwd_wall bwd_wall fwd_cpu bwd_cpu rss_kb base_rss_kb checksum".
int run_one(bool chunked, int64_t T, int64_t H, int64_t K, int64_t V, int64_t chunk, int64_t reps,
            bool saved_vn) {
  const size_t NH = size_t(T * H);
  std::vector<float> q(NH * K), k(NH * K), g(NH * K), v(NH * V), beta(NH), o(NH * V), dout(NH * V);
  std::vector<float> dq(NH * K), dk(NH * K), dg(NH * K), dv(NH * V), db(NH), vn(saved_vn ? NH * V : 0);
  float* vnp = saved_vn ? vn.data() : nullptr;
  std::mt19937 gen(1);
  std::normal_distribution<float> nd;
  for (auto& x : q) x = nd(gen);
  for (auto& x : k) x = nd(gen);
  l2norm_forward(q.data(), int64_t(NH), K, float(kL2NormEps), q.data());
  l2norm_forward(k.data(), int64_t(NH), K, float(kL2NormEps), k.data());
  for (auto& x : v) x = nd(gen);
  for (auto& x : dout) x = nd(gen);
  std::vector<float> f(NH * K), dtb(size_t(H * K), 0.0f), A_log(size_t(H), std::log(4.0f)), b(NH);
  for (auto& x : f) x = nd(gen);
  for (auto& x : b) x = nd(gen);
  kda_gate_forward(f.data(), A_log.data(), dtb.data(), T, H, K, g.data());
  kda_beta_forward(b.data(), int64_t(NH), true, beta.data());
  // Documents of 4096 tokens (SFT-like packing) so the state resets regularly.
  std::vector<int32_t> seg(static_cast<size_t>(T));
  for (int64_t t = 0; t < T; ++t) seg[t] = int32_t(t / 4096);
  const long base = peak_rss_kb();
  const KdaDims d{1, T, H, K, V};
  const float scale = 1.0f / std::sqrt(float(K));
  double tf = 1e30, tb = 1e30, cf = 1e30, cb = 1e30;
  for (int64_t r = 0; r < reps; ++r) {
    auto t0 = Clock::now();
    double c0 = cpu_seconds();
    if (chunked)
      kda_chunk_forward(q.data(), k.data(), v.data(), g.data(), beta.data(), seg.data(), d, scale, o.data(),
                        chunk, vnp);
    else
      kda_recurrent_forward(q.data(), k.data(), v.data(), g.data(), beta.data(), seg.data(), d, scale,
                            o.data());
    tf = std::min(tf, seconds_since(t0));
    cf = std::min(cf, cpu_seconds() - c0);
    t0 = Clock::now();
    c0 = cpu_seconds();
    if (chunked)
      kda_chunk_backward(q.data(), k.data(), v.data(), g.data(), beta.data(), seg.data(), d, scale,
                         dout.data(), dq.data(), dk.data(), dv.data(), dg.data(), db.data(), chunk, vnp);
    else
      kda_recurrent_backward(q.data(), k.data(), v.data(), g.data(), beta.data(), seg.data(), d, scale,
                             dout.data(), dq.data(), dk.data(), dv.data(), dg.data(), db.data());
    tb = std::min(tb, seconds_since(t0));
    cb = std::min(cb, cpu_seconds() - c0);
  }
  double cs = 0;
  for (size_t i = 0; i < o.size(); i += 97) cs += o[i];
  for (size_t i = 0; i < dg.size(); i += 89) cs += dg[i];
  std::printf("RESULT %s %ld %.6f %.6f %.6f %.6f %ld %ld %.9e\n", chunked ? "chunked" : "recurrent", long(T),
              tf, tb, cf, cb, peak_rss_kb(), base, cs);
  return 0;
}

std::vector<int64_t> parse_list(const char* s) {
  std::vector<int64_t> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) out.push_back(std::stoll(item));
  return out;
}

// Runs one child (a --one run of this binary, or the PyTorch peer) and prints its RESULT line as a table row;
// returns its tokens per CPU-second, or a negative value when it failed.
double run_child(const std::string& cmd, int64_t T) {
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) {
    std::perror("popen");
    return -1;
  }
  char line[512];
  double tps = -1;
  while (std::fgets(line, sizeof line, p)) {
    char algo[32];
    long tr, rss, base;
    double tf, tb, cf, cb, cs;
    if (std::sscanf(line, "RESULT %31s %ld %lf %lf %lf %lf %ld %ld %lf", algo, &tr, &tf, &tb, &cf, &cb, &rss,
                    &base, &cs) == 9) {
      tps = double(tr) / (cf + cb);
      std::printf("%-10s %8ld %8ld %9.3f %9.3f %9.3f %9.3f %12.0f %10.1f %10.1f\n", algo, long(T), tr, tf, tb,
                  cf, cb, tps, rss / 1024.0, (rss - base) / 1024.0);
    } else if (std::strncmp(line, "NOTE ", 5) == 0) {
      std::printf("%s", line + 5);
    }
  }
  if (pclose(p) != 0) return -1;
  return tps;
}

// The hardware peer: the best of 3 single-threaded 1024^3 sgemms of the library the chunk kernels call
// (OpenBLAS), in FLOP per CPU-second.
double sgemm_peak_per_cpu_s() {
  const int n = 1024;
  std::vector<float> a(size_t(n) * n, 0.5f), b(size_t(n) * n, 0.25f), c(size_t(n) * n, 0.0f);
  olmosft::BlasSingleThread blas1;
  double best = 1e30;
  for (int r = 0; r < 3; ++r) {
    const double c0 = cpu_seconds();
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f,
                c.data(), n);
    best = std::min(best, cpu_seconds() - c0);
  }
  return 2.0 * n * n * n / best;
}

// The FLOP rates of one T: fm = model FLOPs per token, fh = with what the chunked backward recomputes (the
// hardware count); tps = {recurrent, chunked} tokens per CPU-second, tps_torch <= 0 when not run.
void print_flops(int64_t T, double fm, double fh, const double tps[2], double tps_torch, double peak) {
  std::printf(
      "%-10s %8ld  GFLOP per CPU-s, delta-rule model FLOPs (%.2f MFLOP/token): chunked %.1f, recurrent %.1f",
      "flops", long(T), fm * 1e-6, fm * tps[1] * 1e-9, fm * tps[0] * 1e-9);
  if (tps_torch > 0) std::printf(", torch %.1f", fm * tps_torch * 1e-9);
  std::printf("; chunked with its recompute (%.2f MFLOP/token): %.1f = %.2f of the sgemm peak\n", fh * 1e-6,
              fh * tps[1] * 1e-9, fh * tps[1] / peak);
}

std::string shell_quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int64_t> Ts = {4096, 65536};
  int64_t H = 1, K = 128, V = 256, chunk = 64, threads = 1, max_rec = 16384, reps = 3;
  bool one = false, one_chunked = false, gdn = false, torch = true, ftz = false, saved_vn = true,
       set_H = false, set_K = false, set_V = false, set_T = false;
  int64_t one_T = 0;
  std::string gemm_lib = "openblas";
  double A = 8.0, dt_bias = -4.6;  // --gdn only
  for (int i = 1; i < argc; ++i) {
    auto next = [&]() -> const char* {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "bench_kda: %s needs a value\n", argv[i]);
        std::exit(2);
      }
      return argv[++i];
    };
    const std::string a = argv[i];
    if (a == "--T") {
      Ts = parse_list(next());
      set_T = true;
    } else if (a == "--H") {
      H = std::stoll(next());
      set_H = true;
    } else if (a == "--K") {
      K = std::stoll(next());
      set_K = true;
    } else if (a == "--V") {
      V = std::stoll(next());
      set_V = true;
    } else if (a == "--chunk")
      chunk = std::stoll(next());
    else if (a == "--threads")
      threads = std::stoll(next());
    else if (a == "--max-recurrent-tokens")
      max_rec = std::stoll(next());
    else if (a == "--reps")
      reps = std::max<int64_t>(1, std::stoll(next()));
    else if (a == "--A")
      A = std::stod(next());
    else if (a == "--dt-bias")
      dt_bias = std::stod(next());
    else if (a == "--gemm")
      gemm_lib = next();
    else if (a == "--gdn")
      gdn = true;
    else if (a == "--no-saved-vn")
      saved_vn = false;
    else if (a == "--ftz")
      ftz = true;
    else if (a == "--no-torch")
      torch = false;
    else if (a == "--one") {
      one = true;
      one_chunked = std::string(next()) == "chunked";
      one_T = std::stoll(next());
    } else {
      std::fprintf(stderr, "bench_kda: unknown argument %s\n", a.c_str());
      return 2;
    }
  }
  if (gdn) {
    if (!set_T) Ts = {4096, 16384, 65536};
    if (!set_H) H = 2;
    if (!set_K) K = 96;
    if (!set_V) V = 192;
  }
  olmosft::default_passive_omp_wait(argv);     // as olmosft train does (both modes)
  if (ftz) _mm_setcsr(_mm_getcsr() | 0x8040);  // FTZ (bit 15) | DAZ (bit 6); inherited by OpenMP threads
  olmosft::set_threads(int(threads));
  olmosft::set_cpu_gemm({olmosft::parse_gemm_lib(gemm_lib, "--gemm"), olmosft::ComputeDtype::F32});
  if (one)
    return gdn ? run_one_gdn(one_chunked, one_T, H, K, V, chunk, reps, A, dt_bias, saved_vn)
               : run_one(one_chunked, one_T, H, K, V, chunk, reps, saved_vn);

  const std::string py = std::string(OLMOSFT_SOURCE_DIR) + "/deps/venv-reference/bin/python";
  if (gdn && torch && ::access(py.c_str(), X_OK) != 0) {
    std::printf("torch: skipped (%s not found; scripts/install-deps.sh --reference)\n", py.c_str());
    torch = false;
  }
  if (gdn)
    std::printf(
        "GDN delta rule fwd+bwd (unit_gdn's path: l2norm q/k, per-head decay broadcast over dk, dg summed), "
        "float32, H=%ld dk=%ld dv=%ld chunk=%ld threads=%ld, documents of 4096, best of %ld, "
        "g = -%g softplus(N(0,1) + %g), OMP_WAIT_POLICY=%s\n",
        long(H), long(K), long(V), long(chunk), long(threads), long(reps), A, dt_bias,
        olmosft::omp_wait_policy());
  else
    std::printf(
        "KDA delta rule fwd+bwd, float32, H=%ld dk=%ld dv=%ld chunk=%ld threads=%ld, documents of 4096, "
        "best of %ld, OMP_WAIT_POLICY=%s\n",
        long(H), long(K), long(V), long(chunk), long(threads), long(reps), olmosft::omp_wait_policy());
  std::printf("chunk GEMMs: %s; backward %s\n", gemm_lib.c_str(),
              saved_vn ? "given the forward's Vn (as the model runs it)" : "recomputing Vn (--no-saved-vn)");
  // Delta-rule FLOPs per token and head (train::kda_document_flops, the count behind MFU: GEMMs, solves and
  // pairwise products; recompute = what our backward recomputes, the hardware count).
  auto flops_per_token = [&](int64_t T, bool recompute) {
    const int64_t doc = std::min<int64_t>(T, 4096);
    const auto f = olmosft::train::kda_document_flops(doc, K, V, chunk, recompute);
    return double(H) * (f.gemm + f.other) / double(doc);
  };
  const double peak = sgemm_peak_per_cpu_s();
  std::printf("hardware peer: OpenBLAS sgemm 1024^3, 1 thread, best of 3: %.1f GFLOP per CPU-s\n",
              peak * 1e-9);
  if (ftz)
    std::printf("--ftz: subnormals flushed to zero in every child (diagnostic; not the kernels' numerics)\n");
  std::printf("%-10s %8s %8s %9s %9s %9s %9s %12s %10s %10s\n", "algo", "T", "T_run", "fwd_wall", "bwd_wall",
              "fwd_cpu", "bwd_cpu", "tok/s(cpu)", "peakRSS_MB", "kernel_MB");
  for (int64_t T : Ts) {
    double tps[2] = {0, 0};
    for (int c = 1; c >= 0; --c) {
      const int64_t Tr = c ? T : std::min(T, max_rec);
      std::ostringstream cmd;
      cmd << "OPENBLAS_NUM_THREADS=" << threads << " " << argv[0] << " --one "
          << (c ? "chunked" : "recurrent") << " " << Tr << " --H " << H << " --K " << K << " --V " << V
          << " --chunk " << chunk << " --threads " << threads << " --reps " << reps << " --gemm " << gemm_lib;
      if (gdn) cmd << " --gdn --A " << A << " --dt-bias " << dt_bias;
      if (ftz) cmd << " --ftz";
      if (!saved_vn) cmd << " --no-saved-vn";
      tps[c] = run_child(cmd.str(), T);
      if (tps[c] < 0) {
        std::fprintf(stderr, "bench_kda: child run failed: %s\n", cmd.str().c_str());
        return 1;
      }
    }
    double tps_torch = -1;
    if (gdn && torch) {
      // Same threads for torch's intra-op pool and its BLAS; the script also calls torch.set_num_threads.
      std::ostringstream cmd;
      cmd << "OMP_NUM_THREADS=" << threads << " MKL_NUM_THREADS=" << threads
          << " OPENBLAS_NUM_THREADS=" << threads << " " << shell_quote(py) << " "
          << shell_quote(OLMOSFT_SOURCE_DIR "/bench/gdn_torch.py") << " --T " << T << " --H " << H << " --K "
          << K << " --V " << V << " --chunk " << chunk << " --threads " << threads << " --reps " << reps
          << " --A " << A << " --dt-bias " << dt_bias << (ftz ? " --ftz" : "");
      tps_torch = run_child(cmd.str(), T);
      if (tps_torch < 0) std::printf("torch: script failed: %s\n", cmd.str().c_str());
    }
    std::printf("%-10s %8ld  chunked/recurrent tokens/s ratio: %.2f", "ratio", long(T), tps[1] / tps[0]);
    if (tps_torch > 0) std::printf("; chunked/torch: %.2f", tps[1] / tps_torch);
    std::printf("\n");
    print_flops(T, flops_per_token(T, false), flops_per_token(T, true), tps, tps_torch, peak);
  }
  return 0;
}
