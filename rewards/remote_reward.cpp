#include "rewards/remote_reward.h"

#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <nlohmann/json.hpp>

#include "core/errors.h"

namespace rlhf::rewards {

namespace beast = boost::beast;
namespace http = beast::http;
namespace net = boost::asio;
using tcp = net::ip::tcp;

RemoteReward::RemoteReward(RemoteRewardConfig config) : config_(std::move(config)) {
  const std::string scheme = "http://";
  const std::string& url = config_.url;
  if (url.rfind(scheme, 0) != 0)
    throw InputError("reward.remote_url: expected http://host[:port][/path], found \"" + url +
                     "\"");
  std::string rest = url.substr(scheme.size());
  auto slash = rest.find('/');
  std::string authority = rest.substr(0, slash);
  target_ = slash == std::string::npos ? "/" : rest.substr(slash);
  auto colon = authority.rfind(':');
  host_ = colon == std::string::npos ? authority : authority.substr(0, colon);
  port_ = colon == std::string::npos ? "80" : authority.substr(colon + 1);
  if (host_.empty() || port_.empty())
    throw InputError("reward.remote_url: no host in \"" + url + "\"");
}

std::vector<double> RemoteReward::score(const std::vector<std::string>& prompts,
                                        const std::vector<std::string>& responses,
                                        const std::vector<std::string>& labels) const {
  nlohmann::json body = {{"prompts", prompts}, {"responses", responses}, {"labels", labels}};
  std::vector<std::string> query;
  for (size_t i = 0; i < responses.size(); ++i)
    query.push_back((i < prompts.size() ? prompts[i] : "") + responses[i]);
  body["query"] = query;

  net::io_context ioc;
  tcp::resolver resolver(ioc);
  beast::tcp_stream stream(ioc);
  http::request<http::string_body> req{http::verb::post, target_, 11};
  req.set(http::field::host, host_);
  req.set(http::field::content_type, "application/json");
  // Responses of a byte-level policy need not be valid UTF-8: invalid bytes become U+FFFD.
  req.body() = body.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  req.prepare_payload();
  beast::flat_buffer buffer;
  http::response<http::string_body> res;
  beast::error_code failure;
  const char* stage = "resolve";

  // One asynchronous chain, so the stream's deadline bounds every step.
  auto deadline = std::chrono::milliseconds(static_cast<int64_t>(config_.timeout_s * 1000));
  stream.expires_after(deadline);
  resolver.async_resolve(host_, port_, [&](beast::error_code ec, tcp::resolver::results_type r) {
    if (ec) {
      failure = ec;
      return;
    }
    stage = "connect";
    stream.async_connect(r, [&](beast::error_code ec2, const tcp::endpoint&) {
      if (ec2) {
        failure = ec2;
        return;
      }
      stage = "send";
      http::async_write(stream, req, [&](beast::error_code ec3, size_t) {
        if (ec3) {
          failure = ec3;
          return;
        }
        stage = "receive";
        http::async_read(stream, buffer, res,
                         [&](beast::error_code ec4, size_t) { failure = ec4; });
      });
    });
  });
  ioc.run_for(deadline + std::chrono::seconds(1));
  const std::string where = "remote reward " + config_.url + ": ";
  if (failure == beast::error::timeout || !ioc.stopped())
    throw RuntimeError(where + "no reply within " + std::to_string(config_.timeout_s) +
                       " s (reward.remote_timeout_s) during " + stage);
  if (failure) throw RuntimeError(where + stage + " failed: " + failure.message());
  if (res.result() != http::status::ok)
    throw RuntimeError(where + "HTTP " + std::to_string(res.result_int()) + ": " +
                       res.body().substr(0, 200));
  nlohmann::json reply = nlohmann::json::parse(res.body(), nullptr, false);
  const nlohmann::json* scores = nullptr;
  if (reply.is_object())
    for (const char* key : {"rewards", "scores"})
      if (reply.contains(key) && reply[key].is_array()) scores = &reply[key];
  if (!scores)
    throw RuntimeError(where + "expected a JSON object with a \"rewards\" list, got: " +
                       res.body().substr(0, 200));
  if (scores->size() != responses.size())
    throw RuntimeError(where + "sent " + std::to_string(responses.size()) + " samples, got " +
                       std::to_string(scores->size()) + " rewards");
  std::vector<double> out;
  for (const auto& s : *scores) {
    if (!s.is_number()) throw RuntimeError(where + "reward is not a number: " + s.dump());
    out.push_back(s.get<double>());
  }
  return out;
}

}  // namespace rlhf::rewards
