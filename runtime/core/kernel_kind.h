// The one kernel kind (issue 17: it was an enum in fusion, another in the tuner and
// emitters, and a string in LocalKernel and the Plan): what fusion makes, which
// emitter builds it, what the tuner's space and cache key name, and plan.json's
// "kind".
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

namespace sf {

// Attention: a fused (flash) attention, scores and softmax never written (codegen/kernels/attention.h).
enum class KernelKind : uint8_t { Pointwise, Reduction, Matmul, Gather, Attention };
inline constexpr KernelKind kAllKernelKinds[] = {KernelKind::Pointwise, KernelKind::Reduction, KernelKind::Matmul,
                                                 KernelKind::Gather, KernelKind::Attention};

// "pointwise", "reduction", "matmul", "gather", "attention": plan.json's and the tuning cache's
// spelling, and kernel names' suffix.
constexpr std::string_view kernel_kind_name(KernelKind k) {
  switch (k) {
    case KernelKind::Pointwise: return "pointwise";
    case KernelKind::Reduction: return "reduction";
    case KernelKind::Matmul: return "matmul";
    case KernelKind::Gather: return "gather";
    case KernelKind::Attention: return "attention";
  }
  return "?";
}

// The kind a name spells; nullopt for any other text.
constexpr std::optional<KernelKind> parse_kernel_kind(std::string_view name) {
  for (KernelKind k : kAllKernelKinds)
    if (kernel_kind_name(k) == name) return k;
  return std::nullopt;
}

}  // namespace sf
