// The renderer of the Jinja2 subset, statements and expressions: a tree walk over the AST with a stack of
// scopes; errors name the template line being rendered. Filters, tests and string methods are in
// template_filters.cpp.
#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "data/template_internal.h"

namespace olmosft::tmpl {

Value Renderer::lookup(const std::string& n) {
  for (auto it = scopes.rbegin(); it != scopes.rend(); ++it) {
    auto f = it->find(n);
    if (f != it->end()) return f->second;
  }
  return Value::undef(n);
}

void Renderer::render(const std::vector<std::unique_ptr<Node>>& nodes) {
  for (auto& n : nodes) exec(*n);
}

void Renderer::exec(const Node& n) {
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
    case Node::For:
      exec_for(n);
      return;
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
    case Node::SetBlock:
      scopes.back()[n.targets[0]] = Value::str(capture(n.body));
      return;
    case Node::Macro:
      define_macro(n);
      return;
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

// {% for targets in iterable [if filter] %} body [{% else %} else_body] {% endfor %}, with the `loop`
// variable.
void Renderer::exec_for(const Node& n) {
  Value it = eval(*n.expr);
  List items;
  if (it.kind == Value::ListK)
    items = *it.list;
  else if (it.kind == Value::DictK) {
    for (auto& kv : *it.dict) items.push_back(Value::str(kv.first));
  } else if (it.kind == Value::Str) {
    items = utf8_chars(it.s);            // iterate characters (UTF-8 code points)
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
    Value loop = Value::make_dict({{"index", Value::integer(k + 1)},
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
}

// Renders body into a string instead of the output; generation spans inside it are dropped.
std::string Renderer::capture(const std::vector<std::unique_ptr<Node>>& body) {
  std::string saved;
  saved.swap(out_.text);
  size_t spans = out_.generation_spans.size();
  render(body);
  out_.generation_spans.resize(spans);
  std::string captured;
  captured.swap(out_.text);
  out_.text.swap(saved);
  return captured;
}

// {% macro name(params) %}: binds a function that renders the body in a fresh scope and returns its text.
void Renderer::define_macro(const Node& n) {
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
    int saved_line = line_;
    // Python raises RecursionError for a macro that calls itself without end; this was a stack overflow.
    if (calls_ >= kMaxNesting)
      err("macro '" + mn->targets[0] + "': calls nested deeper than " + std::to_string(kMaxNesting) +
          " levels (unbounded recursion?)");
    ++calls_;
    scopes.push_back(std::move(sc));
    std::string r = capture(mn->body);
    scopes.pop_back();
    --calls_;
    line_ = saved_line;
    return Value::str(r);
  });
}

void Renderer::need_defined(const Value& v) {
  if (v.kind == Value::Undef) err(v.s.empty() ? "undefined value used" : "'" + v.s + "' is undefined");
}

Value Renderer::eval(const Expr& e) {
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
    case Expr::Slice:
      return slice(e);
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
      if (v.kind == Value::Float) return Value::real(-v.f);
      int64_t r = 0;
      if (__builtin_sub_overflow(int64_t{0}, v.kind == Value::Int ? v.i : int64_t{v.b}, &r))
        err("integer overflow in unary - (this engine has 64-bit integers)");
      return Value::integer(r);
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

// o[start:stop:step] on a list or a string (Python semantics: negative indices, clamping, negative steps).
Value Renderer::slice(const Expr& e) {
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

Value Renderer::subscript(const Value& o, const Value& k) {
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

Value Renderer::binary(const std::string& op, const Value& a, const Value& b) {
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
    if (n > 0 && !s.s.empty() && static_cast<uint64_t>(n) > kMaxStringBytes / s.s.size())
      err("string repetition makes more than " + std::to_string(kMaxStringBytes) + " bytes");
    std::string r;
    for (int64_t k = 0; k < n; ++k) r += s.s;
    return Value::str(r);
  }
  if (op == "%" && a.kind == Value::Str) err("printf-style '%' string formatting is not supported");
  if (!a.is_num() || !b.is_num())
    err(std::string("unsupported operand types for ") + op + ": '" + type_name(a) + "' and '" + type_name(b) +
        "'");
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
    int64_t x = iv(a), y = iv(b);
    if (x == INT64_MIN && y == -1) overflow(op);
    int64_t q = x / y;
    if ((x % y != 0) && ((x < 0) != (y < 0))) --q;
    return op == "//" ? Value::integer(q) : Value::integer(x - q * y);
  }
  if (op == "**") {
    if (!fl && iv(b) >= 0) {
      // by squaring: O(log exponent), every product checked (2 ** 10**18 was a loop of 10**18 steps)
      int64_t r = 1, base = iv(a);
      for (int64_t e = iv(b); e > 0; e >>= 1) {
        if ((e & 1) && __builtin_mul_overflow(r, base, &r)) overflow(op);
        if (e > 1 && __builtin_mul_overflow(base, base, &base)) overflow(op);
      }
      return Value::integer(r);
    }
    return Value::real(std::pow(a.num(), b.num()));
  }
  if (fl) {
    double x = a.num(), y = b.num();
    return Value::real(op == "+" ? x + y : op == "-" ? x - y : x * y);
  }
  int64_t x = iv(a), y = iv(b), r = 0;
  bool bad = op == "+"   ? __builtin_add_overflow(x, y, &r)
             : op == "-" ? __builtin_sub_overflow(x, y, &r)
                         : __builtin_mul_overflow(x, y, &r);
  if (bad) overflow(op);
  return Value::integer(r);
}

Value Renderer::kwarg(Kwargs& kw, const std::string& name, Args& a, size_t pos, Value def) {
  for (auto& [k, v] : kw)
    if (k == name) return v;
  return pos < a.size() ? a[pos] : def;
}

Value Renderer::call(const Expr& e) {
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
      err("access to attribute '" + m + "' of 'list' object is unsafe (HF renders in an immutable sandbox)");
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
      // Jinja2's sandbox (transformers renders chat templates in ImmutableSandboxedEnvironment) refuses
      // ranges longer than MAX_RANGE = 100000; so does this engine (a range(10**18) was a hang).
      const double count =
          std::ceil((static_cast<double>(hi) - static_cast<double>(lo)) / static_cast<double>(st));
      if (count > static_cast<double>(kMaxRange))
        err("range() of " + std::to_string(static_cast<int64_t>(std::min(count, 9e18))) +
            " items is too big (the sandbox limit is " + std::to_string(kMaxRange) + ")");
      List l;
      for (int64_t k = lo; st > 0 ? k < hi : k > hi;) {
        l.push_back(Value::integer(k));
        if (__builtin_add_overflow(k, st, &k)) break;
      }
      return Value::make_list(std::move(l));
    }
    err("unknown function '" + n + "' (unsupported)");
  }
  Value f = eval(callee);
  if (f.kind != Value::FnK) err("value is not callable");
  return (*f.fn)(a, kw);
}

}  // namespace olmosft::tmpl
