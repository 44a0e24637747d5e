#include "report/dashboard.h"

#include <fcntl.h>

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <chrono>
#include <nlohmann/json.hpp>
#include <thread>

#include "core/errors.h"
#include "report/run_report.h"

namespace rlhf::report {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;

// Worker processes are forked from this process: they must not inherit the server's sockets
// (a listening socket held by a stray worker would keep the port bound).
void close_on_exec(int fd) {
  ::fcntl(fd, F_SETFD, ::fcntl(fd, F_GETFD) | FD_CLOEXEC);
}

http::response<http::string_body> respond(const std::string& run_dir,
                                          const http::request<http::string_body>& req) {
  http::response<http::string_body> res;
  res.version(req.version());
  res.keep_alive(false);
  res.set(http::field::server, "rlhf");
  res.set(http::field::cache_control, "no-store");
  const std::string target(req.target());
  const std::string path = target.substr(0, target.find('?'));
  if (req.method() != http::verb::get && req.method() != http::verb::head) {
    res.result(http::status::method_not_allowed);
    res.set(http::field::content_type, "text/plain; charset=utf-8");
    res.body() = "only GET\n";
  } else {
    try {
      const RunRecords run = read_run(run_dir, ReadMode::kLive);
      if (path == "/" || path == "/index.html") {
        res.set(http::field::content_type, "text/html; charset=utf-8");
        res.body() = report_page(run, PageKind::kLive);
      } else if (path == "/body") {
        res.set(http::field::content_type, "text/html; charset=utf-8");
        res.body() = report_body(run);
      } else if (path == "/metrics.json") {
        res.set(http::field::content_type, "application/json");
        res.body() =
            nlohmann::json{{"run_dir", run.dir}, {"steps", run.steps}, {"evals", run.evals}}.dump();
      } else {
        res.result(http::status::not_found);
        res.set(http::field::content_type, "text/plain; charset=utf-8");
        res.body() = "not found: " + path + " (try /, /body or /metrics.json)\n";
      }
    } catch (const std::exception& e) {
      res.result(http::status::internal_server_error);
      res.set(http::field::content_type, "text/plain; charset=utf-8");
      res.body() = std::string(e.what()) + "\n";
    }
  }
  res.prepare_payload();
  if (req.method() == http::verb::head) res.body().clear();
  return res;
}

// One connection: read a request, answer, close. A client that sends nothing within 10 s
// is dropped.
class Session : public std::enable_shared_from_this<Session> {
 public:
  Session(tcp::socket socket, const std::string& run_dir)
      : stream_(std::move(socket)), run_dir_(run_dir) {}
  void start() {
    stream_.expires_after(std::chrono::seconds(10));
    http::async_read(stream_, buffer_, req_,
                     [self = shared_from_this()](beast::error_code ec, size_t) {
                       if (!ec) self->answer();
                     });
  }

 private:
  void answer() {
    res_ = respond(run_dir_, req_);
    http::async_write(stream_, res_, [self = shared_from_this()](beast::error_code, size_t) {
      beast::error_code ignored;
      self->stream_.socket().shutdown(tcp::socket::shutdown_send, ignored);
    });
  }
  beast::tcp_stream stream_;
  beast::flat_buffer buffer_;
  http::request<http::string_body> req_;
  http::response<http::string_body> res_;
  const std::string run_dir_;
};

}  // namespace

struct Dashboard::Impl {
  std::string run_dir;
  asio::io_context io{1};
  tcp::acceptor acceptor{io};
  std::thread thread;
  int port = 0;

  void accept() {
    acceptor.async_accept([this](beast::error_code ec, tcp::socket socket) {
      if (ec) {
        if (ec == asio::error::operation_aborted) return;
      } else {
        close_on_exec(socket.native_handle());
        std::make_shared<Session>(std::move(socket), run_dir)->start();
      }
      accept();
    });
  }
};

Dashboard::Dashboard(std::string run_dir, int port) : impl_(std::make_unique<Impl>()) {
  impl_->run_dir = std::move(run_dir);
  const tcp::endpoint endpoint(asio::ip::make_address("127.0.0.1"),
                               static_cast<unsigned short>(port));
  beast::error_code ec;
  impl_->acceptor.open(endpoint.protocol(), ec);
  if (!ec) close_on_exec(impl_->acceptor.native_handle());
  if (!ec) impl_->acceptor.set_option(asio::socket_base::reuse_address(true), ec);
  if (!ec) impl_->acceptor.bind(endpoint, ec);
  if (!ec) impl_->acceptor.listen(asio::socket_base::max_listen_connections, ec);
  if (ec)
    throw InputError("logger.dashboard_port " + std::to_string(port) +
                     ": cannot serve the dashboard on 127.0.0.1:" + std::to_string(port) + ": " +
                     ec.message() + " (choose another port, -1 for any free one, or 0 for none)");
  impl_->port = impl_->acceptor.local_endpoint().port();
  impl_->accept();
  impl_->thread = std::thread([this] { impl_->io.run(); });
}

Dashboard::~Dashboard() {
  impl_->io.stop();
  if (impl_->thread.joinable()) impl_->thread.join();
}

int Dashboard::port() const {
  return impl_->port;
}

std::string Dashboard::url() const {
  return "http://127.0.0.1:" + std::to_string(port()) + "/";
}

}  // namespace rlhf::report
