// HttpEnvironment: the trajectories' call queues on the caller's thread; the HTTP exchanges
// (resolve, connect, write, read under one deadline, as rewards/remote_reward.cpp) on one
// Boost.Asio thread, which hands finished calls back through a mutex-guarded queue.
#include "envs/http_env.h"

#include <algorithm>
#include <boost/asio/connect.hpp>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <chrono>
#include <cstdio>
#include <functional>

#include "core/errors.h"

namespace rlhf::envs {

namespace beast = boost::beast;
namespace http = beast::http;
namespace net = boost::asio;
using tcp = net::ip::tcp;
using nlohmann::json;

namespace {

// One POST and its reply; keeps itself alive through its handlers.
struct Exchange : std::enable_shared_from_this<Exchange> {
  Exchange(net::io_context& ioc, std::function<void(bool, std::string, int, std::string)> done)
      : resolver(ioc), stream(ioc), done(std::move(done)) {}

  void start(const std::string& host, const std::string& port, std::chrono::milliseconds limit) {
    stream.expires_after(limit);
    auto self = shared_from_this();
    resolver.async_resolve(host, port, [self](beast::error_code ec, tcp::resolver::results_type r) {
      if (ec) return self->finish(ec, "resolve");
      self->stream.async_connect(r, [self](beast::error_code ec2, const tcp::endpoint&) {
        if (ec2) return self->finish(ec2, "connect");
        http::async_write(self->stream, self->request, [self](beast::error_code ec3, size_t) {
          if (ec3) return self->finish(ec3, "send");
          http::async_read(self->stream, self->buffer, self->response,
                           [self](beast::error_code ec4, size_t) { self->finish(ec4, "receive"); });
        });
      });
    });
  }
  void finish(beast::error_code ec, const char* stage) {
    const bool timed_out = ec == beast::error::timeout;
    std::string error = ec && !timed_out ? std::string(stage) + ": " + ec.message() : "";
    if (timed_out) error = stage;
    done(timed_out, error, ec ? 0 : response.result_int(), ec ? "" : response.body());
  }

  tcp::resolver resolver;
  beast::tcp_stream stream;
  http::request<http::string_body> request;
  beast::flat_buffer buffer;
  http::response<http::string_body> response;
  std::function<void(bool, std::string, int, std::string)> done;
};

}  // namespace

class HttpEnvironment::Io {
 public:
  Io() : work_(net::make_work_guard(ioc_)), thread_([this] { ioc_.run(); }) {}
  ~Io() {
    ioc_.stop();
    thread_.join();
  }
  // Runs `f` on the I/O thread.
  void post(std::function<void(net::io_context&)> f) {
    net::post(ioc_, [this, f = std::move(f)] { f(ioc_); });
  }

 private:
  net::io_context ioc_;
  net::executor_work_guard<net::io_context::executor_type> work_;
  std::thread thread_;
};

HttpEnvironment::HttpEnvironment(const EnvironmentConfig& config)
    : url_(config.url),
      timeout_s_(config.timeout_s),
      options_(config.options),
      tool_format_(ToolCallFormat::kAuto) {
  const std::string scheme = "http://";
  if (url_.rfind(scheme, 0) != 0) {
    throw InputError("env.url: expected http://host[:port][/path], found \"" + url_ + "\"");
  }
  const std::string rest = url_.substr(scheme.size());
  const size_t slash = rest.find('/');
  const std::string authority = rest.substr(0, slash);
  base_path_ = slash == std::string::npos ? "" : rest.substr(slash);
  while (!base_path_.empty() && base_path_.back() == '/') base_path_.pop_back();
  const size_t colon = authority.rfind(':');
  host_ = colon == std::string::npos ? authority : authority.substr(0, colon);
  port_ = colon == std::string::npos ? "80" : authority.substr(colon + 1);
  if (host_.empty() || port_.empty()) {
    throw InputError("env.url: no host or port in \"" + url_ + "\"");
  }
  if (!(timeout_s_ > 0)) throw InputError("env.timeout_s: expected a number > 0");
  if (!options_.is_object()) throw InputError("env.options: expected an object");
  tool_format_ = parse_tool_call_format(options_.value("tool_format", std::string("auto")));
  io_ = std::make_unique<Io>();
}

HttpEnvironment::~HttpEnvironment() = default;

void HttpEnvironment::check_usable() const {
  if (!failed_.empty()) {
    throw RuntimeError(url_ + ": the environment was stopped by an earlier failure: " + failed_);
  }
}

void HttpEnvironment::fail(const std::string& message) {
  failed_ = message;
  throw RuntimeError(message);
}

HttpEnvironment::Trajectory* HttpEnvironment::trajectory_of(const Call& call) {
  auto it = trajectories_.find(call.id);
  return it == trajectories_.end() || it->second.serial != call.serial ? nullptr : &it->second;
}

void HttpEnvironment::enqueue(Call call) {
  Lane& lane = lanes_[call.id];
  if (lane.busy) {
    lane.waiting.push_back(std::move(call));
    return;
  }
  lane.busy = true;
  start(std::move(call));
}

void HttpEnvironment::start(Call call) {
  if (in_flight_ >= kMaxConnections) {
    backlog_.push_back(std::move(call));
    return;
  }
  ++in_flight_;
  launch(std::move(call));
}

void HttpEnvironment::launch(Call call) {
  const std::string target = base_path_ + "/" + call.what;
  const auto limit = std::chrono::milliseconds(static_cast<int64_t>(timeout_s_ * 1000));
  io_->post([this, call = std::move(call), target, limit](net::io_context& ioc) {
    auto exchange = std::make_shared<Exchange>(ioc, [this, call](bool timed_out, std::string error,
                                                                 int status, std::string body) {
      {
        std::lock_guard<std::mutex> lock(mutex_);
        outcomes_.push_back(Outcome{call, timed_out, std::move(error), status, std::move(body)});
      }
      arrived_.notify_one();
    });
    auto& req = exchange->request;
    req = http::request<http::string_body>{http::verb::post, target, 11};
    req.set(http::field::host, host_);
    req.set(http::field::content_type, "application/json");
    req.body() = call.body;
    req.prepare_payload();
    exchange->start(host_, port_, limit);
  });
}

void HttpEnvironment::reset(int64_t id, const json& row) {
  check_usable();
  const uint64_t serial = next_serial_++;
  trajectories_[id] = Trajectory{serial, false, false, true};
  const json body = {{"id", id}, {"row", row}, {"options", options_}};
  enqueue(Call{id, serial, "reset", body.dump(-1, ' ', false, json::error_handler_t::replace)});
}

void HttpEnvironment::step(int64_t id, const std::string& action) {
  check_usable();
  auto it = trajectories_.find(id);
  if (it == trajectories_.end()) {
    throw RuntimeError(url_ + ": step for trajectory " + std::to_string(id) +
                       ", which was not reset or is closed");
  }
  if (it->second.timed_out) {
    Observation obs;
    obs.done = obs.timed_out = true;
    ready_.emplace_back(id, obs);
    return;
  }
  it->second.step_pending = true;
  const json body = {{"id", id},
                     {"action", action},
                     {"tool_calls", tool_calls_json(parse_tool_calls(action, tool_format_))}};
  enqueue(Call{id, it->second.serial, "step",
               body.dump(-1, ' ', false, json::error_handler_t::replace)});
}

void HttpEnvironment::close(int64_t id) {
  auto it = trajectories_.find(id);
  if (!failed_.empty() || it == trajectories_.end()) return;
  const uint64_t serial = it->second.serial;
  trajectories_.erase(it);
  resets_ready_.erase(std::remove_if(resets_ready_.begin(), resets_ready_.end(),
                                     [id](const auto& r) { return r.first == id; }),
                      resets_ready_.end());
  enqueue(Call{id, serial, "close", json{{"id", id}}.dump()});
}

template <typename Done>
void HttpEnvironment::settle_until(double wait_s, Done done) {
  check_usable();
  const auto end = std::chrono::steady_clock::now() +
                   std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                       std::chrono::duration<double>(std::max(0.0, wait_s)));
  while (true) {
    std::deque<Outcome> arrived;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      arrived.swap(outcomes_);
    }
    for (auto& outcome : arrived) settle(std::move(outcome));
    if (done()) break;
    std::unique_lock<std::mutex> lock(mutex_);
    if (!arrived_.wait_until(lock, end, [this] { return !outcomes_.empty(); })) break;
  }
}

std::vector<std::pair<int64_t, Observation>> HttpEnvironment::poll(double wait_s) {
  settle_until(wait_s, [this] {
    bool waiting = false;
    for (const auto& t : trajectories_) waiting = waiting || t.second.step_pending;
    return !ready_.empty() || !waiting;
  });
  return std::exchange(ready_, {});
}

std::vector<std::pair<int64_t, std::string>> HttpEnvironment::poll_resets(double wait_s) {
  settle_until(wait_s, [this] {
    bool waiting = false;
    for (const auto& t : trajectories_) waiting = waiting || t.second.reset_pending;
    return !resets_ready_.empty() || !waiting;
  });
  return std::exchange(resets_ready_, {});
}

void HttpEnvironment::settle(Outcome outcome) {
  const Call& call = outcome.call;
  --in_flight_;
  while (in_flight_ < kMaxConnections && !backlog_.empty()) {
    ++in_flight_;
    launch(std::move(backlog_.front()));
    backlog_.pop_front();
  }
  const std::string what =
      "POST " + base_path_ + "/" + call.what + " for trajectory " + std::to_string(call.id);
  Trajectory* t = trajectory_of(call);
  if (outcome.timed_out && t) {  // the trajectory ends; so does a step waiting behind its reset
    t->timed_out = true;
    if (t->reset_pending) {
      t->reset_pending = false;
      resets_ready_.emplace_back(call.id, std::string());
    }
    if (t->step_pending) {
      t->step_pending = false;
      Observation obs;
      obs.done = obs.timed_out = true;
      ready_.emplace_back(call.id, obs);
    }
  }
  // The trajectory's next call; a closed or timed-out trajectory's are dropped, but its
  // close is always sent.
  Lane& lane = lanes_[call.id];
  lane.busy = false;
  while (!lane.busy && !lane.waiting.empty()) {
    Call next = std::move(lane.waiting.front());
    lane.waiting.pop_front();
    const Trajectory* next_of = trajectory_of(next);
    if (next.what != "close" && (!next_of || next_of->timed_out)) continue;
    lane.busy = true;
    start(std::move(next));
  }
  if (!lane.busy) lanes_.erase(call.id);
  if (outcome.timed_out) return;
  if (!outcome.error.empty())
    fail("HTTP environment " + url_ + ": " + what + " failed: " + outcome.error);
  if (outcome.status != 200) {
    fail("HTTP environment " + url_ + ": " + what + " answered HTTP " +
         std::to_string(outcome.status) + ": " + outcome.body.substr(0, 200));
  }
  if (call.what == "reset" && t && t->reset_pending) {
    t->reset_pending = false;
    resets_ready_.emplace_back(call.id, read_reset(outcome));
  }
  if (call.what != "step" || !t || !t->step_pending) return;
  t->step_pending = false;
  ready_.emplace_back(call.id, read_step(outcome));
}

std::string HttpEnvironment::read_reset(const Outcome& outcome) {
  // Replies written for the older protocol (any body) still work: no observation.
  const json reply = json::parse(outcome.body, nullptr, /*allow_exceptions=*/false);
  if (!reply.is_object() || !reply.contains("observation") || reply["observation"].is_null())
    return "";
  if (!reply["observation"].is_string()) {
    fail("HTTP environment " + url_ + ": reset for trajectory " + std::to_string(outcome.call.id) +
         " answered " + outcome.body.substr(0, 200) +
         ": \"observation\" is not a string; expected {\"observation\": str | null}");
  }
  return reply["observation"].get<std::string>();
}

Observation HttpEnvironment::read_step(const Outcome& outcome) {
  const json reply = json::parse(outcome.body, nullptr, /*allow_exceptions=*/false);
  auto bad = [&](const std::string& why) {
    fail("HTTP environment " + url_ + ": step for trajectory " + std::to_string(outcome.call.id) +
         " answered " + outcome.body.substr(0, 200) + ": " + why +
         "; expected {\"observation\": str | null, \"reward\": number, \"done\": bool}");
  };
  if (!reply.is_object()) bad("not a JSON object");
  Observation obs;
  const json& text = reply.contains("observation") ? reply["observation"] : json();
  if (text.is_string())
    obs.text = text.get<std::string>();
  else if (!text.is_null())
    bad("\"observation\" is not a string");
  if (reply.contains("reward")) {
    if (!reply["reward"].is_number()) bad("\"reward\" is not a number");
    obs.reward = reply["reward"].get<double>();
  }
  if (!reply.contains("done") || !reply["done"].is_boolean()) bad("\"done\" is not true or false");
  obs.done = reply["done"].get<bool>();
  if (reply.contains("role")) {
    if (reply["role"] != "tool" && reply["role"] != "user") bad("\"role\" is not tool or user");
    obs.role = reply["role"].get<std::string>();
  }
  for (const char* key : {"tool_calls", "tool_errors"}) {
    if (!reply.contains(key)) continue;
    if (!reply[key].is_number_integer()) bad(std::string("\"") + key + "\" is not an integer");
    (std::string(key) == "tool_calls" ? obs.tool_calls : obs.tool_errors) = reply[key].get<int>();
  }
  return obs;
}

}  // namespace rlhf::envs
