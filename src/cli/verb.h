// Verb registry for the olmosft binary. Each src/cli/<verb>.cpp registers itself with OLMOSFT_VERB; a verb
// name may have two words ("data build"), matched before the one-word form.
#pragma once
#include <CLI/CLI.hpp>
#include <functional>
#include <string>
#include <vector>

namespace olmosft::cli {

using VerbFn = std::function<int(int argc, char** argv)>;

struct Verb {
  std::string name;
  std::string summary;
  VerbFn run;
};

std::vector<Verb>& verbs();

struct Registrar {
  Registrar(const char* name, const char* summary, VerbFn fn) {
    verbs().push_back({name, summary, std::move(fn)});
  }
};

// Parses argv with a CLI11 app that also has --threads, sets the thread count, runs body, and turns
// olmosft::Error and CLI11 parse errors into a clear message and a non-zero exit code (2).
int run_app(CLI::App& app, int argc, char** argv, const std::function<int()>& body);

// The options of a verb that writes an HF model directory (export hf, import olmo-core): --out, --dtype,
// --shard-size (model::parse_export_options reads dtype and shard). KEPT: what --dtype keep keeps.
struct HfOutOptions {
  std::string out, dtype = "keep", shard = "5GB";
  void add(CLI::App& app, const std::string& kept) {
    app.add_option("--out", out, "output HF directory (must not exist or be empty)")->required();
    app.add_option("--dtype", dtype, "tensor dtype: bf16, fp32, fp16 or keep (" + kept + ")")
        ->check(CLI::IsMember({"bf16", "fp32", "fp16", "keep"}));
    app.add_option("--shard-size", shard, "maximum safetensors shard size, e.g. 5GB, 500MB, 2GiB");
  }
};

}  // namespace olmosft::cli

#define OLMOSFT_VERB_CAT2(a, b) a##b
#define OLMOSFT_VERB_CAT(a, b) OLMOSFT_VERB_CAT2(a, b)
#define OLMOSFT_VERB(name, summary, fn) \
  static ::olmosft::cli::Registrar OLMOSFT_VERB_CAT(olmosft_verb_, __LINE__)(name, summary, fn)
