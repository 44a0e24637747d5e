// A supervised pool of Python interpreters that each host live objects made by one user
// factory, `FILE:FACTORY`, and call their methods on request: the object-hosting mode of
// pyhost, for stateful Python code such as multi-turn environments (envs/). It knows nothing
// about environments: which methods are called and what their results mean is the caller's.
//
// Processes as PythonFunctionPool's (python_process.h: own process group, PR_SET_PDEATHSIG,
// one JSON line per request and reply over a socket, the user's prints to stderr). Unlike it,
// the pool is asynchronous: send() queues a request for one worker and returns; receive()
// hands back replies as they arrive. A worker answers its requests in order, one at a time.
#pragma once

#include <sys/types.h>

#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "pyhost/python_pool.h"

namespace rlhf::pyhost {

class PythonWorker;

class PythonObjectPool {
 public:
  // Starts `config.workers` interpreters, each importing `file` and looking up `factory`, and
  // returns once all are ready (within config.start_timeout_s; config.timeout_s is unused:
  // the caller times its own requests). Throws InputError naming "FILE:FACTORY" when the file
  // does not exist, does not import (with the traceback's last lines), or has no such callable;
  // InputError when the interpreter is not found; RuntimeError when a worker dies or does not
  // get ready in time. Construct it on a thread that lives as long as it (PR_SET_PDEATHSIG).
  PythonObjectPool(PythonPoolConfig config, std::string file, std::string factory);
  ~PythonObjectPool();  // closes every worker's input, then kills and reaps what is left
  PythonObjectPool(const PythonObjectPool&) = delete;
  PythonObjectPool& operator=(const PythonObjectPool&) = delete;

  // Queues `request` for `worker`. Requests, and the reply each gets:
  //   {"op": "create", "key": K, "kwargs": {...}}  object K = FACTORY(**kwargs)
  //   {"op": "call", "key": K, "method": M, "args": [...], "optional_kwargs"?: {...}}
  //      K.M(*args, **those optional kwargs M's signature accepts (by name, or all of them
  //      with **kwargs); read once per class and method with inspect.signature)
  //   {"op": "drop", "key": K}  forgets K, calling K.close() first when it has one
  // -> {"ok": true, "result": <the call's return value as JSON, tuples as lists; null for
  //    create and drop>} or {"ok": false, "kind": "raised" | "interrupted" | "returned",
  //    "error": "ValueError: ...", "traceback": "..."} (returned: the result is not JSON).
  // Throws RuntimeError when the pool was stopped.
  void send(size_t worker, const nlohmann::json& request);

  // Replies that arrived, as (worker, reply), each worker's in the order of its requests.
  // Writes queued requests meanwhile. Waits up to `wait_s` for the first reply, then takes
  // what else is already there. Throws RuntimeError naming FILE:FACTORY, the worker's pid and
  // doing(worker) when a worker dies or sends garbage; every worker is then killed.
  std::vector<std::pair<size_t, nlohmann::json>> receive(
      double wait_s, const std::function<std::string(size_t)>& doing);

  // SIGINT to the worker's process (not its group). The runner turns it into KeyboardInterrupt
  // inside a user call (reply kind "interrupted") and ignores it between calls.
  void interrupt(size_t worker);

  // Kills every worker, remembers `message` (later calls throw it) and throws it.
  // Stops every worker and throws `message`: a WorkerDied when `died`, else a RuntimeError.
  [[noreturn]] void fail_and_stop(const std::string& message, bool died = false);

  size_t size() const { return workers_.size(); }
  const std::string& name() const { return name_; }  // "FILE:FACTORY"
  std::vector<pid_t> worker_pids() const;            // live workers' pids (for supervision)

 private:
  PythonPoolConfig config_;
  std::string name_;
  std::vector<std::unique_ptr<PythonWorker>> workers_;
  std::vector<std::string> outbox_;  // per worker: request bytes not yet written
  std::string stopped_because_;
};

}  // namespace rlhf::pyhost
