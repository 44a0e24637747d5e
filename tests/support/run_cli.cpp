#include "tests/support/run_cli.h"

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include "test_paths.h"

namespace rlhf::test {

std::string shell_quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += (c == '\'') ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

std::string run_python_reference(const std::string& script, const std::string& args,
                                 const std::string& log, const std::string& install_hint) {
  const std::string cmd = "OMP_NUM_THREADS=1 timeout 300 " + shell_quote(RLHF_PYTHON) + " " +
                          shell_quote(script) + " " + args + " >" + shell_quote(log) + " 2>&1";
  const int status = std::system(cmd.c_str());
  if (status != -1 && WIFEXITED(status) && WEXITSTATUS(status) == 0) return "";
  return "the reference " + script + " failed (" + cmd + ", status " + std::to_string(status) +
         "); " + install_hint + ". Output:\n" + slurp(log);
}

namespace {

std::string quote(const std::string& s) {
  return shell_quote(s);
}

std::string temp_dir() {
  static const std::string dir = [] {
    auto d = std::filesystem::temp_directory_path() / ("rlhf-cli-test-" + std::to_string(getpid()));
    std::filesystem::create_directories(d);
    return d.string();
  }();
  return dir;
}

}  // namespace

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream buf;
  buf << in.rdbuf();
  return buf.str();
}

std::vector<nlohmann::json> read_jsonl(const std::string& path) {
  std::vector<nlohmann::json> out;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);)
    if (!line.empty()) out.push_back(nlohmann::json::parse(line));
  return out;
}

CliResult run_cli(const std::vector<std::string>& args, int timeout_s) {
  static int counter = 0;
  std::string base = temp_dir() + "/run" + std::to_string(counter++);
  std::string cmd = "cd " + quote(RLHF_SOURCE_DIR) + " && timeout " + std::to_string(timeout_s) +
                    " " + quote(RLHF_CLI_PATH);
  for (const auto& a : args) cmd += " " + quote(a);
  cmd += " >" + quote(base + ".out") + " 2>" + quote(base + ".err");
  int status = std::system(cmd.c_str());
  if (status == -1) throw std::runtime_error("could not run " + cmd);
  CliResult r;
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  r.out = slurp(base + ".out");
  r.err = slurp(base + ".err");
  return r;
}

std::string write_temp(const std::string& name, const std::string& text) {
  std::string path = temp_dir() + "/" + name;
  std::ofstream(path) << text;
  return path;
}

std::string tiny_models_dir(const std::string& name) {
  namespace fs = std::filesystem;
  const fs::path dir =
      fs::path(RLHF_BINARY_DIR) / "test-runs" / (name + "-" + std::to_string(getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"init-model", "--preset", "tiny", "--out",
                                 (dir / "tiny").string()},
        std::vector<std::string>{"init-model", "--preset", "tiny", "--value-head", "--seed", "7",
                                 "--out", (dir / "tiny-value").string()}}) {
    const CliResult r = run_cli(args);
    if (r.exit_code != 0)
      throw std::runtime_error("rlhf init-model failed (exit " + std::to_string(r.exit_code) +
                               "): " + r.err);
  }
  return dir.string();
}

size_t count_of(const std::string& text, const std::string& part) {
  size_t n = 0;
  for (size_t at = text.find(part); at != std::string::npos; at = text.find(part, at + 1)) ++n;
  return n;
}

}  // namespace rlhf::test
