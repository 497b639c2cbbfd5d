// olmosft: one binary, many verbs. `olmosft --help` lists them; `olmosft VERB --help` explains one.
#include <algorithm>
#include <cstring>
#include <iostream>

#include "cli/verb.h"
#include "core/error.h"
#include "core/signals.h"
#include "core/threads.h"
#include "kernels/gemm.h"

namespace olmosft::cli {

std::vector<Verb>& verbs() {
  static std::vector<Verb> v;
  return v;
}

int run_app(CLI::App& app, int argc, char** argv, const std::function<int()>& body) {
  int threads = 0;
  app.add_option("--threads", threads, "CPU threads for kernels and BLAS (0 = all cores)")
      ->envname("OLMOSFT_THREADS")
      ->check(CLI::Range(0, 4096));
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) {
      std::cout << app.help();
      return 0;
    }
    std::cerr << "olmosft " << app.get_name() << ": error: " << e.what() << "\n(run 'olmosft "
              << app.get_name() << " --help' for usage)\n";
    return 2;
  }
  try {
    set_threads(threads);
    return body();
  } catch (const Error& e) {
    std::cerr << "olmosft " << app.get_name() << ": error: " << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "olmosft " << app.get_name() << ": internal error: " << e.what() << "\n";
    return 3;
  }
}

static void print_help(std::ostream& os) {
  auto v = verbs();
  std::sort(v.begin(), v.end(), [](const Verb& a, const Verb& b) { return a.name < b.name; });
  os << "olmosft: supervised fine-tuning of Olmo-family models (CPU), from chat data to an HF export.\n\n"
     << "usage: olmosft VERB [options]      olmosft VERB --help\n\nverbs:\n";
  for (const auto& x : v) {
    os << "  " << x.name << std::string(x.name.size() < 18 ? 18 - x.name.size() : 1, ' ') << x.summary
       << "\n";
  }
}

}  // namespace olmosft::cli

int main(int argc, char** argv) {
  using namespace olmosft::cli;
  olmosft::default_passive_omp_wait(argv);
  // Before any thread starts: SIGTERM and SIGINT are taken on one thread of their own, never on a thread
  // inside oneDNN's JIT GEMM (core/signals.h).
  olmosft::route_stop_signals();
  // Every verb computes on this machine's fp32 GEMM library (compute.gemm=auto); `train` then applies the
  // recipe's compute.gemm / compute.dtype.
  olmosft::set_cpu_gemm({olmosft::auto_gemm_lib(), olmosft::ComputeDtype::F32});
  if (argc < 2 || !std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h") ||
      !std::strcmp(argv[1], "help")) {
    print_help(argc < 2 ? std::cerr : std::cout);
    return argc < 2 ? 2 : 0;
  }
  if (!std::strcmp(argv[1], "--version")) {
    std::cout << "olmosft 0.1.0\n";
    return 0;
  }
  // Two-word verbs first ("data build"), then one-word verbs.
  if (argc >= 3) {
    std::string two = std::string(argv[1]) + " " + argv[2];
    for (const auto& v : verbs()) {
      if (v.name == two) {
        std::string prog = "olmosft " + two;
        std::vector<char*> args(argv + 2, argv + argc);
        args[0] = prog.data();
        return v.run(static_cast<int>(args.size()), args.data());
      }
    }
  }
  std::string one = argv[1];
  for (const auto& v : verbs()) {
    if (v.name == one) return v.run(argc - 1, argv + 1);
  }
  // A group word with a missing or unknown sub-verb ("olmosft data frobnicate").
  std::vector<std::string> group;
  for (const auto& v : verbs()) {
    if (v.name.rfind(one + " ", 0) == 0) group.push_back(v.name);
  }
  if (!group.empty()) {
    std::cerr << "olmosft: unknown or missing sub-verb for '" << one << "'; expected one of:";
    for (const auto& g : group) std::cerr << " '" << g << "'";
    std::cerr << "\n";
    return 2;
  }
  std::cerr << "olmosft: unknown verb '" << one << "'\n\n";
  print_help(std::cerr);
  return 2;
}
