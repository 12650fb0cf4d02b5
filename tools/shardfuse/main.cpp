// shardfuse: op graphs over sharded tensors -> per-rank fused kernels.
#include <cstdlib>
#include <iostream>
#include <stdexcept>
#include <string>

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
  sf::cli::add_tune_measure_only(app, exit_code);
  app.footer("This is a runtime-only build (SHARDFUSE_LLVM=OFF): explain, run and compile need the code generator, "
             "and tune only measures (--measure).\nRun 'shardfuse COMMAND --help' for a command's options and an "
             "example.");
#endif
  sf::cli::add_exec(app, exit_code);
  // Exit statuses (README): 0 success, 1 bad input or a failed
  // run/check, 2 usage, 3 internal error. Commands report errors as values; an
  // exception that still reaches here is a bug of shardfuse, not of the input, so
  // it gets a status of its own rather than abort()'s 134 and no message.
  // report_failure prints it as the commands print an internal Diag, and returns 3.
  const auto internal = [](sf::Diag d) {
    d.internal = true;
    return sf::cli::report_failure(d);
  };
  try {
    // A test hook: once every throw site that input can reach is a value, only a
    // deliberate throw reaches the handlers below (tests/tools/hardening_ranks_test.cpp).
    if (const char* t = std::getenv("SHARDFUSE_TEST_THROW")) {
      const std::string kind = t;
      if (kind == "diag") throw sf::DiagError{sf::Diag{"", {}, "test: a DiagError"}};
      if (kind == "std") throw std::runtime_error("test: a std::exception");
      if (kind == "other") throw 42;
    }
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int rc = app.exit(e);
    // CLI11 returns 0 for --help; usage errors become exit 2 like other Unix tools.
    return rc == 0 ? 0 : 2;
  } catch (const sf::DiagError& e) {
    return internal(e.diag);
  } catch (const std::exception& e) {
    return internal(sf::Diag{"", {}, e.what()});
  } catch (...) {
    return internal(sf::Diag{"", {}, "an unknown exception"});
  }
  return exit_code;
}
