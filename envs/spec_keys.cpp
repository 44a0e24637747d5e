#include "envs/spec_keys.h"

#include <filesystem>

#include "core/python_ref.h"
#include "core/spec_check.h"
#include "core/text.h"

namespace rlhf::envs {

using nlohmann::json;

namespace {

const char* const kEnvKinds[] = {"env.builtin", "env.python", "env.url"};

// At most one kind, a Python file that exists, an http:// URL, and only in ppo jobs (the
// rollout runs the environment).
void check_env(SpecCheck& v) {
  std::vector<std::string> set;
  for (const char* k : kEnvKinds)
    if (v.ok({k}) && !v.str(k).empty()) set.push_back(k);
  if (set.size() > 1)
    v.problem(set[1], "set at most one of env.builtin, env.python, env.url (found " +
                          join(set, " and ") + ")");
  if (!set.empty() && v.kind() != "ppo")
    v.problem(set[0], "environments run in the rollout of ppo jobs, not in a " + v.kind() + " job");
  const std::string python = v.ok({"env.python"}) ? v.str("env.python") : "";
  if (!python.empty()) {
    if (const auto ref = parse_python_ref(python); !ref)
      v.problem("env.python", "expected \"FILE.py:FACTORY\", found \"" + python + "\"");
    else if (!std::filesystem::is_regular_file(ref->file))
      v.problem("env.python", "no such file: " + ref->file);
  }
  const std::string url = v.ok({"env.url"}) ? v.str("env.url") : "";
  if (!url.empty() && (url.rfind("http://", 0) != 0 || url.size() == 7))
    v.problem("env.url", "expected http://host[:port][/path], found \"" + url + "\"");
}

}  // namespace

bool has_environment(const nlohmann::json& resolved) {
  for (const char* k : kEnvKinds)
    if (!resolved.at(spec_pointer(k)).get<std::string>().empty()) return true;
  return false;
}

SpecSection spec_section() {
  SpecSection s;
  s.owner = "envs";
  s.keys = [](KeyTable& t) {
    t.choice("env.builtin", "", {"", "calculator", "guess_number"},
             "Built-in environment of multi-turn rollouts: calculator (a tool `calculator` with "
             "argument `expression`) or guess_number (\"higher\"/\"lower\" feedback). Empty: "
             "none (single-turn rollouts, unless env.python or env.url is set).");
    t.file("env.python", "",
           "A Python environment \"FILE.py:FACTORY\": FACTORY(**env.options) makes one object per "
           "trajectory with reset(row) -> str | None and step(action) -> (observation, reward, "
           "done), run in rlhf's pool of Python processes.");
    t.string("env.url", "",
             "An HTTP environment: POST {url}/reset, {url}/step and {url}/close with the JSON "
             "protocol of docs/agentic.md.");
    t.number("env.timeout_s", 30.0, 0, 86400,
             "Seconds one environment call may take; past it the trajectory ends (timed out). A "
             "Python process that does not come back from it stops the job.",
             true);
    t.integer("env.python_workers", 2, 1, 256,
              "Python processes of a Python environment; each trajectory's object lives in one.");
    t.string(
        "env.python_interpreter", "python3",
        "Interpreter of the Python environment processes (a venv's python for your packages).");
    t.add("env.options", KeyType::kObject, json::object(),
          "Options of the environment: the factory's keyword arguments (Python), \"options\" of "
          "each reset (HTTP), or the built-in's: tool_format (auto, hermes, llama3) for the "
          "calculator; low, high, seed, max_guesses for guess_number.");
  };
  s.rules = check_env;
  return s;
}

}  // namespace rlhf::envs
