// This machine's host name, as the worker registration, the scheduler's endpoint and the
// TensorBoard event file name use it.
#pragma once

#include <optional>
#include <string>

namespace rlhf {

// gethostname(2), or nullopt when it fails (each caller has its own fallback).
std::optional<std::string> host_name();

}  // namespace rlhf
