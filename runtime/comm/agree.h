// Agreement across ranks over the comm backend: rank 0's text reaches every rank.
// The autotuner uses it so that every rank runs the configs rank 0 chose; ranks
// that tuned on their own could pick different configs, and kernels that differ
// across ranks (in split-K or grid, or just in timing) can deadlock or skew
// collectives.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "runtime/core/device_mesh.h"
#include "runtime/comm/comm.h"

namespace sf {

// Every rank returns global rank 0's `text` (the others' are ignored). Goes along
// each mesh dim in turn: after dim d, each rank holds the text of the rank with
// coordinate 0 on dims 0..d and its own coordinates elsewhere.
Result<std::string> broadcast_text(Comm& comm, const std::string& text);

// Every rank's text, in rank order (for checking that ranks agree).
Result<std::vector<std::string>> all_gather_text(Comm& comm, const std::string& text);

// What a rank of a multi-process run is about to run, as named parts ("graph",
// "options", "plan", "configs", "inputs"), compared across ranks at connect by
// agree_on_run. A part's text is kept whole when it is short (so a difference can
// be shown: options), else as a 128-bit digest of it.
// 128 bits over bytes fed in pieces: two FNV-1a 64 lanes from different offset
// bases. Enough to tell apart what differs by mistake (another graph file, seed or
// cache); not a defence against a peer forging a collision.
class Digest {
 public:
  Digest& update(const void* data, size_t n);
  Digest& update(const std::string& s) { return update(s.data(), s.size()); }
  std::string hex() const;  // 32 hex digits and the byte count

 private:
  uint64_t a_ = 14695981039346656037ull, b_ = 0x84222325cbf29ce4ull;
  size_t n_ = 0;
};

class RunDigest {
 public:
  void add(const std::string& name, const std::string& text);
  void add(const std::string& name, const Digest& d);
  // The parts, one per line: "name value".
  std::string str() const;

 private:
  std::vector<std::pair<std::string, std::string>> parts_;
};

// Every rank sends every other its digest; if any rank's differs from rank 0's,
// every rank returns the same Diag (they all see every digest), naming the lowest
// such rank and the parts that differ:
//   rank 0: the ranks disagree on what to run (...): rank 1's graph digest
//   b15e... (83 bytes) differs from rank 0's digest 6b2a... (80 bytes)
// A run whose ranks were started with different graphs, options, Plans or configs
// would otherwise exchange collectives that happen to fit and save a wrong result.
Result<void> agree_on_run(Comm& comm, const RunDigest& digest);

// Runs fn(comm) on every rank of `mesh` as a thread of this process, each with a
// Comm meeting in-process. A rank whose fn returns a Diag aborts the others; the
// first Diag is returned, preferring one that is not `from_peer` (a rank that
// only saw another rank's abort), so the root cause is what the caller reports.
Result<void> on_rank_threads(const DeviceMesh& mesh, std::chrono::milliseconds timeout,
                             const std::function<Result<void>(Comm&)>& fn);

// One rank's Comm of a multi-process run meeting through `rendezvous_dir`;
// connecting ends by `deadline` when one is given (CommOptions::connect_deadline).
Result<std::unique_ptr<Comm>> connect_rank(const DeviceMesh& mesh, int rank, const std::string& rendezvous_dir,
                                           std::chrono::milliseconds timeout,
                                           std::optional<std::chrono::steady_clock::time_point> deadline = {});

}  // namespace sf
