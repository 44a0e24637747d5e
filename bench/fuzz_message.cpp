// libFuzzer target for the message decoder: arbitrary bytes become a multipart message
// (byte 0: frame count; then per frame but the last a 2-byte little-endian length; the last
// frame takes the rest) and go through decode(). A MessageError is the expected answer to
// garbage; any other exception, crash or sanitizer report is a bug. Decoded messages are
// re-encoded and decoded again, and must match. Built and run by scripts/fuzz (clang).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "transport/message.h"

namespace {

rlhf::Frames split_frames(const uint8_t* data, size_t size) {
  rlhf::Frames frames;
  if (size == 0) return frames;
  const size_t count = data[0] % 9;
  size_t at = 1;
  for (size_t i = 0; i + 1 < count && at + 2 <= size; ++i) {
    size_t len = data[at] | (size_t{data[at + 1]} << 8);
    at += 2;
    len = std::min(len, size - at);
    frames.emplace_back(data + at, len);
    at += len;
  }
  if (count > 0) frames.emplace_back(data + at, size - at);
  return frames;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  at::set_num_threads(1);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  rlhf::MessageLimits limits;
  limits.max_total_bytes = uint64_t{1} << 24;  // keep a valid-but-large claim cheap
  rlhf::Message m;
  try {
    m = rlhf::decode(split_frames(data, size), limits);
  } catch (const rlhf::MessageError&) {
    return 0;  // rejected with a reason: the expected outcome for garbage
  }
  rlhf::Message again = rlhf::decode(rlhf::encode(m), limits);
  if (again.tensors.size() != m.tensors.size() || again.args != m.args || again.id != m.id)
    std::abort();
  for (size_t i = 0; i < m.tensors.size(); ++i) {  // bytes, so NaN payloads compare too
    const at::Tensor& a = m.tensors[i].tensor;
    const at::Tensor& b = again.tensors[i].tensor;
    if (a.sizes() != b.sizes() || a.scalar_type() != b.scalar_type() ||
        (a.nbytes() > 0 && std::memcmp(a.data_ptr(), b.data_ptr(), a.nbytes()) != 0))
      std::abort();
  }
  return 0;
}
