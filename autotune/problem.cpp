#include "autotune/problem.h"

#include <cstdio>

namespace sf {

std::string fnv1a_hex(std::string_view s) {
  uint64_t h = 14695981039346656037ull;  // FNV-1a 64 offset basis
  for (unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ull;  // FNV-1a 64 prime
  }
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

std::string TuneKey::text() const {
  return "kind: " + kind + "\nsignature: " + signature + "\nshapes: " + shapes + "\ntarget: " + target +
         "\ntoolchain: " + toolchain + "\n";
}

std::string TuneKey::hash() const { return fnv1a_hex(text()); }

namespace {
int64_t round_pow2(int64_t v) {
  int64_t p = 1;
  while (p < v) p <<= 1;
  return p;
}
}  // namespace

std::string shapes_key(const std::vector<std::vector<int64_t>>& shapes, size_t num_inputs, ShapeBuckets b) {
  std::string s;
  for (size_t i = 0; i < shapes.size(); ++i) {
    if (i == num_inputs)
      s += "->";
    else if (i > 0)
      s += ',';
    if (shapes[i].empty()) s += "scalar";
    for (size_t d = 0; d < shapes[i].size(); ++d) {
      if (d) s += 'x';
      s += std::to_string(b == ShapeBuckets::Pow2 ? round_pow2(shapes[i][d]) : shapes[i][d]);
    }
  }
  if (num_inputs >= shapes.size()) s += "->";
  return s;
}

TuneKey make_tune_key(const TuneProblem& p, ShapeBuckets buckets, const std::string& target,
                      const std::string& toolchain) {
  TuneKey k;
  k.kind = std::string(kernel_kind_name(p.kind));
  k.signature = p.signature;
  k.shapes = shapes_key(p.shapes, p.num_inputs, buckets);
  k.target = target;
  k.toolchain = toolchain;
  return k;
}

}  // namespace sf
