// The live dashboard of `rlhf run`: an HTTP server on loopback, on a thread of the driver
// process, that serves the run's report page (report/run_report.h) while the job writes its
// metrics. It reads the run directory on each request and shares nothing with the job, so a
// slow browser never slows training. Endpoints: GET / (the page; its script fetches /body
// every 2 s), /body (the page's content), /metrics.json (the records as JSON).
#pragma once

#include <memory>
#include <string>

namespace rlhf::report {

class Dashboard {
 public:
  // Listens on 127.0.0.1:`port` (0: a free port the system picks) and starts serving. Throws
  // InputError naming the port when it cannot be bound (in use, not permitted).
  Dashboard(std::string run_dir, int port);
  ~Dashboard();  // stops the server and joins its thread
  Dashboard(const Dashboard&) = delete;
  Dashboard& operator=(const Dashboard&) = delete;

  int port() const;
  std::string url() const;  // "http://127.0.0.1:PORT/"

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace rlhf::report
