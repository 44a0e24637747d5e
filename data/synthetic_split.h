// The held-out split of a built-in synthetic problem set (synthetic:arith, synthetic:calc): a
// problem's split is a hash of its text, so the training and held-out splits never share a
// problem whatever seeds draw them.
#pragma once

#include <cstdint>
#include <random>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "core/errors.h"

namespace rlhf::data {

// FNV-1a of the problem's text: one in five problems is held out.
inline bool held_out(std::string_view text) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : text) h = (h ^ c) * 1099511628211ull;
  return h % 5 == 0;
}

// `count` distinct problems of one split (`test`: the held-out one) drawn by `draw(rng)`, told
// apart by `text(problem)`. Throws InputError naming `dataset` when they cannot be drawn.
template <class Draw, class Text>
auto draw_split(int64_t count, std::mt19937_64& rng, bool test, Draw draw, Text text,
                const std::string& dataset) {
  std::vector<decltype(draw(rng))> out;
  std::set<std::string> seen;
  for (int64_t tries = 0; static_cast<int64_t>(out.size()) < count; ++tries) {
    if (tries > 1000 * count + 100000)
      throw InputError(dataset + ": cannot draw " + std::to_string(count) + " distinct problems");
    auto p = draw(rng);
    const std::string key = text(p);
    if (held_out(key) != test || !seen.insert(key).second) continue;
    out.push_back(std::move(p));
  }
  return out;
}

}  // namespace rlhf::data
