#include "core/python_ref.h"

namespace rlhf {

std::optional<PythonRef> parse_python_ref(const std::string& text) {
  const auto colon = text.rfind(':');
  if (colon == std::string::npos || colon + 1 == text.size()) return std::nullopt;
  std::string file = text.substr(0, colon);
  if (file.size() < 4 || file.compare(file.size() - 3, 3, ".py") != 0) return std::nullopt;
  return PythonRef{std::move(file), text.substr(colon + 1)};
}

}  // namespace rlhf
