#include "rewards/http_client.h"

#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <chrono>
#include <sstream>

#include "core/errors.h"

namespace rlhf::rewards {

namespace beast = boost::beast;
namespace http = beast::http;
namespace net = boost::asio;
using tcp = net::ip::tcp;

HttpUrl parse_http_url(const std::string& url, const std::string& key) {
  const std::string scheme = "http://";
  if (url.rfind(scheme, 0) != 0)
    throw InputError(key + ": expected http://host[:port][/path], found \"" + url + "\"");
  HttpUrl out;
  out.text = url;
  const std::string rest = url.substr(scheme.size());
  const auto slash = rest.find('/');
  const std::string authority = rest.substr(0, slash);
  out.target = slash == std::string::npos ? "/" : rest.substr(slash);
  const auto colon = authority.rfind(':');
  out.host = colon == std::string::npos ? authority : authority.substr(0, colon);
  out.port = colon == std::string::npos ? "80" : authority.substr(colon + 1);
  if (out.host.empty() || out.port.empty()) throw InputError(key + ": no host in \"" + url + "\"");
  return out;
}

std::string post_json(const HttpUrl& url, const std::string& body, double timeout_s,
                      const std::string& who, const std::string& timeout_key) {
  net::io_context ioc;
  tcp::resolver resolver(ioc);
  beast::tcp_stream stream(ioc);
  http::request<http::string_body> req{http::verb::post, url.target, 11};
  req.set(http::field::host, url.host);
  req.set(http::field::content_type, "application/json");
  req.body() = body;
  req.prepare_payload();
  beast::flat_buffer buffer;
  http::response<http::string_body> res;
  beast::error_code failure;
  const char* stage = "resolve";

  // One asynchronous chain, so the stream's deadline bounds every step.
  auto deadline = std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000));
  stream.expires_after(deadline);
  resolver.async_resolve(
      url.host, url.port, [&](beast::error_code ec, tcp::resolver::results_type r) {
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
  const std::string where = who + " " + url.text + ": ";
  if (failure == beast::error::timeout || !ioc.stopped())
    throw RuntimeError(where + "no reply within " + (std::ostringstream() << timeout_s).str() +
                       " s (" + timeout_key + ") during " + stage);
  if (failure) throw RuntimeError(where + stage + " failed: " + failure.message());
  if (res.result() != http::status::ok)
    throw RuntimeError(where + "HTTP " + std::to_string(res.result_int()) + ": " +
                       res.body().substr(0, 200));
  return res.body();
}

}  // namespace rlhf::rewards
