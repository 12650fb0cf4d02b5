// A discrete-event model of every rank's program on a multi-GPU system: when each
// kernel and collective would run, how much communication hides behind compute,
// and FLUX's overlap efficiency. No GPU and no LLVM: kernel times come from the
// caller (tuning-cache measurements or a roofline), collectives from an α-β model
// per link class. docs/overlap.md gives the equations.
//
// Per rank there is a compute stream and a comm stream, both in order. The host
// issues the steps in program order: kernels (and slices, partialisations, unfused
// ops) go to the compute stream; a Start goes to the comm stream once its operand
// exists; a Wait makes the compute stream wait for its collective. A collective
// starts when every member of its group has reached it on a free comm stream
// (NCCL's semantics: a communicator's ranks run a collective together), and while
// it runs, kernels on its ranks progress at (1 - sm_fraction) of their speed,
// because NCCL's kernels occupy some of the SMs.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "autotune/perf_model.h"
#include "autotune/system.h"
#include "runtime/core/device_mesh.h"
#include "codegen/dist/local_program.h"
#include "runtime/core/diag.h"
#include "runtime/io/trace.h"

namespace sf {

// --- the collectives ----------------------------------------------------------------

// A Start that is one step of a decomposed collective matmul (an all_to_all with
// ring_steps set: one chunk to the previous member, one from the next). It costs
// one point-to-point transfer, alpha + chunk / bandwidth (shift_us), not an
// all_to_all.
bool is_ring_shift(const LocalStep& s);

// nccl-tests' size of the Start at `step` of program `p` on a group of n: all_gather
// the gathered output (n times the largest member's shard, as NCCL gathers equal
// counts), reduce_scatter the input before scattering (n times the largest kept
// block), all_reduce the buffer, all_to_all the send buffer (n times the largest
// block sent); a ring shift the chunk it sends. Without sizes (hand-built
// programs): all_gather n times the operand, the others the operand.
int64_t collective_bytes(const LocalProgram& p, size_t step, int n);

// --- compute work --------------------------------------------------------------------

// Flops and bytes moved by a compute-stream step: a kernel's own counts; an unfused
// op reads its operands and writes its result, one flop per output element (2K per
// element for a matmul); a slice, partialisation or concat reads and writes its result.
struct StepWork {
  int64_t flops = 0;         // on the CUDA cores (FP32 SIMT)
  int64_t bytes = 0;
  int64_t tensor_flops = 0;  // matmuls of f16/bf16 operands: on the tensor cores
};
StepWork step_work(const LocalProgram& p, size_t step);

// max(flops / fp32 peak + tensor_flops / 16-bit peak, bytes / HBM bandwidth) + launch
// overhead, microseconds, over `r` (device_rates(gpu) for a system's GPU: tensor_flops
// at the fp32 peak when its bf16_tflops is 0).
double roofline_us(const StepWork& w, const DeviceRates& r);

// --- the timeline ----------------------------------------------------------------------

struct TimelineModel {
  // The links: a group inside one node runs over comm.intra, one spanning nodes
  // over comm.inter (rank r is on node r / comm.gpus_per_node).
  CommRates comm;
  // Unslowed time of a compute-stream step (Kernel, Compute, Slice, Partialize) of a
  // program, in microseconds. Required.
  std::function<double(const LocalProgram&, size_t step)> compute_us;
  double host_issue_us = 0;  // host time to issue one step (the host never blocks)
};
TimelineModel timeline_model(const SystemSpec& sys, std::function<double(const LocalProgram&, size_t)> compute_us);

enum class CommMode : uint8_t {
  Overlapped,  // as scheduled
  Blocking,    // each collective waits for the compute stream to drain, and its Wait follows its Start
};

struct TimelineEvent {
  enum class Kind : uint8_t { Kernel, Op, Slice, Partialize, Concat, Collective };
  Kind kind = Kind::Kernel;
  Stream stream = Stream::Compute;
  std::string name;  // kernel name, op name, "slice v3", "all_reduce v10"
  size_t step = 0;   // index into the program's steps
  double start_us = 0, end_us = 0;
  int64_t bytes = 0, flops = 0;  // collectives: nccl-tests' size; flops 0
  double work_us = 0;  // compute: the unslowed time; collectives: the α-β time uncontended
  // Collectives only.
  CollectiveKind comm = CollectiveKind::AllGather;
  std::vector<int> group;
  LinkClass link = LinkClass::NvLink;
  double ready_us = 0;   // when this rank had issued it, its operand existed and its comm stream was free
  double hidden_us = 0;  // time within [start, end) this rank's compute stream ran a kernel
  double dur_us() const { return end_us - start_us; }
};

struct RankTimeline {
  int rank = 0;
  std::vector<TimelineEvent> events;  // compute events in stream order, then collectives in stream order
  double finish_us = 0;   // end of its last event
  double compute_us = 0;  // sum of unslowed compute times
  double comm_us = 0;     // sum of collective durations (groups of more than one)
  double hidden_us = 0;   // sum of their hidden parts
  int collectives = 0;    // over groups of more than one (a group of one is free and not listed)
};

struct Timeline {
  std::vector<RankTimeline> ranks;
  double total_us = 0;    // T_total: the last rank's finish
  double compute_us = 0;  // T_compute: the largest rank's unslowed compute sum
};

// Runs the model over every rank's program (programs[r] is rank r's; all from one
// graph). A Diag when the programs do not fit together (a collective some member
// never issues, mismatched handles), or a compute time is negative or not finite.
Result<Timeline> simulate_timeline(const std::vector<LocalProgram>& programs, const DeviceMesh& mesh,
                                   const TimelineModel& model, CommMode mode = CommMode::Overlapped);

// FLUX's overlap efficiency from the effective communication times
// (ECT = T_total - T_compute): 1 - ect_overlapped / ect_serial. 1 when every
// collective hides, 0 when none does, negative when overlapping costs more than it
// hides. With no communication (ect_serial == 0) there is nothing to hide: 0.
double overlap_efficiency(double ect_overlapped, double ect_serial);

struct OverlapReport {
  Timeline serial, overlapped;
  double t_compute = 0;  // from the serial (baseline) programs
  double ect_serial = 0, ect_overlapped = 0;
  double e_overlap = 0;
  bool has_comm = false;  // ect_serial > 0: otherwise e_overlap is 0 by definition
};

// The serial (blocking) and overlapped timelines of the same programs and E_overlap.
Result<OverlapReport> simulate_overlap(const std::vector<LocalProgram>& programs, const DeviceMesh& mesh,
                                       const TimelineModel& model);
// The same with the overlapped run on other programs than the baseline (a
// decomposed schedule against the plain one): T_compute stays the baseline's, as in
// FLUX, so extra compute the overlapped programs spend counts against them.
Result<OverlapReport> simulate_overlap(const std::vector<LocalProgram>& baseline,
                                       const std::vector<LocalProgram>& overlapped, const DeviceMesh& mesh,
                                       const TimelineModel& model);

// Adds every event of `t` to a trace: one process per rank, kernels on "compute",
// collectives on "comm", with bytes, flops and the step index as args.
void add_to_trace(const Timeline& t, TraceWriter& w);

}  // namespace sf
