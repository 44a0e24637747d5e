// A transport message: one JSON header frame (kind, operation, request id, step, small
// arguments, and name/dtype/shape/bytes per tensor) followed by one raw frame per tensor.
// Encoding never copies tensor bytes; decoding validates everything before any use and
// yields tensors that own their frame's memory. No sockets here (see channel.h).
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>
#include <zmq.hpp>

#include "core/errors.h"

namespace rlhf {

using Frames = std::vector<zmq::message_t>;

enum class MessageKind {
  kRequest,     // scheduler -> worker: run `op`
  kReply,       // worker -> scheduler: result of request `id`
  kError,       // either way: request `id` failed (or the message was malformed), see `error`
  kRegister,    // worker -> scheduler: join the job (args carry the token and identity)
  kRegistered,  // scheduler -> worker: accepted (args carry heartbeat settings)
  kHeartbeat,   // both ways: liveness
  kShutdown,    // scheduler -> worker: finish the current operation and exit
  kPartial,     // worker -> scheduler: part of request `id`'s result, ahead of its reply
};
const char* message_kind_name(MessageKind kind);

struct NamedTensor {
  std::string name;
  torch::Tensor tensor;  // any shape; CPU and contiguous once decoded
};

struct Message {
  MessageKind kind = MessageKind::kRequest;
  std::string op;    // operation name ("echo", "train_step"), echoed in replies
  uint64_t id = 0;   // request id; replies and errors carry the request's id
  int64_t step = 0;  // training step the message belongs to (for logs)
  nlohmann::json args = nlohmann::json::object();  // small scalar arguments / results
  std::vector<NamedTensor> tensors;
  std::string error;  // what went wrong (kError only)

  // The tensor called `name`; throws InputError naming the operation when absent.
  const torch::Tensor& tensor(const std::string& name) const;
  bool has_tensor(const std::string& name) const;
  Message& add(std::string name, torch::Tensor tensor);
};

// Bounds a receiver enforces before it trusts a header.
struct MessageLimits {
  size_t max_header_bytes = size_t{1} << 20;  // 1 MiB of JSON
  size_t max_tensors = 4096;
  size_t max_dims = 16;
  uint64_t max_total_bytes = uint64_t{16} << 30;  // 16 GiB of tensor data per message
};

// Malformed message: what was wrong, for the error reply and the log.
class MessageError : public InputError {
 public:
  using InputError::InputError;
};

// How large tensors travel.
struct EncodeOptions {
  // Tensors of at least this many bytes go through shared memory (transport/shm_tensor.h)
  // instead of a frame; 0: never. Only for a receiver on the same node.
  uint64_t shm_min_bytes = 0;
};

// Header frame + one frame per tensor. Tensors are made contiguous and moved to CPU when
// they are not already (a copy only then); otherwise each frame points at the tensor's
// bytes and keeps the tensor alive until ZeroMQ has sent it.
// With `options.shm_min_bytes`, large tensors are copied once into shared memory and their
// frame is empty.
Frames encode(const Message& message, const EncodeOptions& options = {});

// Validates and decodes; consumes `frames`. Throws MessageError with the reason (bad JSON,
// unknown kind or dtype, shape vs byte-size mismatch, frame count, limits exceeded, a
// shared-memory segment that is missing or of the wrong size).
Message decode(Frames&& frames, const MessageLimits& limits);

// Best-effort request id from a header that may be malformed (0 when unreadable), so an
// error reply can still name the request it answers.
uint64_t peek_request_id(const zmq::message_t& header) noexcept;

// An error reply to request `id` (operation `op`).
Message make_error(uint64_t id, std::string op, std::string error);

// dtype <-> header name ("float32", "bfloat16", "int64", "bool", ...).
const char* dtype_name(c10::ScalarType dtype);
// Throws MessageError for a name outside the supported set.
c10::ScalarType parse_dtype(const std::string& name);

}  // namespace rlhf
