// `olmosft generate`: greedy completions of chat prompts (JSONL, one conversation per line) with a trained HF
// export or a random init (the trainer's, for a before/after comparison). See docs/train.md.
#include "train/generate.h"

#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cli/verb.h"
#include "core/error.h"
#include "data/build_bytes_encoder.h"
#include "data/source.h"
#include "data/tokenizer.h"
#include "io/atomic_file.h"
#include "io/json.h"
#include "model/config.h"
#include "model/model.h"

namespace {

using olmosft::fail;

struct Prompt {
  int64_t line = 0;
  nlohmann::json id;         // the line's "id" (null when absent)
  nlohmann::json reference;  // content of a trailing assistant message (null when none)
  olmosft::Conversation conv;
};

std::vector<Prompt> read_prompts(const std::string& path) {
  std::error_code ec;
  OLMO_CHECK(std::filesystem::is_regular_file(path, ec), "--prompts file ", path, " does not exist");
  std::ifstream f(path);
  OLMO_CHECK(f, path, ": cannot open");
  std::vector<Prompt> out;
  std::string text;
  int64_t line = 0;
  while (std::getline(f, text)) {
    ++line;
    if (text.find_first_not_of(" \t\r") == std::string::npos) continue;
    const nlohmann::json j = olmosft::io::parse_json(text, path + " line " + std::to_string(line));
    OLMO_CHECK(j.is_object(), path, " line ", line, ": expected a JSON object {\"messages\": [...]}, got a ",
               j.type_name());
    OLMO_CHECK(j.contains("messages"), path, " line ", line, ": no \"messages\" key");
    Prompt p;
    p.line = line;
    p.id = j.value("id", nlohmann::json());
    olmosft::RawConversation raw;
    raw.messages_json = j["messages"].dump();
    std::string why;
    olmosft::Skip s = olmosft::parse_conversation(raw, p.conv, &why);
    OLMO_CHECK(s == olmosft::Skip::kNone || s == olmosft::Skip::kNoAssistant, path, " line ", line, ": ",
               why);
    if (!p.conv.messages.empty() && p.conv.messages.back().role == "assistant") {
      p.reference = p.conv.messages.back().content;
      p.conv.messages.pop_back();
    }
    OLMO_CHECK(!p.conv.messages.empty(), path, " line ", line,
               ": no message left to prompt with (only a trailing assistant message)");
    for (const char* key : {"tools", "functions"}) {
      if (j.contains(key) && !j[key].is_null()) p.conv.extra[key] = j[key];
    }
    out.push_back(std::move(p));
  }
  OLMO_CHECK(!out.empty(), path, ": no prompts (empty file)");
  return out;
}

int generate_main(int argc, char** argv) {
  CLI::App app{"Greedy completions of chat prompts (JSONL) with an HF model or a random init", "generate"};
  std::string model_dir, config_path, tokenizer, prompts_path, out_path;
  uint64_t seed = 0;
  int64_t max_new = 64, batch = 8;
  auto* m = app.add_option("--model", model_dir, "HF model directory (config.json + safetensors)");
  auto* c =
      app.add_option("--config", config_path,
                     "config.json for a random init (as the trainer's model.config with the same --seed)");
  m->excludes(c);
  app.add_option("--seed", seed, "seed of the random init (with --config; the recipe's seed)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--tokenizer", tokenizer, "tokenizer directory (HF) or builtin:bytes")->required();
  app.add_option(
         "--prompts", prompts_path,
         "JSONL, one {\"id\": ..., \"messages\": [...]} per line; a trailing assistant message is removed "
         "from the prompt and echoed as \"reference\"")
      ->required();
  app.add_option("--out", out_path, "output JSONL (one line per prompt, in order)")->required();
  app.add_option("--max-new-tokens", max_new, "stop after this many new tokens (default 64)");
  app.add_option("--batch", batch, "prompts per forward (default 8)");
  return olmosft::cli::run_app(app, argc, argv, [&] {
    using namespace olmosft;
    OLMO_CHECK(!model_dir.empty() || !config_path.empty(),
               "generate: give --model HF_DIR or --config CONFIG.json");
    OLMO_CHECK(max_new >= 1, "generate: --max-new-tokens must be >= 1, got ", max_new);
    OLMO_CHECK(batch >= 1, "generate: --batch must be >= 1, got ", batch);
    std::vector<Prompt> prompts = read_prompts(prompts_path);
    std::unique_ptr<ChatEncoder> enc = open_chat_encoder(tokenizer);
    std::vector<std::vector<int32_t>> ids;
    for (const Prompt& p : prompts) {
      try {
        ids.push_back(enc->encode_prompt(p.conv));
      } catch (const Error& e) {
        fail(prompts_path, " line ", p.line, ": ", e.what());
      }
    }
    std::unique_ptr<model::CausalLM> model = model_dir.empty()
                                                 ? model::make_model(model::load_config(config_path), seed)
                                                 : model::load_model(model_dir);
    const int64_t V = model->config().vocab_size;
    OLMO_CHECK(enc->vocab_size() <= V, "generate: tokenizer ", tokenizer, " has ", enc->vocab_size(),
               " ids but the model's vocab_size is ", V);
    train::GenerateOptions go;
    go.max_new_tokens = max_new;
    go.batch = batch;
    go.valid_vocab = enc->vocab_size();
    go.stop_ids = enc->stop_ids();
    train::GenerateStats st;
    std::vector<train::Generation> gens;
    try {
      gens = train::greedy_generate(*model, ids, go, &st);
    } catch (const Error& e) {
      fail(prompts_path, ": ", e.what(), " (prompt k = the k-th non-empty line, 0-based)");
    }
    std::string text;
    int64_t stopped = 0;
    for (size_t i = 0; i < prompts.size(); ++i) {
      const train::Generation& g = gens[i];
      std::vector<int32_t> body = g.tokens;
      if (g.stopped) body.pop_back();
      nlohmann::json j;
      j["id"] = prompts[i].id;
      j["line"] = prompts[i].line;
      j["prompt_tokens"] = ids[i].size();
      j["completion"] = sanitize_utf8(enc->decode(body));
      j["tokens"] = g.tokens;
      j["stopped"] = g.stopped;
      j["stop_token"] =
          g.stopped ? nlohmann::json(sanitize_utf8(enc->decode({g.stop_id}))) : nlohmann::json();
      j["stopped_on_eos"] = g.stopped && g.stop_id == enc->eos_id();
      if (!prompts[i].reference.is_null()) j["reference"] = prompts[i].reference;
      text += j.dump() + "\n";
      stopped += g.stopped;
    }
    io::write_file_atomic(out_path, text);
    std::string stop_names;
    for (int32_t id : go.stop_ids) stop_names += (stop_names.empty() ? "" : " ") + enc->decode({id});
    std::ostringstream msg;
    msg.precision(4);
    msg << "generate: " << prompts.size() << " prompts, " << st.generated_tokens << " new tokens, " << stopped
        << " stopped on a stop token (" << stop_names << "), " << st.forwards << " forwards in " << st.seconds
        << " s (" << (st.seconds > 0 ? double(st.generated_tokens) / st.seconds : 0.0) << " new tokens/s) -> "
        << out_path;
    std::cout << msg.str() << "\n";
    return 0;
  });
}

}  // namespace

OLMOSFT_VERB("generate", "greedy completions of chat prompts (JSONL) with an HF model or a random init",
             generate_main);
