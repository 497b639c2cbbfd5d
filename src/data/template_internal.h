// Internals of the Jinja2 subset (see template.h), shared by the template*.cpp files and used by nothing
// else: the Python-like value model (template_values.cpp), the two lexers' tokens (template_lexer.cpp), the
// AST the parser builds (template_parser.cpp) and the tree-walking renderer (template_render.cpp for
// statements and expressions, template_filters.cpp for filters, tests and string methods).
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"
#include "data/template.h"

namespace olmosft::tmpl {

// Limits that turn a runaway template into an error naming its line instead of a hang or an out-of-memory
// kill: range() length (Jinja2's sandbox MAX_RANGE, which transformers' chat-template environment applies)
// and the size of a string made by one operation (repetition, concatenation); and the nesting of
// expressions, of blocks and of macro calls (the parser and the renderer recurse once per level).
inline constexpr int64_t kMaxRange = 100000;
inline constexpr int kMaxNesting = 100;
inline constexpr size_t kMaxStringBytes = size_t{1} << 26;

// ============================================================================================== values

struct Value;
using List = std::vector<Value>;
using Dict = std::vector<std::pair<std::string, Value>>;
using Args = std::vector<Value>;
using Kwargs = std::vector<std::pair<std::string, Value>>;
using Fn = std::function<Value(Args&, Kwargs&)>;

struct Value {
  enum Kind : uint8_t { Undef, None, Bool, Int, Float, Str, ListK, DictK, FnK } kind = Undef;
  bool b = false;
  int64_t i = 0;
  double f = 0;
  std::string s;  // string value; for Undef: the name, for error messages
  std::shared_ptr<List> list;
  std::shared_ptr<Dict> dict;
  std::shared_ptr<Fn> fn;
  bool is_namespace = false;

  static Value of(Kind k) {
    Value v;
    v.kind = k;
    return v;
  }
  static Value undef(std::string name = "") {
    Value v = of(Undef);
    v.s = std::move(name);
    return v;
  }
  static Value none() { return of(None); }
  static Value boolean(bool x) {
    Value v = of(Bool);
    v.b = x;
    return v;
  }
  static Value integer(int64_t x) {
    Value v = of(Int);
    v.i = x;
    return v;
  }
  static Value real(double x) {
    Value v = of(Float);
    v.f = x;
    return v;
  }
  static Value str(std::string x) {
    Value v = of(Str);
    v.s = std::move(x);
    return v;
  }
  static Value make_list(List l = {}) {
    Value v = of(ListK);
    v.list = std::make_shared<List>(std::move(l));
    return v;
  }
  static Value make_dict(Dict d = {}) {
    Value v = of(DictK);
    v.dict = std::make_shared<Dict>(std::move(d));
    return v;
  }
  static Value function(Fn f) {
    Value v = of(FnK);
    v.fn = std::make_shared<Fn>(std::move(f));
    return v;
  }
  bool is_num() const { return kind == Int || kind == Float || kind == Bool; }
  double num() const { return kind == Float ? f : kind == Int ? static_cast<double>(i) : (b ? 1.0 : 0.0); }
  const Value* get(const std::string& k) const {
    if (kind != DictK) return nullptr;
    for (auto& [key, v] : *dict)
      if (key == k) return &v;
    return nullptr;
  }
  void set(const std::string& k, Value v) {
    for (auto& [key, old] : *dict)
      if (key == k) {
        old = std::move(v);
        return;
      }
    dict->emplace_back(k, std::move(v));
  }
};

Value from_json(const nlohmann::ordered_json& j);
std::string py_float(double x);      // Python repr of a float
std::string to_str(const Value& v);  // Python str()
std::string repr(const Value& v);    // Python repr()
// HF's tojson: json.dumps(ensure_ascii=False), key order kept unless sort_keys; indent < 0 = one line.
void to_json(std::string& o, const Value& v, int indent, int depth, bool sort_keys);
bool truthy(const Value& v);
bool equal(const Value& a, const Value& b);
const char* type_name(const Value& v);
List utf8_chars(const std::string& s);  // a Python str indexes code points

// ============================================================================================== lexing

// Expression tokens (the inside of {{ }} and {% %}).
struct Tok {
  enum Kind { Name, Int, Float, Str, Op, End } kind;
  std::string text;
  int64_t i = 0;
  double f = 0;
};

std::vector<Tok> lex_expr(const std::string& src, const std::function<void(const std::string&)>& err);

// Template pieces: text, {{ output }}, {% statement %} (comments dropped, whitespace control applied).
struct TplTok {
  enum Kind { Text, Out, Stmt } kind;
  std::string text;
  int line;
};

// Splits the source into text / output / statement pieces, applying -, + and trim/lstrip_blocks.
std::vector<TplTok> lex_template(const std::string& src, const std::string& origin);

// ============================================================================================== AST

struct Expr {
  enum Kind {
    Lit,
    Var,
    Attr,
    Item,
    Slice,
    Call,
    Filter,
    Test,
    Not,
    Neg,
    Pos,
    Bin,
    Cond,
    ListE,
    DictE,
    And,
    Or
  } kind;
  Value lit;
  std::string name;  // Var / Attr name / Filter name / Test name / Bin op
  std::vector<std::unique_ptr<Expr>> kids;
  std::vector<std::pair<std::string, std::unique_ptr<Expr>>> kwargs;
  bool negate = false;  // Test: "is not"
  int depth = 1;        // levels of the tree below and including this node (bounded by kMaxNesting)
};
using ExprP = std::unique_ptr<Expr>;

struct Node {
  enum Kind { Text, Out, If, For, Set, SetBlock, Macro, Generation, Break, Continue } kind;
  int line = 0;
  std::string text;                                                            // Text
  ExprP expr;                                                                  // Out, Set value, For iterable
  std::vector<std::pair<ExprP, std::vector<std::unique_ptr<Node>>>> branches;  // If
  std::vector<std::unique_ptr<Node>> body, else_body;  // For/SetBlock/Macro/Generation; If else; For else
  std::vector<std::string> targets;                    // For targets; Set: {name} or {ns, attr}
  ExprP filter;                                        // For ... if cond
  std::vector<std::pair<std::string, ExprP>> params;   // Macro params with defaults (null = none)
};

// Parses the template pieces into body; throws olmosft::Error "ORIGIN line N: ..." on bad syntax.
void parse_template(const std::string& origin, std::vector<TplTok> toks,
                    std::vector<std::unique_ptr<Node>>& body);

// ============================================================================================== rendering

// Thrown by {% break %} / {% continue %}, caught by the enclosing loop.
struct LoopCtl {
  enum K { Break, Continue } k;
};

class Renderer {
 public:
  Renderer(const std::string& origin, RenderResult& out) : origin_(origin), out_(out) {}

  [[noreturn]] void err(const std::string& m) const { fail(origin_, " line ", line_, ": ", m); }

  std::vector<std::map<std::string, Value>> scopes;

  Value lookup(const std::string& n);
  void render(const std::vector<std::unique_ptr<Node>>& nodes);

 private:
  // template_render.cpp: statements and expressions
  void exec(const Node& n);
  void exec_for(const Node& n);
  void define_macro(const Node& n);
  std::string capture(const std::vector<std::unique_ptr<Node>>& body);
  void need_defined(const Value& v);
  Value eval(const Expr& e);
  Value slice(const Expr& e);
  Value subscript(const Value& o, const Value& k);
  Value binary(const std::string& op, const Value& a, const Value& b);
  [[noreturn]] void overflow(const std::string& op) const {
    err("integer overflow in '" + op + "' (this engine has 64-bit integers)");
  }
  Value kwarg(Kwargs& kw, const std::string& name, Args& a, size_t pos, Value def);
  Value call(const Expr& e);
  // template_filters.cpp: filters, tests, string methods
  Value str_method(const std::string& s, const std::string& m, Args& a);
  bool run_test(const std::string& n, const Value& v, Args& a);
  bool test(const Expr& e);
  List as_list(const Value& v, const std::string& f);
  Value attr_of(const Value& item, const std::string& path);
  Value filter(const Expr& e);
  std::optional<Value> filter_sequence(const std::string& f, const Value& v, Args& a, Kwargs& kw);
  std::optional<Value> filter_string(const std::string& f, const Value& v, Args& a, Kwargs& kw);
  std::optional<Value> filter_value(const std::string& f, const Value& v, Args& a, Kwargs& kw);

  std::string origin_;
  RenderResult& out_;
  int line_ = 0;
  int calls_ = 0;  // macro calls in progress (bounded by kMaxNesting)
};

}  // namespace olmosft::tmpl
