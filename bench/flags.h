// A benchmark's command line: `--name value` flags and bare `--name` switches, read by name
// with a default, every error naming the flag and ending with the usage line. One copy for
// every bench/ program (each used to parse argv by hand).
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace rlhf::bench {

// "a,b,c" -> {"a", "b", "c"} (empty items dropped).
inline std::vector<std::string> split_list(const std::string& text) {
  std::vector<std::string> out;
  std::stringstream in(text);
  for (std::string item; std::getline(in, item, ',');)
    if (!item.empty()) out.push_back(item);
  return out;
}

// "1,8,32" -> {1, 8, 32}. Throws std::invalid_argument naming an item that is no integer.
inline std::vector<int64_t> integer_list(const std::string& text) {
  std::vector<int64_t> out;
  for (const auto& item : split_list(text)) {
    size_t used = 0;
    long long n = 0;
    try {
      n = std::stoll(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == 0 || used != item.size())
      throw std::invalid_argument("expected integers separated by commas, got \"" + text + "\"");
    out.push_back(n);
  }
  return out;
}

class Flags {
 public:
  // argv[1..]: each argument is a switch named in `switches` or "--name value". Throws
  // std::invalid_argument for a value missing at the end or an argument that is no flag.
  Flags(int argc, char** argv, std::string usage, std::set<std::string> switches = {})
      : usage_(std::move(usage)) {
    for (int i = 1; i < argc; ++i) {
      const std::string name = argv[i];
      if (switches.count(name)) {
        values_[name] = "";
      } else if (name.rfind("--", 0) != 0) {
        fail("unexpected argument \"" + name + "\"");
      } else if (i + 1 >= argc) {
        fail("missing value after " + name);
      } else {
        values_[name] = argv[++i];
      }
    }
  }

  // The value of --name (the last one given), or `fallback` without it.
  std::string text(const std::string& name, const std::string& fallback = "") {
    asked_.insert(name);
    const auto it = values_.find(name);
    return it == values_.end() ? fallback : it->second;
  }
  int64_t integer(const std::string& name, int64_t fallback) {
    const std::string v = text(name);
    return v.empty() ? fallback : to_integer(name, v);
  }
  double number(const std::string& name, double fallback) {
    const std::string v = text(name);
    if (v.empty()) return fallback;
    try {
      size_t used = 0;
      const double d = std::stod(v, &used);
      if (used == v.size()) return d;
    } catch (const std::exception&) {
    }
    fail(name + ": expected a number, got \"" + v + "\"");
  }
  // "a,b,c" (empty items dropped), or `fallback` without the flag.
  std::vector<std::string> list(const std::string& name, std::vector<std::string> fallback) {
    const std::string v = text(name);
    return v.empty() ? fallback : split_list(v);
  }
  std::vector<int64_t> integers(const std::string& name, std::vector<int64_t> fallback) {
    const std::string v = text(name);
    if (v.empty()) return fallback;
    try {
      return integer_list(v);
    } catch (const std::invalid_argument& e) {
      fail(name + ": " + e.what());
    }
  }
  // Whether the switch was given.
  bool on(const std::string& name) {
    asked_.insert(name);
    return values_.count(name) > 0;
  }
  // Throws std::invalid_argument naming the first flag that no getter asked for.
  void check_all_known() const {
    for (const auto& [name, value] : values_)
      if (!asked_.count(name)) fail("unknown flag " + name);
  }
  // Throws std::invalid_argument with `what` and the usage line.
  [[noreturn]] void fail(const std::string& what) const {
    throw std::invalid_argument(what + "\n" + usage_);
  }

 private:
  int64_t to_integer(const std::string& name, const std::string& v) const {
    try {
      size_t used = 0;
      const long long n = std::stoll(v, &used);
      if (used == v.size()) return n;
    } catch (const std::exception&) {
    }
    fail(name + ": expected an integer, got \"" + v + "\"");
  }

  std::string usage_;
  std::map<std::string, std::string> values_;
  std::set<std::string> asked_;
};

}  // namespace rlhf::bench
