// The `.sf` text format (DESIGN.md, docs/graph-format.md): one optional mesh line,
// one graph. Every error is `file:line:col: error: ...` as a Diag; nothing throws.
#pragma once

#include <string>
#include <string_view>

#include "runtime/core/diag.h"
#include "codegen/ir/graph.h"

namespace sf {

// Parses and verifies `text`; `filename` only names the source in diagnostics.
Result<Graph> parse_graph(std::string_view text, const std::string& filename = "<input>");
// Reads `path` and parses it; an unreadable file is a Diag naming it.
Result<Graph> parse_file(const std::string& path);

}  // namespace sf
