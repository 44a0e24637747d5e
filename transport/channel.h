// A ZeroMQ socket with the few things every rlhf endpoint needs: bind to a wildcard port
// and read the real endpoint back, multipart send, and receive with an optional timeout
// (an empty optional means "nothing arrived"; real failures throw). No message parsing.
#pragma once

#include <chrono>
#include <optional>
#include <string>
#include <zmq.hpp>

#include "transport/message.h"

namespace rlhf {

class Channel {
 public:
  // `linger`: how long unsent messages may delay close.
  Channel(zmq::context_t& context, zmq::socket_type type,
          std::chrono::milliseconds linger = std::chrono::milliseconds(200));

  // Binds and returns the resolved endpoint ("tcp://127.0.0.1:*" -> "tcp://127.0.0.1:40123").
  std::string bind(const std::string& endpoint);
  void connect(const std::string& endpoint);
  // Rejects (drops the connection of) any incoming message larger than `bytes`.
  void set_max_message_size(uint64_t bytes);

  // Sends every frame as one multipart message; blocks while the peer's queue is full.
  void send(Frames&& frames);
  void send(const Message& message) { send(encode(message)); }
  // One whole multipart message; nullopt when none arrived within `timeout`
  // (no timeout: wait forever).
  std::optional<Frames> recv(std::optional<std::chrono::milliseconds> timeout);

  zmq::socket_t& socket() { return socket_; }

 private:
  zmq::socket_t socket_;
};

// "tcp://127.0.0.1:*" style wildcard endpoint for a host.
std::string tcp_wildcard(const std::string& host);

}  // namespace rlhf
