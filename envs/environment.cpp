// PLACEHOLDER (issue 31, h-tloop branch): the envs helper's environment.cpp (built-in,
// Python and HTTP environments) replaces this file; here every configuration is refused.
#include "envs/environment.h"

#include "core/errors.h"

namespace rlhf::envs {

std::unique_ptr<Environment> make_environment(const EnvironmentConfig& config) {
  const std::string what = !config.builtin.empty()  ? "env.builtin \"" + config.builtin + "\""
                           : !config.python.empty() ? "env.python \"" + config.python + "\""
                           : !config.url.empty()    ? "env.url \"" + config.url + "\""
                                                    : std::string("no env.* key");
  throw InputError(what + ": environments are not built into this binary yet");
}

}  // namespace rlhf::envs
