// "FILE.py:NAME", the form a spec names Python code in (reward.python, a {"python": ...}
// reward source, env.python): parsed here and nowhere else.
#pragma once

#include <optional>
#include <string>

namespace rlhf {

struct PythonRef {
  std::string file;  // "rewards/my_reward.py"
  std::string name;  // the function or factory: "score"
};

// nullopt unless `text` is FILE.py:NAME with a non-empty NAME (the last ':' splits them).
std::optional<PythonRef> parse_python_ref(const std::string& text);

}  // namespace rlhf
