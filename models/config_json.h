// Reading config.json fields with errors that name the file and the key: shared by the
// common reader (models/config.cpp) and each family's own fields (models/families/).
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "core/errors.h"
#include "models/config.h"

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

// One RoPE parameter dict (transformers 5's rope_parameters, or an older rope_scaling): its
// rope_theta (else `top`'s rope_theta, else `default_theta`) into `theta`, its scaling
// (default, linear, llama3) into `scaling`; partial rotary, other types and per-layer-type
// dicts are an InputError naming `where`. `max_positions`: llama3's default original length.
void read_rope(const nlohmann::json& top, const nlohmann::json& params, const std::string& where,
               double default_theta, int64_t max_positions, double& theta, RopeScaling& scaling);

// The rope_parameters dict of `theta` and `scaling`, as transformers 5 writes it.
nlohmann::json rope_json(double theta, const RopeScaling& scaling);

}  // namespace rlhf::models::config_json
