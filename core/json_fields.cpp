// JsonFields: see json_fields.h.
#include "core/json_fields.h"

namespace rlhf {

JsonFields::JsonFields(const nlohmann::json& j, std::string where)
    : j_(j), where_(std::move(where)) {
  if (!j.is_object()) throw RuntimeError(where_ + ": expected a JSON object, got " + j.dump());
}

const nlohmann::json& JsonFields::take(const char* name) {
  seen_.insert(name);
  auto it = j_.find(name);
  if (it == j_.end()) throw RuntimeError(where_ + ": missing field \"" + name + "\"");
  return *it;
}

void JsonFields::finish() const {
  for (const auto& [name, value] : j_.items())
    if (!seen_.count(name)) throw RuntimeError(where_ + ": unknown field \"" + name + "\"");
}

RuntimeError JsonFields::wrong_type(const char* name, const nlohmann::json& value) const {
  return RuntimeError(where_ + ": field \"" + name + "\" has the wrong type: " + value.dump());
}

}  // namespace rlhf
