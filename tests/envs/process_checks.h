// Helpers of the environment tests, from tests/support: the process checks and the message
// of an expected exception.
#pragma once

#include "tests/support/message_of.h"
#include "tests/support/process_checks.h"

namespace rlhf::envs::testing {

using test::children_of_this_process;
using test::message_of;
using test::pid_alive;
using test::read_text;

}  // namespace rlhf::envs::testing
