// shardfuse: op graphs over sharded tensors -> per-rank fused kernels.
#include <iostream>

#include "tools/shardfuse/commands.h"

int main(int argc, char** argv) {
  CLI::App app{"shardfuse: sharded op graphs -> fused kernels and overlapped per-rank plans"};
  app.require_subcommand(1);
  app.footer("Run 'shardfuse COMMAND --help' for a command's options and an example.");
  int exit_code = 0;
  sf::cli::add_check(app, exit_code);
#ifndef SF_RUNTIME_ONLY
  sf::cli::add_explain(app, exit_code);
  sf::cli::add_run(app, exit_code);
  sf::cli::add_compile(app, exit_code);
  sf::cli::add_tune(app, exit_code);
  sf::cli::add_simulate(app, exit_code);
#else
  app.footer("This is a runtime-only build (SHARDFUSE_LLVM=OFF): explain, run, compile and tune need the code "
             "generator.\nRun 'shardfuse COMMAND --help' for a command's options and an example.");
#endif
  sf::cli::add_exec(app, exit_code);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int rc = app.exit(e);
    // CLI11 returns 0 for --help; usage errors become exit 2 like other Unix tools.
    return rc == 0 ? 0 : 2;
  }
  return exit_code;
}
