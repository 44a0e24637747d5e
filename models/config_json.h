// Reading config.json fields with errors that name the file and the key: shared by the
// common reader (models/config.cpp) and each family's own fields (models/families/).
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "core/errors.h"

namespace rlhf::models::config_json {

template <typename T>
T get_or(const nlohmann::json& j, const char* key, T fallback, const std::string& source) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return fallback;
  try {
    return it->get<T>();
  } catch (const nlohmann::json::exception&) {
    throw InputError(source + ": key \"" + key + "\" has the wrong type (" + it->dump() + ")");
  }
}

template <typename T>
T require(const nlohmann::json& j, const char* key, const std::string& source) {
  if (!j.contains(key) || j[key].is_null())
    throw InputError(source + ": missing required key \"" + key + "\"");
  return get_or<T>(j, key, T{}, source);
}

}  // namespace rlhf::models::config_json
