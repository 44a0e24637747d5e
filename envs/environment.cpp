// make_environment: the env.* keys to one of the three kinds of environment.
#include "envs/environment.h"

#include "core/errors.h"
#include "core/spec.h"
#include "envs/builtin_envs.h"
#include "envs/http_env.h"
#include "envs/python_env.h"

namespace rlhf::envs {

EnvironmentConfig EnvironmentConfig::from_spec(const JobSpec& spec) {
  EnvironmentConfig c;
  c.builtin = spec.get_string("env.builtin");
  c.python = spec.get_string("env.python");
  c.url = spec.get_string("env.url");
  c.timeout_s = spec.get_float("env.timeout_s");
  c.python_workers = static_cast<int>(spec.get_int("env.python_workers"));
  c.python_interpreter = spec.get_string("env.python_interpreter");
  c.options = spec.at("env.options");
  return c;
}

std::unique_ptr<Environment> make_environment(const EnvironmentConfig& config) {
  const int kinds = !config.builtin.empty() + !config.python.empty() + !config.url.empty();
  if (kinds != 1) {
    throw InputError(
        std::string("env: expected exactly one of env.builtin, env.python, env.url, ") +
        (kinds == 0 ? "found none" : "found " + std::to_string(kinds)));
  }
  if (!config.options.is_object()) {
    throw InputError("env.options: expected an object, found " + config.options.dump());
  }
  if (!config.builtin.empty()) return make_builtin_environment(config.builtin, config.options);
  if (!config.python.empty()) return std::make_unique<PythonEnvironment>(config);
  return std::make_unique<HttpEnvironment>(config);
}

}  // namespace rlhf::envs
