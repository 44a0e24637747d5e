// Job tokens from getrandom(2).
#include "transport/job_token.h"

#include <sys/random.h>

#include <cerrno>
#include <cstring>

#include "core/errors.h"

namespace rlhf {

std::string make_job_token() {
  unsigned char bytes[32];
  size_t got = 0;
  while (got < sizeof bytes) {
    ssize_t n = getrandom(bytes + got, sizeof bytes - got, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw RuntimeError(std::string("getrandom failed: ") + std::strerror(errno));
    got += static_cast<size_t>(n);
  }
  static const char kHex[] = "0123456789abcdef";
  std::string token;
  for (unsigned char b : bytes) {
    token += kHex[b >> 4];
    token += kHex[b & 15];
  }
  return token;
}

bool token_matches(const std::string& expected, const std::string& offered) {
  unsigned char diff = expected.size() == offered.size() ? 0 : 1;
  for (size_t i = 0; i < expected.size(); ++i)
    diff |= static_cast<unsigned char>(expected[i] ^ (i < offered.size() ? offered[i] : 0));
  return diff == 0 && !expected.empty();
}

}  // namespace rlhf
