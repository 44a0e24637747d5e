// Helpers of the environment tests: the process checks of tests/support, and the message of
// an expected exception.
#pragma once

#include <string>

#include "tests/support/process_checks.h"

namespace rlhf::envs::testing {

using test::children_of_this_process;
using test::pid_alive;
using test::read_text;

// The what() of the E that `f` throws; "" (and a test failure by the caller) if none.
template <class E, class F>
std::string message_of(F f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  }
  return "";
}

}  // namespace rlhf::envs::testing
