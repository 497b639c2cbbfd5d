// `olmosft selfcheck` and `olmosft demo`: the kernel self-check (each kernel's gradient against float64
// finite differences on small shapes), printed as a table. `demo` becomes the tiny end-to-end training
// run once the trainer exists.
#include "kernels/selfcheck.h"

#include <iostream>

#include "cli/verb.h"

namespace {
int selfcheck_main(int argc, char** argv) {
  CLI::App app{"Run every kernel's gradient self-check against float64 finite differences", "selfcheck"};
  return olmosft::cli::run_app(app, argc, argv, [] { return olmosft::kernel_selfcheck(std::cout) ? 0 : 1; });
}
}  // namespace

OLMOSFT_VERB("selfcheck", "check every CPU kernel's gradient against float64 finite differences",
             selfcheck_main);

namespace {
int demo_main(int argc, char** argv) {
  CLI::App app{"The embedded default job (until the trainer lands: the kernel self-check)", "demo"};
  std::string out_dir = "demo-out";
  app.add_option("--out", out_dir, "directory for the demo's outputs");
  return olmosft::cli::run_app(app, argc, argv, [&] { return olmosft::kernel_selfcheck(std::cout) ? 0 : 1; });
}
}  // namespace

OLMOSFT_VERB("demo", "run the embedded default job (see README)", demo_main);
