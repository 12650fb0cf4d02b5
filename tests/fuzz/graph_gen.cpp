#include "tests/fuzz/graph_gen.h"

#include <algorithm>
#include <numeric>
#include <optional>
#include <sstream>
#include <vector>

#include "runtime/core/mesh.h"
#include "codegen/ir/ops.h"

namespace sf::fuzz {

namespace {

// Reads decisions from the bytes front to back; once they run out every choice is
// its lowest option, so a short input is a small graph, not a rejected one.
class Bytes {
 public:
  Bytes(const uint8_t* d, size_t n) : d_(d), n_(n) {}
  // Uniform enough over lo..hi (inclusive) for hi - lo < 256.
  int range(int lo, int hi) {
    if (hi <= lo) return lo;
    if (i_ >= n_) return lo;
    return lo + static_cast<int>(d_[i_++] % static_cast<unsigned>(hi - lo + 1));
  }
  bool chance(int percent) { return range(0, 99) < percent; }
  uint64_t u64() {
    uint64_t v = 0;
    for (int k = 0; k < 8 && i_ < n_; ++k) v = v << 8 | d_[i_++];
    return v;
  }
  bool empty() const { return i_ >= n_; }

 private:
  const uint8_t* d_;
  size_t n_;
  size_t i_ = 0;
};

struct Val {
  std::string name;
  TensorType type;
};



class Generator {
 public:
  Generator(Bytes& in, const GenOptions& o) : in_(in), o_(o) {}

  GeneratedCase run() {
    GeneratedCase c;
    make_mesh();
    int params = in_.range(1, 3);
    for (int i = 0; i < params; ++i) {
      TensorType t = random_type(o_.max_rank);
      vals_.push_back({declare_param(t, true), t});
    }
    int statements = in_.range(1, o_.max_statements);
    for (int i = 0; i < statements && !in_.empty(); ++i) statement();
    // The returns: the last value, and sometimes one more.
    std::vector<std::string> rets;
    int nret = in_.chance(30) ? 2 : 1;
    for (int i = 0; i < nret; ++i) {
      const Val& v = i == 0 ? vals_.back() : vals_[static_cast<size_t>(in_.range(0, static_cast<int>(vals_.size()) - 1))];
      std::string r = v.name;
      if (in_.chance(40)) r += " " + placement(v.type.rank()).str(mesh_);
      rets.push_back(r);
    }
    c.fuse = !in_.chance(15);
    c.reorder = !in_.chance(15);
    c.decompose = in_.range(0, 2);
    c.seed = in_.u64();

    std::string text;
    if (!mesh_.dims.empty()) text += "mesh " + mesh_.str() + "\n";
    text += "graph g(";
    for (size_t i = 0; i < decls_.size(); ++i) text += (i ? ",\n        " : "") + decls_[i];
    text += ") {\n";
    for (const std::string& s : stmts_) text += "  " + s + "\n";
    text += "  return ";
    for (size_t i = 0; i < rets.size(); ++i) text += (i ? ", " : "") + rets[i];
    text += "\n}\n";
    c.text = std::move(text);
    return c;
  }

 private:
  void make_mesh() {
    switch (in_.range(0, 3)) {
      case 0: break;  // no mesh line: one rank
      case 1:
      case 2: mesh_.dims.push_back({"tp", in_.range(1, o_.max_world)}); break;
      default: {
        int64_t dp = in_.range(1, 2);
        int64_t tp = in_.range(1, std::max<int>(1, o_.max_world / static_cast<int>(dp)));
        mesh_.dims.push_back({"dp", dp});
        mesh_.dims.push_back({"tp", tp});
      }
    }
  }

  DType random_dtype() {
    static constexpr DType kPick[] = {DType::F32, DType::F32, DType::F32, DType::F32, DType::F32,
                                      DType::F16, DType::BF16, DType::I32, DType::I64, DType::Bool};
    return kPick[in_.range(0, 9)];
  }
  int64_t random_dim() { return in_.chance(3) ? 0 : in_.range(1, o_.max_dim); }
  TensorType random_type(int max_rank) {
    TensorType t;
    t.dtype = random_dtype();
    int rank = in_.range(0, max_rank);
    if (rank == 0 && in_.chance(70)) rank = 2;  // scalars are dull; matrices feed most ops
    for (int i = 0; i < rank; ++i) t.shape.push_back(random_dim());
    return t;
  }

  Placement one_placement(int rank) {
    switch (in_.range(0, 5)) {
      case 0:
      case 1:
      case 2: return Placement::replicate();
      case 3:
      case 4:
        if (rank == 0) return Placement::replicate();
        return Placement::shard(in_.range(-rank, rank - 1));
      default: return Placement::partial(static_cast<ReduceOp>(in_.range(0, 3)));
    }
  }
  PlacementSpec placement(int rank) {
    PlacementSpec s;
    for (size_t d = 0; d < std::max<size_t>(1, mesh_.dims.size()); ++d) s.per_dim.push_back(one_placement(rank));
    if (mesh_.dims.empty()) s.per_dim.clear();
    return s;
  }

  // A new param of type `t`, declared at once when `commit`, else pending until the
  // statement that needs it is accepted.
  std::string declare_param(const TensorType& t, bool commit) {
    std::string name = "p" + std::to_string(next_param_++);
    std::string decl = name + ": " + t.str();
    if (!mesh_.dims.empty() && in_.chance(50)) decl += " " + placement(t.rank()).str(mesh_);
    (commit ? decls_ : pending_).push_back(decl);
    return name;
  }

  const Val& any_val() { return vals_[static_cast<size_t>(in_.range(0, static_cast<int>(vals_.size()) - 1))]; }

  // An operand for a binary op next to `a`: a number, an existing value, or a new
  // param whose shape broadcasts against a's.
  struct Arg {
    std::string text;
    Operand op;
  };
  Arg literal() {
    static const char* kNums[] = {"2.0", "0.5", "-1", "3", "1e-3", "0", "-0.25", "1"};
    const char* s = kNums[in_.range(0, 7)];
    bool is_int = std::string(s).find_first_of(".e") == std::string::npos;
    return {s, Operand{TensorType{is_int ? DType::I64 : DType::F32, {}}, true}};
  }
  Arg val_arg(const Val& v) { return {v.name, Operand{v.type, false}}; }
  Arg fitting(const TensorType& a) {
    switch (in_.range(0, 3)) {
      case 0: return literal();
      case 1: return val_arg(any_val());
      default: {
        TensorType t;
        t.dtype = in_.chance(75) ? a.dtype : random_dtype();
        // A suffix of a's shape, some dims set to 1 (NumPy broadcasting).
        int drop = in_.range(0, a.rank());
        for (int i = drop; i < a.rank(); ++i) t.shape.push_back(in_.chance(20) ? 1 : a.shape[static_cast<size_t>(i)]);
        return {declare_param(t, false), Operand{t, false}};
      }
    }
  }
  Arg new_param(const TensorType& t) { return {declare_param(t, false), Operand{t, false}}; }

  // One statement: pick an op from the table and operands and attributes for it;
  // keep it if the op table's type rule accepts it.
  void statement() {
    std::vector<const OpInfo*> ops;
    for (const OpInfo& info : all_ops()) {
      if (info.category == OpCategory::Leaf) continue;
      if (info.category == OpCategory::Collective && info.kind != OpKind::Redistribute && !o_.explicit_collectives)
        continue;
      ops.push_back(&info);
    }
    const OpInfo& info = *ops[static_cast<size_t>(in_.range(0, static_cast<int>(ops.size()) - 1))];
    pending_.clear();
    const Val& x = any_val();
    std::vector<Arg> args;
    std::vector<std::pair<std::string, AttrValue>> attrs;
    const int r = x.type.rank();
    const Shape& s = x.type.shape;
    switch (info.category) {
      case OpCategory::Unary:
        args.push_back(val_arg(x));
        if (info.kind == OpKind::Cast) attrs.push_back({"dtype", AttrValue(random_dtype())});
        break;
      case OpCategory::Binary:
      case OpCategory::Compare:
        if (in_.chance(20)) {
          args.push_back(fitting(x.type));
          args.push_back(val_arg(x));
        } else {
          args.push_back(val_arg(x));
          args.push_back(fitting(x.type));
        }
        break;
      case OpCategory::Where: {
        TensorType c{DType::Bool, s};
        const Val* cond = nullptr;
        for (const Val& v : vals_)
          if (v.type.dtype == DType::Bool && in_.chance(50)) cond = &v;
        args.push_back(cond ? val_arg(*cond) : new_param(c));
        args.push_back(val_arg(x));
        args.push_back(fitting(x.type));
        break;
      }
      case OpCategory::Reduce: {
        args.push_back(val_arg(x));
        std::vector<int64_t> dims;
        for (int d = 0; d < r; ++d)
          if (in_.chance(40)) dims.push_back(in_.chance(30) ? d - r : d);
        if (!dims.empty() || in_.chance(50)) attrs.push_back({"dims", AttrValue(dims)});
        if (in_.chance(40)) attrs.push_back({"keepdim", AttrValue(in_.chance(50))});
        break;
      }
      case OpCategory::Matmul: {
        if (r < 2) return;
        args.push_back(val_arg(x));
        if (in_.chance(20)) {
          args.push_back(val_arg(any_val()));
        } else {
          TensorType w;
          w.dtype = x.type.dtype;
          // Batch dims: none, or a's own (or 1s, which broadcast).
          if (r > 2 && in_.chance(50))
            for (int i = 0; i < r - 2; ++i) w.shape.push_back(in_.chance(25) ? 1 : s[static_cast<size_t>(i)]);
          w.shape.push_back(s[static_cast<size_t>(r - 1)]);
          w.shape.push_back(random_dim());
          args.push_back(new_param(w));
        }
        break;
      }
      case OpCategory::Movement:
        args.push_back(val_arg(x));
        switch (info.kind) {
          case OpKind::Transpose:
            if (r == 0) return;
            attrs.push_back({"dim0", AttrValue(int64_t{in_.range(-r, r - 1)})});
            attrs.push_back({"dim1", AttrValue(int64_t{in_.range(-r, r - 1)})});
            break;
          case OpKind::Permute: {
            std::vector<int64_t> p(static_cast<size_t>(r));
            std::iota(p.begin(), p.end(), 0);
            for (int i = r - 1; i > 0; --i) std::swap(p[static_cast<size_t>(i)], p[static_cast<size_t>(in_.range(0, i))]);
            attrs.push_back({"dims", AttrValue(p)});
            break;
          }
          case OpKind::Reshape: attrs.push_back({"shape", AttrValue(reshape_of(s))}); break;
          case OpKind::Expand: attrs.push_back({"shape", AttrValue(expand_of(s))}); break;
          case OpKind::Slice:  // bounds past either end and negative ones, as Python allows
            if (r == 0) return;
            attrs.push_back({"dim", AttrValue(int64_t{in_.range(-r, r - 1)})});
            attrs.push_back({"start", AttrValue(int64_t{in_.range(-4, 4)})});
            if (in_.chance(70)) attrs.push_back({"end", AttrValue(int64_t{in_.range(-4, 8)})});
            if (in_.chance(50)) attrs.push_back({"step", AttrValue(int64_t{in_.range(1, 3)})});
            break;
          case OpKind::Concat: {  // x, then values or new params that differ from it on `dim` only
            if (r == 0) return;
            const int d = in_.range(0, r - 1);
            for (int i = 0, n = in_.range(1, 2); i < n; ++i) {
              TensorType t = x.type;
              t.shape[static_cast<size_t>(d)] = in_.chance(20) ? 0 : random_dim();
              args.push_back(in_.chance(40) ? val_arg(x) : new_param(t));
            }
            attrs.push_back({"dim", AttrValue(int64_t{in_.chance(50) ? d : d - r})});
            break;
          }
          case OpKind::Gather:       // x, then an index no larger than x off `dim`
          case OpKind::IndexSelect: {  // x, then a 1-D index
            if (r == 0) return;
            const int d = in_.range(0, r - 1);
            TensorType idx{in_.chance(50) ? DType::I32 : DType::I64, {}};
            if (info.kind == OpKind::IndexSelect) {
              idx.shape.push_back(random_dim());
            } else {
              for (int e = 0; e < r; ++e)
                idx.shape.push_back(e == d ? random_dim() : in_.range(0, static_cast<int>(s[static_cast<size_t>(e)])));
            }
            args.push_back(val_arg(x));
            args.push_back(new_param(idx));
            attrs.push_back({"dim", AttrValue(int64_t{in_.chance(50) ? d : d - r})});
            break;
          }
          default: return;
        }
        break;
      case OpCategory::Gather: {  // embedding(indices, weight)
        TensorType idx{in_.chance(50) ? DType::I32 : DType::I64, {}};
        for (int i = 0, n = in_.range(1, 2); i < n; ++i) idx.shape.push_back(random_dim());
        args.push_back(new_param(idx));
        if (r == 2 && is_float(x.type.dtype)) {
          args.push_back(val_arg(x));
        } else {
          args.push_back(new_param(TensorType{DType::F32, {in_.range(1, o_.max_dim), random_dim()}}));
        }
        break;
      }
      case OpCategory::Composite:
        args.push_back(val_arg(x));
        if (info.kind == OpKind::ScatterAdd) {  // x, an index no larger than x off `dim`, src of its shape
          if (r == 0) return;
          const int d = in_.range(0, r - 1);
          TensorType idx{DType::I64, {}};
          for (int e = 0; e < r; ++e)
            idx.shape.push_back(e == d ? random_dim() : in_.range(0, static_cast<int>(s[static_cast<size_t>(e)])));
          args.push_back(new_param(idx));
          args.push_back(new_param(TensorType{x.type.dtype, idx.shape}));
          attrs.push_back({"dim", AttrValue(int64_t{d})});
        }
        if (info.kind == OpKind::CrossEntropy) {  // logits x (classes on dim 1, 0 for rank 1), a target without that dim
          if (r == 0 || !is_float(x.type.dtype)) return;
          const size_t cd = r == 1 ? 0 : 1;
          if (s[cd] == 0) return;
          TensorType t{in_.chance(50) ? DType::I32 : DType::I64, s};
          t.shape.erase(t.shape.begin() + static_cast<std::ptrdiff_t>(cd));
          args.push_back(new_param(t));
          static const char* const kReductions[] = {"mean", "sum", "none"};
          attrs.push_back({"reduction", AttrValue(std::string(kReductions[in_.range(0, 2)]))});
          if (in_.chance(50)) attrs.push_back({"ignore_index", AttrValue(int64_t{in_.range(-1, 3)})});
        }
        if (info.kind == OpKind::Softmax || info.kind == OpKind::LogSoftmax) {
          if (in_.chance(70)) attrs.push_back({"dim", AttrValue(int64_t{in_.range(-std::max(r, 1), std::max(r, 1) - 1)})});
        } else if (info.kind == OpKind::LayerNorm || info.kind == OpKind::RmsNorm) {
          TensorType w{x.type.dtype, {}};
          for (int i = r - in_.range(1, std::max(r, 1)); i < r; ++i)
            if (i >= 0) w.shape.push_back(s[static_cast<size_t>(i)]);
          args.push_back(new_param(w));
          if (info.kind == OpKind::LayerNorm) args.push_back(new_param(w));
          if (in_.chance(30)) attrs.push_back({"eps", AttrValue(in_.chance(50) ? 1e-3 : 0.0)});
        } else if (info.kind == OpKind::ScaledDotProductAttention && r >= 3) {
          // x as q [..., Hq, L, E]; k and v new params with S keys, sometimes fewer
          // kv heads (GQA), a bool or additive mask [L, S], or causal.
          const int64_t hq = s[static_cast<size_t>(r - 3)], keys = random_dim();
          int64_t hkv = hq;
          if (hq > 1 && in_.chance(40)) {
            hkv = hq % 2 == 0 ? hq / 2 : 1;
            attrs.push_back({"enable_gqa", AttrValue(true)});
          }
          TensorType k = x.type;
          k.shape[static_cast<size_t>(r - 3)] = hkv;
          k.shape[static_cast<size_t>(r - 2)] = keys;
          TensorType v = k;
          if (in_.chance(30)) v.shape.back() = random_dim();
          args.push_back(new_param(k));
          args.push_back(new_param(v));
          if (in_.chance(30)) {
            args.push_back(new_param(TensorType{in_.chance(50) ? DType::Bool : x.type.dtype, {s[static_cast<size_t>(r - 2)], keys}}));
          } else if (in_.chance(50)) {
            attrs.push_back({"is_causal", AttrValue(true)});
          }
          if (in_.chance(20)) attrs.push_back({"scale", AttrValue(0.5)});
        }
        break;
      case OpCategory::Collective:
        args.push_back(val_arg(x));
        if (info.kind == OpKind::Redistribute) {
          PlacementSpec p = placement(r);
          if (p.per_dim.empty()) return;  // `{}` names no mesh dim
          attrs.push_back({"placements", AttrValue(p)});
        } else {
          std::string dim = mesh_.dims.empty() ? "tp" : mesh_.dims[static_cast<size_t>(in_.range(0, static_cast<int>(mesh_.dims.size()) - 1))].name;
          attrs.push_back({"mesh_dim", AttrValue(dim)});
          if (info.kind == OpKind::AllToAll) {
            attrs.push_back({"split_dim", AttrValue(int64_t{in_.range(0, std::max(r - 1, 0))})});
            attrs.push_back({"concat_dim", AttrValue(int64_t{in_.range(0, std::max(r - 1, 0))})});
          } else if (info.kind != OpKind::AllReduce) {
            attrs.push_back({"dim", AttrValue(int64_t{in_.range(0, std::max(r - 1, 0))})});
          }
        }
        break;
      case OpCategory::Generator:  // no operands: arange(end, start, step) or full(x's shape)
        if (info.kind == OpKind::Arange) {
          attrs.push_back({"end", AttrValue(int64_t{in_.range(-o_.max_dim, o_.max_dim)})});
          if (in_.chance(50)) attrs.push_back({"start", AttrValue(int64_t{in_.range(-o_.max_dim, o_.max_dim)})});
          if (in_.chance(50)) attrs.push_back({"step", AttrValue(int64_t{in_.range(-3, 3)})});
        } else {
          attrs.push_back({"shape", AttrValue(std::vector<int64_t>(s))});
          attrs.push_back({"value", AttrValue(in_.chance(50) ? 1.5 : -2.0)});
        }
        if (in_.chance(50)) attrs.push_back({"dtype", AttrValue(random_dtype())});
        break;
      case OpCategory::Positional:
        args.push_back(val_arg(x));
        if (info.kind == OpKind::Dropout) {  // p in {0, 0.25, 0.5, 1}: the edges and exact scales
          if (in_.chance(70)) attrs.push_back({"p", AttrValue(0.25 * in_.range(0, 2) * (in_.chance(20) ? 2 : 1))});
          attrs.push_back({"seed", AttrValue(int64_t{in_.range(0, 1000)})});
        } else if (in_.chance(70)) {
          attrs.push_back({"diagonal", AttrValue(int64_t{in_.range(-3, 3)})});
        }
        break;
      case OpCategory::AlongDim:  // cumsum(x, dim), argmax/argmin(x, dim, keepdim); dim out of range sometimes
        args.push_back(val_arg(x));
        attrs.push_back({"dim", AttrValue(int64_t{in_.range(-r - 1, r)})});
        if (info.kind != OpKind::Cumsum && in_.chance(40)) attrs.push_back({"keepdim", AttrValue(in_.chance(50))});
        break;
      case OpCategory::Leaf: return;
    }
    // The op table decides, as the verifier will.
    TensorType result;
    try {
      std::vector<Operand> operands;
      for (const Arg& a : args) operands.push_back(a.op);
      Attrs complete = normalize_attrs(info.kind, {}, attrs);
      result = infer_type(info.kind, operands, complete, mesh_);
    } catch (const OpError&) {
      next_param_ -= static_cast<int>(pending_.size());
      pending_.clear();
      return;
    }
    for (std::string& d : pending_) decls_.push_back(std::move(d));
    pending_.clear();
    std::string name = "v" + std::to_string(next_val_++);
    std::string call = std::string(info.name) + "(";
    for (size_t i = 0; i < args.size(); ++i) call += (i ? ", " : "") + args[i].text;
    for (size_t i = 0; i < attrs.size(); ++i)
      call += (args.empty() && i == 0 ? "" : ", ") + attrs[i].first + "=" + attr_value_str(attrs[i].second, mesh_);
    call += ")";
    std::string stmt = name + " = " + call;
    if (!mesh_.dims.empty() && in_.chance(20)) stmt += " " + placement(result.rank()).str(mesh_);
    stmts_.push_back(stmt);
    vals_.push_back({name, result});
  }

  // A shape with s's element count: its dims merged, split or reordered into
  // factors, one entry sometimes -1.
  std::vector<int64_t> reshape_of(const Shape& s) {
    int64_t n = 1;
    for (int64_t d : s) n *= d;
    std::vector<int64_t> out;
    if (n == 0) {
      out = {0, in_.range(1, 3)};
    } else {
      int64_t left = n;
      for (int i = 0, parts = in_.range(0, 3); i < parts && left > 1; ++i) {
        std::vector<int64_t> divisors;
        for (int64_t d = 2; d <= left; ++d)
          if (left % d == 0) divisors.push_back(d);
        int64_t d = divisors[static_cast<size_t>(in_.range(0, static_cast<int>(divisors.size()) - 1))];
        out.push_back(d);
        left /= d;
      }
      if (left > 1 || out.empty()) out.push_back(left);
      if (in_.chance(20)) out.insert(out.begin() + in_.range(0, static_cast<int>(out.size())), 1);
    }
    if (in_.chance(30)) out[static_cast<size_t>(in_.range(0, static_cast<int>(out.size()) - 1))] = -1;
    return out;
  }

  // A shape s expands to: size-1 dims stretched, others kept (or -1), sometimes a
  // new leading dim.
  std::vector<int64_t> expand_of(const Shape& s) {
    std::vector<int64_t> out;
    if (in_.chance(40)) out.push_back(in_.range(1, 3));
    for (int64_t d : s) out.push_back(d == 1 ? in_.range(1, 4) : (in_.chance(20) ? -1 : d));
    return out;
  }

  Bytes& in_;
  GenOptions o_;
  Mesh mesh_;
  std::vector<Val> vals_;
  std::vector<std::string> decls_, pending_, stmts_;
  int next_param_ = 0, next_val_ = 0;
};

}  // namespace

GeneratedCase generate_graph(const uint8_t* data, size_t size, const GenOptions& opts) {
  Bytes in(data, size);
  return Generator(in, opts).run();
}

}  // namespace sf::fuzz
