// The parser of the Jinja2 subset: statements ({% if %}, {% for %}, {% set %}, {% macro %},
// {% generation %}, break/continue) by TemplateParser, expressions by a recursive-descent Parser following
// Jinja2's precedence.
#include <algorithm>
#include <initializer_list>

#include "core/error.h"
#include "data/template_internal.h"

namespace olmosft::tmpl {

namespace {

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

  ExprP expr() {
    Nest g(*this);
    return cond();
  }

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
      add(*e, std::move(c));
      add(*e, std::move(a));
      add(*e, std::move(b));
      a = std::move(e);
    }
    return a;
  }
  ExprP or_() { return left_assoc(&Parser::and_, Expr::Or, {"or"}, true); }
  ExprP and_() { return left_assoc(&Parser::not_, Expr::And, {"and"}, true); }
  // Prefix operators are counted in a loop, then wrapped by add() (which bounds the depth), not recursed.
  ExprP not_() {
    size_t n = 0;
    for (; at_name("not"); ++p_) ++n;
    ExprP a = compare();
    for (; n > 0; --n) {
      ExprP e = mk(Expr::Not);
      add(*e, std::move(a));
      a = std::move(e);
    }
    return a;
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
  ExprP math1() { return left_assoc(&Parser::concat, Expr::Bin, {"+", "-"}); }
  ExprP concat() { return left_assoc(&Parser::math2, Expr::Bin, {"~"}); }
  ExprP math2() { return left_assoc(&Parser::pow_, Expr::Bin, {"*", "/", "//", "%"}); }
  ExprP pow_() { return left_assoc(&Parser::unary, Expr::Bin, {"**"}); }
  ExprP unary() {
    std::vector<Expr::Kind> signs;
    for (; at_op("-") || at_op("+"); ++p_) signs.push_back(peek().text == "-" ? Expr::Neg : Expr::Pos);
    ExprP a = filters(postfix(primary()));
    for (auto k = signs.rbegin(); k != signs.rend(); ++k) {
      ExprP e = mk(*k);
      add(*e, std::move(a));
      a = std::move(e);
    }
    return a;
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
          add(*e, std::move(a));
          add(*e, std::move(idx));
        } else {
          e->name = expect_name();
          add(*e, std::move(a));
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
        add(*e, std::move(a));
        if (is_slice) {
          for (auto& p : parts) add(*e, std::move(p));  // may be null
        } else {
          if (!parts[0]) err("empty subscript");
          add(*e, std::move(parts[0]));
        }
        a = std::move(e);
      } else if (at_op("(")) {
        ExprP e = mk(Expr::Call);
        add(*e, std::move(a));
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
        add_kw(e, k, expr());
      } else {
        if (!e.kwargs.empty()) err("positional argument after keyword argument");
        add(e, expr());
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
        add(*e, std::move(a));
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
        add(*e, std::move(a));
        if (at_op("(")) {
          args(*e);
        } else if (peek().kind == Tok::Str || peek().kind == Tok::Int || peek().kind == Tok::Float ||
                   (peek().kind == Tok::Name && !at_name("and") && !at_name("or") && !at_name("else") &&
                    !at_name("if") && !at_name("in") && !at_name("not") && !at_name("is"))) {
          add(*e, postfix(primary()));  // `is equalto 'x'`, `is divisibleby 3`
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
        add(*l, std::move(a));
        while (at_op(",")) {
          ++p_;
          if (at_op(")")) break;
          add(*l, expr());
        }
        a = std::move(l);
      }
      expect_op(")");
      return a;
    }
    if (at_op("[")) {
      ++p_;
      return collection(Expr::ListE, "]");
    }
    if (at_op("{")) {
      ++p_;
      return collection(Expr::DictE, "}");
    }
    err("unexpected '" + t.text + "' in expression (unsupported syntax)");
  }

  size_t pos() const { return p_; }
  void set_pos(size_t p) { p_ = p; }

 private:
  // Parser recursion (parentheses, brackets, arguments: one expr() per level) and the depth of the tree it
  // builds (which also grows without recursion: a+a+a..., x|f|f..., a.b.c...) are bounded by kMaxNesting: the
  // renderer evaluates, and the destructor frees, a tree recursively, so a template of 100,000 '(' or '+1'
  // was a stack overflow. Real templates nest a handful of levels.
  struct Nest {
    Parser& p;
    explicit Nest(Parser& parser) : p(parser) {
      if (++p.nest_ > kMaxNesting)
        p.err("expression nested deeper than " + std::to_string(kMaxNesting) + " levels");
    }
    ~Nest() { --p.nest_; }
  };
  void add(Expr& parent, ExprP kid) {
    if (kid && kid->depth >= parent.depth) {
      parent.depth = kid->depth + 1;
      if (parent.depth > kMaxNesting)
        err("expression nested deeper than " + std::to_string(kMaxNesting) + " levels");
    }
    parent.kids.push_back(std::move(kid));
  }
  void add_kw(Expr& parent, const std::string& k, ExprP kid) {
    if (kid->depth >= parent.depth) {
      parent.depth = kid->depth + 1;
      if (parent.depth > kMaxNesting)
        err("expression nested deeper than " + std::to_string(kMaxNesting) + " levels");
    }
    parent.kwargs.emplace_back(k, std::move(kid));
  }
  ExprP mk(Expr::Kind k) {
    auto e = std::make_unique<Expr>();
    e->kind = k;
    return e;
  }
  // The items of a list literal, or the key/value pairs of a dict literal, up to and including the closing
  // bracket (the opening one is consumed).
  ExprP collection(Expr::Kind k, const char* close) {
    ExprP e = mk(k);
    while (!at_op(close)) {
      add(*e, expr());
      if (k == Expr::DictE) {
        expect_op(":");
        add(*e, expr());
      }
      if (!at_op(close)) expect_op(",");
    }
    expect_op(close);
    return e;
  }
  // One left-associative precedence level: next (op next)*, op one of ops (keywords when names, else
  // operator tokens).
  ExprP left_assoc(ExprP (Parser::*next)(), Expr::Kind k, std::initializer_list<const char*> ops,
                   bool names = false) {
    ExprP a = (this->*next)();
    while (true) {
      const char* op = nullptr;
      for (const char* o : ops)
        if (names ? at_name(o) : at_op(o)) {
          op = o;
          break;
        }
      if (!op) return a;
      ++p_;
      a = bin(k, op, std::move(a), (this->*next)());
    }
  }
  ExprP bin(Expr::Kind k, const std::string& op, ExprP a, ExprP b) {
    ExprP e = mk(k);
    e->name = op;
    add(*e, std::move(a));
    add(*e, std::move(b));
    return e;
  }
  std::string origin_;
  int line_;
  std::vector<Tok> t_;
  size_t p_ = 0;
  int nest_ = 0;
};

class TemplateParser {
 public:
  TemplateParser(const std::string& origin, std::vector<TplTok> toks)
      : origin_(origin), toks_(std::move(toks)) {}

  // Parses nodes until one of the end keywords; returns the keyword found ("" at end of input).
  std::string parse_body(std::vector<std::unique_ptr<Node>>& out, const std::vector<std::string>& ends,
                         Parser** end_parser_out = nullptr) {
    // One level per open block ({% if %}, {% for %}, {% macro %}, ...): bounded like expressions, since
    // parsing, rendering and freeing the tree recurse per level.
    struct Level {
      int& n;
      ~Level() { --n; }
    } level{++blocks_};
    if (blocks_ > kMaxNesting && i_ > 0)
      fail(origin_, " line ", toks_[i_ - 1].line, ": blocks nested deeper than ", kMaxNesting, " levels");
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
  int blocks_ = 0;
  std::unique_ptr<Parser> cur_, last_end_;
};

}  // namespace

void parse_template(const std::string& origin, std::vector<TplTok> toks,
                    std::vector<std::unique_ptr<Node>>& body) {
  TemplateParser tp(origin, std::move(toks));
  std::string e = tp.parse_body(body, {});
  (void)e;
}

}  // namespace olmosft::tmpl
