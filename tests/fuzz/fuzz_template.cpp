// libFuzzer entry point for the Jinja chat-template engine (src/data/template*.cpp): the input is a template
// source. It is parsed, then rendered with a fixed small conversation (system, user, assistant with a tool
// call) twice, with and without the generation prompt. Any input must either render or throw
// olmosft::Error; a crash, a sanitizer report, another exception type or a hang (-timeout) is a bug.
#include <cstdint>
#include <cstdlib>
#include <string>

#include "core/error.h"
#include "data/template.h"

namespace {
const nlohmann::ordered_json& messages() {
  static const nlohmann::ordered_json m = nlohmann::ordered_json::parse(R"json([
    {"role": "system", "content": "You are helpful."},
    {"role": "user", "content": "What is 2+2? <b>ünï</b>"},
    {"role": "assistant", "content": "4", "function_calls": "add(2, 2)",
     "tool_calls": [{"type": "function", "function": {"name": "add", "arguments": {"a": 2, "b": 2}}}]},
    {"role": "tool", "content": "{\"result\": 4}"},
    {"role": "user", "content": ""}
  ])json");
  return m;
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string source(reinterpret_cast<const char*>(data), size);
  try {
    olmosft::tmpl::Template t(source, "fuzz.jinja");
    for (bool gen : {false, true}) {
      nlohmann::ordered_json vars = {{"messages", messages()},
                                     {"add_generation_prompt", gen},
                                     {"eos_token", "<|endoftext|>"},
                                     {"bos_token", ""},
                                     {"tools", nlohmann::ordered_json::array({{{"name", "add"}}})}};
      olmosft::tmpl::RenderResult r = t.render(vars);
      for (const auto& [b, e] : r.generation_spans)
        if (b > e || e > r.text.size()) std::abort();  // spans must lie inside the text
    }
  } catch (const olmosft::Error&) {
  }
  return 0;
}
