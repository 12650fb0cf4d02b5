#include "runtime/core/diag.h"

namespace sf {

std::string Diag::str() const {
  std::string s;
  if (!file.empty()) {
    s += file;
    s += ':';
  }
  if (loc.line > 0) {
    s += std::to_string(loc.line) + ":" + std::to_string(loc.col) + ":";
  }
  if (!s.empty()) s += ' ';
  s += "error: ";
  s += message;
  return s;
}

}  // namespace sf
