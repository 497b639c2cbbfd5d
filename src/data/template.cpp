// Jinja2 subset (see template.h): the public Template. Structure: template lexer (text / {{ }} / {% %} /
// {# #} with whitespace control) -> expression lexer (template_lexer.cpp) -> recursive-descent parser
// following Jinja2's precedence (template_parser.cpp) -> tree-walking renderer (template_render.cpp,
// template_filters.cpp) over a small Python-like value model (none/undefined/bool/int/float/str/list/dict/
// callable; template_values.cpp). The shared types are in template_internal.h.
#include "data/template.h"

#include "core/error.h"
#include "data/template_internal.h"

namespace olmosft::tmpl {

Template::Template(const std::string& source, std::string origin)
    : source_(source), origin_(std::move(origin)) {
  // Jinja's default keep_trailing_newline=False: one trailing newline of the source is dropped.
  std::string src = source_;
  if (!src.empty() && src.back() == '\n') {
    src.pop_back();
    if (!src.empty() && src.back() == '\r') src.pop_back();
  }
  parse_template(origin_, lex_template(src, origin_), body_);
}
Template::~Template() = default;
Template::Template(Template&&) noexcept = default;

RenderResult Template::render(const nlohmann::ordered_json& vars) const {
  RenderResult res;
  Renderer r(origin_, res);
  r.scopes.emplace_back();
  if (!vars.is_object()) fail(origin_, ": template variables must be a JSON object");
  for (auto it = vars.begin(); it != vars.end(); ++it) r.scopes.back()[it.key()] = from_json(it.value());
  r.scopes.emplace_back();  // template-level `set` scope
  try {
    r.render(body_);
  } catch (const LoopCtl&) {
    fail(origin_, ": 'break'/'continue' outside a loop");
  }
  return res;
}

}  // namespace olmosft::tmpl
