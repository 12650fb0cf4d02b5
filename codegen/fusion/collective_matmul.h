// Collective-matmul decomposition (PyTorch's async TP fused_all_gather_matmul /
// fused_matmul_reduce_scatter, XLA's windowed einsum), on every rank's unfused
// program before fusion:
//
//   all_gather(x) -> [unary/broadcast ops] -> matmul(., W) -> [epilogue ops]
//     becomes n steps around the ring: step s computes the rows of shard
//     (rank + s) mod n while that shard moves on to the previous rank and the
//     next one arrives (a ring shift: an all_to_all with one non-empty chunk);
//     a concat assembles the result.
//   all_gather(w) -> [cast, transpose] -> matmul(X, .) -> [epilogue ops]
//     (FSDP's weight gather, along the matmul's N dim) likewise: step s computes
//     the column block of shard (rank + s) mod n.
//   An operand of an epilogue op that varies along the shard dim (a residual along
//   the rows, a bias along the columns) is sliced to each shard.
//   matmul(x, W) -> reduce_scatter(sum)
//     becomes n steps: step s computes the partial rows of chunk
//     j = (rank + s + 1) mod n and sends them straight to rank j while the next
//     chunk is computed; the last step computes the rank's own chunk and adds the
//     n - 1 chunks received to it, all but the last in its epilogue (PyTorch's
//     fused_matmul_reduce_scatter: produce, all-to-all, reduce locally).
//   matmul(x, W) -> all_reduce(sum)   (Megatron's rowwise linear)
//     becomes reduce_scatter + all_gather along the matmul's row dim M (the two
//     halves of a ring all-reduce); the reduce_scatter is then decomposed as
//     above, so half of the all-reduce's traffic hides behind the matmul, and the
//     all_gather of the reduced chunks follows as a plain collective.
//   In both, the matmul's result may have terms added before the collective (a
//   partialised residual or bias): each chunk adds its rows of them.
//
// Each step's compute overlaps the shift in flight (the scheduler issues shifts as
// early as their operand exists). The shard dim must not be the contracted one.
#pragma once

#include <string>
#include <vector>

#include "codegen/dist/local_program.h"
#include "codegen/dist/redistribute.h"
#include "autotune/perf_model.h"
#include <optional>

namespace sf {

enum class DecomposeMode { Auto, Always, Never };
// "auto", "always", "never"; nullopt for anything else.
std::optional<DecomposeMode> parse_decompose_mode(const std::string& s);

struct DecomposeOptions {
  DecomposeMode mode = DecomposeMode::Auto;
  // Auto: the estimates that decide (docs/overlap.md), by the one performance model
  // (autotune/perf_model.h). Collectives and ring shifts by its alpha-beta model over
  // the link class of the collective's mesh dim, from `comm` (the system file's links
  // with --system, else default_comm_rates()); compute by its roofline over `rates`:
  // the system file's GPU, else the target arch's row (compile, explain); unset, sm_90a's.
  CommRates comm = default_comm_rates();
  std::optional<DeviceRates> rates;
  bool allow_tf32 = false;  // f32 matmuls at the TF32 rate, as --allow-tf32 builds them
};

struct DecomposeDecision {
  std::string what;  // "all_gather x -> matmul h" for explain
  bool decomposed = false;
  std::string why;   // the estimate that decided, or why the pattern does not apply
};

// Rewrites every rank's program alike (the decision is taken on rank 0's program,
// which has the same steps as every other rank's). Returns one decision per
// all_gather that feeds a matmul and per reduce_scatter or all_reduce that follows one.
std::vector<DecomposeDecision> decompose_collective_matmuls(std::vector<LocalProgram>& programs,
                                                            const DeviceMesh& mesh, const DecomposeOptions& opts);

}  // namespace sf
