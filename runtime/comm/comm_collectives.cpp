// The collectives of the Gloo backend: Comm::Impl's all_gather, reduce_scatter,
// all_reduce and all_to_all as the comm thread runs them, each opening with the
// header exchange (Comm::Impl::agree, runtime/comm/comm.cpp) and then moving its data
// in one or two phases (gather_chunks, reduce_chunks, or one exchange), packed
// and reduced with runtime/comm/comm_wire.cpp's helpers.
#include "runtime/comm/comm_internal.h"

#include <cstring>
#include <numeric>

namespace sf {

using comm_detail::DimView;
using comm_detail::Fnv;
using comm_detail::from_wire;
using comm_detail::pack_split;
using comm_detail::Reducer;
using comm_detail::reducer;
using comm_detail::to_wire;
using comm_detail::unpack_concat;
using comm_detail::view_at;

// ---------------------------------------------------------------------------------
// Data phases shared by the collectives
// ---------------------------------------------------------------------------------

void Comm::Impl::gather_chunks(Group& g, uint64_t seq, int phase, std::byte* buf, size_t size,
                               const std::vector<size_t>& chunk_bytes) {
  std::vector<size_t> off(chunk_bytes.size(), 0);
  for (size_t k = 1; k < off.size(); ++k) off[k] = off[k - 1] + chunk_bytes[k - 1];
  std::vector<Transfer> sends, recvs;
  const size_t me = static_cast<size_t>(g.me);
  for (size_t p = 0; p < chunk_bytes.size(); ++p) {
    if (p == me) continue;
    sends.push_back({static_cast<int>(p), off[me], chunk_bytes[me]});
    recvs.push_back({static_cast<int>(p), off[p], chunk_bytes[p]});
  }
  exchange(g, seq, phase, buf, size, sends, buf, size, recvs);
}

std::vector<std::byte> Comm::Impl::reduce_chunks(Group& g, uint64_t seq, int phase, std::byte* packed,
                                                 size_t packed_size, const std::vector<size_t>& counts, DType t,
                                                 ReduceOp op) {
  const size_t n = counts.size(), me = static_cast<size_t>(g.me);
  const size_t esize = static_cast<size_t>(dtype_size(t));
  const size_t mine = counts[me] * esize;
  std::vector<size_t> off(n, 0);
  for (size_t k = 1; k < n; ++k) off[k] = off[k - 1] + counts[k - 1] * esize;
  std::vector<std::byte> got(n * mine);  // slot p: p's contribution
  std::vector<Transfer> sends, recvs;
  for (size_t p = 0; p < n; ++p) {
    if (p == me) continue;
    sends.push_back({static_cast<int>(p), off[p], counts[p] * esize});
    recvs.push_back({static_cast<int>(p), p * mine, mine});
  }
  if (mine) std::memcpy(got.data() + me * mine, packed + off[me], mine);
  exchange(g, seq, phase, packed, packed_size, sends, got.data(), got.size(), recvs);
  const int64_t count = static_cast<int64_t>(counts[me]);
  std::vector<std::byte> acc(counts[me] * 8), next(counts[me] * 8);
  const Reducer f = reducer(op, is_float(t));
  for (size_t p = 0; p < n; ++p) {
    to_wire(got.data() + p * mine, t, count, p == 0 ? acc.data() : next.data());
    if (p > 0) f(acc.data(), next.data(), counts[me]);
  }
  return acc;
}

// ---------------------------------------------------------------------------------
// The collectives (comm thread)
// ---------------------------------------------------------------------------------

Result<Tensor> Comm::Impl::identity(Op& op) {
  // A group of one; validate() made sure the sizes describe `local` itself.
  return std::move(op.local);
}

Tensor Comm::Impl::execute(Op& op, Group& g, uint64_t seq) {
  switch (op.kind) {
    case CollectiveKind::AllGather: return all_gather(op, g, seq);
    case CollectiveKind::ReduceScatter: return reduce_scatter(op, g, seq);
    case CollectiveKind::AllReduce: return all_reduce(op, g, seq);
    case CollectiveKind::AllToAll: return all_to_all(op, g, seq);
  }
  return {};
}

Tensor Comm::Impl::all_gather(Op& op, Group& g, uint64_t seq) {
  const Tensor& x = op.local;
  const size_t n = g.ranks.size(), me = static_cast<size_t>(g.me);
  Shape shape = x.shape();
  shape[static_cast<size_t>(op.dim)] = std::accumulate(op.sizes.begin(), op.sizes.end(), int64_t{0});
  const int64_t esize = dtype_size(x.dtype());
  DimView v = view_at(shape, op.dim, esize);
  std::vector<size_t> chunk(n);
  for (size_t k = 0; k < n; ++k) chunk[k] = static_cast<size_t>(v.outer * op.sizes[k] * v.inner_bytes);
  Shape agreed = shape;
  Fnv fp;
  fp.add(op.dim).add_all(agreed).add_all(op.sizes);
  agree(g, seq, op, fp.h, std::vector<size_t>(n, chunk[me]), chunk);

  Tensor out(x.dtype(), shape);
  // Along dim 0 (or below leading dims of extent 1) the result is the members'
  // buffers one after the other: receive straight into it.
  const bool direct = v.outer == 1;
  std::vector<std::byte> scratch(direct ? 0 : out.nbytes());
  std::byte* buf = direct ? out.data() : scratch.data();
  size_t my_off = 0;
  for (size_t k = 0; k < me; ++k) my_off += chunk[k];
  if (x.nbytes()) std::memcpy(buf + my_off, x.data(), x.nbytes());
  gather_chunks(g, seq, 1, buf, out.nbytes(), chunk);
  if (!direct) unpack_concat(buf, op.sizes, out.data(), shape, esize, op.dim);
  return out;
}

Tensor Comm::Impl::reduce_scatter(Op& op, Group& g, uint64_t seq) {
  const Tensor& x = op.local;
  const size_t n = g.ranks.size(), me = static_cast<size_t>(g.me);
  const int64_t esize = dtype_size(x.dtype());
  DimView v = view_at(x.shape(), op.dim, 1);  // inner in elements
  std::vector<size_t> counts(n), bytes_to(n);
  for (size_t k = 0; k < n; ++k) {
    counts[k] = static_cast<size_t>(v.outer * op.sizes[k] * v.inner_bytes);
    bytes_to[k] = counts[k] * static_cast<size_t>(esize);
  }
  Fnv fp;
  fp.add(op.dim).add_all(x.shape()).add_all(op.sizes);
  agree(g, seq, op, fp.h, bytes_to, std::vector<size_t>(n, bytes_to[me]));

  std::vector<std::byte> packed = pack_split(x.data(), x.shape(), esize, op.dim, op.sizes);
  std::vector<std::byte> mine = reduce_chunks(g, seq, 1, packed.data(), packed.size(), counts, x.dtype(), op.reduce);
  Shape s = x.shape();
  s[static_cast<size_t>(op.dim)] = op.sizes[me];
  return from_wire(mine.data(), x.dtype(), s, op.reduce, static_cast<int64_t>(n));
}

Tensor Comm::Impl::all_reduce(Op& op, Group& g, uint64_t seq) {
  Tensor& x = op.local;
  const size_t n = g.ranks.size(), me = static_cast<size_t>(g.me);
  const size_t total = static_cast<size_t>(x.numel());
  const size_t esize = static_cast<size_t>(dtype_size(x.dtype()));
  std::vector<size_t> counts(n), bytes(n);
  for (size_t k = 0; k < n; ++k) {
    counts[k] = total / n + (k < total % n ? 1 : 0);
    bytes[k] = counts[k] * esize;
  }
  Fnv fp;
  fp.add_all(x.shape());
  agree(g, seq, op, fp.h, bytes, std::vector<size_t>(n, bytes[me]));

  // The flat chunks are contiguous: x itself is the packed buffer (ours to use,
  // it was moved in).
  std::vector<std::byte> mine = reduce_chunks(g, seq, 1, x.data(), x.nbytes(), counts, x.dtype(), op.reduce);
  Tensor reduced = from_wire(mine.data(), x.dtype(), {static_cast<int64_t>(counts[me])}, op.reduce,
                             static_cast<int64_t>(n));
  Tensor out(x.dtype(), x.shape());
  size_t my_off = 0;
  for (size_t k = 0; k < me; ++k) my_off += bytes[k];
  if (reduced.nbytes()) std::memcpy(out.data() + my_off, reduced.data(), reduced.nbytes());
  gather_chunks(g, seq, 2, out.data(), out.nbytes(), bytes);
  return out;
}

Tensor Comm::Impl::all_to_all(Op& op, Group& g, uint64_t seq) {
  const Tensor& x = op.local;
  const size_t n = g.ranks.size(), me = static_cast<size_t>(g.me);
  const int64_t esize = dtype_size(x.dtype());
  Shape shape = x.shape();
  shape[static_cast<size_t>(op.dim)] = op.sizes[me];
  shape[static_cast<size_t>(op.dim2)] = std::accumulate(op.sizes2.begin(), op.sizes2.end(), int64_t{0});
  // To member k: local's shape with split_dim = send_sizes[k]. From member k: the
  // result's shape with concat_dim = recv_sizes[k].
  std::vector<size_t> to(n), from(n), send_off(n, 0), recv_off(n, 0);
  for (size_t k = 0; k < n; ++k) {
    Shape s = x.shape();
    s[static_cast<size_t>(op.dim)] = op.sizes[k];
    to[k] = static_cast<size_t>(numel(s) * esize);
    Shape r = shape;
    r[static_cast<size_t>(op.dim2)] = op.sizes2[k];
    from[k] = static_cast<size_t>(numel(r) * esize);
    if (k) {
      send_off[k] = send_off[k - 1] + to[k - 1];
      recv_off[k] = recv_off[k - 1] + from[k - 1];
    }
  }
  // The members agree on the dims and on the extents other than split/concat;
  // the sizes only pairwise, which the byte counts in the headers check.
  Shape others = x.shape();
  others[static_cast<size_t>(op.dim)] = -1;
  others[static_cast<size_t>(op.dim2)] = -1;
  Fnv fp;
  fp.add(op.dim).add(op.dim2).add_all(others);
  agree(g, seq, op, fp.h, to, from);

  std::vector<std::byte> send = pack_split(x.data(), x.shape(), esize, op.dim, op.sizes);
  Tensor out(x.dtype(), shape);
  std::vector<std::byte> recv(out.nbytes());
  if (to[me]) std::memcpy(recv.data() + recv_off[me], send.data() + send_off[me], to[me]);
  std::vector<Transfer> sends, recvs;
  for (size_t p = 0; p < n; ++p) {
    if (p == me) continue;
    sends.push_back({static_cast<int>(p), send_off[p], to[p]});
    recvs.push_back({static_cast<int>(p), recv_off[p], from[p]});
  }
  exchange(g, seq, 1, send.data(), send.size(), sends, recv.data(), recv.size(), recvs);
  unpack_concat(recv.data(), op.sizes2, out.data(), shape, esize, op.dim2);
  return out;
}

}  // namespace sf
