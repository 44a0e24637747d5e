// What a trainer's checkpoint shard holds, counted for tests of what is saved (LoRA: only
// adapters and heads, with their AdamW state).
#pragma once

#include <cstdint>
#include <string>

#include "models/safetensors.h"

namespace rlhf::test {

// FP32 elements of a shard (the RNG state, not FP32, left out): master weights (".master"
// names) and all of them (master + the two AdamW moments).
struct Fp32Elements {
  int64_t master = 0;
  int64_t total = 0;
};

inline Fp32Elements fp32_elements(const std::string& shard) {
  models::SafetensorsFile file(shard);
  Fp32Elements out;
  for (const auto& info : file.tensors()) {
    if (info.dtype != torch::kFloat32) continue;
    int64_t n = 1;
    for (int64_t d : info.shape) n *= d;
    out.total += n;
    if (info.name.find(".master") != std::string::npos) out.master += n;
  }
  return out;
}

}  // namespace rlhf::test
