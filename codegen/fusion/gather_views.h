// Per rank, before fusion: a transpose or permute whose only reader is an all-gather
// moves after it. all_gather(permute(x), dim d) is permute(all_gather(x, dim p[d]))
// for the permutation p (result dim d is operand dim p[d]): the same members' blocks
// along the same global dim. A collective reads a dense buffer, so before the move
// the permute was a copy kernel of its own (FSDP's transposed weight shard, or
// RowwiseParallel's weight all-gathered when propagation prefers that to a
// reduce-scatter of the product); after it, the permute is a view of the gathered
// value that the matmul reading it takes in place. Every rank is rewritten alike.
#pragma once

#include "codegen/dist/local_program.h"

namespace sf {

LocalProgram gather_before_views(LocalProgram p);

}  // namespace sf
