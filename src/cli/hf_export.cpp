// `olmosft export hf` (re-export an HF directory: dtype conversion, resharding) and `olmosft model info`.
#include <iostream>

#include "cli/verb.h"
#include "model/hf_dir.h"
#include "model/olmo_core.h"

namespace {

int export_hf_main(int argc, char** argv) {
  CLI::App app{"Export an HF model directory (config.json, safetensors, tokenizer files)", "export hf"};
  std::string from;
  olmosft::cli::HfOutOptions o;
  app.add_option("--from", from, "source HF model directory")->required();
  o.add(app, "the source's dtypes");
  return olmosft::cli::run_app(app, argc, argv, [&] {
    using namespace olmosft;
    model::ExportOptions opts = model::parse_export_options(o.dtype, o.shard);
    opts.copy_side_files_from = from;
    auto m = model::load_hf_dir(from);
    auto res = model::export_hf_dir(o.out, m.config, m.named(), opts);
    std::cout << "exported " << m.registry.size() << " tensors (" << res.tensor_bytes << " bytes) to "
              << o.out << ":";
    for (const auto& f : res.files) std::cout << " " << f;
    std::cout << "\n";
    return 0;
  });
}

int model_info_main(int argc, char** argv) {
  CLI::App app{"Validate an HF model directory and print its configuration and parameter counts",
               "model info"};
  std::string dir, config;
  app.add_option("dir", dir, "HF model directory, or an OLMo-core step directory (distributed checkpoint)")
      ->required();
  app.add_option("--config", config, "OLMo-core config.json for a step directory (default: DIR/config.json)");
  return olmosft::cli::run_app(app, argc, argv, [&] {
    namespace oc = olmosft::model::olmo_core;
    if (oc::is_olmo_core_dir(dir))
      std::cout << oc::model_info(oc::open(dir, config), dir);
    else
      std::cout << olmosft::model::model_info(olmosft::model::load_hf_dir(dir));
    return 0;
  });
}

}  // namespace

OLMOSFT_VERB("export hf", "export an HF model directory (dtype conversion, sharding, tokenizer files)",
             export_hf_main);
OLMOSFT_VERB("model info",
             "validate an HF model directory (or an OLMo-core checkpoint) and print config, parameter and "
             "tensor counts",
             model_info_main);
