// `olmosft check model DIR [--tokenizer TOK]`: the runbook's traps a model directory's config shows
// (model/traps.h), and its special ids against a tokenizer's.
#include <iostream>

#include "cli/verb.h"
#include "data/build_bytes_encoder.h"
#include "model/config.h"
#include "model/traps.h"

namespace {

using namespace olmosft;

int check_model_main(int argc, char** argv) {
  CLI::App app{
      "Check a model directory's config.json (or a preset) for the runbook's traps: RoPE/YaRN per "
      "layer type, NoPE, dolma2 special ids; with --tokenizer, its eos/pad/vocabulary against the "
      "config. Exit 1 on a failure (warnings do not fail)",
      "check model"};
  std::string dir, tok;
  app.add_option("DIR", dir, "HF model directory, config.json, or a preset name")->required();
  app.add_option("--tokenizer", tok, "tokenizer directory (or builtin:bytes) to compare with");
  return cli::run_app(app, argc, argv, [&] {
    const bool is_dir = dir.find('/') != std::string::npos && !dir.ends_with(".json");
    const model::ModelConfig c = model::config_from_path_or_preset(is_dir ? dir + "/config.json" : dir);
    std::vector<model::TrapCheck> checks = model::config_trap_checks(c);
    if (!tok.empty()) {
      const auto enc = open_chat_encoder(tok);
      for (auto& t : model::tokenizer_trap_checks(c, enc->eos_id(), enc->pad_id(), enc->vocab_size()))
        checks.push_back(std::move(t));
    }
    int fails = 0;
    std::cout << "model " << c.model_type_name << ", " << c.num_hidden_layers << " layers, vocab "
              << c.vocab_size << "\n";
    for (const auto& t : checks) {
      static const char* const kTag[] = {"ok   ", "WARN ", "FAIL "};
      std::cout << kTag[t.level] << t.what << ": " << t.detail << "\n";
      fails += t.level == model::TrapCheck::Fail;
    }
    return fails == 0 ? 0 : 1;
  });
}

}  // namespace

OLMOSFT_VERB("check model",
             "check a model config for the runbook's traps (RoPE/YaRN per layer type, special ids)",
             check_model_main);
