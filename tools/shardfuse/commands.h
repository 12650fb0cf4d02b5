// The shardfuse subcommands. Each registers its options on the app and returns the
// exit code through the callback it installs.
#pragma once

#include <CLI/CLI.hpp>

#include "codegen/ir/graph.h"

namespace sf::cli {

void add_check(CLI::App& app, int& exit_code);
void add_run(CLI::App& app, int& exit_code);

// Parses and verifies a graph file, printing the located error on failure.
std::optional<Graph> load_graph(const std::string& path);

// `--world N` against the graph's mesh: N must equal the mesh's rank count. Returns
// the world size to use, or nullopt after printing why not.
std::optional<int64_t> resolve_world(const Graph& g, std::optional<int64_t> world);

}  // namespace sf::cli
