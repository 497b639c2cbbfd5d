// The renderer of the Jinja2 subset, filters (|name), tests (is name) and Python string methods.
#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>

#include "core/error.h"
#include "data/template_internal.h"

namespace olmosft::tmpl {

Value Renderer::str_method(const std::string& s, const std::string& m, Args& a) {
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

bool Renderer::run_test(const std::string& n, const Value& v, Args& a) {
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

bool Renderer::test(const Expr& e) {
  Value v = eval(*e.kids[0]);
  Args a;
  for (size_t k = 1; k < e.kids.size(); ++k) a.push_back(eval(*e.kids[k]));
  return run_test(e.name, v, a);
}

List Renderer::as_list(const Value& v, const std::string& f) {
  if (v.kind == Value::ListK) return *v.list;
  if (v.kind == Value::DictK) {
    List l;
    for (auto& kv : *v.dict) l.push_back(Value::str(kv.first));
    return l;
  }
  if (v.kind == Value::Str) return utf8_chars(v.s);
  if (v.kind == Value::Undef) return {};
  err("filter '" + f + "': '" + type_name(v) + "' is not iterable");
}

Value Renderer::attr_of(const Value& item, const std::string& path) {
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

// Filters over sequences and mappings: length, list, first/last, reverse, join, items, select/reject(attr),
// map, unique, sum. Empty when f is not one of them.
std::optional<Value> Renderer::filter_sequence(const std::string& f, const Value& v, Args& a, Kwargs& kw) {
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
  return std::nullopt;
}

// String filters: trim, upper/lower, capitalize/title, replace, indent. Empty when f is not one of them.
std::optional<Value> Renderer::filter_string(const std::string& f, const Value& v, Args& a, Kwargs& kw) {
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
  return std::nullopt;
}

// Conversions and values: default/d, string, int, float, abs, tojson, safe. Empty when f is not one of them.
std::optional<Value> Renderer::filter_value(const std::string& f, const Value& v, Args& a, Kwargs& kw) {
  if (f == "default" || f == "d") {
    Value def = a.empty() ? Value::str("") : a[0];
    bool boolean = truthy(kwarg(kw, "boolean", a, 1, Value::boolean(false)));
    if (v.kind == Value::Undef || (boolean && !truthy(v))) return def;
    return v;
  }
  if (f == "string") return Value::str(to_str(v));
  if (f == "int") {
    if (v.kind == Value::Int) return v;
    if (v.kind == Value::Float) {
      // Python: int(nan) is a ValueError (the filter's default), int(inf) an OverflowError; a float beyond
      // 64 bits is refused here (a plain cast was undefined behaviour).
      if (std::isnan(v.f)) return a.empty() ? Value::integer(0) : a[0];
      if (!(v.f > -9.2233720368547758e18 && v.f < 9.2233720368547758e18))
        err("int of " + to_str(v) + " is out of range (this engine has 64-bit integers)");
      return Value::integer(static_cast<int64_t>(v.f));
    }
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
    if (v.kind == Value::Int && v.i == INT64_MIN)
      err("integer overflow in abs (this engine has 64-bit integers)");
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
  if (f == "safe") return v;
  return std::nullopt;
}

// {{ v | f(args) }}: evaluates the operand and arguments, then dispatches by filter family.
Value Renderer::filter(const Expr& e) {
  const std::string& f = e.name;
  Value v = eval(*e.kids[0]);
  Args a;
  Kwargs kw;
  for (size_t k = 1; k < e.kids.size(); ++k) a.push_back(eval(*e.kids[k]));
  for (auto& [k, x] : e.kwargs) kw.emplace_back(k, eval(*x));
  if (auto r = filter_sequence(f, v, a, kw)) return *r;
  if (auto r = filter_string(f, v, a, kw)) return *r;
  if (auto r = filter_value(f, v, a, kw)) return *r;
  err("unsupported filter '" + f + "'");
}

}  // namespace olmosft::tmpl
