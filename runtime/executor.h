// Executes per-rank programs: each rank's compute steps with the reference kernels
// on its local shards, its collectives through a Comm (Gloo on the CPU), issued
// asynchronously at Start and collected at Wait, so the schedule's overlap is real.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <vector>

#include "codegen/dist/local_program.h"
#include "runtime/comm.h"
#include "runtime/kernel_runner.h"
#include "runtime/trace.h"

namespace sf {

struct ExecOptions {
  std::chrono::milliseconds timeout{60000};  // per collective
  // Test hook, called before every step of every rank; it may throw (a failing rank)
  // or block until `aborted` becomes true (a stalled rank).
  std::function<void(int rank, size_t step, const std::atomic<bool>& aborted)> before_step;
  // Runs Kernel steps; the reference evaluator when null.
  const KernelRunner* kernels = nullptr;
  // When set, every step becomes an event: local steps on the rank's compute
  // thread (their wall time), each collective on its comm thread from its issue to
  // the return of its wait (an upper bound: the Gloo thread does not report when it
  // finished), and the time a wait blocked as a "wait" event on the compute thread.
  // Times are microseconds since `trace_origin`.
  TraceWriter* trace = nullptr;
  std::chrono::steady_clock::time_point trace_origin = std::chrono::steady_clock::now();
  // run_rank_in_process: called once the rank's Comm is connected, before the
  // first step (every rank must call it, as a collective); a Diag ends the run
  // there. The CLI compares what the ranks are about to run (agree_on_run).
  std::function<std::optional<Diag>(Comm&)> on_connect;
  // CommOptions::connect_deadline for the ranks' Comms (the CLI: its start plus
  // --timeout); unset, connecting may take `timeout` from its start.
  std::optional<std::chrono::steady_clock::time_point> connect_deadline;
};

// Runs rank p.rank's program; inputs hold its local tensor per graph param. Returns
// its local outputs, or a Diag naming the rank and the step that failed.
Result<std::vector<Tensor>> execute(const LocalProgram& p, Comm& comm, const std::vector<Tensor>& inputs,
                                    const ExecOptions& opts = {}, const std::atomic<bool>* aborted = nullptr);

// Runs every rank of `mesh` as a thread of this process, meeting through an
// in-process rendezvous. When one rank fails, the others are aborted at once and
// the first failure is returned (the first that is not an echo of another rank's
// abort, Diag::from_peer, when there is one); nothing hangs past the timeout.
Result<std::vector<std::vector<Tensor>>> run_ranks_in_threads(const std::vector<LocalProgram>& programs,
                                                              const DeviceMesh& mesh,
                                                              const std::vector<std::vector<Tensor>>& inputs,
                                                              const ExecOptions& opts = {});

// Runs one rank of a multi-process run that meets through `rendezvous_dir`.
Result<std::vector<Tensor>> run_rank_in_process(const LocalProgram& program, const DeviceMesh& mesh,
                                                const std::vector<Tensor>& inputs, const std::string& rendezvous_dir,
                                                const ExecOptions& opts = {});

}  // namespace sf
