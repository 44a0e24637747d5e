// The per-job registration token: random bytes from the kernel, compared in constant time,
// so a stray process (or another job's worker) cannot join. Not encryption: the token
// travels in clear over the job's own endpoints, which bind to loopback by default.
#pragma once

#include <string>

namespace rlhf {

// 32 random bytes as 64 hex characters; throws RuntimeError when getrandom fails.
std::string make_job_token();

// Constant-time equality (no early exit on the first differing byte).
bool token_matches(const std::string& expected, const std::string& offered);

}  // namespace rlhf
