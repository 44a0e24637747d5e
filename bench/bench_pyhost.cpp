// Per-call overhead of the Python reward pool: a batch of ROWS completions (~200 chars each)
// scored by a trivial function (`len(c) % 2`) with 1 and 2 workers, median of CALLS calls,
// in ms per call and us per row. What it costs beyond Python's own work is two JSON
// encodings and decodings of the batch and a socket round trip per worker, so the limit
// printed next to it is an in-process nlohmann JSON round trip of the same request and
// reply bytes (dump + parse both ways); the ratio says how many such round trips a call
// costs (Python's json module and the interpreter's loop are the rest).
// usage: bench_pyhost [ROWS=512] [CALLS=20] [INTERPRETER=python3]
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "core/timing.h"
#include "pyhost/python_pool.h"

namespace {

using rlhf::seconds_since;

using Clock = std::chrono::steady_clock;
using nlohmann::json;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

// Printable ASCII of the given length; a fixed seed so every run sends the same bytes.
std::vector<std::string> make_texts(size_t rows, size_t length, unsigned seed) {
  std::mt19937 rng(seed);
  std::vector<std::string> texts(rows);
  for (auto& t : texts) {
    for (size_t i = 0; i < length + rng() % 16; ++i)
      t.push_back(static_cast<char>(' ' + rng() % 95));
  }
  return texts;
}

// Median seconds of an in-process JSON round trip of the request and the reply.
double json_round_trip_s(const std::vector<std::string>& prompts,
                         const std::vector<std::string>& completions,
                         const std::vector<std::string>& labels, int calls) {
  std::vector<double> times;
  size_t sink = 0;
  for (int i = 0; i < calls; ++i) {
    const auto t0 = Clock::now();
    json request = {{"prompts", prompts},
                    {"completions", completions},
                    {"labels", labels},
                    {"columns", json::object()}};
    const json parsed = json::parse(request.dump());
    json reply = {{"ok", true}, {"rewards", std::vector<double>(completions.size(), 1.0)}};
    sink += json::parse(reply.dump())["rewards"].size() + parsed["completions"].size();
    times.push_back(seconds_since(t0));
  }
  if (sink == 0) std::puts("");  // keeps the work observable
  return median(times);
}

}  // namespace

int main(int argc, char** argv) {
  const size_t rows = argc > 1 ? std::strtoul(argv[1], nullptr, 10) : 512;
  const int calls = argc > 2 ? std::atoi(argv[2]) : 20;
  const std::string interpreter = argc > 3 ? argv[3] : "python3";
  if (rows == 0 || calls <= 0) {
    std::fprintf(stderr, "usage: bench_pyhost [ROWS=512] [CALLS=20] [INTERPRETER=python3]\n");
    return 2;
  }

  namespace fs = std::filesystem;
  const fs::path dir =
      fs::temp_directory_path() / ("rlhf-bench-pyhost-" + std::to_string(getpid()));
  fs::create_directories(dir);
  const std::string file = (dir / "parity.py").string();
  std::ofstream(file) << "def parity(prompts, completions, labels, **columns):\n"
                         "    return [len(c) % 2 for c in completions]\n";

  const auto prompts = make_texts(rows, 100, 1);
  const auto completions = make_texts(rows, 200, 2);
  const std::vector<std::string> labels(rows, "42");
  size_t bytes = 0;
  for (size_t r = 0; r < rows; ++r) bytes += prompts[r].size() + completions[r].size() + 2;

  const double json_s = json_round_trip_s(prompts, completions, labels, calls);
  std::printf("batch: %zu rows, %.1f KB of text; median of %d calls after 3 warm-up calls\n", rows,
              bytes / 1e3, calls);
  std::printf("limit: in-process JSON round trip of the same bytes: %.3f ms\n", json_s * 1e3);

  int status = 0;
  for (int workers : {1, 2}) {
    rlhf::pyhost::PythonPoolConfig config;
    config.interpreter = interpreter;
    config.workers = workers;
    rlhf::pyhost::PythonFunctionPool pool(config, file, "parity");
    std::vector<double> times;
    for (int i = 0; i < calls + 3; ++i) {
      const auto t0 = Clock::now();
      const auto rewards = pool.call(prompts, completions, labels);
      const double s = seconds_since(t0);
      if (i >= 3) times.push_back(s);
      if (rewards.size() != rows || rewards[0] != static_cast<double>(completions[0].size() % 2)) {
        std::fprintf(stderr, "wrong rewards from %d workers\n", workers);
        status = 1;
      }
    }
    const double call_s = median(times);
    std::printf("%d worker%s: %7.3f ms/call  %6.2f us/row  %5.1fx the JSON round trip\n", workers,
                workers == 1 ? " " : "s", call_s * 1e3, call_s * 1e6 / static_cast<double>(rows),
                call_s / json_s);
  }
  fs::remove_all(dir);
  return status;
}
