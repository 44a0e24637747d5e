// Channel: socket options, wildcard binding and timed multipart receive over cppzmq.
#include "transport/channel.h"

#include <zmq_addon.hpp>

#include "core/errors.h"

namespace rlhf {

Channel::Channel(zmq::context_t& context, zmq::socket_type type, std::chrono::milliseconds linger)
    : socket_(context, type) {
  socket_.set(zmq::sockopt::linger, static_cast<int>(linger.count()));
}

std::string Channel::bind(const std::string& endpoint) {
  try {
    socket_.bind(endpoint);
  } catch (const zmq::error_t& e) {
    throw RuntimeError("cannot bind " + endpoint + ": " + e.what());
  }
  return socket_.get(zmq::sockopt::last_endpoint);
}

void Channel::connect(const std::string& endpoint) {
  try {
    socket_.connect(endpoint);
  } catch (const zmq::error_t& e) {
    throw RuntimeError("cannot connect to " + endpoint + ": " + e.what());
  }
}

void Channel::set_max_message_size(uint64_t bytes) {
  socket_.set(zmq::sockopt::maxmsgsize, static_cast<int64_t>(bytes));
}

void Channel::send(Frames&& frames) {
  for (size_t i = 0; i < frames.size(); ++i) {
    auto flags = i + 1 < frames.size() ? zmq::send_flags::sndmore : zmq::send_flags::none;
    if (!socket_.send(frames[i], flags))
      throw RuntimeError("zmq send would block on a blocking socket");
  }
  frames.clear();
}

std::optional<Frames> Channel::recv(std::optional<std::chrono::milliseconds> timeout) {
  if (timeout) {
    zmq::pollitem_t item{socket_.handle(), 0, ZMQ_POLLIN, 0};
    if (zmq::poll(&item, 1, *timeout) == 0) return std::nullopt;
  }
  Frames frames;
  if (!zmq::recv_multipart(socket_, std::back_inserter(frames))) return std::nullopt;
  return frames;
}

std::string tcp_wildcard(const std::string& host) {
  return "tcp://" + host + ":*";
}

}  // namespace rlhf
