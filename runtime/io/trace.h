// Chrome trace-event files (the JSON format chrome://tracing and Perfetto open):
// one process per rank, named "rank N", with a "compute" and a "comm" thread for the
// rank's two streams, and one complete event ("ph": "X") per kernel or collective.
// The simulator writes them today; the CPU executor and the GPU runtime can feed the
// same writer from their own threads (add() is thread-safe).
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "runtime/core/diag.h"

namespace sf {

// A rank's two streams: kernels run on Compute, collectives on Comm.
enum class Stream : uint8_t { Compute, Comm };
std::string_view stream_name(Stream s);  // "compute", "comm"

class TraceWriter {
 public:
  // One complete event on `rank`'s `stream`, `start_us` and `dur_us` in
  // microseconds from the trace's origin. `args` (an object) is shown when the event
  // is selected; `category` is the event's "cat" ("kernel", "collective", ...).
  void add(int rank, Stream s, std::string name, double start_us, double dur_us,
           nlohmann::json args = nlohmann::json::object(), std::string category = {});
  // Makes `rank` a process of the trace even if no event lands on it.
  void add_rank(int rank);
  // A top-level "otherData" entry (what produced the trace: graph, system, ...).
  void set_metadata(const std::string& key, nlohmann::json value);

  size_t size() const;  // events added so far

  // The whole trace: {"traceEvents": [...], "displayTimeUnit": "ns", "otherData": {...}}.
  // Per rank, metadata events name the process and both threads; complete events
  // follow, ordered by rank, stream and start time, so the file is the same
  // whatever order threads added them in.
  nlohmann::json to_json() const;
  // Writes to_json() to `path` through a temporary file in the same directory and
  // a rename, so `path` is either the old file or the whole new one.
  Result<void> write(const std::string& path) const;

 private:
  struct Event {
    int rank;
    Stream stream;
    std::string name, category;
    double start_us, dur_us;
    nlohmann::json args;
  };
  mutable std::mutex mu_;
  std::vector<Event> events_;
  std::map<int, bool> ranks_;  // ordered: processes appear by rank
  nlohmann::json other_ = nlohmann::json::object();
};

}  // namespace sf
