// The message of an exception a test expects.
#pragma once

#include <gtest/gtest.h>

#include <string>

namespace rlhf::test {

// The what() of the E that `f` throws; a test failure (and "") if it throws nothing.
template <class E, class F>
std::string message_of(F f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected an exception";
  return "";
}

}  // namespace rlhf::test
