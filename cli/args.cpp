#include "cli/args.h"

#include <iostream>
#include <sstream>
#include <stdexcept>

#include "core/errors.h"
#include "core/model_ref.h"

namespace rlhf::cli {

Args::Args(const std::vector<std::string>& argv, const std::vector<OptionSpec>& options) {
  auto find = [&](const std::string& name) -> const OptionSpec* {
    for (const auto& o : options)
      if (o.name == name) return &o;
    return nullptr;
  };
  for (size_t i = 0; i < argv.size(); ++i) {
    const std::string& a = argv[i];
    if (a.size() > 2 && a.rfind("--", 0) == 0) {
      std::string name = a, inline_value;
      bool has_inline = false;
      if (auto eq = a.find('='); eq != std::string::npos) {
        name = a.substr(0, eq);
        inline_value = a.substr(eq + 1);
        has_inline = true;
      }
      const OptionSpec* spec = find(name);
      if (!spec) throw InputError("unknown option " + name + " (see --help)");
      if (!spec->takes_value) {
        if (has_inline) throw InputError("option " + name + " takes no value");
        values_[name].push_back("");
      } else if (has_inline) {
        values_[name].push_back(inline_value);
      } else {
        if (i + 1 >= argv.size()) throw InputError("option " + name + " needs a value");
        values_[name].push_back(argv[++i]);
      }
    } else {
      positionals_.push_back(a);
    }
  }
}

bool Args::flag(const std::string& name) const {
  return values_.count(name) > 0;
}

std::optional<std::string> Args::value(const std::string& name) const {
  auto it = values_.find(name);
  if (it == values_.end() || it->second.empty()) return std::nullopt;
  return it->second.back();
}

int64_t Args::integer(const std::string& name, int64_t fallback, int64_t min) const {
  auto v = value(name);
  if (!v) return fallback;
  try {
    size_t used = 0;
    const int64_t x = std::stoll(*v, &used);
    if (used == v->size() && x >= min) return x;
  } catch (const std::exception&) {
  }
  throw InputError(name + " must be an integer >= " + std::to_string(min) + ", got \"" + *v + "\"");
}

std::vector<std::string> Args::values(const std::string& name) const {
  auto it = values_.find(name);
  return it == values_.end() ? std::vector<std::string>{} : it->second;
}

std::optional<std::string> Args::model(const std::string& name) const {
  const auto ref = value(name);
  if (!ref) return std::nullopt;
  const ModelSource found = require_model_ref(*ref, name);
  if (found.found_in != "directory") std::cerr << "rlhf: " << found.describe(name) << '\n';
  return found.path;
}

std::string format_options(const std::vector<OptionSpec>& options) {
  std::ostringstream out;
  for (const auto& o : options) {
    if (o.hidden) continue;
    std::string left = o.name + (o.takes_value ? " " + o.value_name : "");
    out << "  " << left;
    for (size_t pad = left.size(); pad < 26; ++pad) out << ' ';
    out << ' ' << o.help << '\n';
  }
  return out.str();
}

}  // namespace rlhf::cli
