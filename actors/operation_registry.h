// Named operations a worker serves: name -> handler(request) -> reply. Algorithms register
// their operations (generate, log_probs, train_step, ...) here; the transport and the
// worker loop never change for a new operation. Not thread-safe: fill it before serving.
#pragma once

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "transport/message.h"
#include "transport/operation.h"

namespace rlhf {

// Who the worker is, for handlers that need it.
struct WorkerIdentity {
  std::string role;    // "actor"
  int rank = 0;        // within the role group
  int world_size = 1;  // role group size
  std::string device;  // "cpu:1", "cuda:0"
  std::string node;    // node name
};

// A handler returns the reply's args and tensors; the worker fills kind, id, op and step.
// Throwing reports an error reply to the caller and the worker keeps serving.
using Operation = std::function<Message(const Message& request, const WorkerIdentity& self)>;

class OperationRegistry {
 public:
  // Throws std::logic_error when `name` is already registered.
  void add(const std::string& name, Operation operation);
  // The typed form (transport/operation.h): handler(const Request&, const Message& request,
  // const WorkerIdentity&) gets the args read strictly as a Request (a field missing or
  // unknown is an error reply naming the operation and the field; the handler reads the
  // request's tensors from `request`) and returns reply_message(Reply{...}) plus tensors,
  // whose args are checked to be a Request::Reply before they leave.
  template <typename Request, typename Handler>
  void add(Handler handler) {
    add(Request::kName, [handler](const Message& message, const WorkerIdentity& self) {
      const Request request = message.args.template get<Request>();
      Message reply = handler(request, message, self);
      reply_of<Request>(reply);
      return reply;
    });
  }
  // nullptr when no operation has that name.
  const Operation* find(const std::string& name) const;
  // Replaces `name`'s handler with wrapper(handler) (measurements around an operation).
  // Throws std::logic_error when no operation has that name.
  void wrap(const std::string& name, const std::function<Operation(Operation)>& wrapper);
  std::vector<std::string> names() const;

 private:
  std::map<std::string, Operation> operations_;
};

}  // namespace rlhf
