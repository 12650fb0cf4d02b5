// The shardfuse subcommands. Each registers its options on the app and returns the
// exit code through the callback it installs.
#pragma once

#include <CLI/CLI.hpp>

#include <set>

#include "codegen/ir/graph.h"
#include "autotune/cache.h"
#include "codegen/dist/local_program.h"
#include "codegen/llvm/backend.h"

namespace sf::cli {

void add_check(CLI::App& app, int& exit_code);
void add_run(CLI::App& app, int& exit_code);
void add_explain(CLI::App& app, int& exit_code);
void add_compile(CLI::App& app, int& exit_code);
void add_tune(CLI::App& app, int& exit_code);

// Parses and verifies a graph file, printing the located error on failure.
std::optional<Graph> load_graph(const std::string& path);

// `--world N` against the graph's mesh. On a mesh of one dim, N resizes that dim
// (a graph written for tp=4 runs on 3 ranks, with uneven shards); on an N-D mesh N
// must equal the product. Returns the graph to run, or nullopt after printing why not.
std::optional<Graph> resolve_world(Graph g, std::optional<int64_t> world);

// --dump-after: the set of stages to print, or nullopt (after printing why) for an
// unknown stage name; and the printer, for rank `rank` of the graph's mesh.
std::optional<std::set<std::string>> parse_dump_after(const std::string& arg);
void dump_pipeline(const Graph& g, const std::set<std::string>& want, int rank, const llvmb::Target& target);

// The tuning cache options shared by tune, run, compile and explain.
struct CacheCliOptions {
  std::string dir;                 // --cache; empty: TuneCache::default_dir()
  std::string buckets = "exact";   // --shape-buckets
};
void add_cache_options(CLI::App* cmd, CacheCliOptions& o);
ShapeBuckets parse_buckets(const std::string& s);
// Opens (creating) the cache directory. When it cannot: an error (and *failed set)
// if the cache is `required` or `dir` was given explicitly, else a warning; null
// either way, and kernels then use default configs.
std::unique_ptr<TuneCache> open_tune_cache(const std::string& dir, bool required, bool* failed = nullptr);
// Every rank's fused program, split where the target's emitters cannot go.
std::vector<LocalProgram> programs_for_tuning(const Graph& g, const std::string& device, const std::string& arch,
                                              bool fuse);

}  // namespace sf::cli
