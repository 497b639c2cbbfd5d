// Jinja2 subset (see template.h). Structure: template lexer (text / {{ }} / {% %} / {# #} with whitespace
// control) -> expression lexer -> recursive-descent parser following Jinja2's precedence -> tree-walking
// renderer over a small Python-like value model (none/undefined/bool/int/float/str/list/dict/callable).
#include "data/template.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <functional>
#include <map>

#include "core/error.h"

namespace olmosft::tmpl {

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

  static Value undef(std::string name = "") {
    Value v;
    v.s = std::move(name);
    return v;
  }
  static Value none() {
    Value v;
    v.kind = None;
    return v;
  }
  static Value boolean(bool x) {
    Value v;
    v.kind = Bool;
    v.b = x;
    return v;
  }
  static Value integer(int64_t x) {
    Value v;
    v.kind = Int;
    v.i = x;
    return v;
  }
  static Value real(double x) {
    Value v;
    v.kind = Float;
    v.f = x;
    return v;
  }
  static Value str(std::string x) {
    Value v;
    v.kind = Str;
    v.s = std::move(x);
    return v;
  }
  static Value make_list(List l = {}) {
    Value v;
    v.kind = ListK;
    v.list = std::make_shared<List>(std::move(l));
    return v;
  }
  static Value make_dict(Dict d = {}) {
    Value v;
    v.kind = DictK;
    v.dict = std::make_shared<Dict>(std::move(d));
    return v;
  }
  static Value function(Fn f) {
    Value v;
    v.kind = FnK;
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

Value from_json(const nlohmann::ordered_json& j) {
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null:
      return Value::none();
    case nlohmann::ordered_json::value_t::boolean:
      return Value::boolean(j.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer:
    case nlohmann::ordered_json::value_t::number_unsigned:
      return Value::integer(j.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_float:
      return Value::real(j.get<double>());
    case nlohmann::ordered_json::value_t::string:
      return Value::str(j.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      List l;
      for (auto& x : j) l.push_back(from_json(x));
      return Value::make_list(std::move(l));
    }
    case nlohmann::ordered_json::value_t::object: {
      Dict d;
      for (auto it = j.begin(); it != j.end(); ++it) d.emplace_back(it.key(), from_json(it.value()));
      return Value::make_dict(std::move(d));
    }
    default:
      fail("unsupported JSON value in template variables");
  }
}

namespace {

std::string py_float(double x) {
  if (std::isnan(x)) return "nan";
  if (std::isinf(x)) return x > 0 ? "inf" : "-inf";
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof buf, x);
  std::string s(buf, r.ptr);
  // Python repr: scientific when exponent < -4 or >= 16; to_chars picks the shortest form instead.
  int exp10 = x == 0 ? 0 : static_cast<int>(std::floor(std::log10(std::fabs(x))));
  if (exp10 < -4 || exp10 >= 16) {
    r = std::to_chars(buf, buf + sizeof buf, x, std::chars_format::scientific);
    s.assign(buf, r.ptr);
    auto e = s.find('e');
    std::string mant = s.substr(0, e), ex = s.substr(e + 1);
    char sign = ex[0] == '-' ? '-' : '+';
    if (ex[0] == '-' || ex[0] == '+') ex = ex.substr(1);
    while (ex.size() > 1 && ex[0] == '0') ex = ex.substr(1);
    if (ex.size() < 2) ex = "0" + ex;
    return mant + "e" + sign + ex;
  }
  if (s.find_first_of(".e") == std::string::npos) s += ".0";
  return s;
}

std::string py_repr_str(const std::string& s) {
  bool has_sq = s.find('\'') != std::string::npos, has_dq = s.find('"') != std::string::npos;
  char q = has_sq && !has_dq ? '"' : '\'';
  std::string out(1, q);
  for (unsigned char c : s) {
    if (c == '\\')
      out += "\\\\";
    else if (c == static_cast<unsigned char>(q))
      out += std::string("\\") + static_cast<char>(q);
    else if (c == '\n')
      out += "\\n";
    else if (c == '\r')
      out += "\\r";
    else if (c == '\t')
      out += "\\t";
    else if (c < 0x20 || c == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    } else
      out += static_cast<char>(c);
  }
  return out + q;
}

std::string repr(const Value& v);

std::string to_str(const Value& v) {  // Python str()
  switch (v.kind) {
    case Value::Undef:
      return "";
    case Value::None:
      return "None";
    case Value::Bool:
      return v.b ? "True" : "False";
    case Value::Int:
      return std::to_string(v.i);
    case Value::Float:
      return py_float(v.f);
    case Value::Str:
      return v.s;
    default:
      return repr(v);
  }
}

std::string repr(const Value& v) {
  switch (v.kind) {
    case Value::Str:
      return py_repr_str(v.s);
    case Value::ListK: {
      std::string o = "[";
      for (size_t k = 0; k < v.list->size(); ++k) o += (k ? ", " : "") + repr((*v.list)[k]);
      return o + "]";
    }
    case Value::DictK: {
      if (v.is_namespace) return "<Namespace>";
      std::string o = "{";
      for (size_t k = 0; k < v.dict->size(); ++k)
        o += (k ? ", " : "") + py_repr_str((*v.dict)[k].first) + ": " + repr((*v.dict)[k].second);
      return o + "}";
    }
    case Value::FnK:
      return "<function>";
    default:
      return to_str(v);
  }
}

void json_str(std::string& o, const std::string& s) {  // json.dumps(ensure_ascii=False)
  o += '"';
  for (unsigned char c : s) {
    switch (c) {
      case '"':
        o += "\\\"";
        break;
      case '\\':
        o += "\\\\";
        break;
      case '\n':
        o += "\\n";
        break;
      case '\r':
        o += "\\r";
        break;
      case '\t':
        o += "\\t";
        break;
      case '\b':
        o += "\\b";
        break;
      case '\f':
        o += "\\f";
        break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          o += buf;
        } else {
          o += static_cast<char>(c);
        }
    }
  }
  o += '"';
}

void to_json(std::string& o, const Value& v, int indent, int depth, bool sort_keys) {
  auto nl = [&](int d) {
    if (indent >= 0) {
      o += '\n';
      o.append(static_cast<size_t>(indent * d), ' ');
    }
  };
  const char* item_sep = indent >= 0 ? "," : ", ";
  switch (v.kind) {
    case Value::Undef:
    case Value::None:
      o += "null";
      return;
    case Value::Bool:
      o += v.b ? "true" : "false";
      return;
    case Value::Int:
      o += std::to_string(v.i);
      return;
    case Value::Float:
      o += std::isnan(v.f) ? "NaN" : std::isinf(v.f) ? (v.f > 0 ? "Infinity" : "-Infinity") : py_float(v.f);
      return;
    case Value::Str:
      json_str(o, v.s);
      return;
    case Value::ListK:
      if (v.list->empty()) {
        o += "[]";
        return;
      }
      o += '[';
      for (size_t k = 0; k < v.list->size(); ++k) {
        if (k) o += item_sep;
        nl(depth + 1);
        to_json(o, (*v.list)[k], indent, depth + 1, sort_keys);
      }
      nl(depth);
      o += ']';
      return;
    case Value::DictK: {
      if (v.dict->empty()) {
        o += "{}";
        return;
      }
      std::vector<const std::pair<std::string, Value>*> items;
      for (auto& kv : *v.dict) items.push_back(&kv);
      if (sort_keys)
        std::stable_sort(items.begin(), items.end(), [](auto* a, auto* b) { return a->first < b->first; });
      o += '{';
      for (size_t k = 0; k < items.size(); ++k) {
        if (k) o += item_sep;
        nl(depth + 1);
        json_str(o, items[k]->first);
        o += ": ";
        to_json(o, items[k]->second, indent, depth + 1, sort_keys);
      }
      nl(depth);
      o += '}';
      return;
    }
    case Value::FnK:
      fail("tojson: cannot serialize a function");
  }
}

bool truthy(const Value& v) {
  switch (v.kind) {
    case Value::Undef:
    case Value::None:
      return false;
    case Value::Bool:
      return v.b;
    case Value::Int:
      return v.i != 0;
    case Value::Float:
      return v.f != 0;
    case Value::Str:
      return !v.s.empty();
    case Value::ListK:
      return !v.list->empty();
    case Value::DictK:
      return v.is_namespace || !v.dict->empty();
    case Value::FnK:
      return true;
  }
  return false;
}

bool equal(const Value& a, const Value& b) {
  if (a.is_num() && b.is_num()) {
    if (a.kind == Value::Float || b.kind == Value::Float) return a.num() == b.num();
    return (a.kind == Value::Int ? a.i : a.b) == (b.kind == Value::Int ? b.i : b.b);
  }
  if ((a.kind == Value::None || a.kind == Value::Undef) && (b.kind == Value::None || b.kind == Value::Undef))
    return a.kind == b.kind;
  if (a.kind != b.kind) return false;
  switch (a.kind) {
    case Value::Str:
      return a.s == b.s;
    case Value::ListK:
      if (a.list->size() != b.list->size()) return false;
      for (size_t k = 0; k < a.list->size(); ++k)
        if (!equal((*a.list)[k], (*b.list)[k])) return false;
      return true;
    case Value::DictK:
      if (a.dict->size() != b.dict->size()) return false;
      for (auto& [k, v] : *a.dict) {
        const Value* o = b.get(k);
        if (!o || !equal(v, *o)) return false;
      }
      return true;
    case Value::FnK:
      return a.fn == b.fn;
    default:
      return false;
  }
}

const char* type_name(const Value& v) {
  static const char* n[] = {"undefined", "NoneType", "bool", "int",     "float",
                            "str",       "list",     "dict", "function"};
  return n[v.kind];
}

List utf8_chars(const std::string& s) {  // a Python str indexes code points
  List l;
  for (size_t k = 0; k < s.size();) {
    size_t n = 1;
    while (k + n < s.size() && (static_cast<unsigned char>(s[k + n]) & 0xC0) == 0x80) ++n;
    l.push_back(Value::str(s.substr(k, n)));
    k += n;
  }
  return l;
}

// ============================================================================================== lexing

struct Tok {
  enum Kind { Name, Int, Float, Str, Op, End } kind;
  std::string text;
  int64_t i = 0;
  double f = 0;
};

std::vector<Tok> lex_expr(const std::string& src, const std::function<void(const std::string&)>& err) {
  std::vector<Tok> out;
  size_t p = 0, n = src.size();
  while (p < n) {
    char c = src[p];
    if (c == ' ' || c == '\t' || c == '\n' || c == '\r') {
      ++p;
      continue;
    }
    if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
      size_t b = p;
      while (p < n && (std::isalnum(static_cast<unsigned char>(src[p])) || src[p] == '_')) ++p;
      out.push_back({Tok::Name, src.substr(b, p - b)});
      continue;
    }
    if (std::isdigit(static_cast<unsigned char>(c))) {
      size_t b = p;
      while (p < n && (std::isdigit(static_cast<unsigned char>(src[p])) || src[p] == '_')) ++p;
      bool is_float = false;
      if (p + 1 < n && src[p] == '.' && std::isdigit(static_cast<unsigned char>(src[p + 1]))) {
        is_float = true;
        ++p;
        while (p < n && std::isdigit(static_cast<unsigned char>(src[p]))) ++p;
      }
      if (p < n && (src[p] == 'e' || src[p] == 'E')) {
        size_t q = p + 1;
        if (q < n && (src[q] == '+' || src[q] == '-')) ++q;
        if (q < n && std::isdigit(static_cast<unsigned char>(src[q]))) {
          is_float = true;
          p = q;
          while (p < n && std::isdigit(static_cast<unsigned char>(src[p]))) ++p;
        }
      }
      std::string t = src.substr(b, p - b);
      t.erase(std::remove(t.begin(), t.end(), '_'), t.end());
      Tok tk{is_float ? Tok::Float : Tok::Int, t};
      if (is_float)
        tk.f = std::stod(t);
      else
        tk.i = std::stoll(t);
      out.push_back(tk);
      continue;
    }
    if (c == '\'' || c == '"') {
      std::string s;
      ++p;
      bool closed = false;
      while (p < n) {
        char d = src[p++];
        if (d == c) {
          closed = true;
          break;
        }
        if (d == '\\' && p < n) {
          char e = src[p++];
          switch (e) {
            case 'n':
              s += '\n';
              break;
            case 't':
              s += '\t';
              break;
            case 'r':
              s += '\r';
              break;
            case '\\':
              s += '\\';
              break;
            case '\'':
              s += '\'';
              break;
            case '"':
              s += '"';
              break;
            case '0':
              s += '\0';
              break;
            case 'x':
            case 'u':
            case 'U': {  // \xHH, \uHHHH, \UHHHHHHHH (Python string literal escapes)
              size_t len = e == 'x' ? 2 : e == 'u' ? 4 : 8;
              if (p + len > n) err("truncated \\" + std::string(1, e) + " escape");
              uint32_t cp = 0;
              for (size_t k = 0; k < len; ++k) {
                char h = src[p + k];
                int v = h >= '0' && h <= '9'   ? h - '0'
                        : h >= 'a' && h <= 'f' ? h - 'a' + 10
                        : h >= 'A' && h <= 'F' ? h - 'A' + 10
                                               : -1;
                if (v < 0) err("bad \\" + std::string(1, e) + " escape");
                cp = cp * 16 + static_cast<uint32_t>(v);
              }
              p += len;
              if (cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
                err("escape is not a Unicode scalar value");
              if (cp < 0x80) {
                s += static_cast<char>(cp);
              } else if (cp < 0x800) {
                s += static_cast<char>(0xC0 | (cp >> 6));
                s += static_cast<char>(0x80 | (cp & 0x3F));
              } else if (cp < 0x10000) {
                s += static_cast<char>(0xE0 | (cp >> 12));
                s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
                s += static_cast<char>(0x80 | (cp & 0x3F));
              } else {
                s += static_cast<char>(0xF0 | (cp >> 18));
                s += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
                s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
                s += static_cast<char>(0x80 | (cp & 0x3F));
              }
              break;
            }
            default:
              s += '\\';
              s += e;
          }
        } else {
          s += d;
        }
      }
      if (!closed) err("unterminated string literal");
      out.push_back({Tok::Str, s});
      continue;
    }
    static const char* ops[] = {"**", "//", "==", "!=", "<=", ">=", "+", "-", "*", "/", "%", "~", "<",
                                ">",  "|",  ".",  ",",  ":",  "(",  ")", "[", "]", "{", "}", "=", nullptr};
    bool found = false;
    for (int k = 0; ops[k]; ++k) {
      size_t l = std::char_traits<char>::length(ops[k]);
      if (src.compare(p, l, ops[k]) == 0) {
        out.push_back({Tok::Op, ops[k]});
        p += l;
        found = true;
        break;
      }
    }
    if (!found) err(std::string("unexpected character '") + c + "' in expression");
  }
  out.push_back({Tok::End, ""});
  return out;
}

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
};
using ExprP = std::unique_ptr<Expr>;

}  // namespace

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

namespace {

struct TplTok {
  enum Kind { Text, Out, Stmt } kind;
  std::string text;
  int line;
};

struct LoopCtl {
  enum K { Break, Continue } k;
};

class Parser {
 public:
  Parser(const std::string& origin, int line, std::vector<Tok> toks)
      : origin_(origin), line_(line), t_(std::move(toks)) {}
  [[noreturn]] void err(const std::string& m) const { fail(origin_, " line ", line_, ": ", m); }
  const Tok& peek(size_t k = 0) const { return t_[std::min(p_ + k, t_.size() - 1)]; }
  bool at_op(const char* o) const { return peek().kind == Tok::Op && peek().text == o; }
  bool at_name(const char* o, size_t k = 0) const { return peek(k).kind == Tok::Name && peek(k).text == o; }
  bool at_end() const { return peek().kind == Tok::End; }
  void expect_op(const char* o) {
    if (!at_op(o)) err(std::string("expected '") + o + "', got '" + peek().text + "'");
    ++p_;
  }
  std::string expect_name() {
    if (peek().kind != Tok::Name) err("expected a name, got '" + peek().text + "'");
    return t_[p_++].text;
  }
  void expect_end() {
    if (!at_end()) err("unexpected '" + peek().text + "' (unsupported syntax)");
  }

  ExprP expr() { return cond(); }

  ExprP cond() {
    ExprP a = or_();
    while (at_name("if")) {
      ++p_;
      ExprP c = or_();
      ExprP b;
      if (at_name("else")) {
        ++p_;
        b = cond();
      } else {
        b = mk(Expr::Lit);
        b->lit = Value::undef();
      }
      ExprP e = mk(Expr::Cond);
      e->kids.push_back(std::move(c));
      e->kids.push_back(std::move(a));
      e->kids.push_back(std::move(b));
      a = std::move(e);
    }
    return a;
  }
  ExprP or_() {
    ExprP a = and_();
    while (at_name("or")) {
      ++p_;
      a = bin(Expr::Or, "or", std::move(a), and_());
    }
    return a;
  }
  ExprP and_() {
    ExprP a = not_();
    while (at_name("and")) {
      ++p_;
      a = bin(Expr::And, "and", std::move(a), not_());
    }
    return a;
  }
  ExprP not_() {
    if (at_name("not")) {
      ++p_;
      ExprP e = mk(Expr::Not);
      e->kids.push_back(not_());
      return e;
    }
    return compare();
  }
  ExprP compare() {
    ExprP a = math1();
    while (true) {
      std::string op;
      if (peek().kind == Tok::Op &&
          (at_op("==") || at_op("!=") || at_op("<") || at_op(">") || at_op("<=") || at_op(">="))) {
        op = t_[p_++].text;
      } else if (at_name("in")) {
        ++p_;
        op = "in";
      } else if (at_name("not") && at_name("in", 1)) {
        p_ += 2;
        op = "not in";
      } else {
        break;
      }
      a = bin(Expr::Bin, op, std::move(a), math1());
    }
    return a;
  }
  ExprP math1() {
    ExprP a = concat();
    while (at_op("+") || at_op("-")) {
      std::string op = t_[p_++].text;
      a = bin(Expr::Bin, op, std::move(a), concat());
    }
    return a;
  }
  ExprP concat() {
    ExprP a = math2();
    while (at_op("~")) {
      ++p_;
      a = bin(Expr::Bin, "~", std::move(a), math2());
    }
    return a;
  }
  ExprP math2() {
    ExprP a = pow_();
    while (at_op("*") || at_op("/") || at_op("//") || at_op("%")) {
      std::string op = t_[p_++].text;
      a = bin(Expr::Bin, op, std::move(a), pow_());
    }
    return a;
  }
  ExprP pow_() {
    ExprP a = unary();
    while (at_op("**")) {
      ++p_;
      a = bin(Expr::Bin, "**", std::move(a), unary());
    }
    return a;
  }
  ExprP unary() {
    if (at_op("-") || at_op("+")) {
      bool neg = t_[p_++].text == "-";
      ExprP e = mk(neg ? Expr::Neg : Expr::Pos);
      e->kids.push_back(unary());
      return e;
    }
    ExprP a = postfix(primary());
    return filters(std::move(a));
  }
  ExprP postfix(ExprP a) {
    while (true) {
      if (at_op(".")) {
        ++p_;
        ExprP e = mk(Expr::Attr);
        if (peek().kind == Tok::Int) {
          e = mk(Expr::Item);
          ExprP idx = mk(Expr::Lit);
          idx->lit = Value::integer(t_[p_++].i);
          e->kids.push_back(std::move(a));
          e->kids.push_back(std::move(idx));
        } else {
          e->name = expect_name();
          e->kids.push_back(std::move(a));
        }
        a = std::move(e);
      } else if (at_op("[")) {
        ++p_;
        ExprP parts[3];
        bool is_slice = false;
        int k = 0;
        while (true) {
          if (at_op(":")) {
            is_slice = true;
            ++p_;
            if (++k > 2) err("bad slice");
            continue;
          }
          if (at_op("]")) break;
          if (parts[k]) err("bad subscript");
          parts[k] = expr();
        }
        expect_op("]");
        ExprP e = mk(is_slice ? Expr::Slice : Expr::Item);
        e->kids.push_back(std::move(a));
        if (is_slice) {
          for (auto& p : parts) e->kids.push_back(std::move(p));  // may be null
        } else {
          if (!parts[0]) err("empty subscript");
          e->kids.push_back(std::move(parts[0]));
        }
        a = std::move(e);
      } else if (at_op("(")) {
        ExprP e = mk(Expr::Call);
        e->kids.push_back(std::move(a));
        args(*e);
        a = std::move(e);
      } else {
        return a;
      }
    }
  }
  void args(Expr& e) {
    expect_op("(");
    while (!at_op(")")) {
      if (peek().kind == Tok::Name && peek(1).kind == Tok::Op && peek(1).text == "=") {
        std::string k = expect_name();
        ++p_;
        e.kwargs.emplace_back(k, expr());
      } else {
        if (!e.kwargs.empty()) err("positional argument after keyword argument");
        e.kids.push_back(expr());
      }
      if (!at_op(")")) expect_op(",");
    }
    expect_op(")");
  }
  ExprP filters(ExprP a) {
    while (true) {
      if (at_op("|")) {
        ++p_;
        ExprP e = mk(Expr::Filter);
        e->name = expect_name();
        e->kids.push_back(std::move(a));
        if (at_op("(")) args(*e);
        a = std::move(e);
      } else if (at_name("is")) {
        ++p_;
        ExprP e = mk(Expr::Test);
        if (at_name("not")) {
          ++p_;
          e->negate = true;
        }
        e->name = expect_name();
        e->kids.push_back(std::move(a));
        if (at_op("(")) {
          args(*e);
        } else if (peek().kind == Tok::Str || peek().kind == Tok::Int || peek().kind == Tok::Float ||
                   (peek().kind == Tok::Name && !at_name("and") && !at_name("or") && !at_name("else") &&
                    !at_name("if") && !at_name("in") && !at_name("not") && !at_name("is"))) {
          e->kids.push_back(postfix(primary()));  // `is equalto 'x'`, `is divisibleby 3`
        }
        a = std::move(e);
      } else {
        return a;
      }
    }
  }
  ExprP primary() {
    const Tok& t = peek();
    if (t.kind == Tok::Str) {
      std::string s;
      while (peek().kind == Tok::Str) s += t_[p_++].text;  // adjacent literals concatenate
      ExprP e = mk(Expr::Lit);
      e->lit = Value::str(s);
      return e;
    }
    if (t.kind == Tok::Int || t.kind == Tok::Float) {
      ExprP e = mk(Expr::Lit);
      e->lit = t.kind == Tok::Int ? Value::integer(t.i) : Value::real(t.f);
      ++p_;
      return e;
    }
    if (t.kind == Tok::Name) {
      std::string n = t_[p_++].text;
      ExprP e = mk(Expr::Lit);
      if (n == "true" || n == "True")
        e->lit = Value::boolean(true);
      else if (n == "false" || n == "False")
        e->lit = Value::boolean(false);
      else if (n == "none" || n == "None")
        e->lit = Value::none();
      else {
        e = mk(Expr::Var);
        e->name = n;
      }
      return e;
    }
    if (at_op("(")) {
      ++p_;
      ExprP a = expr();
      if (at_op(",")) {  // tuple -> list
        ExprP l = mk(Expr::ListE);
        l->kids.push_back(std::move(a));
        while (at_op(",")) {
          ++p_;
          if (at_op(")")) break;
          l->kids.push_back(expr());
        }
        a = std::move(l);
      }
      expect_op(")");
      return a;
    }
    if (at_op("[")) {
      ++p_;
      ExprP l = mk(Expr::ListE);
      while (!at_op("]")) {
        l->kids.push_back(expr());
        if (!at_op("]")) expect_op(",");
      }
      expect_op("]");
      return l;
    }
    if (at_op("{")) {
      ++p_;
      ExprP d = mk(Expr::DictE);
      while (!at_op("}")) {
        d->kids.push_back(expr());
        expect_op(":");
        d->kids.push_back(expr());
        if (!at_op("}")) expect_op(",");
      }
      expect_op("}");
      return d;
    }
    err("unexpected '" + t.text + "' in expression (unsupported syntax)");
  }

  size_t pos() const { return p_; }
  void set_pos(size_t p) { p_ = p; }

 private:
  ExprP mk(Expr::Kind k) {
    auto e = std::make_unique<Expr>();
    e->kind = k;
    return e;
  }
  ExprP bin(Expr::Kind k, const std::string& op, ExprP a, ExprP b) {
    ExprP e = mk(k);
    e->name = op;
    e->kids.push_back(std::move(a));
    e->kids.push_back(std::move(b));
    return e;
  }
  std::string origin_;
  int line_;
  std::vector<Tok> t_;
  size_t p_ = 0;
};

// Splits the source into text / output / statement pieces, applying -, + and trim/lstrip_blocks.
std::vector<TplTok> lex_template(const std::string& src, const std::string& origin) {
  std::vector<TplTok> out;
  size_t p = 0, n = src.size();
  int line = 1;
  auto line_at = [&](size_t upto) {
    return line + static_cast<int>(std::count(src.begin() + static_cast<ptrdiff_t>(p),
                                              src.begin() + static_cast<ptrdiff_t>(upto), '\n'));
  };
  bool strip_next_ws = false, trim_next_nl = false;
  while (p <= n) {
    size_t open = std::string::npos;
    for (size_t q = src.find('{', p); q != std::string::npos && q + 1 < n; q = src.find('{', q + 1)) {
      char c = src[q + 1];
      if (c == '{' || c == '%' || c == '#') {
        open = q;
        break;
      }
    }
    size_t text_end = open == std::string::npos ? n : open;
    std::string text = src.substr(p, text_end - p);
    size_t text_start = p;
    if (strip_next_ws) {
      size_t k = text.find_first_not_of(" \t\n\r\f\v");
      text = k == std::string::npos ? "" : text.substr(k);
      text_start = text_end - text.size();
    } else if (trim_next_nl && !text.empty() && text[0] == '\n') {
      text = text.substr(1);
      text_start += 1;
    } else if (trim_next_nl && text.size() >= 2 && text[0] == '\r' && text[1] == '\n') {
      text = text.substr(2);
      text_start += 2;
    }
    strip_next_ws = trim_next_nl = false;
    if (open == std::string::npos) {
      if (!text.empty()) out.push_back({TplTok::Text, text, line});
      break;
    }
    char kind = src[open + 1];
    const char* close = kind == '{' ? "}}" : kind == '%' ? "%}" : "#}";
    int tag_line = line_at(open);
    size_t inner = open + 2;
    char lmod = inner < n ? src[inner] : 0;
    if (lmod == '-' || lmod == '+') ++inner;
    size_t cl = src.find(close, inner);
    if (cl == std::string::npos) fail(origin, " line ", tag_line, ": unclosed '", src.substr(open, 2), "'");
    size_t inner_end = cl;
    char rmod = inner_end > inner ? src[inner_end - 1] : 0;
    if (rmod == '-' || rmod == '+')
      --inner_end;
    else
      rmod = 0;
    bool block = kind != '{';
    // left side
    if (lmod == '-') {
      size_t k = text.find_last_not_of(" \t\n\r\f\v");
      text = k == std::string::npos ? "" : text.substr(0, k + 1);
    } else if (block && lmod != '+') {  // lstrip_blocks
      size_t nl = text.rfind('\n');
      size_t from = nl == std::string::npos ? 0 : nl + 1;
      bool line_start =
          nl != std::string::npos || text_start == 0 || (text_start > 0 && src[text_start - 1] == '\n');
      if (line_start && text.find_first_not_of(" \t\r\f\v", from) == std::string::npos) text.resize(from);
    }
    if (!text.empty()) out.push_back({TplTok::Text, text, line});
    std::string body = src.substr(inner, inner_end - inner);
    if (kind == '{')
      out.push_back({TplTok::Out, body, tag_line});
    else if (kind == '%')
      out.push_back({TplTok::Stmt, body, tag_line});
    // right side
    if (rmod == '-')
      strip_next_ws = true;
    else if (block && rmod != '+')
      trim_next_nl = true;
    line = line_at(cl + 2);
    p = cl + 2;
  }
  return out;
}

}  // namespace

// ============================================================================================== statements

namespace {

class TemplateParser {
 public:
  TemplateParser(const std::string& origin, std::vector<TplTok> toks)
      : origin_(origin), toks_(std::move(toks)) {}

  // Parses nodes until one of the end keywords; returns the keyword found ("" at end of input).
  std::string parse_body(std::vector<std::unique_ptr<Node>>& out, const std::vector<std::string>& ends,
                         Parser** end_parser_out = nullptr) {
    while (i_ < toks_.size()) {
      const TplTok& t = toks_[i_++];
      if (t.kind == TplTok::Text) {
        auto nd = node(Node::Text, t.line);
        nd->text = t.text;
        out.push_back(std::move(nd));
        continue;
      }
      auto err = [&](const std::string& m) { fail(origin_, " line ", t.line, ": ", m); };
      cur_ = std::make_unique<Parser>(origin_, t.line, lex_expr(t.text, err));
      Parser& P = *cur_;
      if (t.kind == TplTok::Out) {
        auto nd = node(Node::Out, t.line);
        nd->expr = P.expr();
        P.expect_end();
        out.push_back(std::move(nd));
        continue;
      }
      std::string kw = P.expect_name();
      if (std::find(ends.begin(), ends.end(), kw) != ends.end()) {
        if (end_parser_out)
          *end_parser_out = cur_.get();
        else
          P.expect_end();
        last_end_ = std::move(cur_);
        return kw;
      }
      if (kw == "if") {
        auto nd = node(Node::If, t.line);
        ExprP c = P.expr();
        P.expect_end();
        while (true) {
          std::vector<std::unique_ptr<Node>> body;
          Parser* ep = nullptr;
          std::string e = parse_body(body, {"elif", "else", "endif"}, &ep);
          if (e.empty()) err("'if' without 'endif'");
          nd->branches.emplace_back(std::move(c), std::move(body));
          if (e == "elif") {
            c = ep->expr();
            ep->expect_end();
            continue;
          }
          ep->expect_end();
          if (e == "else") {
            std::string e2 = parse_body(nd->else_body, {"endif"});
            if (e2.empty()) err("'if' without 'endif'");
          }
          break;
        }
        out.push_back(std::move(nd));
      } else if (kw == "for") {
        auto nd = node(Node::For, t.line);
        nd->targets.push_back(P.expect_name());
        while (P.at_op(",")) {
          P.expect_op(",");
          nd->targets.push_back(P.expect_name());
        }
        if (!P.at_name("in")) P.err("expected 'in' in for loop");
        P.expect_name();
        nd->expr = P.or_();  // not a conditional expression: `if` here filters
        if (P.at_name("if")) {
          P.expect_name();
          nd->filter = P.or_();
        }
        if (P.at_name("recursive")) P.err("recursive loops are not supported");
        P.expect_end();
        Parser* ep = nullptr;
        std::string e = parse_body(nd->body, {"else", "endfor"}, &ep);
        if (e.empty()) err("'for' without 'endfor'");
        ep->expect_end();
        if (e == "else" && parse_body(nd->else_body, {"endfor"}).empty()) err("'for' without 'endfor'");
        out.push_back(std::move(nd));
      } else if (kw == "set") {
        std::string name = P.expect_name();
        std::vector<std::string> targets{name};
        if (P.at_op(".")) {
          P.expect_op(".");
          targets.push_back(P.expect_name());
        }
        if (P.at_op(",")) P.err("tuple unpacking in 'set' is not supported");
        if (P.at_op("=")) {
          P.expect_op("=");
          auto nd = node(Node::Set, t.line);
          nd->targets = targets;
          nd->expr = P.expr();
          P.expect_end();
          out.push_back(std::move(nd));
        } else {
          P.expect_end();
          if (targets.size() != 1) P.err("block 'set' needs a plain name");
          auto nd = node(Node::SetBlock, t.line);
          nd->targets = targets;
          if (parse_body(nd->body, {"endset"}).empty()) err("'set' without 'endset'");
          out.push_back(std::move(nd));
        }
      } else if (kw == "macro") {
        auto nd = node(Node::Macro, t.line);
        nd->targets.push_back(P.expect_name());
        P.expect_op("(");
        while (!P.at_op(")")) {
          std::string pn = P.expect_name();
          ExprP def;
          if (P.at_op("=")) {
            P.expect_op("=");
            def = P.expr();
          }
          nd->params.emplace_back(pn, std::move(def));
          if (!P.at_op(")")) P.expect_op(",");
        }
        P.expect_op(")");
        P.expect_end();
        if (parse_body(nd->body, {"endmacro"}).empty()) err("'macro' without 'endmacro'");
        out.push_back(std::move(nd));
      } else if (kw == "generation") {
        P.expect_end();
        auto nd = node(Node::Generation, t.line);
        if (parse_body(nd->body, {"endgeneration"}).empty()) err("'generation' without 'endgeneration'");
        out.push_back(std::move(nd));
      } else if (kw == "break" || kw == "continue") {
        P.expect_end();
        out.push_back(node(kw == "break" ? Node::Break : Node::Continue, t.line));
      } else {
        err("unsupported or unexpected tag '{% " + kw + " %}'");
      }
    }
    return "";
  }

 private:
  std::unique_ptr<Node> node(Node::Kind k, int line) {
    auto n = std::make_unique<Node>();
    n->kind = k;
    n->line = line;
    return n;
  }
  std::string origin_;
  std::vector<TplTok> toks_;
  size_t i_ = 0;
  std::unique_ptr<Parser> cur_, last_end_;
};

}  // namespace

Template::Template(const std::string& source, std::string origin)
    : source_(source), origin_(std::move(origin)) {
  // Jinja's default keep_trailing_newline=False: one trailing newline of the source is dropped.
  std::string src = source_;
  if (!src.empty() && src.back() == '\n') {
    src.pop_back();
    if (!src.empty() && src.back() == '\r') src.pop_back();
  }
  TemplateParser tp(origin_, lex_template(src, origin_));
  std::string e = tp.parse_body(body_, {});
  (void)e;
}
Template::~Template() = default;
Template::Template(Template&&) noexcept = default;

// ============================================================================================== rendering

namespace {

class Renderer {
 public:
  Renderer(const std::string& origin, RenderResult& out) : origin_(origin), out_(out) {}

  [[noreturn]] void err(const std::string& m) const { fail(origin_, " line ", line_, ": ", m); }

  std::vector<std::map<std::string, Value>> scopes;

  Value lookup(const std::string& n) {
    for (auto it = scopes.rbegin(); it != scopes.rend(); ++it) {
      auto f = it->find(n);
      if (f != it->end()) return f->second;
    }
    return Value::undef(n);
  }

  void render(const std::vector<std::unique_ptr<Node>>& nodes) {
    for (auto& n : nodes) exec(*n);
  }

  void exec(const Node& n) {
    line_ = n.line;
    switch (n.kind) {
      case Node::Text:
        out_.text += n.text;
        return;
      case Node::Out: {
        out_.text += to_str(eval(*n.expr));
        return;
      }
      case Node::If:
        for (auto& [c, body] : n.branches) {
          line_ = n.line;
          if (truthy(eval(*c))) {
            render(body);
            return;
          }
        }
        render(n.else_body);
        return;
      case Node::For: {
        Value it = eval(*n.expr);
        List items;
        if (it.kind == Value::ListK)
          items = *it.list;
        else if (it.kind == Value::DictK) {
          for (auto& kv : *it.dict) items.push_back(Value::str(kv.first));
        } else if (it.kind == Value::Str) {
          // iterate characters (UTF-8 code points)
          for (size_t k = 0; k < it.s.size();) {
            size_t l = 1;
            while (k + l < it.s.size() && (static_cast<unsigned char>(it.s[k + l]) & 0xC0) == 0x80) ++l;
            items.push_back(Value::str(it.s.substr(k, l)));
            k += l;
          }
        } else if (it.kind != Value::Undef) {  // iterating an undefined value yields nothing (Jinja)
          err(std::string("'") + type_name(it) + "' object is not iterable");
        }
        auto bind = [&](std::map<std::string, Value>& scope, const Value& item) {
          if (n.targets.size() == 1) {
            scope[n.targets[0]] = item;
          } else {
            if (item.kind != Value::ListK || item.list->size() != n.targets.size())
              err("cannot unpack loop item into " + std::to_string(n.targets.size()) + " names");
            for (size_t k = 0; k < n.targets.size(); ++k) scope[n.targets[k]] = (*item.list)[k];
          }
        };
        if (n.filter) {
          List kept;
          for (auto& item : items) {
            scopes.emplace_back();
            bind(scopes.back(), item);
            bool keep = truthy(eval(*n.filter));
            scopes.pop_back();
            if (keep) kept.push_back(item);
          }
          items = std::move(kept);
        }
        if (items.empty()) {
          render(n.else_body);
          return;
        }
        int64_t len = static_cast<int64_t>(items.size());
        for (int64_t k = 0; k < len; ++k) {
          scopes.emplace_back();
          auto& sc = scopes.back();
          bind(sc, items[k]);
          Value loop =
              Value::make_dict({{"index", Value::integer(k + 1)},
                                {"index0", Value::integer(k)},
                                {"revindex", Value::integer(len - k)},
                                {"revindex0", Value::integer(len - k - 1)},
                                {"first", Value::boolean(k == 0)},
                                {"last", Value::boolean(k == len - 1)},
                                {"length", Value::integer(len)},
                                {"previtem", k > 0 ? items[k - 1] : Value::undef("previtem")},
                                {"nextitem", k + 1 < len ? items[k + 1] : Value::undef("nextitem")}});
          sc["loop"] = loop;
          bool brk = false;
          try {
            render(n.body);
          } catch (const LoopCtl& c) {
            brk = c.k == LoopCtl::Break;
          }
          scopes.pop_back();
          if (brk) break;
        }
        return;
      }
      case Node::Set: {
        Value v = eval(*n.expr);
        if (n.targets.size() == 1) {
          scopes.back()[n.targets[0]] = v;
        } else {
          Value ns = lookup(n.targets[0]);
          if (ns.kind != Value::DictK || !ns.is_namespace)
            err("cannot assign attribute '" + n.targets[1] + "' on '" + n.targets[0] + "' (not a namespace)");
          ns.set(n.targets[1], v);
        }
        return;
      }
      case Node::SetBlock: {
        std::string saved;
        saved.swap(out_.text);
        size_t spans = out_.generation_spans.size();
        render(n.body);
        out_.generation_spans.resize(spans);
        std::string captured;
        captured.swap(out_.text);
        out_.text.swap(saved);
        scopes.back()[n.targets[0]] = Value::str(captured);
        return;
      }
      case Node::Macro: {
        const Node* mn = &n;
        scopes.back()[n.targets[0]] = Value::function([this, mn](Args& a, Kwargs& kw) {
          if (a.size() > mn->params.size()) err("too many arguments to macro '" + mn->targets[0] + "'");
          std::map<std::string, Value> sc;
          for (size_t k = 0; k < mn->params.size(); ++k) {
            const auto& [pn, def] = mn->params[k];
            if (k < a.size())
              sc[pn] = a[k];
            else
              sc[pn] = def ? eval(*def) : Value::undef(pn);
          }
          for (auto& [k, v] : kw) {
            bool ok = false;
            for (auto& p : mn->params) ok |= p.first == k;
            if (!ok) err("macro '" + mn->targets[0] + "' has no parameter '" + k + "'");
            sc[k] = v;
          }
          std::string saved;
          saved.swap(out_.text);
          size_t spans = out_.generation_spans.size();
          int saved_line = line_;
          scopes.push_back(std::move(sc));
          render(mn->body);
          scopes.pop_back();
          line_ = saved_line;
          out_.generation_spans.resize(spans);
          std::string r;
          r.swap(out_.text);
          out_.text.swap(saved);
          return Value::str(r);
        });
        return;
      }
      case Node::Generation: {
        size_t b = out_.text.size();
        render(n.body);
        out_.generation_spans.emplace_back(b, out_.text.size());
        return;
      }
      case Node::Break:
        throw LoopCtl{LoopCtl::Break};
      case Node::Continue:
        throw LoopCtl{LoopCtl::Continue};
    }
  }

  void need_defined(const Value& v) {
    if (v.kind == Value::Undef) err(v.s.empty() ? "undefined value used" : "'" + v.s + "' is undefined");
  }

  Value eval(const Expr& e) {
    switch (e.kind) {
      case Expr::Lit:
        return e.lit;
      case Expr::Var:
        return lookup(e.name);
      case Expr::Attr: {
        Value o = eval(*e.kids[0]);
        need_defined(o);
        if (const Value* v = o.get(e.name)) return *v;
        return Value::undef(e.name);
      }
      case Expr::Item: {
        Value o = eval(*e.kids[0]);
        Value k = eval(*e.kids[1]);
        need_defined(o);
        return subscript(o, k);
      }
      case Expr::Slice: {
        Value o = eval(*e.kids[0]);
        need_defined(o);
        auto opt = [&](int k, int64_t d) {
          if (!e.kids[k]) return d;
          Value v = eval(*e.kids[k]);
          if (v.kind == Value::None) return d;
          if (v.kind != Value::Int) err("slice indices must be integers");
          return v.i;
        };
        int64_t step = opt(3, 1);
        if (step == 0) err("slice step cannot be zero");
        List src;
        bool is_str = o.kind == Value::Str;
        if (is_str) {
          src = utf8_chars(o.s);
        } else if (o.kind == Value::ListK) {
          src = *o.list;
        } else {
          err(std::string("cannot slice '") + type_name(o) + "'");
        }
        int64_t n = static_cast<int64_t>(src.size());
        auto norm = [&](int64_t x, bool lo) {
          if (x < 0) x += n;
          if (step > 0) return std::clamp<int64_t>(x, 0, n);
          return std::clamp<int64_t>(x, -1, n - 1) + (lo ? 0 : 0);
        };
        int64_t start = e.kids[1] ? norm(opt(1, 0), true) : (step > 0 ? 0 : n - 1);
        int64_t stop = e.kids[2] ? norm(opt(2, 0), false) : (step > 0 ? n : -1);
        List res;
        if (step > 0)
          for (int64_t k = start; k < stop; k += step) res.push_back(src[k]);
        else
          for (int64_t k = start; k > stop; k += step) res.push_back(src[k]);
        if (is_str) {
          std::string s;
          for (auto& v : res) s += v.s;
          return Value::str(s);
        }
        return Value::make_list(std::move(res));
      }
      case Expr::Call:
        return call(e);
      case Expr::Filter:
        return filter(e);
      case Expr::Test: {
        bool r = test(e);
        return Value::boolean(e.negate ? !r : r);
      }
      case Expr::Not:
        return Value::boolean(!truthy(eval(*e.kids[0])));
      case Expr::Neg:
      case Expr::Pos: {
        Value v = eval(*e.kids[0]);
        if (!v.is_num()) err(std::string("bad operand type for unary ") + (e.kind == Expr::Neg ? "-" : "+"));
        if (e.kind == Expr::Pos) return v;
        return v.kind == Value::Float ? Value::real(-v.f)
                                      : Value::integer(-(v.kind == Value::Int ? v.i : v.b));
      }
      case Expr::And: {
        Value a = eval(*e.kids[0]);
        return truthy(a) ? eval(*e.kids[1]) : a;
      }
      case Expr::Or: {
        Value a = eval(*e.kids[0]);
        return truthy(a) ? a : eval(*e.kids[1]);
      }
      case Expr::Cond:
        return truthy(eval(*e.kids[0])) ? eval(*e.kids[1]) : eval(*e.kids[2]);
      case Expr::ListE: {
        List l;
        for (auto& k : e.kids) l.push_back(eval(*k));
        return Value::make_list(std::move(l));
      }
      case Expr::DictE: {
        Value d = Value::make_dict();
        for (size_t k = 0; k + 1 < e.kids.size(); k += 2) {
          Value key = eval(*e.kids[k]);
          if (key.kind != Value::Str) err("only string dict keys are supported");
          d.set(key.s, eval(*e.kids[k + 1]));
        }
        return d;
      }
      case Expr::Bin:
        return binary(e.name, eval(*e.kids[0]), eval(*e.kids[1]));
    }
    err("internal: bad expression");
  }

  Value subscript(const Value& o, const Value& k) {
    if (o.kind == Value::DictK) {
      if (k.kind != Value::Str) return Value::undef();
      const Value* v = o.get(k.s);
      return v ? *v : Value::undef(k.s);
    }
    if (o.kind == Value::ListK || o.kind == Value::Str) {
      if (k.kind != Value::Int) return Value::undef();
      List chars;
      if (o.kind == Value::Str) chars = utf8_chars(o.s);
      const List& l = o.kind == Value::ListK ? *o.list : chars;
      int64_t n = static_cast<int64_t>(l.size());
      int64_t i = k.i < 0 ? k.i + n : k.i;
      if (i < 0 || i >= n) return Value::undef();
      return l[i];
    }
    return Value::undef();
  }

  Value binary(const std::string& op, const Value& a, const Value& b) {
    if (op == "~") return Value::str(to_str(a) + to_str(b));
    if (op == "==") return Value::boolean(equal(a, b));
    if (op == "!=") return Value::boolean(!equal(a, b));
    if (op == "in" || op == "not in") {
      bool r = false;
      if (b.kind == Value::Str) {
        if (a.kind != Value::Str) err("'in <string>' requires string as left operand");
        r = b.s.find(a.s) != std::string::npos;
      } else if (b.kind == Value::ListK) {
        for (auto& x : *b.list) r |= equal(a, x);
      } else if (b.kind == Value::DictK) {
        r = a.kind == Value::Str && b.get(a.s) != nullptr;
      } else if (b.kind == Value::Undef) {
        need_defined(b);
      } else {
        err(std::string("argument of type '") + type_name(b) + "' is not iterable");
      }
      return Value::boolean(op == "in" ? r : !r);
    }
    need_defined(a);
    need_defined(b);
    if (op == "<" || op == ">" || op == "<=" || op == ">=") {
      int c;
      if (a.is_num() && b.is_num())
        c = a.num() < b.num() ? -1 : a.num() > b.num() ? 1 : 0;
      else if (a.kind == Value::Str && b.kind == Value::Str)
        c = a.s.compare(b.s);
      else
        err(std::string("'") + op + "' not supported between '" + type_name(a) + "' and '" + type_name(b) +
            "'");
      bool r = op == "<" ? c < 0 : op == ">" ? c > 0 : op == "<=" ? c <= 0 : c >= 0;
      return Value::boolean(r);
    }
    if (op == "+") {
      if (a.kind == Value::Str && b.kind == Value::Str) return Value::str(a.s + b.s);
      if (a.kind == Value::ListK && b.kind == Value::ListK) {
        List l = *a.list;
        l.insert(l.end(), b.list->begin(), b.list->end());
        return Value::make_list(std::move(l));
      }
    }
    if (op == "*" &&
        ((a.kind == Value::Str && b.kind == Value::Int) || (a.kind == Value::Int && b.kind == Value::Str))) {
      const Value& s = a.kind == Value::Str ? a : b;
      int64_t n = a.kind == Value::Int ? a.i : b.i;
      std::string r;
      for (int64_t k = 0; k < n; ++k) r += s.s;
      return Value::str(r);
    }
    if (op == "%" && a.kind == Value::Str) err("printf-style '%' string formatting is not supported");
    if (!a.is_num() || !b.is_num())
      err(std::string("unsupported operand types for ") + op + ": '" + type_name(a) + "' and '" +
          type_name(b) + "'");
    bool fl = a.kind == Value::Float || b.kind == Value::Float;
    auto iv = [](const Value& v) { return v.kind == Value::Int ? v.i : static_cast<int64_t>(v.b); };
    if (op == "/") {
      if (b.num() == 0) err("division by zero");
      return Value::real(a.num() / b.num());
    }
    if (op == "//" || op == "%") {
      if (b.num() == 0) err("division by zero");
      if (fl) {
        double q = std::floor(a.num() / b.num());
        return op == "//" ? Value::real(q) : Value::real(a.num() - q * b.num());
      }
      int64_t x = iv(a), y = iv(b), q = x / y;
      if ((x % y != 0) && ((x < 0) != (y < 0))) --q;
      return op == "//" ? Value::integer(q) : Value::integer(x - q * y);
    }
    if (op == "**") {
      if (!fl && iv(b) >= 0) {
        int64_t r = 1;
        for (int64_t k = 0; k < iv(b); ++k) r *= iv(a);
        return Value::integer(r);
      }
      return Value::real(std::pow(a.num(), b.num()));
    }
    if (fl) {
      double x = a.num(), y = b.num();
      return Value::real(op == "+" ? x + y : op == "-" ? x - y : x * y);
    }
    int64_t x = iv(a), y = iv(b);
    return Value::integer(op == "+" ? x + y : op == "-" ? x - y : x * y);
  }

  Value kwarg(Kwargs& kw, const std::string& name, Args& a, size_t pos, Value def) {
    for (auto& [k, v] : kw)
      if (k == name) return v;
    return pos < a.size() ? a[pos] : def;
  }

  Value call(const Expr& e) {
    Args a;
    Kwargs kw;
    for (size_t k = 1; k < e.kids.size(); ++k) a.push_back(eval(*e.kids[k]));
    for (auto& [k, v] : e.kwargs) kw.emplace_back(k, eval(*v));
    const Expr& callee = *e.kids[0];
    if (callee.kind == Expr::Attr) {
      Value o = eval(*callee.kids[0]);
      need_defined(o);
      const std::string& m = callee.name;
      if (o.kind == Value::DictK && !o.is_namespace) {
        if (m == "get") {
          if (a.empty() || a[0].kind != Value::Str) err("dict.get needs a string key");
          const Value* v = o.get(a[0].s);
          return v ? *v : (a.size() > 1 ? a[1] : Value::none());
        }
        if (m == "items" || m == "keys" || m == "values") {
          List l;
          for (auto& [k, v] : *o.dict) {
            if (m == "items")
              l.push_back(Value::make_list({Value::str(k), v}));
            else if (m == "keys")
              l.push_back(Value::str(k));
            else
              l.push_back(v);
          }
          return Value::make_list(std::move(l));
        }
      }
      if (o.kind == Value::Str) return str_method(o.s, m, a);
      if (o.kind == Value::ListK && (m == "append" || m == "pop" || m == "extend" || m == "insert"))
        err("access to attribute '" + m +
            "' of 'list' object is unsafe (HF renders in an immutable sandbox)");
      Value f = o.get(m) ? *o.get(m) : Value::undef(m);
      if (f.kind != Value::FnK) err(std::string("'") + type_name(o) + "' object has no method '" + m + "'");
      return (*f.fn)(a, kw);
    }
    if (callee.kind == Expr::Var) {
      const std::string& n = callee.name;
      Value f = lookup(n);
      if (f.kind == Value::FnK) return (*f.fn)(a, kw);
      if (n == "raise_exception") err("raise_exception: " + (a.empty() ? std::string() : to_str(a[0])));
      if (n == "namespace" || n == "dict") {
        Value d = Value::make_dict();
        d.is_namespace = n == "namespace";
        for (auto& [k, v] : kw) d.set(k, v);
        return d;
      }
      if (n == "range") {
        int64_t lo = 0, hi = 0, st = 1;
        for (auto& x : a)
          if (x.kind != Value::Int) err("range() needs integers");
        if (a.size() == 1)
          hi = a[0].i;
        else if (a.size() >= 2) {
          lo = a[0].i;
          hi = a[1].i;
          if (a.size() > 2) st = a[2].i;
        } else
          err("range() needs arguments");
        if (st == 0) err("range() step is zero");
        List l;
        for (int64_t k = lo; st > 0 ? k < hi : k > hi; k += st) l.push_back(Value::integer(k));
        return Value::make_list(std::move(l));
      }
      err("unknown function '" + n + "' (unsupported)");
    }
    Value f = eval(callee);
    if (f.kind != Value::FnK) err("value is not callable");
    return (*f.fn)(a, kw);
  }

  Value str_method(const std::string& s, const std::string& m, Args& a) {
    auto arg_str = [&](size_t k, const char* what) {
      if (k >= a.size() || a[k].kind != Value::Str) err(std::string("str.") + m + " needs a string " + what);
      return a[k].s;
    };
    const char* ws = " \t\n\r\f\v";
    if (m == "strip" || m == "lstrip" || m == "rstrip") {
      std::string chars = a.empty() || a[0].kind == Value::None ? ws : arg_str(0, "argument");
      size_t b = m == "rstrip" ? 0 : s.find_first_not_of(chars);
      if (b == std::string::npos) return Value::str("");
      size_t e = m == "lstrip" ? s.size() : s.find_last_not_of(chars) + 1;
      return Value::str(s.substr(b, e - b));
    }
    if (m == "upper" || m == "lower") {
      std::string r = s;
      for (auto& c : r)
        c = static_cast<char>(m == "upper" ? std::toupper(static_cast<unsigned char>(c))
                                           : std::tolower(static_cast<unsigned char>(c)));
      return Value::str(r);
    }
    if (m == "startswith" || m == "endswith") {
      std::string x = arg_str(0, "prefix");
      bool r = m == "startswith" ? s.compare(0, x.size(), x) == 0
                                 : s.size() >= x.size() && s.compare(s.size() - x.size(), x.size(), x) == 0;
      return Value::boolean(r);
    }
    if (m == "replace") {
      std::string from = arg_str(0, "old"), to = arg_str(1, "new"), r;
      if (from.empty()) err("str.replace with an empty pattern is not supported");
      size_t p = 0, q;
      while ((q = s.find(from, p)) != std::string::npos) {
        r += s.substr(p, q - p) + to;
        p = q + from.size();
      }
      return Value::str(r + s.substr(p));
    }
    if (m == "split") {
      List l;
      if (a.empty() || a[0].kind == Value::None) {
        size_t p = 0;
        while (true) {
          p = s.find_first_not_of(ws, p);
          if (p == std::string::npos) break;
          size_t q = s.find_first_of(ws, p);
          l.push_back(Value::str(s.substr(p, q == std::string::npos ? std::string::npos : q - p)));
          if (q == std::string::npos) break;
          p = q;
        }
      } else {
        std::string sep = arg_str(0, "separator");
        if (sep.empty()) err("empty separator");
        int64_t maxs = a.size() > 1 && a[1].kind == Value::Int ? a[1].i : -1;
        size_t p = 0, q;
        while ((maxs < 0 || static_cast<int64_t>(l.size()) < maxs) &&
               (q = s.find(sep, p)) != std::string::npos) {
          l.push_back(Value::str(s.substr(p, q - p)));
          p = q + sep.size();
        }
        l.push_back(Value::str(s.substr(p)));
      }
      return Value::make_list(std::move(l));
    }
    if (m == "find" || m == "count") {
      std::string x = arg_str(0, "argument");
      if (m == "find") {
        size_t p = s.find(x);
        return Value::integer(p == std::string::npos ? -1 : static_cast<int64_t>(p));
      }
      int64_t c = 0;
      for (size_t p = s.find(x); p != std::string::npos && !x.empty(); p = s.find(x, p + x.size())) ++c;
      return Value::integer(c);
    }
    err("unsupported string method '" + m + "'");
  }

  bool run_test(const std::string& n, const Value& v, Args& a) {
    if (n == "defined") return v.kind != Value::Undef;
    if (n == "undefined") return v.kind == Value::Undef;
    if (n == "none") return v.kind == Value::None;
    if (n == "string") return v.kind == Value::Str;
    if (n == "number") return v.kind == Value::Int || v.kind == Value::Float;
    if (n == "integer") return v.kind == Value::Int;
    if (n == "float") return v.kind == Value::Float;
    if (n == "boolean") return v.kind == Value::Bool;
    if (n == "true") return v.kind == Value::Bool && v.b;
    if (n == "false") return v.kind == Value::Bool && !v.b;
    if (n == "mapping") return v.kind == Value::DictK;
    if (n == "sequence") return v.kind == Value::ListK || v.kind == Value::Str || v.kind == Value::DictK;
    if (n == "iterable") return v.kind == Value::ListK || v.kind == Value::Str || v.kind == Value::DictK;
    if (n == "callable") return v.kind == Value::FnK;
    if (n == "equalto" || n == "eq" || n == "==" || n == "sameas") {
      if (a.empty()) err("test '" + n + "' needs an argument");
      return equal(v, a[0]);
    }
    if (n == "ne" || n == "!=") return a.size() == 1 && !equal(v, a[0]);
    if (n == "in") return a.size() == 1 && truthy(binary("in", v, a[0]));
    if (n == "odd" || n == "even") {
      if (v.kind != Value::Int) err("test '" + n + "' needs an integer");
      return (v.i % 2 != 0) == (n == "odd");
    }
    if (n == "divisibleby") {
      if (v.kind != Value::Int || a.empty() || a[0].kind != Value::Int || a[0].i == 0) err("bad divisibleby");
      return v.i % a[0].i == 0;
    }
    if (n == "lt" || n == "gt" || n == "le" || n == "ge" || n == "lessthan" || n == "greaterthan") {
      if (a.empty()) err("test '" + n + "' needs an argument");
      std::string op = n == "lt" || n == "lessthan"      ? "<"
                       : n == "gt" || n == "greaterthan" ? ">"
                       : n == "le"                       ? "<="
                                                         : ">=";
      return truthy(binary(op, v, a[0]));
    }
    err("unsupported test '" + n + "'");
  }

  bool test(const Expr& e) {
    Value v = eval(*e.kids[0]);
    Args a;
    for (size_t k = 1; k < e.kids.size(); ++k) a.push_back(eval(*e.kids[k]));
    return run_test(e.name, v, a);
  }

  List as_list(const Value& v, const std::string& f) {
    if (v.kind == Value::ListK) return *v.list;
    if (v.kind == Value::DictK) {
      List l;
      for (auto& kv : *v.dict) l.push_back(Value::str(kv.first));
      return l;
    }
    if (v.kind == Value::Str) {
      List l;
      for (size_t k = 0; k < v.s.size();) {
        size_t n = 1;
        while (k + n < v.s.size() && (static_cast<unsigned char>(v.s[k + n]) & 0xC0) == 0x80) ++n;
        l.push_back(Value::str(v.s.substr(k, n)));
        k += n;
      }
      return l;
    }
    if (v.kind == Value::Undef) return {};
    err("filter '" + f + "': '" + type_name(v) + "' is not iterable");
  }

  Value attr_of(const Value& item, const std::string& path) {
    Value cur = item;
    size_t p = 0;
    while (p <= path.size()) {
      size_t q = path.find('.', p);
      std::string part = path.substr(p, q == std::string::npos ? std::string::npos : q - p);
      const Value* v = cur.get(part);
      cur = v ? *v : Value::undef(part);
      if (q == std::string::npos) break;
      p = q + 1;
    }
    return cur;
  }

  Value filter(const Expr& e) {
    const std::string& f = e.name;
    Value v = eval(*e.kids[0]);
    Args a;
    Kwargs kw;
    for (size_t k = 1; k < e.kids.size(); ++k) a.push_back(eval(*e.kids[k]));
    for (auto& [k, x] : e.kwargs) kw.emplace_back(k, eval(*x));
    if (f == "length" || f == "count") {
      if (v.kind == Value::Str) {
        int64_t n = 0;
        for (unsigned char c : v.s) n += (c & 0xC0) != 0x80;
        return Value::integer(n);
      }
      if (v.kind == Value::DictK) return Value::integer(static_cast<int64_t>(v.dict->size()));
      return Value::integer(static_cast<int64_t>(as_list(v, f).size()));
    }
    if (f == "list") return Value::make_list(as_list(v, f));
    if (f == "first" || f == "last") {
      List l = as_list(v, f);
      if (l.empty()) return Value::undef();
      return f == "first" ? l.front() : l.back();
    }
    if (f == "reverse") {
      if (v.kind == Value::Str) {
        List l = as_list(v, f);
        std::string r;
        for (auto it = l.rbegin(); it != l.rend(); ++it) r += it->s;
        return Value::str(r);
      }
      List l = as_list(v, f);
      std::reverse(l.begin(), l.end());
      return Value::make_list(std::move(l));
    }
    if (f == "join") {
      std::string sep = a.empty() ? "" : to_str(a[0]), r;
      Value attr = kwarg(kw, "attribute", a, 99, Value::undef());
      List l = as_list(v, f);
      for (size_t k = 0; k < l.size(); ++k) {
        r += (k ? sep : "") + to_str(attr.kind == Value::Str ? attr_of(l[k], attr.s) : l[k]);
      }
      return Value::str(r);
    }
    if (f == "trim") {
      need_defined(v);
      Args no;
      return str_method(to_str(v), "strip", a.empty() ? no : a);
    }
    if (f == "upper" || f == "lower") {
      Args no;
      return str_method(to_str(v), f, no);
    }
    if (f == "capitalize" || f == "title") {
      std::string s = to_str(v);
      bool start = true;
      for (size_t k = 0; k < s.size(); ++k) {
        unsigned char c = static_cast<unsigned char>(s[k]);
        if (f == "capitalize") {
          s[k] = static_cast<char>(k == 0 ? std::toupper(c) : std::tolower(c));
        } else {
          s[k] = static_cast<char>(start ? std::toupper(c) : std::tolower(c));
          start = !std::isalnum(c);
        }
      }
      return Value::str(s);
    }
    if (f == "replace") {
      Args b{a.size() > 0 ? a[0] : Value(), a.size() > 1 ? a[1] : Value()};
      return str_method(to_str(v), "replace", b);
    }
    if (f == "default" || f == "d") {
      Value def = a.empty() ? Value::str("") : a[0];
      bool boolean = truthy(kwarg(kw, "boolean", a, 1, Value::boolean(false)));
      if (v.kind == Value::Undef || (boolean && !truthy(v))) return def;
      return v;
    }
    if (f == "string") return Value::str(to_str(v));
    if (f == "int") {
      if (v.kind == Value::Int) return v;
      if (v.kind == Value::Float) return Value::integer(static_cast<int64_t>(v.f));
      if (v.kind == Value::Bool) return Value::integer(v.b);
      if (v.kind == Value::Str) {
        try {
          size_t used = 0;
          int64_t x = std::stoll(v.s, &used);
          if (used == v.s.size()) return Value::integer(x);
        } catch (...) {
        }
      }
      return a.empty() ? Value::integer(0) : a[0];
    }
    if (f == "float") {
      if (v.is_num()) return Value::real(v.num());
      if (v.kind == Value::Str) {
        try {
          return Value::real(std::stod(v.s));
        } catch (...) {
        }
      }
      return Value::real(0.0);
    }
    if (f == "abs") {
      if (!v.is_num()) err("abs of a non-number");
      return v.kind == Value::Float ? Value::real(std::fabs(v.f))
                                    : Value::integer(std::llabs(v.kind == Value::Int ? v.i : v.b));
    }
    if (f == "tojson") {
      Value ind = kwarg(kw, "indent", a, 0, Value::none());
      int indent = ind.kind == Value::Int ? static_cast<int>(ind.i) : -1;
      bool sort_keys = truthy(kwarg(kw, "sort_keys", a, 99, Value::boolean(false)));
      std::string o;
      to_json(o, v, indent, 0, sort_keys);
      return Value::str(o);
    }
    if (f == "items") {
      if (v.kind == Value::Undef) return Value::make_list();
      if (v.kind != Value::DictK) err("filter 'items' needs a mapping");
      List l;
      for (auto& [k, x] : *v.dict) l.push_back(Value::make_list({Value::str(k), x}));
      return Value::make_list(std::move(l));
    }
    if (f == "selectattr" || f == "rejectattr" || f == "select" || f == "reject") {
      bool attr = f == "selectattr" || f == "rejectattr";
      bool keep_if = f == "selectattr" || f == "select";
      size_t base = attr ? 1 : 0;
      if (attr && (a.empty() || a[0].kind != Value::Str)) err("filter '" + f + "' needs an attribute name");
      std::string tname = a.size() > base ? to_str(a[base]) : "";
      Args targs(a.begin() + static_cast<ptrdiff_t>(std::min(a.size(), base + 1)), a.end());
      List out;
      for (auto& item : as_list(v, f)) {
        Value x = attr ? attr_of(item, a[0].s) : item;
        bool r = tname.empty() ? truthy(x) : run_test(tname, x, targs);
        if (r == keep_if) out.push_back(item);
      }
      return Value::make_list(std::move(out));
    }
    if (f == "map") {
      Value at = kwarg(kw, "attribute", a, 99, Value::undef());
      List out;
      if (at.kind == Value::Str) {
        Value def = kwarg(kw, "default", a, 99, Value::undef());
        for (auto& item : as_list(v, f)) {
          Value x = attr_of(item, at.s);
          out.push_back(x.kind == Value::Undef && def.kind != Value::Undef ? def : x);
        }
        return Value::make_list(std::move(out));
      }
      if (a.empty() || a[0].kind != Value::Str) err("filter 'map' needs attribute= or a filter name");
      Expr fe;
      fe.kind = Expr::Filter;
      fe.name = a[0].s;
      for (auto& item : as_list(v, f)) {
        auto lit = std::make_unique<Expr>();
        lit->kind = Expr::Lit;
        lit->lit = item;
        fe.kids.clear();
        fe.kids.push_back(std::move(lit));
        out.push_back(filter(fe));
      }
      return Value::make_list(std::move(out));
    }
    if (f == "unique") {
      List out;
      for (auto& item : as_list(v, f)) {
        bool seen = false;
        for (auto& o : out) seen |= equal(o, item);
        if (!seen) out.push_back(item);
      }
      return Value::make_list(std::move(out));
    }
    if (f == "sum") {
      Value acc = Value::integer(0);
      for (auto& item : as_list(v, f)) acc = binary("+", acc, item);
      return acc;
    }
    if (f == "indent") {
      int64_t w = a.empty() ? 4 : (a[0].kind == Value::Int ? a[0].i : 4);
      bool first = truthy(kwarg(kw, "first", a, 1, Value::boolean(false)));
      std::string pad(static_cast<size_t>(w), ' '), s = to_str(v), r;
      for (size_t k = 0; k < s.size(); ++k) {
        r += s[k];
        if (s[k] == '\n' && k + 1 < s.size() && s[k + 1] != '\n') r += pad;
      }
      return Value::str(first ? pad + r : r);
    }
    if (f == "safe") return v;
    err("unsupported filter '" + f + "'");
  }

 private:
  std::string origin_;
  RenderResult& out_;
  int line_ = 0;
};

}  // namespace

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
