#include "codegen/dist/local_program.h"

#include "codegen/ir/printer.h"

namespace sf {

std::string kernel_key(const LocalKernel& k) { return std::string(kernel_kind_name(k.kind)) + "\n" + print_graph(k.group); }

}  // namespace sf
