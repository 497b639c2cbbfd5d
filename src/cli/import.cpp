// `olmosft import olmo-core STEP_DIR --config CONFIG_JSON --out HF_DIR`: an OLMo-core distributed checkpoint
// (PyTorch DCP, model_and_optim/) written as an HF directory, one tensor in memory at a time, with progress.
#include <chrono>
#include <cstdio>
#include <iostream>
#include <set>

#include "cli/verb.h"
#include "model/hf_dir.h"
#include "model/olmo_core.h"

namespace {

// Progress on stderr: tensors and bytes done, read rate and ETA, at most once a second (and at the end).
struct Progress {
  using Clock = std::chrono::steady_clock;
  size_t total_tensors;
  uint64_t total_bytes;
  size_t tensors = 0;
  uint64_t bytes = 0;
  Clock::time_point start = Clock::now(), last = start;

  void tick(const std::string& name, uint64_t n) {
    ++tensors;
    bytes += n;
    auto now = Clock::now();
    if (now - last < std::chrono::seconds(1) && tensors < total_tensors) return;
    last = now;
    const double s = std::chrono::duration<double>(now - start).count();
    const double rate = s > 0 ? double(bytes) / s : 0.0;
    const double eta = rate > 0 ? double(total_bytes - bytes) / rate : 0.0;
    std::fprintf(stderr, "import: %zu/%zu tensors, %.1f/%.1f MB, %.1f MB/s, ETA %.0f s (%s)\n", tensors,
                 total_tensors, double(bytes) / 1e6, double(total_bytes) / 1e6, rate / 1e6, eta,
                 name.c_str());
  }
};

int import_olmo_core_main(int argc, char** argv) {
  CLI::App app{
      "Import an OLMo-core distributed checkpoint (model_and_optim/ .metadata + .distcp shards) as an "
      "HF model directory",
      "import olmo-core"};
  std::string step, config;
  olmosft::cli::HfOutOptions o;
  app.add_option("step_dir", step, "OLMo-core step directory (holding model_and_optim/) or the DCP directory")
      ->required();
  app.add_option("--config", config, "OLMo-core config.json (default: STEP_DIR/config.json)");
  o.add(app, "the checkpoint's");
  return olmosft::cli::run_app(app, argc, argv, [&] {
    using namespace olmosft;
    model::ExportOptions opts = model::parse_export_options(o.dtype, o.shard);
    auto ck = model::olmo_core::open(step, config);
    if (!opts.dtype) {  // keep: config.json's torch_dtype names the stored dtype when there is one
      std::set<DType> stored;
      for (const auto& [hf, key] : ck.key_of) stored.insert(*ck.dcp.at(key).dtype);
      if (stored.size() == 1) opts.dtype = *stored.begin();
    }
    Progress p{ck.registry.size(), ck.total_bytes()};
    auto res = model::export_hf_dir(
        o.out, ck.config, ck.lazy_named([&](const std::string& n, uint64_t b) { p.tick(n, b); }), opts);
    std::cout << "imported " << ck.registry.size() << " tensors (" << res.tensor_bytes << " bytes) from "
              << ck.dcp.dir() << " to " << o.out << ":";
    for (const auto& f : res.files) std::cout << " " << f;
    std::cout << "\n";
    if (ck.config.eos_token_ids.empty())
      std::cout << "note: the OLMo-core config names no tokenizer (dataset.tokenizer), so config.json has no "
                   "eos/pad/bos token ids; add them (and the tokenizer files) before generating\n";
    return 0;
  });
}

}  // namespace

OLMOSFT_VERB("import olmo-core",
             "import an OLMo-core distributed checkpoint (distcp) as an HF model directory",
             import_olmo_core_main);
