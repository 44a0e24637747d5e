// A supervised pool of Python interpreters that each host one user function with TRL's
// reward signature, `f(prompts, completions, labels, **columns) -> list[float | None]`, and
// score batches of rows over them. It knows nothing about rewards beyond that signature:
// weighting, rules and remote scorers live in rewards/.
//
// Each worker is `interpreter -u -c <runner>` in its own process group, killed by the kernel
// if this process dies (PR_SET_PDEATHSIG). Requests and replies are one JSON object per line
// over a socket on the worker's stdin/stdout; the user's own prints go to the worker's
// stderr, which is this process's stderr or `log_path`.
#pragma once

#include <sys/types.h>

#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

namespace rlhf::pyhost {

struct PythonPoolConfig {
  std::string interpreter = "python3";  // looked up on PATH when it has no '/'
  int workers = 2;                      // processes; a batch is split into this many chunks
  double timeout_s = 60;                // limit on each call (all chunks together)
  double start_timeout_s = 120;         // limit on starting: interpreter and the file's import
  std::string log_path;                 // workers' stderr, appended; empty: inherit ours
  // A worker that dies during a call (fault.max_restarts): every worker starts again (the file
  // imported anew) and the call is made again, at most this many times in the pool's life.
  int max_restarts = 0;
};

class PythonWorker;

class PythonFunctionPool {
 public:
  // Starts `config.workers` interpreters, each importing `file` and looking up `function`,
  // and returns once all of them are ready. Throws InputError naming "FILE:FUNCTION" when the
  // file does not exist, does not import (with the traceback's last lines), has no such
  // function, or it is not callable with keywords (prompts, completions, labels, **columns);
  // InputError when the interpreter is not found; RuntimeError when an interpreter dies or
  // does not get ready within start_timeout_s.
  // PR_SET_PDEATHSIG fires when the *thread* that forked exits: construct the pool on a
  // thread that lives as long as it.
  PythonFunctionPool(PythonPoolConfig config, std::string file, std::string function);
  ~PythonFunctionPool();  // closes every worker's input, then kills and reaps what is left
  PythonFunctionPool(const PythonFunctionPool&) = delete;
  PythonFunctionPool& operator=(const PythonFunctionPool&) = delete;

  // One reward per row, in row order. Rows are split into contiguous chunks, one per worker
  // (the first `rows % workers` chunks one row longer), scored concurrently and concatenated.
  // The function is called with keywords, as TRL does: prompts=, completions=, labels= (lists
  // of str; labels is a list of None when `labels` is empty) and one keyword list per key of
  // `extra` (per-row JSON objects: the row's other columns; a row without the key gets None).
  // A None or NaN reward (TRL's "not applicable") comes back as NaN. Strings that are not
  // valid UTF-8 reach Python with U+FFFD in place of the bad bytes.
  // Throws InputError when the sizes disagree or a column is named prompts/completions/labels;
  // RuntimeError "FILE:FUNCTION raised ..." with the traceback and the chunk's first row, or
  // "FILE:FUNCTION returned ..." for anything but a list of that many finite numbers or None
  // (the pool stays usable after those two); RuntimeError when a worker dies or does not
  // answer within timeout_s: then every worker is killed and later calls throw (after a death,
  // config.max_restarts times the pool starts again and the call is made again instead).
  // One call at a time: the pool is not thread-safe.
  std::vector<double> call(const std::vector<std::string>& prompts,
                           const std::vector<std::string>& completions,
                           const std::vector<std::string>& labels,
                           const std::vector<nlohmann::json>& extra = {});
  int restarts() const { return restarts_; }  // times the pool started again after a death

  const std::string& name() const { return name_; }  // "FILE:FUNCTION"
  std::vector<pid_t> worker_pids() const;            // live workers' pids (for supervision)

 private:
  // Sends requests[i] to worker i (an empty request sends nothing) and reads one reply line
  // from each of the first requests.size() workers, all at once, within `timeout_s`. On a death
  // or the timeout, stops the pool and throws, naming what worker i was doing: doing(i).
  std::vector<nlohmann::json> exchange(const std::vector<std::string>& requests, double timeout_s,
                                       const std::function<std::string(size_t)>& doing);
  void start();  // every worker, until each has imported the function
  std::vector<double> call_once(const std::vector<std::string>& prompts,
                                const std::vector<std::string>& completions,
                                const std::vector<std::string>& labels,
                                const std::vector<nlohmann::json>& extra);
  // Stops every worker and throws `message`: a WorkerDied when `died` (what call() may recover
  // from by starting again), else a RuntimeError.
  [[noreturn]] void fail_and_stop(const std::string& message, bool died = false);
  std::optional<nlohmann::json> read_reply(size_t i, int fd,
                                           const std::function<void(size_t)>& died,
                                           const std::function<std::string(size_t)>& doing);

  PythonPoolConfig config_;
  std::string file_;
  std::string function_;
  std::string name_;
  std::vector<std::unique_ptr<PythonWorker>> workers_;
  std::string stopped_because_;  // set after a crash or timeout: the pool refuses to call
  int restarts_ = 0;
};

}  // namespace rlhf::pyhost
