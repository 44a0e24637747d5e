// OperationRegistry: a map from operation names to handlers.
#include "actors/operation_registry.h"

#include <stdexcept>

namespace rlhf {

void OperationRegistry::add(const std::string& name, Operation operation) {
  if (!operations_.emplace(name, std::move(operation)).second)
    throw std::logic_error("operation \"" + name + "\" registered twice");
}

const Operation* OperationRegistry::find(const std::string& name) const {
  auto it = operations_.find(name);
  return it == operations_.end() ? nullptr : &it->second;
}

void OperationRegistry::wrap(const std::string& name,
                             const std::function<Operation(Operation)>& wrapper) {
  auto it = operations_.find(name);
  if (it == operations_.end())
    throw std::logic_error("cannot wrap operation \"" + name + "\": not registered");
  it->second = wrapper(std::move(it->second));
}

std::vector<std::string> OperationRegistry::names() const {
  std::vector<std::string> out;
  for (const auto& [name, op] : operations_) out.push_back(name);
  return out;
}

}  // namespace rlhf
