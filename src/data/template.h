// A hand-written Jinja2 subset for HF chat templates (Debian ships no C++ Jinja library). It follows the
// environment transformers uses: trim_blocks=True, lstrip_blocks=True, loop controls (break/continue),
// raise_exception(), namespace(), HF's tojson (json.dumps, ensure_ascii=False, key order kept), and the
// {% generation %} ... {% endgeneration %} block whose output ranges are reported (assistant-token masks).
// Anything outside the subset is an olmosft::Error naming the template line, never silent output.
#pragma once
#include <cstddef>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

namespace olmosft::tmpl {

struct RenderResult {
  std::string text;
  // Byte ranges [begin, end) of text produced inside {% generation %} blocks, in order.
  std::vector<std::pair<size_t, size_t>> generation_spans;
};

struct Node;

class Template {
 public:
  // Parses the template; throws olmosft::Error "ORIGIN line N: ..." on unsupported or invalid syntax.
  explicit Template(const std::string& source, std::string origin = "chat template");
  ~Template();
  Template(Template&&) noexcept;
  // Renders with the given variables (messages, add_generation_prompt, eos_token, tools, ...). Errors
  // (including raise_exception) throw olmosft::Error naming the template line.
  RenderResult render(const nlohmann::ordered_json& vars) const;
  const std::string& source() const { return source_; }

 private:
  std::string source_, origin_;
  std::vector<std::unique_ptr<Node>> body_;
};

}  // namespace olmosft::tmpl
