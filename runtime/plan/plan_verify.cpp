#include "runtime/plan/plan_verify.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <map>
#include <set>
#include <sstream>

#include "runtime/core/collective_check.h"
#include "runtime/core/device_mesh.h"

namespace sf {

namespace {

// CUDA's launch limits (CUDA C Programming Guide, "Compute Capabilities": grid
// 2^31-1 x 65535 x 65535, block 1024 x 1024 x 64 and 1024 threads) and the most
// shared memory a block may have on sm_90 (227 KB).
constexpr int64_t kMaxGridX = 2147483647, kMaxGridYZ = 65535;
constexpr int64_t kMaxBlockThreads = 1024, kMaxBlockZ = 64;
constexpr int64_t kMaxSharedBytes = 227 * 1024;

// Elements of `s`, or -1 when above kMaxPlanElements (each dim was read in [0, 2^40]).
int64_t plan_numel(const Shape& s) {
  int64_t n = 1;
  bool zero = false, over = false;
  for (int64_t d : s) {
    if (d == 0) zero = true;
    else if (n > kMaxPlanElements / d) over = true;
    else n *= d;
  }
  if (zero) return 0;
  return over ? -1 : n;
}

std::string type_of(const PlanBuffer& b) { return TensorType{b.dtype, b.shape}.str(); }

struct Call {
  int rank;
  size_t step;
  CollectiveCall call;
};

}  // namespace

Result<void> verify_plan(const Plan& p, const std::string& file) {
  auto fail = [&](const std::string& path, const std::string& what) { return Diag{file, {}, path + ": " + what}; };
  if (p.world < 1 || p.world > kMaxPlanWorld)
    return fail("world", std::to_string(p.world) + " is out of range [1, " + std::to_string(kMaxPlanWorld) + "]");
  // "dp=2 tp=2" (Mesh::str) back into a Mesh, its product checked against the world.
  Mesh mesh;
  {
    std::istringstream in(p.mesh);
    std::string tok;
    int64_t product = 1;
    while (in >> tok) {
      const size_t eq = tok.find('=');
      int64_t n = 0;
      bool ok = eq != std::string::npos && eq > 0 && eq + 1 < tok.size() && tok.size() - eq - 1 <= 6;
      for (size_t i = eq + 1; ok && i < tok.size(); ++i) ok = tok[i] >= '0' && tok[i] <= '9';
      if (ok) n = std::stoll(tok.substr(eq + 1));
      if (!ok || n < 1 || n > kMaxPlanWorld)
        return fail("mesh", "\"" + p.mesh + "\" is not a list of name=size with sizes in [1, " +
                                std::to_string(kMaxPlanWorld) + "]");
      const std::string name = tok.substr(0, eq);
      if (mesh.find(name)) return fail("mesh", "\"" + p.mesh + "\" names " + name + " twice");
      product *= n;  // <= 2^16 per factor, and refused once above the world: no overflow
      if (product > p.world) break;
      mesh.dims.push_back({name, n});
    }
    if (product != p.world)
      return fail("mesh", "\"" + p.mesh + "\" is not a mesh of the world's " + std::to_string(p.world) + " rank(s)");
  }
  const DeviceMesh dm(mesh);
  if (static_cast<int64_t>(p.ranks.size()) != p.world)
    return fail("ranks", std::to_string(p.ranks.size()) + " rank(s) for a world of " + std::to_string(p.world));
  for (size_t r = 0; r < p.ranks.size(); ++r)
    if (p.ranks[r].rank != static_cast<int>(r)) {
      std::string why = "is " + std::to_string(p.ranks[r].rank) + ", but the ranks are listed in order: ranks[" +
                        std::to_string(r) + "] is rank " + std::to_string(r);
      for (size_t q = 0; q < r; ++q)
        if (p.ranks[q].rank == p.ranks[r].rank) why = "rank " + std::to_string(p.ranks[r].rank) + " appears twice (also ranks[" + std::to_string(q) + "])";
      return fail("ranks[" + std::to_string(r) + "].rank", why);
    }

  std::map<std::string, size_t> kernel_index;
  for (size_t k = 0; k < p.kernels.size(); ++k) {
    const PlanKernel& pk = p.kernels[k];
    const std::string path = "kernels[" + std::to_string(k) + "]";
    if (pk.id.empty()) return fail(path + ".id", "is empty");
    if (!kernel_index.emplace(pk.id, k).second)
      return fail(path + ".id", "\"" + pk.id + "\" is also kernels[" + std::to_string(kernel_index[pk.id]) + "]'s id");
    if (pk.entry.empty()) return fail(path + ".entry", "is empty");
    if (pk.grid[0] > kMaxGridX || pk.grid[1] > kMaxGridYZ || pk.grid[2] > kMaxGridYZ || pk.grid[0] < 0 ||
        pk.grid[1] < 0 || pk.grid[2] < 0)
      return fail(path + ".grid", "beyond CUDA's grid limits (2^31-1, 65535, 65535)");
    if (pk.cluster < 1 || pk.grid[0] % pk.cluster != 0)
      return fail(path + ".cluster", std::to_string(pk.cluster) + " does not divide grid[0] = " + std::to_string(pk.grid[0]) +
                                         " (a launch is whole clusters)");
    const int64_t threads = int64_t{pk.block[0]} * pk.block[1] * pk.block[2];
    if (pk.block[0] < 1 || pk.block[1] < 1 || pk.block[2] < 1 || pk.block[2] > kMaxBlockZ ||
        pk.block[0] > kMaxBlockThreads || pk.block[1] > kMaxBlockThreads || threads > kMaxBlockThreads)
      return fail(path + ".block", "beyond CUDA's block limits (1024 threads; z at most 64)");
    if (pk.shared_bytes < 0 || pk.shared_bytes > kMaxSharedBytes)
      return fail(path + ".shared_bytes", std::to_string(pk.shared_bytes) + " is out of range [0, " +
                                              std::to_string(kMaxSharedBytes) + "]");
  }

  // Every launch of one kernel passes buffers of the same types (its PTX has one
  // set of shapes baked in): the first launch seen, and where.
  std::map<std::string, std::pair<std::string, std::string>> kernel_args;
  std::vector<Call> calls;
  for (const PlanRank& r : p.ranks) {
    const std::string rpath = "ranks[" + std::to_string(r.rank) + "]";
    const int nbuf = static_cast<int>(r.buffers.size());
    auto buf = [&](int b) -> const PlanBuffer& { return r.buffers[static_cast<size_t>(b)]; };
    auto bpath = [&](int b) { return rpath + ".buffers[" + std::to_string(b) + "]"; };
    for (int b = 0; b < nbuf; ++b) {
      for (int64_t d : buf(b).shape)
        if (d < 0) return fail(bpath(b) + ".shape", "has the negative dim " + std::to_string(d));
      if (plan_numel(buf(b).shape) < 0)
        return fail(bpath(b) + ".shape", type_of(buf(b)) + " has more than 2^40 elements, the limit of a Plan buffer");
    }
    auto count = [&](size_t have, size_t want, const std::string& what, const std::string& of) -> Result<void> {
      if (have == want) return {};
      return fail(rpath + "." + what, std::to_string(have) + " entries for the graph's " + std::to_string(want) + " " + of);
    };
    SF_TRY(count(r.inputs.size(), p.params.size(), "inputs", "param(s)"));
    SF_TRY(count(r.input_specs.size(), p.params.size(), "input_placements", "param(s)"));
    SF_TRY(count(r.outputs.size(), p.outputs.size(), "outputs", "output(s)"));
    SF_TRY(count(r.output_specs.size(), p.outputs.size(), "output_placements", "output(s)"));
    for (int b : r.inputs)
      if (b < 0 || b >= nbuf) return fail(rpath + ".inputs", "buffer " + std::to_string(b) + " does not exist");
    for (int b : r.outputs)
      if (b < 0 || b >= nbuf) return fail(rpath + ".outputs", "buffer " + std::to_string(b) + " does not exist");

    std::vector<bool> written(static_cast<size_t>(nbuf), false);
    for (int b : r.inputs) written[static_cast<size_t>(b)] = true;
    struct Open {
      size_t step;
      TensorType result;
    };
    std::map<int, Open> open;  // handle -> its start
    for (size_t i = 0; i < r.steps.size(); ++i) {
      const PlanStep& s = r.steps[i];
      const std::string spath = rpath + ".steps[" + std::to_string(i) + "]";
      const std::optional<CollectiveKind> coll = s.collective();
      const bool known = coll || s.op == "kernel" || s.op == "wait" || s.op == "slice" || s.op == "partialize" ||
                         s.op == "concat" || s.op == "gemm";
      if (!known) return fail(spath + ".op", "unknown op \"" + s.op + "\"");
      const std::string want_stream = coll ? "comm" : "compute";
      if (s.stream != want_stream)
        return fail(spath + ".stream", "\"" + s.stream + "\": a " + s.op + " step runs on the " + want_stream + " stream");
      for (size_t k = 0; k < s.in.size(); ++k) {
        const int b = s.in[k];
        if (b < 0 || b >= nbuf) return fail(spath + ".in", "buffer " + std::to_string(b) + " does not exist");
        if (!written[static_cast<size_t>(b)])
          return fail(spath + ".in[" + std::to_string(k) + "]", "reads buffer " + std::to_string(b) + " (" +
                                                                   buf(b).name + ") before any step writes it");
      }
      for (int b : s.out)
        if (b < 0 || b >= nbuf) return fail(spath + ".out", "buffer " + std::to_string(b) + " does not exist");
      auto arity = [&](size_t in, size_t out) -> Result<void> {
        if (s.in.size() != in || s.out.size() != out)
          return fail(spath, "a " + s.op + " step takes " + std::to_string(in) + " \"in\" and " + std::to_string(out) +
                                 " \"out\" buffer(s), not " + std::to_string(s.in.size()) + " and " +
                                 std::to_string(s.out.size()));
        return {};
      };
      auto same_dtype = [&](int a, int b) -> Result<void> {
        if (buf(a).dtype == buf(b).dtype) return {};
        return fail(spath, s.op + " from " + type_of(buf(a)) + " into " + type_of(buf(b)) + ": the dtypes differ");
      };
      if (s.op == "kernel") {
        if (!kernel_index.count(s.kernel)) return fail(spath + ".kernel", "unknown kernel \"" + s.kernel + "\"");
        if (s.out.empty()) return fail(spath + ".out", "a kernel step writes at least one buffer");
        std::string sig;
        for (int b : s.in) sig += type_of(buf(b)) + " ";
        sig += "->";
        for (int b : s.out) sig += " " + type_of(buf(b));
        auto [it, first] = kernel_args.emplace(s.kernel, std::make_pair(sig, spath));
        if (!first && it->second.first != sig)
          return fail(spath, "launches kernel " + s.kernel + " on " + sig + ", but " + it->second.second +
                                 " launches it on " + it->second.first + " (a kernel is compiled for one set of shapes)");
        // A TMA copy reads anywhere its tensor map reaches: every map must lie inside
        // the input buffer it is encoded over, in that buffer's dtype.
        const PlanKernel& pk = p.kernels[kernel_index.at(s.kernel)];
        for (size_t mi = 0; mi < pk.tensor_maps.size(); ++mi) {
          const PlanTensorMap& m = pk.tensor_maps[mi];
          const std::string mpath = "kernels[" + std::to_string(kernel_index.at(s.kernel)) + "].tensor_maps[" +
                                    std::to_string(mi) + "]";
          // A TMA store's map (over an output) writes anywhere it reaches, an input's reads.
          const bool store = m.output >= 0;
          const std::vector<int>& side = store ? s.out : s.in;
          const int which = store ? m.output : m.input;
          const std::string role = store ? "output" : "input";
          if (which < 0 || which >= static_cast<int>(side.size()))
            return fail(mpath + "." + role, std::to_string(which) + " is not an " + role + " of " + spath + " (it has " +
                                                std::to_string(side.size()) + ")");
          const PlanBuffer& b = buf(side[static_cast<size_t>(which)]);
          if (b.dtype != m.dtype)
            return fail(mpath + ".dtype", std::string(dtype_name(m.dtype)) + ", but " + spath + "'s " + role + " " +
                                              std::to_string(which) + " is " + type_of(b));
          // The last byte the map can address, in 128-bit arithmetic (each term < 2^72).
          __int128 reach = static_cast<__int128>(m.dims[0]) * dtype_size(m.dtype);
          for (int d = 1; d < m.rank; ++d)
            reach += static_cast<__int128>(m.dims[static_cast<size_t>(d)] - 1) * m.strides[static_cast<size_t>(d - 1)];
          const __int128 have = static_cast<__int128>(numel(b.shape)) * dtype_size(b.dtype);
          const std::string shown = reach > static_cast<__int128>(UINT64_MAX)
                                        ? std::string("over 2^64")
                                        : std::to_string(static_cast<unsigned long long>(reach));
          if (reach > have)
            return fail(mpath, "reaches " + shown + " bytes into " + spath +
                                   "'s " + role + " " + std::to_string(which) + ", which holds " +
                                   std::to_string(static_cast<long long>(have)) + " (" + type_of(b) + ")");
        }
      } else if (s.op == "gemm") {
        // The library reads and writes what these fields say: every one is checked
        // against the buffers, and C must be a buffer of its own (cuBLAS does not
        // allow C to overlap A, B or the bias).
        if (s.out.size() != 1) return fail(spath + ".out", "a gemm step writes one buffer (C)");
        std::vector<TensorType> in;
        for (int b : s.in) in.push_back(TensorType{buf(b).dtype, buf(b).shape});
        const PlanBuffer& c = buf(s.out[0]);
        if (std::optional<GemmIssue> why = gemm_check(s.gemm.desc, in, TensorType{c.dtype, c.shape}))
          return fail(spath + "." + why->field, why->message);
        for (size_t k = 0; k < s.in.size(); ++k)
          if (s.in[k] == s.out[0])
            return fail(spath + ".out[0]", "C is buffer " + std::to_string(s.out[0]) + ", which in[" +
                                               std::to_string(k) + "] also is (the library does not write in place)");
      } else if (coll) {
        SF_TRY(arity(1, 0));
        if (s.handle < 0) return fail(spath + ".handle", "a collective needs a handle (>= 0)");
        if (open.count(s.handle))
          return fail(spath + ".handle", std::to_string(s.handle) + " is started again before its wait");
        const std::optional<int> md = mesh.find(s.mesh_dim);
        if (!md) return fail(spath + ".mesh_dim", "\"" + s.mesh_dim + "\" is not a dim of the mesh \"" + p.mesh + "\"");
        for (size_t k = 0; k < s.group.size(); ++k)
          if (s.group[k] < 0 || s.group[k] >= p.world)
            return fail(spath + ".group[" + std::to_string(k) + "]",
                        "rank " + std::to_string(s.group[k]) + " is outside the world of " + std::to_string(p.world));
        const std::vector<int> group = dm.group(r.rank, *md);
        if (s.group != group) {
          std::string want;
          for (int g : group) want += (want.empty() ? "" : ", ") + std::to_string(g);
          return fail(spath + ".group", "is not rank " + std::to_string(r.rank) + "'s group along " + s.mesh_dim +
                                            " ([" + want + "])");
        }
        CollectiveCall c;
        c.kind = *coll;
        if (!s.reduce_op.empty()) {
          std::optional<ReduceOp> op = parse_reduce_op(s.reduce_op);
          if (!op) return fail(spath + ".reduce_op", "unknown reduction \"" + s.reduce_op + "\"");
          c.op = *op;
        } else if (*coll == CollectiveKind::AllReduce || *coll == CollectiveKind::ReduceScatter) {
          return fail(spath, "a " + s.op + " needs a \"reduce_op\"");
        }
        c.dim = s.dim;
        c.dim2 = s.dim2;
        c.sizes = s.sizes;
        c.sizes2 = s.sizes2;
        c.in = TensorType{buf(s.in[0]).dtype, buf(s.in[0]).shape};
        c.members = static_cast<int>(group.size());
        c.member = static_cast<int>(std::find(group.begin(), group.end(), r.rank) - group.begin());
        Result<TensorType> result = collective_result(c);
        if (!result) return fail(spath, s.op + " of " + c.in.str() + ": " + result.error().message);
        if (plan_numel(result->shape) < 0) return fail(spath, s.op + " gives " + result->str() + ", over 2^40 elements");
        open.emplace(s.handle, Open{i, *result});
        calls.push_back({r.rank, i, std::move(c)});
      } else if (s.op == "wait") {
        SF_TRY(arity(0, 1));
        auto it = open.find(s.handle);
        if (it == open.end())
          return fail(spath + ".handle", "waits for handle " + std::to_string(s.handle) + ", which no earlier step started");
        const PlanBuffer& ob = buf(s.out[0]);
        if (TensorType{ob.dtype, ob.shape} != it->second.result)
          return fail(spath + ".out", "buffer " + std::to_string(s.out[0]) + " is " + type_of(ob) + ", but the " +
                                          r.steps[it->second.step].op + " started at step " +
                                          std::to_string(it->second.step) + " gives " + it->second.result.str());
        open.erase(it);
      } else if (s.op == "slice") {
        SF_TRY(arity(1, 1));
        SF_TRY(same_dtype(s.in[0], s.out[0]));
        const Shape& is = buf(s.in[0]).shape;
        const Shape& os = buf(s.out[0]).shape;
        bool fits = s.offset.size() == is.size() && os.size() == is.size();
        for (size_t d = 0; fits && d < is.size(); ++d)
          fits = s.offset[d] >= 0 && s.offset[d] <= is[d] && os[d] <= is[d] - s.offset[d];
        if (!fits)
          return fail(spath + ".offset", "a block of " + type_of(buf(s.out[0])) + " at this offset does not fit in " +
                                             type_of(buf(s.in[0])));
      } else if (s.op == "partialize") {
        SF_TRY(arity(1, 1));
        if (buf(s.in[0]).dtype != buf(s.out[0]).dtype || buf(s.in[0]).shape != buf(s.out[0]).shape)
          return fail(spath, "partialize from " + type_of(buf(s.in[0])) + " into " + type_of(buf(s.out[0])));
      } else if (s.op == "concat") {
        if (s.in.empty() || s.out.size() != 1) return fail(spath, "a concat joins one or more \"in\" into one \"out\"");
        const PlanBuffer& ob = buf(s.out[0]);
        const int rank = static_cast<int>(ob.shape.size());
        if (s.dim < 0 || s.dim >= rank) return fail(spath + ".dim", std::to_string(s.dim) + " is not a dim of " + type_of(ob));
        int64_t total = 0;
        for (int b : s.in) {
          SF_TRY(same_dtype(b, s.out[0]));
          const Shape& ps = buf(b).shape;
          bool fits = ps.size() == ob.shape.size();
          for (int d = 0; fits && d < rank; ++d)
            if (d != s.dim) fits = ps[static_cast<size_t>(d)] == ob.shape[static_cast<size_t>(d)];
          if (!fits) return fail(spath, "part " + type_of(buf(b)) + " does not join into " + type_of(ob) + " along dim " + std::to_string(s.dim));
          total += ps[static_cast<size_t>(s.dim)];  // each <= 2^40, at most 2^24 parts
        }
        if (total != ob.shape[static_cast<size_t>(s.dim)])
          return fail(spath, "the parts add up to " + std::to_string(total) + " along dim " + std::to_string(s.dim) +
                                 " of " + type_of(ob));
      }
      for (int b : s.out) written[static_cast<size_t>(b)] = true;
    }
    if (!open.empty()) {
      const size_t at = open.begin()->second.step;
      return fail(rpath + ".steps[" + std::to_string(at) + "]", r.steps[at].op + " is started but never waited for");
    }
    for (size_t o = 0; o < r.outputs.size(); ++o)
      if (!written[static_cast<size_t>(r.outputs[o])])
        return fail(rpath + ".outputs[" + std::to_string(o) + "]",
                    "buffer " + std::to_string(r.outputs[o]) + " is never written");
  }

  // The collectives of each group meet in order (as Gloo's and NCCL's do): the
  // k-th a member issues along a mesh dim meets the k-th of every other member.
  for (int d = 0; d < dm.ndim(); ++d) {
    const std::string& dname = mesh.dims[static_cast<size_t>(d)].name;
    std::vector<std::vector<const Call*>> seq(p.ranks.size());
    for (const Call& c : calls)
      if (p.ranks[static_cast<size_t>(c.rank)].steps[c.step].mesh_dim == dname) seq[static_cast<size_t>(c.rank)].push_back(&c);
    for (const std::vector<int>& group : dm.groups(d)) {
      const int a = group.front();
      const auto& sa = seq[static_cast<size_t>(a)];
      for (int b : group) {
        const auto& sb = seq[static_cast<size_t>(b)];
        auto where = [](const Call& c) {
          return "ranks[" + std::to_string(c.rank) + "].steps[" + std::to_string(c.step) + "]";
        };
        for (size_t k = 0; k < std::min(sa.size(), sb.size()); ++k)
          if (std::optional<std::string> why = collective_mismatch(sa[k]->call, sb[k]->call))
            return fail(where(*sb[k]), "does not match " + where(*sa[k]) + " (collective " + std::to_string(k) +
                                           " along " + dname + "): " + *why);
        if (sa.size() != sb.size()) {
          const Call& extra = sa.size() > sb.size() ? *sa[sb.size()] : *sb[sa.size()];
          const int missing = sa.size() > sb.size() ? b : a;
          return fail(where(extra), p.ranks[static_cast<size_t>(extra.rank)].steps[extra.step].op +
                                        " along " + dname + " has no partner on rank " + std::to_string(missing) +
                                        " (rank " + std::to_string(a) + " issues " + std::to_string(sa.size()) +
                                        " collective(s) along it, rank " + std::to_string(b) + " " +
                                        std::to_string(sb.size()) + ")");
        }
      }
    }
  }
  return {};
}

int ptx_entry_params(const std::string& ptx, const std::string& entry) {
  const std::string needle = ".entry " + entry;
  for (size_t at = ptx.find(needle); at != std::string::npos; at = ptx.find(needle, at + 1)) {
    size_t i = at + needle.size();
    while (i < ptx.size() && (ptx[i] == ' ' || ptx[i] == '\t' || ptx[i] == '\n' || ptx[i] == '\r')) ++i;
    if (i >= ptx.size() || ptx[i] != '(') continue;
    const size_t close = ptx.find(')', i);
    if (close == std::string::npos) return -1;
    int n = 0;
    for (size_t p = ptx.find(".param", i); p != std::string::npos && p < close; p = ptx.find(".param", p + 1)) ++n;
    return n;
  }
  return -1;
}

Result<void> verify_kernel_arity(const Plan& p, const std::string& kernel_id, int params,
                                 const std::string& ptx_file) {
  size_t maps = 0, workspace = 0;  // tensor maps follow the outputs, then the workspace
  for (const PlanKernel& k : p.kernels)
    if (k.id == kernel_id) {
      maps = k.tensor_maps.size();
      workspace = k.workspace_bytes > 0 ? 1 : 0;
    }
  for (const PlanRank& r : p.ranks)
    for (size_t i = 0; i < r.steps.size(); ++i) {
      const PlanStep& s = r.steps[i];
      if (s.op != "kernel" || s.kernel != kernel_id) continue;
      const size_t args = s.in.size() + s.out.size() + maps + workspace;
      if (static_cast<int>(args) != params)
        return Diag{ptx_file, {}, "kernel " + kernel_id + "'s entry takes " + std::to_string(params) +
                                      " pointer(s), but plan.json's ranks[" + std::to_string(r.rank) + "].steps[" +
                                      std::to_string(i) + "] passes " + std::to_string(s.in.size() + s.out.size()) +
                                      " buffer(s)" + (maps ? " and " + std::to_string(maps) + " tensor map(s)" : std::string()) +
                                      (workspace ? " and a workspace" : "")};
    }
  return {};
}

}  // namespace sf
