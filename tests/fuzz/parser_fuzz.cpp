// libFuzzer target for the .sf parser. Any input must give a Graph or a located
// Diag, never a crash, hang or sanitizer report; and any accepted graph must
// survive print -> parse -> print unchanged.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string_view>

#include "codegen/ir/parser.h"
#include "codegen/ir/printer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);
  sf::Result<sf::Graph> g = sf::parse_graph(text, "fuzz.sf");
  if (!g.ok()) {
    const sf::Diag& d = g.error();
    if (d.message.empty() || d.file != "fuzz.sf") std::abort();
    return 0;
  }
  std::string once = sf::print_graph(*g);
  sf::Result<sf::Graph> again = sf::parse_graph(once, "printed.sf");
  if (!again.ok()) {
    std::fprintf(stderr, "printed graph does not parse: %s\n%s", again.error().str().c_str(), once.c_str());
    std::abort();
  }
  if (sf::print_graph(*again) != once) {
    std::fprintf(stderr, "print(parse(print(g))) != print(g):\n%s", once.c_str());
    std::abort();
  }
  return 0;
}
