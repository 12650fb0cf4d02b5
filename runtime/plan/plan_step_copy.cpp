// The Plan's copy steps (runtime/plan/plan_exec.h): slice (Replicate -> Shard, one
// strided copy, or through the host when it cuts several dims), concat (a decomposed
// collective matmul joining its per-shard results) and partialize (Replicate ->
// Partial: the value on one rank, zeros on the others), on the device's compute
// stream.
#include "runtime/core/shard.h"
#include "runtime/plan/plan_exec.h"
#include "runtime/plan/plan_steps.h"

namespace sf {

namespace plan_steps {

bool is_device_step(const PlanStep& s) { return s.op == "kernel" || s.op == "partialize"; }

int64_t prod(const std::vector<int64_t>& v, size_t from, size_t to) {
  int64_t p = 1;
  for (size_t i = from; i < to && i < v.size(); ++i) p *= v[i];
  return p;
}

std::optional<Block2D> slice_block_2d(const std::vector<int64_t>& in, const std::vector<int64_t>& out,
                                      const std::vector<int64_t>& offset, size_t elem) {
  if (in.size() != out.size() || offset.size() != in.size()) return std::nullopt;
  std::optional<size_t> dim;
  for (size_t d = 0; d < in.size(); ++d) {
    if (offset[d] < 0 || offset[d] + out[d] > in[d]) return std::nullopt;
    if (offset[d] != 0 || out[d] != in[d]) {
      if (dim) return std::nullopt;  // two sliced dims: not one strided copy
      dim = d;
    }
  }
  const size_t d = dim.value_or(0);
  const size_t inner = static_cast<size_t>(prod(in, d + 1, in.size())) * elem;
  Block2D b;
  b.height = static_cast<size_t>(prod(in, 0, d));
  b.src_offset = static_cast<size_t>(in.empty() ? 0 : offset[d]) * inner;
  b.src_pitch = static_cast<size_t>(in.empty() ? 1 : in[d]) * inner;
  b.dst_pitch = static_cast<size_t>(out.empty() ? 1 : out[d]) * inner;
  b.width = b.dst_pitch;
  return b;
}

}  // namespace plan_steps

using plan_steps::Block2D;
using plan_steps::prod;
using plan_steps::slice_block_2d;

Result<void> RankExec::copy_step(size_t i) {
  const PlanStep& s = rank_->steps[i];
  if (s.op == "partialize") {
    const int in = s.in.at(0), out = s.out.at(0);
    if (bytes(out) == 0) return {};
    if (!s.keep) return dev_->zero(addr(out), bytes(out));
    if (addr(in) == addr(out)) return {};
    return dev_->copy_2d(addr(out), bytes(out), addr(in), bytes(out), bytes(out), 1);
  }
  if (s.op == "slice") {
    const PlanBuffer& ib = rank_->buffers[static_cast<size_t>(s.in.at(0))];
    const PlanBuffer& ob = rank_->buffers[static_cast<size_t>(s.out.at(0))];
    std::optional<Block2D> b = slice_block_2d(ib.shape, ob.shape, s.offset, static_cast<size_t>(dtype_size(ob.dtype)));
    if (!b) return host_slice(s);
    return dev_->copy_2d(addr(s.out.at(0)), b->dst_pitch, addr(s.in.at(0)) + b->src_offset, b->src_pitch, b->width,
                         b->height);
  }
  if (s.op == "concat") {
    // A decomposed all_gather -> matmul assembling its per-shard results: one
    // strided copy per part, into its columns of the output.
    const PlanBuffer& ob = rank_->buffers[static_cast<size_t>(s.out.at(0))];
    const int rank = static_cast<int>(ob.shape.size());
    bool fits = s.dim >= 0 && s.dim < rank;
    int64_t total = 0;
    for (int b : s.in) {
      const PlanBuffer& pb = rank_->buffers[static_cast<size_t>(b)];
      fits = fits && pb.dtype == ob.dtype && pb.shape.size() == ob.shape.size();
      for (int d = 0; fits && d < rank; ++d)
        if (d != s.dim) fits = pb.shape[static_cast<size_t>(d)] == ob.shape[static_cast<size_t>(d)];
      if (fits) total += pb.shape[static_cast<size_t>(s.dim)];
    }
    if (!fits || total != ob.shape[static_cast<size_t>(s.dim)])
      return Diag{"", {}, "the parts do not join into the output along dim " + std::to_string(s.dim)};
    const size_t d = static_cast<size_t>(s.dim);
    const size_t inner = static_cast<size_t>(prod(ob.shape, d + 1, ob.shape.size()) * dtype_size(ob.dtype));
    const size_t rows = static_cast<size_t>(prod(ob.shape, 0, d));
    size_t at = 0;
    for (int b : s.in) {
      const size_t width = static_cast<size_t>(rank_->buffers[static_cast<size_t>(b)].shape[d]) * inner;
      SF_TRY(dev_->copy_2d(addr(s.out.at(0)) + at, static_cast<size_t>(ob.shape[d]) * inner, addr(b), width,
                           width, rows));
      at += width;
    }
    return {};
  }
  return Diag{"", {}, "not a local step"};
}

Result<void> RankExec::host_slice(const PlanStep& s) {
  // A slice along several dims at once (no strided copy does it): through the host.
  Result<Tensor> x = download(s.in.at(0));
  if (!x) return x.error();
  const PlanBuffer& ob = rank_->buffers[static_cast<size_t>(s.out.at(0))];
  bool fits = s.offset.size() == ob.shape.size() && ob.shape.size() == x->shape().size();
  for (size_t d = 0; fits && d < ob.shape.size(); ++d)
    fits = s.offset[d] >= 0 && s.offset[d] + ob.shape[d] <= x->shape()[d];
  if (!fits) return Diag{"", {}, "the slice's offset and output shape do not fit its input"};
  return upload(s.out.at(0), slice_block(*x, s.offset, ob.shape));
}

}  // namespace sf
