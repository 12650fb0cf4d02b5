// NumPy .npy files: what `shardfuse run --inputs DIR` reads and `--save-outputs DIR`
// writes (DESIGN.md, CLI contract). The format is NumPy's NEP 1
// (numpy/lib/format.py); docs/npy.md says what is accepted and why this is
// hand-written rather than a library.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "runtime/core/diag.h"
#include "runtime/core/tensor.h"

namespace sf {

// Reads the .npy file at `path` into a tensor of type `expected` (a graph
// parameter's type), converting the file's dtype to it:
//   - the file's shape must equal expected.shape exactly (no broadcasting, no
//     reshaping; a 0-d array `()` matches a scalar `f32[]`);
//   - a float file ('<f2', '<f4', '<f8') feeds f32, f16 and bf16, each value
//     rounded once to nearest-even by Tensor::set (so NumPy's default float64
//     feeds f32 and a bf16 parameter reads float32 files);
//   - an integer file ('<i4', '<i8') feeds i32 and i64; a value outside i32's
//     range is an error that names the value and its index;
//   - a bool file ('|b1') feeds bool.
// Files may be format 1.0, 2.0 or 3.0, must be C order, little-endian (or the
// byte-order-free '|b1'), and hold exactly the array's bytes after the header.
// Anything else is a Diag with `file` = path and a message that says what was
// expected and what was found, e.g.
//   x.npy: error: shape [3, 4] does not match parameter x: f32[20, 10]
// `what` names the destination in those messages: "x" reads as "parameter x";
// when empty they say "expected f32[20, 10]". Never crashes on a malformed file:
// the header is capped at 10000 bytes as NumPy's own reader caps it, and sizes
// are checked for overflow before anything is allocated.
Result<Tensor> read_npy(const std::string& path, const TensorType& expected,
                        std::string_view what = {});

// Writes `t` to `path` as a format 1.0 .npy file that np.load reads: f32 and
// bf16 as '<f4' (bf16 widened exactly, as --save-outputs promises float32),
// f16 as '<f2', i32 as '<i4', i64 as '<i8', bool as '|b1'; C order, header padded
// so the data starts on a 64-byte boundary like NumPy's. Atomic: the bytes go to
// a temporary file next to `path` that is renamed over it only once complete, so
// a reader sees the old file or the new one, and on failure nothing is left
// behind. Returns the Diag (file = path) on failure.
Result<void> write_npy(const std::string& path, const Tensor& t);

// Writes each (path, tensor) as write_npy does, all or none: every file goes to its
// temporary first, and only once all are complete are they renamed into place; on
// any failure the temporaries are removed and no path is touched. A path that
// names a directory, device or FIFO is refused, never replaced.
Result<void> write_npy_all(const std::vector<std::pair<std::string, const Tensor*>>& files);

}  // namespace sf
