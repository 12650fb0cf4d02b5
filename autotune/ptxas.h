// ptxas as a validator and a resource meter: assembles PTX for an arch without a GPU
// and reports each kernel's registers, shared memory, spills and stack, which the
// autotuner's static pruning uses (a config that spills or cannot fit two blocks per
// SM is dropped before it is ever benchmarked). No LLVM here: autotune/ must run
// where only the CUDA toolkit is (DESIGN.md).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/core/diag.h"

namespace sf {

// One entry function as ptxas -v describes it.
struct KernelResources {
  std::string name;             // the .entry name
  std::string arch;             // "sm_90a"
  int registers = 0;            // per thread
  int barriers = 0;             // named barriers used
  int64_t shared_bytes = 0;     // static shared memory ("smem")
  int64_t constant_bytes = 0;   // cmem[0], kernel parameters and constants (0 when not shown)
  int64_t stack_frame_bytes = 0;
  int64_t spill_store_bytes = 0;
  int64_t spill_load_bytes = 0;
  int64_t cumulative_stack_bytes = 0;  // with callees ("cumulative stack size"), 0 when absent
  // ptxas's numbered notes ("(C7508) Potential Performance Loss: 'setmaxnreg'
  // ignored; ..."), the code and text of each (parse_ptxas_info says which entry gets
  // which).
  std::vector<std::string> notes;

  bool spills() const { return spill_store_bytes > 0 || spill_load_bytes > 0; }
  bool operator==(const KernelResources&) const = default;
};

struct PtxasOptions {
  std::string arch = "sm_90a";    // ptxas -arch; must be sm_<digits>[a|f]
  int opt_level = 3;              // -O<n>
  int max_registers = 0;          // --maxrregcount when > 0
  std::string ptx_name = "kernel.ptx";  // the file name ptxas (and our Diags) see
};

// The ptxas to run: $SHARDFUSE_PTXAS when set (and then it must be executable),
// else the toolkit's (SF_PTXAS_PATH from CMake), else `ptxas` on PATH. A Diag that
// starts with "ptxas not found" when there is none; tests skip on it.
Result<std::string> find_ptxas();

// Assembles `ptx` with `ptxas -v -O3 -arch=<arch>` (argv, no shell; the PTX goes
// through a private temporary directory that is removed afterwards) and returns the
// resources of every entry function, in ptxas's order. When ptxas rejects the PTX the
// Diag carries ptxas's error lines, located at the first one's line in the PTX.
Result<std::vector<KernelResources>> run_ptxas(std::string_view ptx, const PtxasOptions& options);
inline Result<std::vector<KernelResources>> run_ptxas(std::string_view ptx, const std::string& arch) {
  PtxasOptions o;
  o.arch = arch;
  return run_ptxas(ptx, o);
}

// Parses ptxas -v's info lines (stderr). Tolerant: lines it does not know are skipped,
// and fields may come in any order or be missing, so both ptxas 11/12's
//   "Used 40 registers, 384 bytes smem, 380 bytes cmem[0]"
// and ptxas 13's
//   "Used 14 registers, used 1 barriers, 1024 bytes smem"
// parse. Properties of non-entry functions (".func", "Function properties for f" with
// no "Compiling entry function 'f'") are not reported. A numbered note ("ptxas info :
// (Cnnnn) ...") ptxas 13 prints before the first entry's line, naming no kernel: it
// goes to every entry of the log (our modules hold one kernel); one after an entry's
// line goes to that entry.
std::vector<KernelResources> parse_ptxas_info(std::string_view log);

// Turns ptxas's error output into a Diag: "<file>, line N; error   : msg" lines give
// the location of the first and the text of all; "ptxas fatal : msg" lines are kept
// too. `file` replaces the (temporary) path ptxas printed.
Diag ptxas_error_diag(std::string_view log, const std::string& file);

// ptxas's version ("V13.0.88"), part of every GPU tuning key: a new ptxas may
// allocate registers differently, so its results are tuned again.
Result<std::string> ptxas_version();

}  // namespace sf
