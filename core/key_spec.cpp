// One key's type and range: what the validator expects, its check of a value, and how a
// `--set` value is read.
#include <cmath>
#include <cstdio>

#include "core/errors.h"
#include "core/spec_schema.h"
#include "core/text.h"

namespace rlhf {

using nlohmann::json;

namespace {

constexpr double kInf = kUnbounded;

std::string format_number(double v) {
  if (std::abs(v) >= kInf) return "inf";
  if (v == std::floor(v) && std::abs(v) < 1e15) return std::to_string(static_cast<int64_t>(v));
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

std::string describe(const json& v) {
  std::string s = v.dump();
  return s.size() > 60 ? s.substr(0, 57) + "..." : s;
}

bool is_integer(const json& v) {
  if (v.is_number_integer()) return true;
  return v.is_number_float() && v.get<double>() == std::floor(v.get<double>()) &&
         std::abs(v.get<double>()) < 9e15;
}

std::string range_text(const KeySpec& k) {
  std::string lo = k.min ? format_number(*k.min) : "";
  std::string hi = k.max ? format_number(*k.max) : "";
  if (k.min && k.max)
    return " in " + std::string(k.min_exclusive ? "(" : "[") + lo + ", " + hi + "]";
  if (k.min) return std::string(k.min_exclusive ? " > " : " >= ") + lo;
  if (k.max) return " <= " + hi;
  return "";
}

bool in_range(const KeySpec& k, double v) {
  if (k.min && (k.min_exclusive ? v <= *k.min : v < *k.min)) return false;
  if (k.max && v > *k.max) return false;
  return true;
}

std::string check_devices(const json& v) {
  auto check_list = [](const json& list) -> std::string {
    if (!list.is_array()) return "a list of device ids";
    for (const auto& d : list)
      if (!d.is_number_integer() || d.get<int64_t>() < 0) return "device ids as integers >= 0";
    return "";
  };
  if (v.is_array()) return check_list(v);
  if (v.is_object()) {
    for (const auto& [node, list] : v.items())
      if (auto e = check_list(list); !e.empty()) return e + " for node \"" + node + "\"";
    return "";
  }
  return "a list of device ids or an object {\"node\": [ids]}";
}

}  // namespace

const char* key_type_name(KeyType type) {
  switch (type) {
    case KeyType::kInt:
      return "integer";
    case KeyType::kFloat:
      return "number";
    case KeyType::kFloatOrAuto:
      return "number or auto";
    case KeyType::kBool:
      return "boolean";
    case KeyType::kString:
      return "string";
    case KeyType::kPath:
      return "path";
    case KeyType::kEnum:
      return "choice";
    case KeyType::kFloatList:
      return "numbers";
    case KeyType::kIntList:
      return "integers";
    case KeyType::kDevices:
      return "devices";
    case KeyType::kNodes:
      return "nodes";
    case KeyType::kSources:
      return "sources";
    case KeyType::kObject:
      return "object";
  }
  return "?";
}

std::string KeySpec::expectation() const {
  switch (type) {
    case KeyType::kInt:
      return "an integer" + range_text(*this);
    case KeyType::kFloat:
      return "a number" + range_text(*this);
    case KeyType::kFloatOrAuto:
      return "\"auto\" or a number" + range_text(*this);
    case KeyType::kBool:
      return "true or false";
    case KeyType::kString:
      return "a string";
    case KeyType::kPath:
      return "a path (a string)";
    case KeyType::kEnum: {
      std::vector<std::string> shown;
      for (const auto& c : choices) shown.push_back(c.empty() ? "\"\"" : c);
      return "one of " + join(shown, ", ");
    }
    case KeyType::kFloatList:
      return "a list of " + std::to_string(list_len) + " numbers";
    case KeyType::kIntList:
      return "a list of integers" + range_text(*this);
    case KeyType::kDevices:
      return "a list of device ids or an object {\"node\": [ids]}";
    case KeyType::kNodes:
      return "a list of node objects";
    case KeyType::kSources:
      return "a list of reward-source objects";
    case KeyType::kObject:
      return "a JSON object";
  }
  return "?";
}

std::string KeySpec::check(const json& v) const {
  auto bad = [&](const std::string& what = "") {
    return "expected " + (what.empty() ? expectation() : what) + ", found " + describe(v);
  };
  switch (type) {
    case KeyType::kInt:
      if (!is_integer(v)) return bad();
      return in_range(*this, v.get<double>()) ? "" : bad();
    case KeyType::kFloat:
      if (!v.is_number()) return bad();
      return in_range(*this, v.get<double>()) ? "" : bad();
    case KeyType::kFloatOrAuto:
      if (v.is_string() && v.get<std::string>() == "auto") return "";
      if (!v.is_number()) return bad();
      return in_range(*this, v.get<double>()) ? "" : bad();
    case KeyType::kBool:
      return v.is_boolean() ? "" : bad();
    case KeyType::kString:
    case KeyType::kPath:
      return v.is_string() ? "" : bad();
    case KeyType::kEnum:
      if (!v.is_string()) return bad();
      for (const auto& c : choices)
        if (c == v.get<std::string>()) return "";
      {
        std::string hint = closest_match(v.get<std::string>(), choices);
        return bad() + (hint.empty() ? "" : " (did you mean " + hint + "?)");
      }
    case KeyType::kFloatList:
      if (!v.is_array() || v.size() != list_len) return bad();
      for (const auto& e : v)
        if (!e.is_number()) return bad();
      return "";
    case KeyType::kIntList:
      if (!v.is_array()) return bad();
      for (const auto& e : v)
        if (!is_integer(e) || !in_range(*this, e.get<double>())) return bad();
      return "";
    case KeyType::kDevices: {
      std::string e = check_devices(v);
      return e.empty() ? "" : bad(e);
    }
    case KeyType::kNodes:
      return v.is_array() && !v.empty() ? "" : bad("a non-empty list of node objects");
    case KeyType::kSources:
      if (!v.is_array()) return bad();
      for (const auto& e : v)
        if (!e.is_object()) return bad();
      return "";
    case KeyType::kObject:
      return v.is_object() ? "" : bad();
  }
  return "";
}

json KeySpec::parse_override(const std::string& text) const {
  auto fail = [&]() -> json {
    throw InputError("--set " + path + "=" + text + ": expected " + expectation());
  };
  switch (type) {
    case KeyType::kString:
    case KeyType::kPath:
    case KeyType::kEnum:
      return text;
    case KeyType::kBool:
      if (text == "true" || text == "1") return true;
      if (text == "false" || text == "0") return false;
      return fail();
    case KeyType::kFloatOrAuto:
      if (trim(text) == "auto") return "auto";
      [[fallthrough]];
    case KeyType::kInt:
    case KeyType::kFloat: {
      json v = json::parse(text, nullptr, /*allow_exceptions=*/false);
      if (v.is_discarded() || !v.is_number()) return fail();
      return v;
    }
    default: {
      // Lists and objects: JSON, or a bare comma-separated list of numbers.
      std::string t = trim(text);
      json v = json::parse(t, nullptr, false);
      if (v.is_discarded() && !t.empty() && t.front() != '[' && t.front() != '{')
        v = json::parse("[" + t + "]", nullptr, false);
      if (v.is_discarded()) return fail();
      return v;
    }
  }
}

}  // namespace rlhf
