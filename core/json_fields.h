// Strict reading of a JSON object into a struct, field by field: a field that is missing, of
// the wrong type, or left unread (unknown to this build) is an error naming `where` and the
// field, never a default filled in by the reader. The one reader behind every typed worker
// request and reply and every config that travels whole between driver and workers.
// RLHF_WIRE_STRUCT declares a struct's one to_json and one strict from_json from its field
// list (nlohmann's ADL hooks, so `json j = request;` and `j.get<Reply>()` work).
#pragma once

#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <type_traits>

#include "core/errors.h"

namespace rlhf {

class JsonFields {
 public:
  // Throws RuntimeError when `j` is not an object.
  JsonFields(const nlohmann::json& j, std::string where);

  // out = the field's value. Throws RuntimeError naming `where` and the field when it is
  // missing or of the wrong type; a nested struct's own RuntimeError comes prefixed with
  // `where` ("load_model: generation: missing field ...").
  template <typename T>
  void read(const char* name, T& out) {
    const nlohmann::json& value = take(name);
    try {
      // JSON has no NaN or infinity: a non-finite number (a skipped step's grad norm, a loss
      // that diverged) is written as null and reads back as NaN.
      if constexpr (std::is_floating_point_v<T>) {
        if (value.is_null()) {
          out = std::numeric_limits<T>::quiet_NaN();
          return;
        }
      } else if constexpr (std::is_same_v<T, std::map<std::string, double>>) {
        out.clear();
        for (const auto& [key, v] : value.template get<std::map<std::string, nlohmann::json>>())
          out[key] =
              v.is_null() ? std::numeric_limits<double>::quiet_NaN() : v.template get<double>();
        return;
      }
      out = value.template get<T>();
    } catch (const nlohmann::json::exception&) {
      throw wrong_type(name, value);
    } catch (const RuntimeError& e) {
      throw RuntimeError(where_ + ": " + e.what());
    }
  }
  template <typename T>
  T get(const char* name) {
    T out{};
    read(name, out);
    return out;
  }
  // The field's JSON, marked as read (for a nested reader or a parse of its own). Throws
  // RuntimeError when it is missing.
  const nlohmann::json& take(const char* name);
  // "where.name": the `where` of a nested reader.
  std::string nested(const char* name) const { return where_ + "." + name; }
  const std::string& where() const { return where_; }
  // Every field of the object was read: another build's field is not silently dropped.
  void finish() const;

 private:
  RuntimeError wrong_type(const char* name, const nlohmann::json& value) const;

  const nlohmann::json& j_;
  std::string where_;
  std::set<std::string> seen_;
};

}  // namespace rlhf

#define RLHF_WIRE_FIELD_TO(field) rlhf_json[#field] = rlhf_value.field;
#define RLHF_WIRE_FIELD_FROM(field) rlhf_fields.read(#field, rlhf_value.field);

// One to_json and one strict from_json for `Type`, whose fields are listed (all of them; a
// field not listed does not travel). `where` names the struct in errors ("train_actor").
// Use at namespace scope, in Type's namespace.
#define RLHF_WIRE_STRUCT(Type, where, ...)                                       \
  inline void to_json(nlohmann::json& rlhf_json, const Type& rlhf_value) {       \
    rlhf_json = nlohmann::json::object();                                        \
    NLOHMANN_JSON_EXPAND(NLOHMANN_JSON_PASTE(RLHF_WIRE_FIELD_TO, __VA_ARGS__))   \
  }                                                                              \
  inline void from_json(const nlohmann::json& rlhf_json, Type& rlhf_value) {     \
    ::rlhf::JsonFields rlhf_fields(rlhf_json, where);                            \
    NLOHMANN_JSON_EXPAND(NLOHMANN_JSON_PASTE(RLHF_WIRE_FIELD_FROM, __VA_ARGS__)) \
    rlhf_fields.finish();                                                        \
  }

// The same for a struct without fields: it travels as {} and refuses any field.
#define RLHF_WIRE_EMPTY(Type, where)                              \
  inline void to_json(nlohmann::json& rlhf_json, const Type&) {   \
    rlhf_json = nlohmann::json::object();                         \
  }                                                               \
  inline void from_json(const nlohmann::json& rlhf_json, Type&) { \
    ::rlhf::JsonFields(rlhf_json, where).finish();                \
  }
