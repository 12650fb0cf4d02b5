#include "autotune/config.h"

#include <charconv>
#include <functional>
#include <vector>

namespace sf {

namespace {

// Every field by name; grid_stride is a bool stored as 0/1 in text.
struct Field {
  const char* name;
  int KernelConfig::*ip = nullptr;
  bool KernelConfig::*bp = nullptr;
};

const std::vector<Field>& all_fields() {
  static const std::vector<Field> f = {
      {"block", &KernelConfig::block},
      {"vector", &KernelConfig::vector},
      {"elems_per_thread", &KernelConfig::elems_per_thread},
      {"grid_stride", nullptr, &KernelConfig::grid_stride},
      {"max_blocks", &KernelConfig::max_blocks},
      {"rows_per_block", &KernelConfig::rows_per_block},
      {"threads_per_row", &KernelConfig::threads_per_row},
      {"split_reduction", &KernelConfig::split_reduction},
      {"block_m", &KernelConfig::block_m},
      {"block_n", &KernelConfig::block_n},
      {"block_k", &KernelConfig::block_k},
      {"warps", &KernelConfig::warps},
      {"stages", &KernelConfig::stages},
      {"group_m", &KernelConfig::group_m},
      {"split_k", &KernelConfig::split_k},
      {"warp_specialize", &KernelConfig::warp_specialize},
      {"persistent", &KernelConfig::persistent},
      {"pingpong", &KernelConfig::pingpong},
      {"setmaxnreg", &KernelConfig::setmaxnreg},
      {"tma_store", &KernelConfig::tma_store},
      {"cluster_m", &KernelConfig::cluster_m},
      {"cluster_n", &KernelConfig::cluster_n},
      {"wgmma", &KernelConfig::wgmma},
      {"group_heads", &KernelConfig::group_heads},
      {"host_vector", &KernelConfig::host_vector},
      {"host_interleave", &KernelConfig::host_interleave},
      {"host_tile_n", &KernelConfig::host_tile_n},
  };
  return f;
}

const Field* find_field(std::string_view name) {
  for (const Field& f : all_fields())
    if (name == f.name) return &f;
  return nullptr;
}

int get(const KernelConfig& c, const Field& f) { return f.ip ? c.*(f.ip) : (c.*(f.bp) ? 1 : 0); }

}  // namespace

std::vector<const char*> config_fields(KernelKind kind, ConfigTarget t) {
  if (t == ConfigTarget::Host) {
    switch (kind) {
      case KernelKind::Pointwise:
      case KernelKind::Reduction:
      case KernelKind::Gather: return {"host_vector", "host_interleave"};
      case KernelKind::Matmul: return {"host_tile_n", "host_vector", "host_interleave"};
      case KernelKind::Attention: return {"block_m", "block_n"};
    }
  }
  switch (kind) {
    case KernelKind::Pointwise: return {"block", "vector", "elems_per_thread", "grid_stride", "max_blocks"};
    case KernelKind::Reduction:
      return {"rows_per_block", "threads_per_row", "split_reduction", "grid_stride", "max_blocks"};
    case KernelKind::Matmul:
      return {"block_m", "block_n", "block_k", "warps",      "stages",
              "group_m", "split_k", "warp_specialize", "persistent", "pingpong", "setmaxnreg", "tma_store",
              "cluster_m", "cluster_n"};
    case KernelKind::Gather: return {"block", "max_blocks"};
    case KernelKind::Attention:
      return {"block_m", "block_n", "warps", "stages", "wgmma", "warp_specialize", "pingpong", "group_heads"};
  }
  return {};
}

// Fields written only where they differ from the default (knobs added after caches
// and plans were written keep those texts valid and unchanged).
static bool omitted_at_default(KernelKind kind, std::string_view name, const KernelConfig& c) {
  return (kind == KernelKind::Attention && name == "stages" && c.stages == 2) || (name == "warp_specialize" && c.warp_specialize == 0) || (name == "persistent" && c.persistent == 0) ||
         (name == "pingpong" && c.pingpong == 0) || (name == "setmaxnreg" && c.setmaxnreg == 0) ||
         (name == "tma_store" && c.tma_store == 0) || (name == "cluster_m" && c.cluster_m == 1) ||
         (name == "cluster_n" && c.cluster_n == 1) ||
         (name == "wgmma" && c.wgmma == 0) || (name == "group_heads" && c.group_heads == 0);
}

std::string config_str(KernelKind kind, ConfigTarget target, const KernelConfig& c) {
  std::string s;
  for (const char* name : config_fields(kind, target)) {
    if (omitted_at_default(kind, name, c)) continue;
    if (!s.empty()) s += ' ';
    s += name;
    s += '=';
    s += std::to_string(get(c, *find_field(name)));
  }
  return s;
}

nlohmann::json config_to_json(KernelKind kind, ConfigTarget target, const KernelConfig& c) {
  nlohmann::json j = nlohmann::json::object();
  for (const char* name : config_fields(kind, target)) {
    if (omitted_at_default(kind, name, c)) continue;
    const Field& f = *find_field(name);
    if (f.bp)
      j[name] = c.*(f.bp);
    else
      j[name] = c.*(f.ip);
  }
  return j;
}

Result<KernelConfig> config_from_json(const nlohmann::json& j, KernelConfig base) {
  if (!j.is_object()) return Diag{"", {}, "a config must be a JSON object, not " + j.dump()};
  for (auto it = j.begin(); it != j.end(); ++it) {
    const Field* f = find_field(it.key());
    if (!f) return Diag{"", {}, "unknown config field '" + it.key() + "'"};
    if (f->bp) {
      if (it->is_boolean())
        base.*(f->bp) = it->get<bool>();
      else if (it->is_number_integer() && (it->get<int64_t>() == 0 || it->get<int64_t>() == 1))
        base.*(f->bp) = it->get<int64_t>() == 1;
      else
        return Diag{"", {}, "config field '" + it.key() + "' must be true or false, not " + it->dump()};
    } else {
      if (!it->is_number_integer() || it->get<int64_t>() < INT32_MIN || it->get<int64_t>() > INT32_MAX)
        return Diag{"", {}, "config field '" + it.key() + "' must be an integer, not " + it->dump()};
      base.*(f->ip) = static_cast<int>(it->get<int64_t>());
    }
  }
  return base;
}

Result<KernelConfig> parse_config_str(std::string_view text, KernelConfig base) {
  size_t i = 0;
  while (i < text.size()) {
    while (i < text.size() && text[i] == ' ') ++i;
    if (i >= text.size()) break;
    size_t end = text.find(' ', i);
    if (end == std::string_view::npos) end = text.size();
    std::string_view tok = text.substr(i, end - i);
    size_t eq = tok.find('=');
    if (eq == std::string_view::npos) return Diag{"", {}, "config token '" + std::string(tok) + "' is not name=value"};
    const Field* f = find_field(tok.substr(0, eq));
    if (!f) return Diag{"", {}, "unknown config field '" + std::string(tok.substr(0, eq)) + "'"};
    std::string_view v = tok.substr(eq + 1);
    int value = 0;
    auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), value);
    if (ec != std::errc() || p != v.data() + v.size())
      return Diag{"", {}, "config token '" + std::string(tok) + "': '" + std::string(v) + "' is not an integer"};
    if (f->bp) {
      if (value != 0 && value != 1) return Diag{"", {}, "config token '" + std::string(tok) + "': must be 0 or 1"};
      base.*(f->bp) = value == 1;
    } else {
      base.*(f->ip) = value;
    }
    i = end;
  }
  return base;
}

namespace {
constexpr std::string_view kExternPrefix = "extern=";
}

std::string extern_config_str(std::string_view library) { return std::string(kExternPrefix) + std::string(library); }

std::optional<std::string> extern_library_of(std::string_view config_text) {
  if (!config_text.starts_with(kExternPrefix) || config_text.size() == kExternPrefix.size()) return std::nullopt;
  return std::string(config_text.substr(kExternPrefix.size()));
}

}  // namespace sf
