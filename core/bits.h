// A double's bits carried in an int64 and back, for sending doubles bit for bit through int64
// tensors (the weight sync's header, the environments' answers under tensor parallelism).
#pragma once

#include <cstdint>
#include <cstring>

namespace rlhf {

inline int64_t double_bits(double v) {
  int64_t bits = 0;
  std::memcpy(&bits, &v, sizeof bits);
  return bits;
}

inline double bits_double(int64_t bits) {
  double v = 0;
  std::memcpy(&v, &bits, sizeof v);
  return v;
}

}  // namespace rlhf
