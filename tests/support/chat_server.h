// An OpenAI-compatible chat-completions server on 127.0.0.1 for tests of generative judges
// (rewards/judge.h): each request's user message goes to `reply` with its "n", every request
// is kept; one connection at a time, until destroyed. A real HTTP server over Boost.Beast.
#pragma once

#include <atomic>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <functional>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

namespace rlhf::test {

class ChatServer {
  using json = nlohmann::json;
  using tcp = boost::asio::ip::tcp;

 public:
  using Reply = std::function<std::vector<std::string>(const std::string& content, int64_t n)>;
  explicit ChatServer(Reply reply,
                      boost::beast::http::status status = boost::beast::http::status::ok)
      : reply_(std::move(reply)),
        status_(status),
        acceptor_(ioc_, {boost::asio::ip::make_address("127.0.0.1"), 0}) {
    port_ = acceptor_.local_endpoint().port();
    thread_ = std::thread([this] { serve(); });
  }
  ~ChatServer() {
    stop_ = true;
    boost::asio::io_context ioc;  // wake the accept with one last connection
    tcp::socket s(ioc);
    boost::beast::error_code ec;
    s.connect({boost::asio::ip::make_address("127.0.0.1"), port_}, ec);
    thread_.join();
  }
  std::string url() const {
    return "http://127.0.0.1:" + std::to_string(port_) + "/v1/chat/completions";
  }
  std::vector<json> requests() {
    std::lock_guard<std::mutex> lock(mutex_);
    return requests_;
  }

 private:
  void serve() {
    while (!stop_) {
      tcp::socket socket(ioc_);
      boost::beast::error_code ec;
      acceptor_.accept(socket, ec);
      if (ec || stop_) return;
      boost::beast::flat_buffer buffer;
      boost::beast::http::request<boost::beast::http::string_body> req;
      boost::beast::http::read(socket, buffer, req, ec);
      if (ec) continue;
      const json body = json::parse(req.body());
      {
        std::lock_guard<std::mutex> lock(mutex_);
        requests_.push_back(body);
      }
      json choices = json::array();
      for (const auto& text :
           reply_(body["messages"][0]["content"].get<std::string>(), body.value("n", int64_t{1})))
        choices.push_back({{"message", {{"role", "assistant"}, {"content", text}}}});
      boost::beast::http::response<boost::beast::http::string_body> res{status_, 11};
      res.body() = status_ == boost::beast::http::status::ok ? json{{"choices", choices}}.dump()
                                                             : "overloaded";
      res.prepare_payload();
      boost::beast::http::write(socket, res, ec);
    }
  }

  Reply reply_;
  boost::beast::http::status status_;
  boost::asio::io_context ioc_;
  tcp::acceptor acceptor_;
  unsigned short port_ = 0;
  std::atomic<bool> stop_{false};
  std::thread thread_;
  std::mutex mutex_;
  std::vector<json> requests_;
};

}  // namespace rlhf::test
