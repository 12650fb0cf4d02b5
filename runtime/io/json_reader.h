// Reading JSON a user can edit (plan.json, tune candidate and measurement files):
// every field is read with its type and range checked and named by its JSON path
// (ranks[1].steps[3].group[0]), since the DOM keeps no line:col. nlohmann's
// get<int>() would C-cast 1e30 or 2^64 (undefined for a double out of range), so
// numbers go through integer(). A failure throws DiagError naming `file` and the
// path; the reading function turns it into its Result.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "runtime/core/diag.h"

namespace sf::json_read {

using json = nlohmann::json;

struct Reader {
  const std::string& file;

  [[noreturn]] void fail(const std::string& path, const std::string& what) const {
    throw DiagError{Diag{file, {}, path + ": " + what}};
  }
  const json& at(const json& obj, const std::string& path, const char* key) const {
    if (!obj.is_object()) fail(path, "expected an object, got " + obj.dump());
    auto it = obj.find(key);
    if (it == obj.end()) fail(path, std::string("missing \"") + key + "\"");
    return *it;
  }
  static std::string child(const std::string& path, const char* key) {
    return path.empty() ? std::string(key) : path + "." + key;
  }
  static std::string item(const std::string& path, size_t i) { return path + "[" + std::to_string(i) + "]"; }
  static std::string shown(const json& v) {
    std::string s = v.dump();
    return s.size() > 60 ? s.substr(0, 57) + "..." : s;
  }
  int64_t integer(const json& v, const std::string& path, int64_t lo, int64_t hi) const {
    bool in_range = false;
    int64_t x = 0;
    if (v.is_number_unsigned()) {
      const uint64_t u = v.get<uint64_t>();
      in_range = u <= static_cast<uint64_t>(hi) && (lo <= 0 || u >= static_cast<uint64_t>(lo));
      x = static_cast<int64_t>(u);
    } else if (v.is_number_integer()) {
      x = v.get<int64_t>();
      in_range = x >= lo && x <= hi;
    } else {
      fail(path, shown(v) + " is not an integer");
    }
    if (!in_range)
      fail(path, shown(v) + " is out of range [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
    return x;
  }
  int64_t integer(const json& obj, const std::string& path, const char* key, int64_t lo, int64_t hi) const {
    return integer(at(obj, path, key), child(path, key), lo, hi);
  }
  int64_t integer_or(const json& obj, const std::string& path, const char* key, int64_t lo, int64_t hi,
                     int64_t dflt) const {
    return obj.contains(key) ? integer(obj, path, key, lo, hi) : dflt;
  }
  std::string string(const json& v, const std::string& path) const {
    if (!v.is_string()) fail(path, shown(v) + " is not a string");
    return v.get<std::string>();
  }
  std::string string(const json& obj, const std::string& path, const char* key) const {
    return string(at(obj, path, key), child(path, key));
  }
  std::string string_or(const json& obj, const std::string& path, const char* key) const {
    return obj.contains(key) ? string(obj, path, key) : std::string();
  }
  bool boolean_or(const json& obj, const std::string& path, const char* key, bool dflt) const {
    if (!obj.contains(key)) return dflt;
    const json& v = obj.at(key);
    if (!v.is_boolean()) fail(child(path, key), shown(v) + " is not true or false");
    return v.get<bool>();
  }
  const json& object(const json& v, const std::string& path) const {
    if (!v.is_object()) fail(path, shown(v) + " is not an object");
    return v;
  }
  const json& array(const json& v, const std::string& path, size_t most) const {
    if (!v.is_array()) fail(path, shown(v) + " is not an array");
    if (v.size() > most) fail(path, std::to_string(v.size()) + " entries, more than the " + std::to_string(most) + " allowed");
    return v;
  }
  std::vector<int64_t> integers(const json& v, const std::string& path, int64_t lo, int64_t hi, size_t most) const {
    std::vector<int64_t> out;
    for (size_t i = 0; i < array(v, path, most).size(); ++i) out.push_back(integer(v[i], item(path, i), lo, hi));
    return out;
  }
  std::vector<int64_t> integers_or(const json& obj, const std::string& path, const char* key, int64_t lo, int64_t hi,
                                   size_t most) const {
    return obj.contains(key) ? integers(obj.at(key), child(path, key), lo, hi, most) : std::vector<int64_t>{};
  }
  std::vector<int> ints_or(const json& obj, const std::string& path, const char* key, int64_t lo, int64_t hi,
                           size_t most) const {
    std::vector<int> out;
    for (int64_t x : integers_or(obj, path, key, lo, hi, most)) out.push_back(static_cast<int>(x));
    return out;
  }
  std::vector<std::string> strings(const json& v, const std::string& path, size_t most) const {
    std::vector<std::string> out;
    for (size_t i = 0; i < array(v, path, most).size(); ++i) out.push_back(string(v[i], item(path, i)));
    return out;
  }
};

}  // namespace sf::json_read
