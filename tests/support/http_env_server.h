// The test HTTP environment (tests/envs/http_env_server.py, docs/agentic.md's protocol) in a
// child process of the test: the constructor starts it and reads the port it prints first;
// the destructor kills (SIGKILL) and reaps it, so no test leaves it running.
#pragma once

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <string>

#include "test_paths.h"

namespace rlhf::test {

class HttpEnvServer {
 public:
  HttpEnvServer() {
    int out[2];
    if (::pipe(out) != 0) return;
    const std::string script = std::string(RLHF_SOURCE_DIR) + "/tests/envs/http_env_server.py";
    pid_ = ::fork();
    if (pid_ == 0) {
      ::dup2(out[1], 1);
      ::close(out[0]);
      ::execl(RLHF_PYTHON, RLHF_PYTHON, "-u", script.c_str(), static_cast<char*>(nullptr));
      ::_exit(127);
    }
    ::close(out[1]);
    FILE* from_server = ::fdopen(out[0], "r");
    if (pid_ < 0 || std::fscanf(from_server, "%d", &port_) != 1) port_ = 0;
    std::fclose(from_server);
  }
  ~HttpEnvServer() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGKILL);
    int status = 0;
    ::waitpid(pid_, &status, 0);
  }
  HttpEnvServer(const HttpEnvServer&) = delete;
  HttpEnvServer& operator=(const HttpEnvServer&) = delete;

  // 0 when the server did not start (printed no port).
  int port() const { return port_; }
  // The environment's endpoint, for env.url.
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_) + "/env"; }

 private:
  pid_t pid_ = -1;
  int port_ = 0;
};

}  // namespace rlhf::test
