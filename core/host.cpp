#include "core/host.h"

#include <unistd.h>

namespace rlhf {

std::optional<std::string> host_name() {
  char name[256] = {};  // HOST_NAME_MAX is 64 on Linux; the last byte stays NUL
  if (::gethostname(name, sizeof name - 1) != 0) return std::nullopt;
  return std::string(name);
}

}  // namespace rlhf
