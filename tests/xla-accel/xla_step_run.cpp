// xla_step_run PLUGIN DIR [REPS] [PEAK_TFLOPS]: compiles and runs a training step exported by `olmosft xla
// export` (DIR/step.mlir + DIR/manifest.txt, the exact program the XLA backend runs) on PLUGIN (cpu | cuda |
// tpu | a path) with the runtime alone (src/xla, src/core: tests/xla-accel builds it where the CPU build's
// libraries are absent). Arguments come from the manifest (files, or generated: constants, random ids,
// positions, uniform weights of a given standard deviation). Prints
//   XLA-STEP plugin=P platform=S dir=DIR model=M layers=L B=B T=T bf16=0|1 compile_s=.. step_s=.. (best of
//   REPS after one warm-up) tokens_per_s=.. tflops=.. mfu=..   (mfu: the manifest's model FLOPs per step /
//   step_s / PEAK_TFLOPS; 0 when no peak is given)
//   XLA-MEMORY dir=DIR compiled_total_bytes=.. device_peak_bytes=.. device_limit_bytes=..
//   peak_over_compiled=.. (the compiled per-device total against the device allocator's measured peak; 0
//   where not reported)
// and, when the manifest has expected results, one line per result checked and
//   RESULT xla_step DIR passed|FAILED (worst max|got - want| / max|want| = X of an allowed Y)
// Exit 0 only when it ran and every expected result matched.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "xla/pjrt.h"

using namespace olmosft;
using Clock = std::chrono::steady_clock;

namespace {

struct Entry {
  std::string name, dtype;
  std::vector<int64_t> dims;
  std::vector<std::string> how;  // the rest of the line
};

struct Manifest {
  std::string model, header;
  double flops = 0;
  int64_t tokens = 0;
  std::vector<Entry> args, results;
};

std::vector<int64_t> parse_dims(const std::string& s) {
  std::vector<int64_t> d;
  if (s == "-") return d;
  std::stringstream ss(s);
  for (std::string x; std::getline(ss, x, ',');) d.push_back(std::stoll(x));
  return d;
}

int64_t numel(const std::vector<int64_t>& d) {
  int64_t n = 1;
  for (int64_t x : d) n *= x;
  return n;
}

Manifest read_manifest(const std::string& path) {
  std::ifstream f(path);
  OLMO_CHECK(f, "xla_step_run: cannot read ", path);
  Manifest m;
  std::string line;
  std::getline(f, line);
  OLMO_CHECK(line == "olmosft-xla-step 1", path, ": not an olmosft step manifest (first line '", line, "')");
  for (int n = 2; std::getline(f, line); ++n) {
    std::istringstream ls(line);
    std::string kind;
    ls >> kind;
    if (kind == "model") {
      m.header = line.substr(6);
      std::vector<std::string> w;  // <model_type> then key value pairs
      for (std::string x; ls >> x;) w.push_back(x);
      int64_t B = 0, T = 0;
      for (size_t i = 1; i + 1 < w.size(); i += 2) {
        if (w[i] == "B") B = std::stoll(w[i + 1]);
        if (w[i] == "T") T = std::stoll(w[i + 1]);
      }
      OLMO_CHECK(B > 0 && T > 0, path, ":", n, ": the model line names no B and T");
      m.tokens = B * T;
    } else if (kind == "flops") {
      ls >> m.flops;
    } else if (kind == "arg" || kind == "result") {
      Entry e;
      std::string dims;
      ls >> e.name >> e.dtype >> dims;
      OLMO_CHECK(e.dtype == "f32" || e.dtype == "s32", path, ":", n, ": dtype must be f32 or s32, got '",
                 e.dtype, "'");
      e.dims = parse_dims(dims);
      for (std::string w; ls >> w;) e.how.push_back(w);
      (kind == "arg" ? m.args : m.results).push_back(e);
    } else {
      OLMO_CHECK(kind.empty(), path, ":", n, ": unknown line kind '", kind, "'");
    }
  }
  OLMO_CHECK(!m.args.empty() && !m.results.empty(), path, ": no arguments or results");
  return m;
}

std::vector<char> read_bytes(const std::string& path, size_t bytes) {
  std::ifstream f(path, std::ios::binary);
  OLMO_CHECK(f, "xla_step_run: cannot read ", path);
  std::vector<char> b(bytes);
  f.read(b.data(), std::streamsize(bytes));
  OLMO_CHECK(size_t(f.gcount()) == bytes && f.peek() == EOF, path, ": expected exactly ", bytes, " bytes");
  return b;
}

uint64_t splitmix(uint64_t& s) {
  uint64_t z = (s += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// One argument's bytes, from a file or generated as the manifest says.
std::vector<char> make_argument(const Entry& e, const std::string& dir) {
  const int64_t n = numel(e.dims);
  const size_t bytes = size_t(n) * 4;
  OLMO_CHECK(!e.how.empty(), "argument ", e.name, ": no source");
  const std::string& k = e.how[0];
  if (k == "file") return read_bytes(dir + "/" + e.how.at(1), bytes);
  std::vector<char> out(bytes);
  float* f = reinterpret_cast<float*>(out.data());
  int32_t* s = reinterpret_cast<int32_t*>(out.data());
  const bool is_f = e.dtype == "f32";
  if (k == "const") {
    const double v = std::stod(e.how.at(1));
    for (int64_t i = 0; i < n; ++i) is_f ? void(f[i] = float(v)) : void(s[i] = int32_t(v));
  } else if (k == "iota_mod") {
    const int64_t T = std::stoll(e.how.at(1));
    for (int64_t i = 0; i < n; ++i) s[i] = int32_t(i % T);
  } else if (k == "randint") {
    const uint64_t hi = std::stoull(e.how.at(1));
    uint64_t st = std::stoull(e.how.at(2));
    for (int64_t i = 0; i < n; ++i) s[i] = int32_t(splitmix(st) % hi);
  } else if (k == "uniform_std") {  // uniform on [-a, a], a = std * sqrt(3): that standard deviation
    const double a = std::stod(e.how.at(1)) * std::sqrt(3.0);
    uint64_t st = std::stoull(e.how.at(2));
    for (int64_t i = 0; i < n; ++i) f[i] = float(a * (2.0 * double(splitmix(st) >> 11) * 0x1.0p-53 - 1.0));
  } else {
    throw Error("argument " + e.name + ": unknown source '" + k + "'");
  }
  return out;
}

// max |got - want| / max |want| (exact comparison for s32).
double scaled_error(const Entry& e, const std::vector<char>& got, const std::vector<char>& want) {
  const int64_t n = numel(e.dims);
  double m = 0, s = 0;
  for (int64_t i = 0; i < n; ++i) {
    double g, w;
    if (e.dtype == "f32") {
      g = reinterpret_cast<const float*>(got.data())[i];
      w = reinterpret_cast<const float*>(want.data())[i];
    } else {
      g = reinterpret_cast<const int32_t*>(got.data())[i];
      w = reinterpret_cast<const int32_t*>(want.data())[i];
    }
    m = std::max(m, std::fabs(g - w));
    s = std::max(s, std::fabs(w));
  }
  return s > 0 ? m / s : m;
}

int run(const std::string& plugin, const std::string& dir, int reps, double peak) {
  const Manifest m = read_manifest(dir + "/manifest.txt");
  std::ifstream tf(dir + "/step.mlir");
  OLMO_CHECK(tf, "xla_step_run: cannot read ", dir, "/step.mlir");
  const std::string text((std::istreambuf_iterator<char>(tf)), std::istreambuf_iterator<char>());
  xla::Client client = xla::Client::create(
      plugin, plugin == "cpu" ? xla::ClientOptions{.cpu_device_count = 1} : xla::ClientOptions{});
  auto t0 = Clock::now();
  xla::Executable exe = client.compile(text);
  const double compile_s = std::chrono::duration<double>(Clock::now() - t0).count();
  OLMO_CHECK(exe.num_outputs() == m.results.size(), dir, ": the program has ", exe.num_outputs(),
             " results, the manifest ", m.results.size());
  std::vector<xla::Buffer> args;
  for (const Entry& e : m.args) {
    const std::vector<char> host = make_argument(e, dir);
    const xla::TensorType t{e.dtype == "s32" ? xla::ElementType::kS32 : xla::ElementType::kF32, e.dims};
    args.push_back(client.to_device(host.data(), t));
  }
  std::vector<xla::Buffer*> ptrs;
  for (auto& b : args) ptrs.push_back(&b);
  std::vector<xla::Buffer> out = exe.execute(ptrs);  // warm-up (and the results checked below)
  double best = 1e300;
  for (int r = 0; r < reps; ++r) {
    t0 = Clock::now();
    std::vector<xla::Buffer> o = exe.execute(ptrs);  // waits for the device
    best = std::min(best, std::chrono::duration<double>(Clock::now() - t0).count());
  }
  const double tflops = m.flops / best / 1e12;
  std::printf(
      "XLA-STEP plugin=%s platform=%s dir=%s %s compile_s=%.2f step_s=%.4f tokens_per_s=%.1f tflops=%.2f "
      "mfu=%.3f\n",
      plugin.c_str(), client.platform_name().c_str(), dir.c_str(), m.header.c_str(), compile_s, best,
      double(m.tokens) / best, tflops, peak > 0 ? tflops / peak : 0.0);
  // The device's measured peak against the compiled figure (issue #46: a compiled plan is only worth what
  // the device confirms). 0 where the plugin reports no statistics.
  int64_t compiled = 0;
  try {
    compiled = exe.memory_stats().total_bytes();
  } catch (const Error&) {
  }
  const xla::Client::DeviceMemory dm = client.device_memory(0);
  std::printf(
      "XLA-MEMORY dir=%s compiled_total_bytes=%lld device_peak_bytes=%lld device_limit_bytes=%lld "
      "peak_over_compiled=%.3f\n",
      dir.c_str(), static_cast<long long>(compiled), static_cast<long long>(dm.peak),
      static_cast<long long>(dm.limit),
      compiled > 0 && dm.peak > 0 ? double(dm.peak) / double(compiled) : 0.0);
  bool any = false, ok = true;
  double worst = 0, allowed = 0;
  for (size_t i = 0; i < m.results.size(); ++i) {
    const Entry& e = m.results[i];
    if (e.how.size() < 3 || e.how[0] != "expect") continue;
    any = true;
    const size_t bytes = size_t(numel(e.dims)) * 4;
    std::vector<char> got(bytes);
    out[i].to_host(got.data(), bytes);
    const double err = scaled_error(e, got, read_bytes(dir + "/" + e.how[1], bytes)),
                 tol = std::stod(e.how[2]);
    if (err > tol) std::printf("  %s: %.3g > %.3g\n", e.name.c_str(), err, tol);
    ok = ok && err <= tol;
    if (err >= worst) worst = err, allowed = tol;
  }
  if (any)
    std::printf("RESULT xla_step %s %s (worst max|got - want| / max|want| = %.3g of an allowed %.3g)\n",
                dir.c_str(), ok ? "passed" : "FAILED", worst, allowed);
  return ok ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s PLUGIN DIR [REPS] [PEAK_TFLOPS]\n", argv[0]);
    return 2;
  }
  const int reps = argc > 3 ? std::atoi(argv[3]) : 3;
  const double peak = argc > 4 ? std::atof(argv[4]) : 0;
  if (reps < 1) {
    std::fprintf(stderr, "%s: REPS must be >= 1\n", argv[0]);
    return 2;
  }
  try {
    return run(argv[1], argv[2], reps, peak);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "xla_step_run: %s\n", e.what());
    return 2;
  }
}
