// Typed worker operations: the one contract between drivers and workers. An operation is a
// request struct with
//   static constexpr const char* kName = "train_actor";  // the operation's name on the wire
//   using Reply = TrainActorReply;                       // what its reply's args hold
// and both structs declared with RLHF_WIRE_STRUCT (core/json_fields.h): one to_json and one
// strict from_json each, so a field missing or unknown on either side is an error naming the
// operation and the field. Tensors travel beside the args (Message::tensors), named in the
// request's comment. Drivers call RoleGroup::call_all / scatter with a request; workers
// register a handler per request type (OperationRegistry::add<Request>). The structs live
// beside what they carry: transport/worker_ops.h (what every worker answers),
// engine/worker_ops.h (model roles), rollout/, ppo/ and dpo/ worker_ops.h.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/json_fields.h"
#include "transport/message.h"

namespace rlhf {

// The wire format's version: bump it when the framing or the meaning of a field changes
// (a field added, removed or retyped changes the fingerprint of actors/wire_version.h on its
// own). A worker of another version is refused at registration, by name.
inline constexpr int kWireVersion = 2;

// The field every reply carries beside its Reply's: the handler's own time (actors/worker.cpp).
inline constexpr const char* kComputeSecondsField = "compute_s";

// One rank's typed reply to a call_all: its args, its tensors, and the handler's time on
// its worker.
template <typename Reply>
struct Answered {
  Reply reply;
  double compute_s = 0;
  Message tensors;  // the reply's tensors (tensors.tensor("log_probs")); its args are empty
};

// The slowest rank's handler time of a call_all (the others ran at the same time).
template <typename Reply>
double slowest_compute(const std::vector<Answered<Reply>>& answers) {
  double most = 0;
  for (const auto& a : answers) most = a.compute_s > most ? a.compute_s : most;
  return most;
}

// The reply args a handler returns for `reply` (the worker adds compute_s).
template <typename Reply>
Message reply_message(const Reply& reply) {
  Message m;
  m.args = nlohmann::json(reply);
  return m;
}

// The request's args.
template <typename Request>
nlohmann::json request_args(const Request& request) {
  return nlohmann::json(request);
}

// The reply's args as Request::Reply (the compute_s envelope field aside). Throws
// RuntimeError naming the operation and the field when they do not match.
template <typename Request>
typename Request::Reply reply_of(const Message& reply) {
  nlohmann::json args = reply.args;
  if (args.is_object()) args.erase(kComputeSecondsField);
  return args.template get<typename Request::Reply>();
}

// Each micro batch's reply of a gathered scatter (RoleGroup::scatter's "micro_batches").
template <typename Request>
std::vector<typename Request::Reply> micro_batch_replies(const Message& gathered) {
  std::vector<typename Request::Reply> out;
  for (const auto& args : gathered.args.at("micro_batches")) {
    Message m;
    m.args = args;
    out.push_back(reply_of<Request>(m));
  }
  return out;
}

}  // namespace rlhf
