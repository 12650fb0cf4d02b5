// Agreement across ranks over the comm backend: rank 0's text reaches every rank.
// The autotuner uses it so that every rank runs the configs rank 0 chose; ranks
// that tuned on their own could pick different configs, and kernels that differ
// across ranks (in split-K or grid, or just in timing) can deadlock or skew
// collectives.
#pragma once

#include <chrono>
#include <functional>
#include <optional>
#include <string>

#include "codegen/dist/device_mesh.h"
#include "runtime/comm.h"

namespace sf {

// Every rank returns global rank 0's `text` (the others' are ignored). Goes along
// each mesh dim in turn: after dim d, each rank holds the text of the rank with
// coordinate 0 on dims 0..d and its own coordinates elsewhere.
Result<std::string> broadcast_text(Comm& comm, const std::string& text);

// Every rank's text, in rank order (for checking that ranks agree).
Result<std::vector<std::string>> all_gather_text(Comm& comm, const std::string& text);

// Runs fn(comm) on every rank of `mesh` as a thread of this process, each with a
// Comm meeting in-process. A rank whose fn returns a Diag aborts the others; the
// first Diag is returned, preferring one that is not `from_peer` (a rank that
// only saw another rank's abort), so the root cause is what the caller reports.
std::optional<Diag> on_rank_threads(const DeviceMesh& mesh, std::chrono::milliseconds timeout,
                                    const std::function<std::optional<Diag>(Comm&)>& fn);

// One rank's Comm of a multi-process run meeting through `rendezvous_dir`.
Result<std::unique_ptr<Comm>> connect_rank(const DeviceMesh& mesh, int rank, const std::string& rendezvous_dir,
                                           std::chrono::milliseconds timeout);

}  // namespace sf
