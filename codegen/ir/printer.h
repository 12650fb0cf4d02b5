// Prints a Graph in the `.sf` text format. Values used once without a name are
// printed inline at their use (as the source nested them); number literals are
// always inline. print(parse(print(g))) == print(g).
#pragma once

#include <string>

#include "codegen/ir/graph.h"

namespace sf {

std::string print_graph(const Graph& g);

}  // namespace sf
