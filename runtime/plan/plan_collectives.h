// How one rank's collective steps run: the communicator interface of the Plan
// executor (as torch.distributed's ProcessGroup backends, or XLA's collective thunks
// over one communicator type). RankExec (runtime/plan/plan_exec.h) hands every
// collective start step and every wait step of its rank to one backend, which moves
// the data between the step's buffers; the executor knows nothing of how.
//
// Three backends, each in its own file:
//   - GlooCollectives (plan_coll_gloo.cpp): host-staged. A start copies its operand
//     to the host and queues the collective on the rank's Gloo comm thread (Comm,
//     runtime/comm/comm.h); its wait takes the result and copies it into the output
//     buffer. Any device, any number of ranks per GPU; the CPU always uses it.
//   - NcclCollectives (plan_coll_nccl.cpp): a GPU per rank. A start is enqueued on
//     the rank's comm stream after an event recorded on the compute stream, a wait
//     makes the compute stream wait for an event recorded after it; nothing waits on
//     the host, so raised starts and sunk waits overlap on the device. Uneven shards
//     and gathers along inner dims are packed and unpacked around the NCCL call.
//   - CopyStandinCollectives (plan_coll_stream.cpp): NCCL's stream ordering with one
//     device-to-device copy of each collective's bus bytes in place of the
//     collective, to time the interleaving on one GPU (the outputs are not the
//     collectives' results).
// The two comm-stream backends share the pairing of starts with waits, their
// events and scratch space (CommStreamCollectives).
//
// Adding a backend: a class implementing CollectiveBackend in its own file, and the
// line of runtime/plan/plan_run.cpp that picks it (GpuCollectives).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "runtime/comm/comm.h"
#include "runtime/comm/nccl.h"
#include "runtime/core/diag.h"
#include "runtime/gpu/cuda.h"

namespace sf {

class RankExec;
struct PlanStep;

class CollectiveBackend {
 public:
  virtual ~CollectiveBackend() = default;
  // What carries the collectives, for stats and messages ("NCCL on a comm stream").
  virtual std::string name() const = 0;
  // Start step `step` (its operand is written by the steps before it on the compute
  // stream) and wait step `step` (its output holds the result for every later step).
  virtual Result<void> start(size_t step) = 0;
  virtual Result<void> wait(size_t step) = 0;
  // After the rank's last step: waits, under the timeout, for what is still in flight.
  virtual Result<void> finish() { return {}; }
  // Before the rank's buffers are freed: makes sure nothing in flight still uses them.
  virtual void quiesce() {}
  // Collectives started so far (NCCL calls or stand-in copies; host-staged ones too).
  int64_t started() const { return started_; }

 protected:
  int64_t started_ = 0;
};

// Host-staged over Gloo: one per run of a rank (RankExec::run gives it the Comm).
class GlooCollectives final : public CollectiveBackend {
 public:
  GlooCollectives(RankExec& rank, Comm& comm) : x_(rank), comm_(comm) {}
  std::string name() const override { return "host-staged (Gloo)"; }
  Result<void> start(size_t step) override;
  Result<void> wait(size_t step) override;

 private:
  RankExec& x_;
  Comm& comm_;
  std::map<int, Work> pending_;                            // by handle
  std::map<int, std::pair<double, std::string>> issued_;  // handle -> (issue time, name), for the trace
};

// Starts and waits on the rank's comm stream, ordered by an event pair per collective.
class CommStreamCollectives : public CollectiveBackend {
 public:
  Result<void> start(size_t step) override;
  Result<void> wait(size_t step) override;

 protected:
  explicit CommStreamCollectives(RankExec& rank) : x_(rank) {}
  // Pairs every start with its wait (a Diag for a start never waited for, a wait
  // with no start, a handle started twice), makes their events and the comm stream.
  Result<void> pair_ops();
  struct Op {
    size_t wait = 0;
    int out = -1;  // the wait step's output buffer
    cuda::Event ready, done;
    std::vector<cuda::Buffer> scratch;
  };
  // Device memory of slot `slot` of `op`, at least `bytes`, zeroed once; kept for
  // every later run (only the comm stream touches it, in stream order).
  Result<CUdeviceptr> scratch(Op& op, size_t slot, size_t bytes);
  // Enqueues start step `step` on the comm stream (after `op.ready`); what goes in
  // the trace event's "bytes" and "via" comes back in `bytes` and `via`.
  virtual Result<void> enqueue(size_t step, Op& op, size_t& bytes, std::string& via) = 0;

  RankExec& x_;
  std::map<size_t, Op> ops_;          // by start step
  std::map<size_t, size_t> start_of_;  // wait step -> start step
};

// NCCL: comms[d] is the rank's communicator along mesh dim d, on the rank's GPU.
class NcclCollectives final : public CommStreamCollectives {
 public:
  static Result<std::unique_ptr<NcclCollectives>> create(RankExec& rank,
                                                         std::vector<std::unique_ptr<nccl::NcclComm>> comms);
  std::string name() const override { return "NCCL on a comm stream"; }
  Result<void> finish() override;
  void quiesce() override;

 private:
  explicit NcclCollectives(RankExec& rank) : CommStreamCollectives(rank) {}
  Result<void> enqueue(size_t step, Op& op, size_t& bytes, std::string& via) override;
  Result<void> enqueue_collective(const PlanStep& s, Op& op, nccl::NcclComm& c);
  std::vector<std::unique_ptr<nccl::NcclComm>> comms_;
};

// The copy stand-in (GpuCollectives::CopyStandin).
class CopyStandinCollectives final : public CommStreamCollectives {
 public:
  static Result<std::unique_ptr<CopyStandinCollectives>> create(RankExec& rank);
  std::string name() const override { return "a device-to-device copy stand-in on a comm stream"; }

 private:
  explicit CopyStandinCollectives(RankExec& rank) : CommStreamCollectives(rank) {}
  Result<void> enqueue(size_t step, Op& op, size_t& bytes, std::string& via) override;
};

}  // namespace sf
