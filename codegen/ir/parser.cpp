#include "codegen/ir/parser.h"

#include <cctype>
#include <cmath>
#include <cstdlib>
#include <charconv>
#include <cstdio>
#include <fstream>
#include <limits>
#include <sstream>
#include <unordered_map>

#include "codegen/ir/builder.h"
#include "codegen/ir/limits.h"
#include "runtime/core/file_io.h"

namespace sf {

namespace {

enum class Tok { Ident, Int, Float, LParen, RParen, LBrace, RBrace, LBracket, RBracket,
                 Comma, Colon, Equals, End };

struct Token {
  Tok kind = Tok::End;
  std::string_view text;
  SourceLoc loc;
};

std::string describe(const Token& t) {
  if (t.kind == Tok::End) return "end of file";
  return "'" + std::string(t.text) + "'";
}

// Deep nesting would exhaust the stack; no real graph nests calls this deep.
constexpr int kMaxNesting = 200;

class Lexer {
 public:
  explicit Lexer(std::string_view s) : s_(s) {}

  Token next() {
    skip_space_and_comments();
    Token t;
    t.loc = {line_, col_};
    if (pos_ >= s_.size()) return t;
    size_t start = pos_;
    unsigned char c = static_cast<unsigned char>(s_[pos_]);
    auto single = [&](Tok k) {
      advance();
      t.kind = k;
      t.text = s_.substr(start, 1);
      return t;
    };
    switch (c) {
      case '(': return single(Tok::LParen);
      case ')': return single(Tok::RParen);
      case '{': return single(Tok::LBrace);
      case '}': return single(Tok::RBrace);
      case '[': return single(Tok::LBracket);
      case ']': return single(Tok::RBracket);
      case ',': return single(Tok::Comma);
      case ':': return single(Tok::Colon);
      case '=': return single(Tok::Equals);
      default: break;
    }
    if (std::isalpha(c) || c == '_') {
      while (pos_ < s_.size() && (std::isalnum(static_cast<unsigned char>(s_[pos_])) || s_[pos_] == '_'))
        advance();
      t.kind = Tok::Ident;
      t.text = s_.substr(start, pos_ - start);
      return t;
    }
    if (std::isdigit(c) || ((c == '-' || c == '+' || c == '.') && pos_ + 1 < s_.size() &&
                            (std::isdigit(static_cast<unsigned char>(s_[pos_ + 1])) || s_[pos_ + 1] == '.'))) {
      bool is_float = false;
      if (c == '-' || c == '+') advance();
      while (pos_ < s_.size()) {
        char d = s_[pos_];
        if (std::isdigit(static_cast<unsigned char>(d))) {
          advance();
        } else if (d == '.') {
          is_float = true;
          advance();
        } else if ((d == 'e' || d == 'E')) {
          is_float = true;
          advance();
          if (pos_ < s_.size() && (s_[pos_] == '-' || s_[pos_] == '+')) advance();
        } else {
          break;
        }
      }
      t.kind = is_float ? Tok::Float : Tok::Int;
      t.text = s_.substr(start, pos_ - start);
      return t;
    }
    char buf[64];
    if (std::isprint(c))
      std::snprintf(buf, sizeof buf, "unexpected character '%c'", c);
    else
      std::snprintf(buf, sizeof buf, "unexpected byte 0x%02x (is this a text file?)", c);
    throw DiagError{Diag{"", t.loc, buf}};
  }

 private:
  void advance() {
    if (s_[pos_] == '\n') {
      ++line_;
      col_ = 1;
    } else {
      ++col_;
    }
    ++pos_;
  }
  void skip_space_and_comments() {
    while (pos_ < s_.size()) {
      char c = s_[pos_];
      if (c == ' ' || c == '\t' || c == '\n' || c == '\r') {
        advance();
      } else if (c == '#') {
        while (pos_ < s_.size() && s_[pos_] != '\n') advance();
      } else {
        break;
      }
    }
  }

  std::string_view s_;
  size_t pos_ = 0;
  int line_ = 1, col_ = 1;
};

// A parsed attribute value before it meets an op's schema.
struct AttrArg {
  AttrValue value;
  SourceLoc loc;
};

class Parser {
 public:
  explicit Parser(std::string_view text) : lex_(text) { tok_ = lex_.next(); }

  Result<Graph> parse() {
    Mesh mesh = parse_mesh();
    expect_keyword("graph", "'graph' (or 'mesh' before it)");
    Token name = expect(Tok::Ident, "a graph name");
    builder_.emplace(std::string(name.text), mesh);
    parse_params();
    Token open = expect(Tok::LBrace, "'{' to open the graph body");
    bool returned = false;
    while (tok_.kind != Tok::RBrace) {
      if (tok_.kind == Tok::End)
        error(tok_.loc, "unexpected end of file: expected '}' to close graph '" +
                            std::string(name.text) + "' opened at " + where(open.loc));
      if (returned) error(tok_.loc, "expected '}' after the return statement, found " + describe(tok_));
      if (tok_.kind == Tok::Ident && tok_.text == "return") {
        parse_return();
        returned = true;
      } else {
        parse_statement();
      }
    }
    if (!returned) error(tok_.loc, "graph '" + std::string(name.text) + "' has no return statement");
    next();
    if (tok_.kind != Tok::End) error(tok_.loc, "unexpected " + describe(tok_) + " after the graph (one graph per file)");
    return builder_->finish();
  }

 private:
  [[noreturn]] void error(SourceLoc loc, std::string msg) { throw DiagError{Diag{"", loc, std::move(msg)}}; }
  static std::string where(SourceLoc l) { return std::to_string(l.line) + ":" + std::to_string(l.col); }

  void next() { tok_ = lex_.next(); }
  Token expect(Tok k, const std::string& what) {
    if (tok_.kind != k) error(tok_.loc, "expected " + what + ", found " + describe(tok_));
    Token t = tok_;
    next();
    return t;
  }
  void expect_keyword(std::string_view kw, const std::string& what) {
    if (tok_.kind != Tok::Ident || tok_.text != kw) error(tok_.loc, "expected " + what + ", found " + describe(tok_));
    next();
  }
  bool accept(Tok k) {
    if (tok_.kind != k) return false;
    next();
    return true;
  }

  int64_t parse_int_text(const Token& t, const char* what) {
    int64_t v = 0;
    std::string_view s = t.text;
    if (!s.empty() && s[0] == '+') s.remove_prefix(1);
    auto r = std::from_chars(s.data(), s.data() + s.size(), v);
    if (r.ec == std::errc::result_out_of_range)
      error(t.loc, std::string(what) + " " + std::string(t.text) + " does not fit in 64 bits");
    if (r.ec != std::errc() || r.ptr != s.data() + s.size())
      error(t.loc, "malformed integer '" + std::string(t.text) + "'");
    return v;
  }
  double parse_float_text(const Token& t) {
    double v = 0;
    std::string_view s = t.text;
    if (!s.empty() && s[0] == '+') s.remove_prefix(1);
    auto r = std::from_chars(s.data(), s.data() + s.size(), v);
    if (r.ptr != s.data() + s.size() || (r.ec != std::errc() && r.ec != std::errc::result_out_of_range))
      error(t.loc, "malformed number '" + std::string(t.text) + "'");
    if (r.ec == std::errc::result_out_of_range) {
      // from_chars reports underflow and overflow alike and leaves v unset; strtod
      // tells them apart. A literal below the smallest double (1e-400) is valid and
      // rounds to zero, as in C and NumPy; one above the largest (1e400) is refused.
      v = std::strtod(std::string(s).c_str(), nullptr);
      if (std::isinf(v)) error(t.loc, "number " + std::string(t.text) + " is out of the range of a 64-bit float");
    }
    return v;
  }

  Mesh parse_mesh() {
    Mesh mesh;
    if (!(tok_.kind == Tok::Ident && tok_.text == "mesh")) return mesh;
    Token kw = tok_;
    next();
    while (tok_.kind == Tok::Ident && tok_.text != "graph" && tok_.text != "mesh") {
      Token name = tok_;
      next();
      expect(Tok::Equals, "'=' after mesh dimension '" + std::string(name.text) + "'");
      Token size = expect(Tok::Int, "a size for mesh dimension '" + std::string(name.text) + "'");
      int64_t n = parse_int_text(size, "mesh size");
      if (n <= 0) error(size.loc, "mesh dimension '" + std::string(name.text) + "' has size " +
                                      std::to_string(n) + " (expected >= 1)");
      if (mesh.find(name.text)) error(name.loc, "mesh dimension '" + std::string(name.text) + "' is named twice");
      mesh.dims.push_back({std::string(name.text), n});
    }
    if (tok_.kind == Tok::Ident && tok_.text == "mesh") error(tok_.loc, "only one mesh line is allowed (the first is at " + where(kw.loc) + ")");
    if (mesh.dims.empty()) error(tok_.loc, "expected NAME=SIZE after 'mesh', found " + describe(tok_));
    // Checked product: `mesh a=4294967296 b=4294967296` would wrap to 0 ranks.
    if (auto why = check_mesh_limits(mesh)) error(kw.loc, *why);
    return mesh;
  }

  TensorType parse_type() {
    Token dt = expect(Tok::Ident, "a dtype (f32 f16 bf16 i32 i64 bool)");
    auto d = parse_dtype(dt.text);
    if (!d) error(dt.loc, "unknown dtype '" + std::string(dt.text) + "' (expected one of f32 f16 bf16 i32 i64 bool)");
    TensorType t{*d, {}};
    Token open = expect(Tok::LBracket, "'[' and a shape after the dtype");
    if (!accept(Tok::RBracket)) {
      for (;;) {
        Token n = tok_;
        if (n.kind != Tok::Int) error(n.loc, "expected a dimension size, found " + describe(n));
        next();
        int64_t v = parse_int_text(n, "dimension");
        if (v < 0) error(n.loc, "dimension " + std::to_string(v) + " is negative");
        if (v > 0 && numel(t.shape) > std::numeric_limits<int64_t>::max() / 16 / v)
          error(n.loc, "shape " + shape_str(t.shape) + " x " + std::to_string(v) + " overflows: too many elements");
        t.shape.push_back(v);
        if (accept(Tok::RBracket)) break;
        if (tok_.kind != Tok::Comma)
          error(tok_.loc, "expected ',' or ']' to close the shape opened at " + where(open.loc) + ", found " + describe(tok_));
        next();
      }
    }
    return t;
  }

  Placement parse_placement() {
    Token t = expect(Tok::Ident, "a placement (R, S(dim), P or P(op))");
    if (t.text == "R") return Placement::replicate();
    if (t.text == "S") {
      expect(Tok::LParen, "'(' after S");
      Token n = tok_;
      if (n.kind != Tok::Int) error(n.loc, "expected a tensor dim in S(...), found " + describe(n));
      next();
      int64_t d = parse_int_text(n, "dim");
      expect(Tok::RParen, "')' to close S(");
      return Placement::shard(d);
    }
    if (t.text == "P") {
      if (!accept(Tok::LParen)) return Placement::partial(ReduceOp::Sum);
      Token op = expect(Tok::Ident, "a reduce op (sum, max, min, avg)");
      auto r = parse_reduce_op(op.text);
      if (!r) error(op.loc, "unknown reduce op '" + std::string(op.text) + "' (expected sum, max, min or avg)");
      expect(Tok::RParen, "')' to close P(");
      return Placement::partial(*r);
    }
    error(t.loc, "unknown placement '" + std::string(t.text) + "' (expected R, S(dim), P or P(op))");
  }

  // `{tp: S(0), dp: R}`; the current token is '{'.
  PlacementSpec parse_placements() {
    Token open = expect(Tok::LBrace, "'{'");
    const Mesh& mesh = builder_->mesh();
    PlacementSpec spec;
    spec.per_dim.assign(mesh.dims.size(), Placement::replicate());
    std::vector<bool> seen(mesh.dims.size());
    if (accept(Tok::RBrace)) return spec;
    for (;;) {
      Token dim = expect(Tok::Ident, "a mesh dimension name");
      auto i = mesh.find(dim.text);
      if (!i)
        error(dim.loc, "unknown mesh dimension '" + std::string(dim.text) + "'" +
                           (mesh.dims.empty() ? std::string(" (the graph has no mesh line)")
                                              : " (the mesh is '" + mesh.str() + "')"));
      if (seen[*i]) error(dim.loc, "mesh dimension '" + std::string(dim.text) + "' is placed twice");
      seen[*i] = true;
      expect(Tok::Colon, "':' after mesh dimension '" + std::string(dim.text) + "'");
      spec.per_dim[*i] = parse_placement();
      if (accept(Tok::RBrace)) break;
      if (tok_.kind != Tok::Comma)
        error(tok_.loc, "expected ',' or '}' to close the placements opened at " + where(open.loc) + ", found " + describe(tok_));
      next();
    }
    return spec;
  }

  void parse_params() {
    Token open = expect(Tok::LParen, "'(' and the parameter list");
    if (accept(Tok::RParen)) return;
    for (;;) {
      Token name = expect(Tok::Ident, "a parameter name");
      check_new_name(name);
      expect(Tok::Colon, "':' and a type after parameter '" + std::string(name.text) + "'");
      TensorType t = parse_type();
      std::optional<PlacementSpec> p;
      SourceLoc ploc = tok_.loc;
      if (tok_.kind == Tok::LBrace) p = parse_placements();
      builder_->param(std::string(name.text), t.dtype, t.shape, std::nullopt, name.loc);
      if (p) constrain_param(name, *p, ploc);
      defined_[std::string(name.text)] = name.loc;
      if (accept(Tok::RParen)) break;
      if (tok_.kind != Tok::Comma)
        error(tok_.loc, "expected ',' or ')' to close the parameter list opened at " + where(open.loc) + ", found " + describe(tok_));
      next();
    }
  }

  void constrain_param(const Token& name, const PlacementSpec& p, SourceLoc loc) {
    Value v = *builder_->lookup(std::string(name.text));
    if (auto err = check_placements(p, builder_->mesh(), v.type().rank()))
      error(loc, "parameter '" + std::string(name.text) + "': " + *err);
    builder_->constrain(v, p, loc);
  }

  void check_new_name(const Token& name) {
    auto it = defined_.find(std::string(name.text));
    if (it != defined_.end())
      error(name.loc, "'" + std::string(name.text) + "' is already defined at " + where(it->second));
    if (name.text == "return" || name.text == "graph" || name.text == "mesh")
      error(name.loc, "'" + std::string(name.text) + "' is a keyword and cannot name a value");
  }

  void parse_statement() {
    Token name = expect(Tok::Ident, "a statement 'name = op(...)' or 'return'");
    check_new_name(name);
    expect(Tok::Equals, "'=' after '" + std::string(name.text) + "'");
    Value v = parse_expr(0);
    builder_->name(v, std::string(name.text), name.loc);
    defined_[std::string(name.text)] = name.loc;
    if (tok_.kind == Tok::LBrace) {
      SourceLoc loc = tok_.loc;
      PlacementSpec p = parse_placements();
      Value named = *builder_->lookup(std::string(name.text));
      if (auto err = check_placements(p, builder_->mesh(), named.type().rank())) error(loc, *err);
      builder_->constrain(named, p, loc);
    }
  }

  void parse_return() {
    next();  // 'return'
    for (;;) {
      SourceLoc loc = tok_.loc;
      Value v = parse_expr(0);
      std::optional<PlacementSpec> p;
      SourceLoc ploc = tok_.loc;
      if (tok_.kind == Tok::LBrace) {
        p = parse_placements();
        if (auto err = check_placements(*p, builder_->mesh(), v.type().rank())) error(ploc, *err);
      }
      builder_->ret(v, p, loc);
      if (!accept(Tok::Comma)) break;
    }
  }

  Value parse_expr(int depth) {
    if (depth > kMaxNesting) error(tok_.loc, "calls nest deeper than " + std::to_string(kMaxNesting) + " levels");
    Token t = tok_;
    if (t.kind == Tok::Int || t.kind == Tok::Float) {
      next();
      if (t.kind == Tok::Int) {
        int64_t v = parse_int_text(t, "integer literal");
        return builder_->constant(static_cast<double>(v), DType::I64, t.loc);
      }
      return builder_->constant(parse_float_text(t), DType::F32, t.loc);
    }
    if (t.kind != Tok::Ident) error(t.loc, "expected a value or an op call, found " + describe(t));
    next();
    if (tok_.kind != Tok::LParen) {
      auto v = builder_->lookup(std::string(t.text));
      if (!v) error(t.loc, "undefined value '" + std::string(t.text) + "'");
      return *v;
    }
    return parse_call(t, depth);
  }

  AttrValue parse_attr_value() {
    Token t = tok_;
    switch (t.kind) {
      case Tok::Int: next(); return AttrValue(parse_int_text(t, "integer"));
      case Tok::Float: next(); return AttrValue(parse_float_text(t));
      case Tok::Ident:
        next();
        if (t.text == "true") return AttrValue(true);
        if (t.text == "false") return AttrValue(false);
        return AttrValue(std::string(t.text));
      case Tok::LBracket: {
        Token open = t;
        next();
        std::vector<int64_t> v;
        if (accept(Tok::RBracket)) return AttrValue(v);
        for (;;) {
          Token n = tok_;
          if (n.kind != Tok::Int) error(n.loc, "expected an integer in the list, found " + describe(n));
          next();
          v.push_back(parse_int_text(n, "integer"));
          if (accept(Tok::RBracket)) break;
          if (tok_.kind != Tok::Comma)
            error(tok_.loc, "expected ',' or ']' to close the list opened at " + where(open.loc) + ", found " + describe(tok_));
          next();
        }
        return AttrValue(v);
      }
      case Tok::LBrace: return AttrValue(parse_placements());
      default: error(t.loc, "expected an attribute value, found " + describe(t));
    }
  }

  Value parse_call(const Token& name, int depth) {
    auto k = find_op(name.text);
    if (!k) error(name.loc, "unknown op '" + std::string(name.text) + "'");
    const OpInfo& info = op_info(*k);
    Token open = tok_;
    next();  // '('
    std::vector<Value> operands;
    std::vector<AttrValue> positional;
    std::vector<std::pair<std::string, AttrValue>> named;
    if (!accept(Tok::RParen)) {
      for (;;) {
        if (tok_.kind == Tok::End)
          error(tok_.loc, "unexpected end of file: expected ')' to close '" + std::string(name.text) + "(' opened at " + where(open.loc));
        // key=value, recognised by one token of lookahead after an identifier.
        Token first = tok_;
        bool is_named = false;
        if (first.kind == Tok::Ident) {
          Lexer save = lex_;
          Token after = lex_.next();
          lex_ = save;
          is_named = after.kind == Tok::Equals;
        }
        if (is_named) {
          next();
          next();  // '='
          for (const auto& [n, v] : named)
            if (n == first.text) error(first.loc, std::string(name.text) + ": attribute '" + std::string(first.text) + "' is given twice");
          named.emplace_back(std::string(first.text), parse_attr_value());
        } else {
          if (!named.empty()) error(first.loc, "a positional argument follows key=value arguments in '" + std::string(name.text) + "'");
          // An op with a varying operand count (concat, scaled_dot_product_attention's
          // optional mask) takes every positional argument as an operand; its
          // attributes are named.
          if (info.arity < 0 || static_cast<int>(operands.size()) < info.arity) {
            if (operands.size() >= max_operands(info))
              error(first.loc, std::string(name.text) + " takes " + arity_str(info) +
                                   " operands (its attributes by name), found an extra argument " + describe(first));
            operands.push_back(parse_expr(depth + 1));
          } else {
            if (info.attrs.empty() || positional.size() >= info.attrs.size())
              error(first.loc, std::string(name.text) + " takes " + std::to_string(info.arity) + " operand(s)" +
                                   (info.attrs.empty() ? "" : " and " + std::to_string(info.attrs.size()) + " attribute(s)") +
                                   ", found an extra argument " + describe(first));
            positional.push_back(parse_attr_value());
          }
        }
        if (accept(Tok::RParen)) break;
        if (tok_.kind != Tok::Comma)
          error(tok_.loc, "expected ',' or ')' to close '" + std::string(name.text) + "(' opened at " + where(open.loc) + ", found " + describe(tok_));
        next();
      }
    }
    if (!arity_ok(info, operands.size()))
      error(name.loc, std::string(name.text) + " expects " + arity_str(info) + " operand(s), got " + std::to_string(operands.size()));
    return builder_->op(*k, operands, positional, named, name.loc);
  }

  Lexer lex_;
  Token tok_;
  std::optional<GraphBuilder> builder_;
  std::unordered_map<std::string, SourceLoc> defined_;
};

}  // namespace

Result<Graph> parse_graph(std::string_view text, const std::string& filename) {
  try {
    Parser p(text);
    Result<Graph> r = p.parse();
    if (!r.ok()) {
      Diag d = r.error();
      d.file = filename;
      return d;
    }
    return r;
  } catch (DiagError& e) {
    e.diag.file = filename;
    return e.diag;
  }
}

Result<Graph> parse_file(const std::string& path) {
  // A FIFO, a device or a directory is refused, and so is a file over the cap.
  Result<std::string> text = read_regular_file(path, kMaxGraphFileBytes, "graph file (.sf)");
  if (!text) return text.error();
  return parse_graph(*text, path);
}

}  // namespace sf
