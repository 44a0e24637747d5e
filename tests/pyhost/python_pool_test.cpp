// PythonFunctionPool against real python3 processes (plain CPython from PATH, no packages):
// each test writes its reward file into a fresh temp dir, and the process checks read /proc
// (this process's children, liveness by pid) rather than trusting the pool's own account.
#include "pyhost/python_pool.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "core/errors.h"
#include "core/text.h"
#include "tests/support/message_of.h"
#include "tests/support/process_checks.h"

namespace rlhf::pyhost {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using Clock = std::chrono::steady_clock;

using test::children_of_this_process;
using test::pid_alive;
using test::read_text;

// Polls every 10 ms until `done` holds or `limit` passes; returns whether it held.
template <class F>
bool poll_until(F done, std::chrono::milliseconds limit) {
  const auto deadline = Clock::now() + limit;
  while (!done()) {
    if (Clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return true;
}

using test::message_of;

class PythonPoolTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() /
           ("rlhf-pyhost-" + std::string(info->name()) + "-" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    children_before_ = children_of_this_process();
  }
  void TearDown() override {
    EXPECT_EQ(children_of_this_process(), children_before_) << "a Python worker outlived its pool";
    fs::remove_all(dir_);
  }

  // Writes `source` to DIR/name and returns its path.
  std::string write(const std::string& name, const std::string& source) {
    const fs::path path = dir_ / name;
    std::ofstream(path) << source;
    return path.string();
  }
  PythonPoolConfig config(int workers) {
    PythonPoolConfig c;
    c.workers = workers;
    c.timeout_s = 30;
    c.log_path = (dir_ / "workers.log").string();
    return c;
  }

  fs::path dir_;
  std::set<pid_t> children_before_;
};

TEST_F(PythonPoolTest, ValuesComeBackInRowOrderOverUnevenChunks) {
  const std::string file = write("score.py", R"PY(
import os
def score(prompts, completions, labels, **columns):
    print(f"chunk pid={os.getpid()} rows={len(prompts)}")  # to the log, not the protocol
    os.write(1, b'{"ok": true, "rewards": [99]}\n')          # nor does a raw write to fd 1
    return [int(p) * 10 + len(c) for p, c in zip(prompts, completions)]
)PY");
  PythonFunctionPool pool(config(3), file, "score");
  ASSERT_EQ(pool.worker_pids().size(), 3u);

  std::vector<std::string> prompts, completions;
  std::vector<double> expected;
  for (int r = 0; r < 10; ++r) {
    prompts.push_back(std::to_string(r));
    completions.push_back(std::string(static_cast<size_t>(r % 3), 'x'));
    expected.push_back(r * 10 + r % 3);
  }
  EXPECT_EQ(pool.call(prompts, completions, {}), expected);

  // 10 rows over 3 workers: contiguous chunks of 4, 3, 3, one per worker.
  std::multiset<int> chunk_rows;
  std::set<pid_t> chunk_pids;
  for (const auto& line : split(read_text(dir_ / "workers.log"), '\n')) {
    int pid = 0, rows = 0;
    if (std::sscanf(line.c_str(), "chunk pid=%d rows=%d", &pid, &rows) != 2) continue;
    chunk_rows.insert(rows);
    chunk_pids.insert(pid);
  }
  EXPECT_EQ(chunk_rows, (std::multiset<int>{3, 3, 4})) << read_text(dir_ / "workers.log");
  const auto pids = pool.worker_pids();
  EXPECT_EQ(chunk_pids, std::set<pid_t>(pids.begin(), pids.end()));

  // Fewer rows than workers, and no rows at all.
  EXPECT_EQ(pool.call({"7", "8"}, {"a", "bcd"}, {}), (std::vector<double>{71, 83}));
  EXPECT_TRUE(pool.call({}, {}, {}).empty());
}

TEST_F(PythonPoolTest, ChunksRunConcurrently) {
  const std::string file = write("slow.py", R"PY(
import time
def score(prompts, completions, labels, **columns):
    time.sleep(0.6)
    return [1.0] * len(prompts)
)PY");
  PythonFunctionPool pool(config(2), file, "score");
  const auto start = Clock::now();
  EXPECT_EQ(pool.call({"a", "b"}, {"a", "b"}, {}), (std::vector<double>{1, 1}));
  // Two 0.6 s sleeps one after the other would take 1.2 s; sleeping needs no CPU, so a busy
  // machine still finishes well inside 1.1 s when they overlap.
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - start).count(), 1.1);
}

TEST_F(PythonPoolTest, ColumnsArriveAsKeywordListsAndLabelsDefaultToNone) {
  const std::string file = write("columns.py", R"PY(
def score(prompts, completions, labels, answer, difficulty, **rest):
    assert not rest, rest
    return [float(c == a) + (d or 0) * 10 + (100 if l == "L" else 0)
            for c, a, d, l in zip(completions, answer, difficulty, labels)]

def no_labels(prompts, completions, labels, **columns):
    return [float(l is None) for l in labels]
)PY");
  PythonFunctionPool pool(config(2), file, "score");
  const std::vector<json> extra = {{{"answer", "4"}, {"difficulty", 2}},
                                   {{"answer", "5"}},  // no difficulty: None
                                   {{"answer", "6"}, {"difficulty", 1}}};
  EXPECT_EQ(pool.call({"p", "p", "p"}, {"4", "5", "x"}, {"L", "", "L"}, extra),
            (std::vector<double>{121, 1, 110}));

  PythonFunctionPool no_labels(config(1), file, "no_labels");
  EXPECT_EQ(no_labels.call({"p", "q"}, {"a", "b"}, {}), (std::vector<double>{1, 1}));
}

TEST_F(PythonPoolTest, TrlRewardFileWorksUnchanged) {
  // As in TRL's docs: keyword-only use of completions and dataset columns, None = n/a.
  const std::string file = write("trl_rewards.py", R"PY(
import re

def format_reward(completions, **kwargs):
    pattern = r"^<think>.*?</think><answer>.*?</answer>$"
    return [1.0 if re.match(pattern, c) else 0.0 for c in completions]

def accuracy_reward(completions, solution, **kwargs):
    return [None if not s else float(c.strip().endswith(s)) for c, s in zip(completions, solution)]
)PY");
  PythonFunctionPool format(config(2), file, "format_reward");
  EXPECT_EQ(format.call({"q", "q"}, {"<think>hm</think><answer>4</answer>", "4"}, {}),
            (std::vector<double>{1, 0}));

  PythonFunctionPool accuracy(config(2), file, "accuracy_reward");
  const auto rewards =
      accuracy.call({"q", "q", "q"}, {"so 4", "so 5", "so 6"}, {},
                    {{{"solution", "4"}}, {{"solution", "4"}}, {{"solution", ""}}});
  ASSERT_EQ(rewards.size(), 3u);
  EXPECT_EQ(rewards[0], 1.0);
  EXPECT_EQ(rewards[1], 0.0);
  EXPECT_TRUE(std::isnan(rewards[2])) << "None means not applicable: NaN";
}

TEST_F(PythonPoolTest, BadFilesAndFunctionsAreInputErrorsNamingThem) {
  const std::string file = write("rewards.py", R"PY(
not_a_function = 3
def one_argument(x):
    return [0.0]
def no_kwargs(prompts, completions, labels):
    return [0.0]
)PY");
  const std::string broken = write("broken.py", "import os\nvalue = 1 / 0\n");
  const std::string missing = (dir_ / "missing.py").string();
  auto start = [&](const std::string& f, const std::string& fn) {
    return message_of<InputError>([&] { PythonFunctionPool(config(2), f, fn); });
  };

  std::string m = start(missing, "score");
  EXPECT_NE(m.find(missing + ":score"), std::string::npos) << m;
  EXPECT_NE(m.find("no such file"), std::string::npos) << m;

  m = start(broken, "score");
  EXPECT_NE(m.find(broken + ":score"), std::string::npos) << m;
  EXPECT_NE(m.find("does not import"), std::string::npos) << m;
  EXPECT_NE(m.find("ZeroDivisionError"), std::string::npos) << m;
  EXPECT_NE(m.find("line 2"), std::string::npos) << "the traceback's last lines: " << m;

  m = start(file, "nope");
  EXPECT_NE(m.find(file + ":nope"), std::string::npos) << m;
  EXPECT_NE(m.find("no attribute 'nope'"), std::string::npos) << m;

  m = start(file, "not_a_function");
  EXPECT_NE(m.find("not a function"), std::string::npos) << m;

  for (const char* fn : {"one_argument", "no_kwargs"}) {
    m = start(file, fn);
    EXPECT_NE(m.find(file + ":" + fn), std::string::npos) << m;
    EXPECT_NE(m.find("must accept the keywords (prompts, completions, labels, **columns)"),
              std::string::npos)
        << m;
  }

  PythonPoolConfig no_python = config(1);
  no_python.interpreter = "rlhf-no-such-python";
  m = message_of<InputError>([&] { PythonFunctionPool(no_python, file, "no_kwargs"); });
  EXPECT_NE(m.find("rlhf-no-such-python' not found on PATH"), std::string::npos) << m;
}

TEST_F(PythonPoolTest, RaisingFunctionReportsTracebackAndFirstRowOfItsChunk) {
  const std::string file = write("raises.py", R"PY(
def parse_digits(text):
    if "bad" in text:
        raise ValueError(f"no digits in {text[:6]!r}")
    return 1.0

def score(prompts, completions, labels, **columns):
    return [parse_digits(c) for c in completions]
)PY");
  PythonFunctionPool pool(config(2), file, "score");
  const std::string long_bad = "bad" + std::string(1000, 'z');
  const std::string m = message_of<RuntimeError>([&] {
    pool.call({"prompt-0", "prompt-1", "prompt-2", "prompt-3"}, {"1", "2", long_bad, "3"}, {});
  });
  EXPECT_NE(m.find(file + ":score raised ValueError: no digits in 'badzzz'"), std::string::npos)
      << m;
  EXPECT_NE(m.find("in parse_digits"), std::string::npos) << "traceback: " << m;
  EXPECT_NE(m.find("rows 2..3 of 4"), std::string::npos) << m;
  EXPECT_NE(m.find("prompt=\"prompt-2\""), std::string::npos) << "the chunk's first row: " << m;
  EXPECT_NE(m.find("... (1003 bytes)"), std::string::npos) << "completion truncated: " << m;
  EXPECT_LT(m.size(), 2000u) << m;

  // A raise is the user's error, not the worker's: the pool goes on.
  EXPECT_EQ(pool.call({"p"}, {"ok"}, {}), (std::vector<double>{1}));
}

TEST_F(PythonPoolTest, WrongReturnsAreNamed) {
  const std::string file = write("returns.py", R"PY(
def score(prompts, completions, labels, **columns):
    mode = prompts[0]
    if mode == "short": return [1.0]
    if mode == "str": return "0.5"
    if mode == "item": return [1.0, "x"]
    if mode == "inf": return [1.0, float("inf")]
    if mode == "none": return [None, float("nan")]
    return (True, 2)
)PY");
  PythonFunctionPool pool(config(1), file, "score");
  auto returned = [&](const std::string& mode) {
    return message_of<RuntimeError>([&] { pool.call({mode, mode}, {"a", "b"}, {}); });
  };
  std::string m = returned("short");
  EXPECT_NE(m.find(file + ":score returned list [1.0], not a list of 2 numbers"), std::string::npos)
      << m;
  m = returned("str");
  EXPECT_NE(m.find("returned str '0.5'"), std::string::npos) << m;
  m = returned("item");
  EXPECT_NE(m.find("returned 'x' at position 1"), std::string::npos) << m;
  m = returned("inf");
  EXPECT_NE(m.find("returned inf at position 1"), std::string::npos) << m;

  const auto none = pool.call({"none", "none"}, {"a", "b"}, {});
  ASSERT_EQ(none.size(), 2u);
  EXPECT_TRUE(std::isnan(none[0]) && std::isnan(none[1]));
  EXPECT_EQ(pool.call({"tuple", "tuple"}, {"a", "b"}, {}), (std::vector<double>{1, 2}));
}

TEST_F(PythonPoolTest, CrashedInterpreterIsNamedAndStopsThePool) {
  const std::string file = write("crash.py", R"PY(
import ctypes, os
def exits(prompts, completions, labels, **columns):
    os._exit(3)
def segfaults(prompts, completions, labels, **columns):
    ctypes.string_at(0)
)PY");
  {
    PythonFunctionPool pool(config(2), file, "exits");
    const auto pids = pool.worker_pids();
    const std::string m = message_of<RuntimeError>([&] { pool.call({"a", "b"}, {"a", "b"}, {}); });
    EXPECT_NE(m.find(file + ":exits"), std::string::npos) << m;
    EXPECT_NE(m.find("exited with status 3"), std::string::npos) << m;
    for (pid_t pid : pids) EXPECT_FALSE(pid_alive(pid)) << pid;
    const std::string again = message_of<RuntimeError>([&] {
      pool.call({"a", "b"}, {"a", "b"}, {});
    });
    EXPECT_NE(again.find("stopped by an earlier failure"), std::string::npos) << again;
  }
  PythonFunctionPool pool(config(1), file, "segfaults");
  const std::string m = message_of<RuntimeError>([&] { pool.call({"a"}, {"a"}, {}); });
  EXPECT_NE(m.find(file + ":segfaults"), std::string::npos) << m;
  EXPECT_NE(m.find("killed by signal 11"), std::string::npos) << m;
}

// Issue 45: with max_restarts, a worker that dies mid-call (here: the first call only, a
// marker file says so) makes the pool start again, import the file anew and score the same
// batch again; the caller gets the scores, and the dead pool's processes are gone.
TEST_F(PythonPoolTest, AWorkerThatDiesIsStartedAgainAndTheBatchScoredAgain) {
  const std::string marker = (dir_ / "died-once").string();
  const std::string file = write("dies_once.py", R"PY(
import os
def score(prompts, completions, labels, **columns):
    if not os.path.exists(")PY" + marker + R"PY("):
        open(")PY" + marker + R"PY(", "w").close()
        os._exit(9)
    return [float(len(c)) for c in completions]
)PY");
  PythonPoolConfig c = config(2);
  c.max_restarts = 1;
  PythonFunctionPool pool(c, file, "score");
  const auto before = pool.worker_pids();
  EXPECT_EQ(pool.call({"p", "p", "p"}, {"a", "bb", "ccc"}, {}), (std::vector<double>{1, 2, 3}));
  EXPECT_EQ(pool.restarts(), 1);
  for (pid_t pid : before) EXPECT_FALSE(pid_alive(pid)) << pid;
  for (pid_t pid : pool.worker_pids()) EXPECT_TRUE(pid_alive(pid)) << pid;
  // The next death is past the budget: the pool stops as without restarts.
  fs::remove(marker);
  const std::string m = message_of<RuntimeError>([&] { pool.call({"p"}, {"a"}, {}); });
  EXPECT_NE(m.find("exited with status 9"), std::string::npos) << m;
}

TEST_F(PythonPoolTest, TimeoutKillsTheWorkerAndWhatItStarted) {
  const std::string pid_file = (dir_ / "grandchild.pid").string();
  const std::string file = write("sleeps.py", R"PY(
import subprocess, time
def score(prompts, completions, labels, **columns):
    if prompts[0] == "slow":
        child = subprocess.Popen(["sleep", "60"])
        with open(")PY" + pid_file + R"PY(", "w") as f:
            f.write(str(child.pid))
        time.sleep(60)
    return [0.0] * len(prompts)
)PY");
  PythonPoolConfig c = config(2);
  c.timeout_s = 1;
  PythonFunctionPool pool(c, file, "score");
  const auto pids = pool.worker_pids();

  const auto start = Clock::now();
  const std::string m = message_of<RuntimeError>([&] {
    pool.call({"fast", "slow"}, {"a", "b"}, {});
  });
  const double took = std::chrono::duration<double>(Clock::now() - start).count();
  EXPECT_GE(took, 1.0);
  EXPECT_LT(took, 3.0) << "timeout 1 s + 2 s";
  EXPECT_NE(m.find(file + ":score did not answer within 1 s"), std::string::npos) << m;
  EXPECT_NE(m.find("row 1 of 2"), std::string::npos) << m;
  for (pid_t pid : pids) EXPECT_FALSE(pid_alive(pid)) << pid;

  // The function's own child was in the worker's process group: killed with it. (Reparented
  // away from us, so it is reaped elsewhere: give that a moment.)
  const std::string grandchild = read_text(pid_file);
  ASSERT_FALSE(grandchild.empty());
  EXPECT_TRUE(poll_until([&] { return !pid_alive(std::stoi(grandchild)); },
                         std::chrono::milliseconds(2000)));
  EXPECT_THROW(pool.call({"fast"}, {"a"}, {}), RuntimeError);
}

TEST_F(PythonPoolTest, DestructorLeavesNoProcess) {
  const std::string file = write(
      "ok.py", "def score(prompts, completions, labels, **kw):\n    return [1.0]*len(prompts)\n");
  std::vector<pid_t> pids;
  {
    PythonFunctionPool pool(config(3), file, "score");
    pids = pool.worker_pids();
    ASSERT_EQ(pids.size(), 3u);
    auto expected = children_before_;
    expected.insert(pids.begin(), pids.end());
    EXPECT_EQ(children_of_this_process(), expected) << "the workers are our children";
    EXPECT_EQ(pool.call({"a"}, {"b"}, {}), (std::vector<double>{1}));
  }
  EXPECT_EQ(children_of_this_process(), children_before_);
  for (pid_t pid : pids) EXPECT_FALSE(pid_alive(pid)) << pid;
}

}  // namespace
}  // namespace rlhf::pyhost
