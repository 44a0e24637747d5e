// The authenticating store: wire protocol, server (a thread per connection) and client.
// Protocol, integers big-endian:
//   server -> client  "RLHFSTORE1" (10 bytes), nonce_s (32 random bytes)
//   client -> server  nonce_c (32), HMAC-SHA256(key = token, "client" nonce_s nonce_c) (32)
//   server -> client  0, HMAC-SHA256(token, "server" nonce_s nonce_c) (32): admitted; or
//                     1, u32 length, a one-line reason; then the server closes
//   request           op (1), wait in ms (8; 0: forever), field count (4), fields
//   reply             status (1: ok, timeout, error), field count (4), fields
//   field             u32 length, bytes
// Fresh nonces on both sides make each proof good for one connection only (no replay).
#include "transport/auth_store.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sodium.h>
#include <sys/socket.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cerrno>
#include <climits>
#include <condition_variable>
#include <cstring>
#include <list>
#include <map>
#include <thread>

#include "core/errors.h"

namespace rlhf::transport {
namespace {

constexpr char kMagic[] = "RLHFSTORE1";
constexpr size_t kMagicSize = sizeof kMagic - 1;
constexpr size_t kNonceSize = 32;
constexpr size_t kTagSize = crypto_auth_hmacsha256_BYTES;
constexpr uint32_t kMaxFields = 1u << 16;
constexpr uint32_t kMaxFieldBytes = 64u << 20;
constexpr uint32_t kMaxReasonBytes = 1024;
constexpr auto kProofTime = std::chrono::seconds(10);   // a connection's time to prove the token
constexpr auto kReplySlack = std::chrono::seconds(30);  // beyond a request's own wait
constexpr const char* kRefusal = "wrong or missing job token";

enum Op : uint8_t { kSet = 1, kGet, kAdd, kCompareSet, kCheck, kWait, kDelete, kNumKeys };
enum Status : uint8_t { kOk = 0, kTimedOut = 1, kFailed = 2 };

using Clock = std::chrono::steady_clock;
using Bytes = std::vector<uint8_t>;
using Fields = std::vector<Bytes>;
using Tag = std::array<uint8_t, kTagSize>;
constexpr Clock::time_point kForever = Clock::time_point::max();

// A connection that closed, broke or timed out (never leaves this file).
struct ConnectionLost : std::runtime_error {
  using std::runtime_error::runtime_error;
};

void init_sodium() {
  static const int rc = sodium_init();  // thread-safe; 1 when already initialised
  if (rc < 0) throw RuntimeError("libsodium: sodium_init failed");
}

// Waits until fd is ready for `events` or `deadline` passes (false).
bool wait_ready(int fd, short events, Clock::time_point deadline) {
  while (true) {
    int ms = -1;
    if (deadline != kForever) {
      const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now());
      if (left.count() <= 0) return false;
      ms = static_cast<int>(std::min<int64_t>(left.count(), INT_MAX));
    }
    pollfd p{fd, events, 0};
    const int rc = ::poll(&p, 1, ms);
    if (rc > 0) return true;
    if (rc < 0 && errno != EINTR)
      throw ConnectionLost(std::string("poll: ") + std::strerror(errno));
  }
}

void read_exact(int fd, void* data, size_t n, Clock::time_point deadline) {
  auto* at = static_cast<uint8_t*>(data);
  while (n > 0) {
    if (!wait_ready(fd, POLLIN, deadline)) throw ConnectionLost("timed out");
    const ssize_t got = ::recv(fd, at, n, 0);
    if (got == 0) throw ConnectionLost("connection closed by the peer");
    if (got < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      throw ConnectionLost(std::strerror(errno));
    }
    at += got;
    n -= static_cast<size_t>(got);
  }
}

void write_all(int fd, const Bytes& data) {
  size_t done = 0;
  while (done < data.size()) {
    const ssize_t sent = ::send(fd, data.data() + done, data.size() - done, MSG_NOSIGNAL);
    if (sent < 0) {
      if (errno == EINTR) continue;
      throw ConnectionLost(std::strerror(errno));
    }
    done += static_cast<size_t>(sent);
  }
}

void put_u32(Bytes& out, uint32_t v) {
  for (int shift = 24; shift >= 0; shift -= 8) out.push_back(static_cast<uint8_t>(v >> shift));
}
void put_u64(Bytes& out, uint64_t v) {
  for (int shift = 56; shift >= 0; shift -= 8) out.push_back(static_cast<uint8_t>(v >> shift));
}
uint64_t get_be(const uint8_t* at, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v = v << 8 | at[i];
  return v;
}

void put_fields(Bytes& out, const Fields& fields) {
  put_u32(out, static_cast<uint32_t>(fields.size()));
  for (const auto& f : fields) {
    put_u32(out, static_cast<uint32_t>(f.size()));
    out.insert(out.end(), f.begin(), f.end());
  }
}

// Reads `count` fields, each within kMaxFieldBytes.
Fields read_fields(int fd, uint32_t count, Clock::time_point deadline) {
  if (count > kMaxFields) throw ConnectionLost("bad frame: " + std::to_string(count) + " fields");
  Fields fields(count);
  for (auto& f : fields) {
    uint8_t length[4];
    read_exact(fd, length, 4, deadline);
    const auto n = static_cast<uint32_t>(get_be(length, 4));
    if (n > kMaxFieldBytes)
      throw ConnectionLost("bad frame: a field of " + std::to_string(n) + " bytes");
    f.resize(n);
    read_exact(fd, f.data(), n, deadline);
  }
  return fields;
}

Bytes bytes_of(const std::string& s) {
  return Bytes(s.begin(), s.end());
}
std::string text_of(const Bytes& b) {
  return std::string(b.begin(), b.end());
}

// HMAC-SHA256(token, side || nonce_s || nonce_c) (RFC 2104 through libsodium).
Tag proof(const std::string& token, const char* side, const uint8_t* nonce_s,
          const uint8_t* nonce_c) {
  crypto_auth_hmacsha256_state state;
  crypto_auth_hmacsha256_init(&state, reinterpret_cast<const unsigned char*>(token.data()),
                              token.size());
  crypto_auth_hmacsha256_update(&state, reinterpret_cast<const unsigned char*>(side),
                                std::strlen(side));
  crypto_auth_hmacsha256_update(&state, nonce_s, kNonceSize);
  crypto_auth_hmacsha256_update(&state, nonce_c, kNonceSize);
  Tag tag;
  crypto_auth_hmacsha256_final(&state, tag.data());
  return tag;
}

// The server's side of the proof: sends the challenge and checks the answer; `reply` is
// what to send back (the server's own proof, or the refusal). False when the client did not
// prove the token.
bool server_handshake(int fd, const std::string& token, Bytes& reply) {
  const auto deadline = Clock::now() + kProofTime;
  Bytes hello(kMagic, kMagic + kMagicSize);
  uint8_t nonce_s[kNonceSize];
  randombytes_buf(nonce_s, kNonceSize);
  hello.insert(hello.end(), nonce_s, nonce_s + kNonceSize);
  write_all(fd, hello);
  uint8_t answer[kNonceSize + kTagSize];
  read_exact(fd, answer, sizeof answer, deadline);
  const Tag expected = proof(token, "client", nonce_s, answer);
  if (sodium_memcmp(expected.data(), answer + kNonceSize, kTagSize) != 0) {
    reply = {1};
    put_u32(reply, static_cast<uint32_t>(std::strlen(kRefusal)));
    reply.insert(reply.end(), kRefusal, kRefusal + std::strlen(kRefusal));
    return false;
  }
  const Tag mine = proof(token, "server", nonce_s, answer);
  reply = {0};
  reply.insert(reply.end(), mine.begin(), mine.end());
  return true;
}

// The client's side: proves the token and checks the server's proof; throws RuntimeError.
void client_handshake(int fd, const std::string& token, const std::string& where,
                      Clock::time_point deadline) {
  try {
    uint8_t hello[kMagicSize + kNonceSize];
    read_exact(fd, hello, sizeof hello, deadline);
    if (std::memcmp(hello, kMagic, kMagicSize) != 0)
      throw RuntimeError(where + ": not an rlhf rendezvous store (unexpected greeting)");
    const uint8_t* nonce_s = hello + kMagicSize;
    Bytes answer(kNonceSize);
    randombytes_buf(answer.data(), kNonceSize);
    const Tag tag = proof(token, "client", nonce_s, answer.data());
    answer.insert(answer.end(), tag.begin(), tag.end());
    write_all(fd, answer);
    uint8_t status = 0;
    read_exact(fd, &status, 1, deadline);
    if (status != 0) {
      uint8_t length[4];
      read_exact(fd, length, 4, deadline);
      Bytes reason(std::min<uint64_t>(get_be(length, 4), kMaxReasonBytes));
      read_exact(fd, reason.data(), reason.size(), deadline);
      throw RuntimeError(where + ": the store refused this client: " + text_of(reason));
    }
    Tag theirs;
    read_exact(fd, theirs.data(), kTagSize, deadline);
    const Tag expected = proof(token, "server", nonce_s, answer.data());
    if (sodium_memcmp(expected.data(), theirs.data(), kTagSize) != 0)
      throw RuntimeError(where + ": the store did not prove the job token: not this job's store");
  } catch (const ConnectionLost& e) {
    throw RuntimeError(where + ": no proof exchange with the store (" + e.what() + ")");
  }
}

// A connected TCP socket to host:port, retrying refused connections until `deadline`.
int connect_until(const std::string& host, uint16_t port, Clock::time_point deadline,
                  const std::string& where) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const int rc = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found);
  if (rc != 0) throw RuntimeError(where + ": cannot resolve the host: " + gai_strerror(rc));
  std::unique_ptr<addrinfo, decltype(&::freeaddrinfo)> owned(found, &::freeaddrinfo);
  std::string last_error = "no address";
  do {
    for (addrinfo* a = found; a; a = a->ai_next) {
      const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
      if (fd < 0) {
        last_error = std::strerror(errno);
        continue;
      }
      int error = ::connect(fd, a->ai_addr, a->ai_addrlen) == 0 ? 0 : errno;
      if (error == EINPROGRESS) {
        socklen_t len = sizeof error;
        error = wait_ready(fd, POLLOUT, deadline) &&
                        ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &len) == 0
                    ? error
                    : ETIMEDOUT;
      }
      if (error == 0 && ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK) == 0) {
        const int one = 1;
        (void)::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);  // latency only
        return fd;
      }
      last_error = std::strerror(error ? error : errno);
      ::close(fd);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  } while (Clock::now() < deadline);
  throw RuntimeError(where + ": cannot connect: " + last_error);
}

}  // namespace

// ---- server -------------------------------------------------------------------------------

struct AuthStoreServer::State {
  struct Connection {
    int fd = -1;
    std::thread thread;
    std::atomic<bool> done{false};
  };

  int listen_fd = -1;
  int wake[2] = {-1, -1};  // written once to stop the acceptor
  std::string token;
  std::mutex mutex;  // data, stopping
  std::condition_variable changed;
  std::map<std::string, Bytes> data;
  bool stopping = false;
  std::mutex connections_mutex;
  std::list<std::unique_ptr<Connection>> connections;
  std::atomic<int> refused{0}, admitted{0}, pending{0};
  std::thread acceptor;

  void accept_loop();
  void reap_done();
  void serve(Connection& c);
  Fields handle(uint8_t op, std::chrono::milliseconds wait, const Fields& f, Status& status);
  bool wait_keys(std::unique_lock<std::mutex>& lock, const std::vector<std::string>& keys,
                 std::chrono::milliseconds wait);
};

void AuthStoreServer::State::accept_loop() {
  while (true) {
    pollfd p[2] = {{listen_fd, POLLIN, 0}, {wake[0], POLLIN, 0}};
    if (::poll(p, 2, -1) < 0) {
      if (errno == EINTR) continue;
      return;
    }
    if (p[1].revents) return;
    if (!(p[0].revents & POLLIN)) continue;
    const int fd = ::accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) {  // out of descriptors, or the peer already gone: do not spin
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
      continue;
    }
    reap_done();
    if (pending.load() >= kMaxPendingConnections) {  // bounded: a flood waits out kProofTime
      ::close(fd);
      ++refused;
      continue;
    }
    const int one = 1;
    (void)::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);  // latency only
    auto connection = std::make_unique<Connection>();
    connection->fd = fd;
    Connection& c = *connection;
    ++pending;
    std::lock_guard<std::mutex> lock(connections_mutex);
    c.thread = std::thread([this, &c] { serve(c); });
    connections.push_back(std::move(connection));
  }
}

void AuthStoreServer::State::reap_done() {
  std::lock_guard<std::mutex> lock(connections_mutex);
  for (auto it = connections.begin(); it != connections.end();) {
    if (!(*it)->done) {
      ++it;
      continue;
    }
    (*it)->thread.join();
    ::close((*it)->fd);
    it = connections.erase(it);
  }
}

void AuthStoreServer::State::serve(Connection& c) {
  bool proven = false;
  Bytes verdict;
  try {
    proven = server_handshake(c.fd, token, verdict);
  } catch (const ConnectionLost&) {
  }
  --pending;
  (proven ? admitted : refused)++;  // counted before the client can learn the verdict
  try {
    if (!verdict.empty()) write_all(c.fd, verdict);
    while (proven) {
      uint8_t head[13];
      read_exact(c.fd, head, sizeof head, kForever);
      const auto op = head[0];
      const std::chrono::milliseconds wait(get_be(head + 1, 8));
      const Fields request =
          read_fields(c.fd, static_cast<uint32_t>(get_be(head + 9, 4)), kForever);
      Status status = kOk;
      Fields out;
      try {
        out = handle(op, wait, request, status);
      } catch (const std::exception& e) {
        status = kFailed;
        out = {bytes_of(e.what())};
      }
      Bytes reply{status};
      put_fields(reply, out);
      write_all(c.fd, reply);
    }
  } catch (const ConnectionLost&) {  // the client left, sent a bad frame, or we are stopping
  }
  ::shutdown(c.fd, SHUT_RDWR);
  c.done = true;
}

bool AuthStoreServer::State::wait_keys(std::unique_lock<std::mutex>& lock,
                                       const std::vector<std::string>& keys,
                                       std::chrono::milliseconds wait) {
  auto ready = [&] {
    if (stopping) return true;
    for (const auto& k : keys)
      if (!data.count(k)) return false;
    return true;
  };
  if (wait.count() == 0)
    changed.wait(lock, ready);
  else if (!changed.wait_for(lock, wait, ready))
    return false;
  if (stopping) throw RuntimeError("the store server is stopping");
  return true;
}

// One request under the store's lock; c10d TCPStore's semantics for each operation.
Fields AuthStoreServer::State::handle(uint8_t op, std::chrono::milliseconds wait, const Fields& f,
                                      Status& status) {
  auto expect = [&](size_t n) {
    if (f.size() != n)
      throw InputError("store operation " + std::to_string(op) + ": expected " + std::to_string(n) +
                       " fields, got " + std::to_string(f.size()));
  };
  std::vector<std::string> keys;
  for (const auto& field : f) keys.push_back(text_of(field));
  std::unique_lock<std::mutex> lock(mutex);
  switch (op) {
    case kSet:
      expect(2);
      data[keys[0]] = f[1];
      changed.notify_all();
      return {};
    case kGet:
      expect(1);
      if (!wait_keys(lock, keys, wait)) status = kTimedOut;
      return status == kOk ? Fields{data.at(keys[0])} : Fields{};
    case kAdd: {  // values are decimal text, as TCPStore keeps them (get() reads them so)
      expect(2);
      auto it = data.find(keys[0]);
      const int64_t now =
          (it == data.end() ? 0 : std::stoll(text_of(it->second))) + std::stoll(keys[1]);
      data[keys[0]] = bytes_of(std::to_string(now));
      changed.notify_all();
      return {bytes_of(std::to_string(now))};
    }
    case kCompareSet: {  // absent: set only when `expected` is empty; returns the value now
      expect(3);
      auto it = data.find(keys[0]);
      if (it == data.end() && !f[1].empty()) return {f[1]};
      if (it != data.end() && it->second != f[1]) return {it->second};
      data[keys[0]] = f[2];
      changed.notify_all();
      return {f[2]};
    }
    case kCheck:
      for (const auto& k : keys)
        if (!data.count(k)) return {bytes_of("0")};
      return {bytes_of("1")};
    case kWait:
      if (!wait_keys(lock, keys, wait)) status = kTimedOut;
      return {};
    case kDelete:
      expect(1);
      return {bytes_of(data.erase(keys[0]) ? "1" : "0")};
    case kNumKeys:
      expect(0);
      return {bytes_of(std::to_string(data.size()))};
    default:
      throw InputError("unknown store operation " + std::to_string(op));
  }
}

AuthStoreServer::AuthStoreServer(int listen_fd, std::string token) : state_(new State) {
  init_sodium();
  if (token.empty()) {
    ::close(listen_fd);
    throw InputError("rendezvous store: the job token is empty");
  }
  state_->listen_fd = listen_fd;
  state_->token = std::move(token);
  if (::pipe2(state_->wake, O_CLOEXEC) != 0) {
    ::close(listen_fd);
    throw RuntimeError(std::string("rendezvous store: pipe2: ") + std::strerror(errno));
  }
  state_->acceptor = std::thread([s = state_.get()] { s->accept_loop(); });
}

AuthStoreServer::~AuthStoreServer() {
  {
    std::lock_guard<std::mutex> lock(state_->mutex);
    state_->stopping = true;
  }
  state_->changed.notify_all();
  const char stop = 1;
  (void)!::write(state_->wake[1], &stop, 1);  // a full pipe would already wake the acceptor
  state_->acceptor.join();
  ::close(state_->listen_fd);
  std::lock_guard<std::mutex> lock(state_->connections_mutex);
  for (auto& c : state_->connections) ::shutdown(c->fd, SHUT_RDWR);  // unblocks their reads
  for (auto& c : state_->connections) {
    c->thread.join();
    ::close(c->fd);
  }
  ::close(state_->wake[0]);
  ::close(state_->wake[1]);
}

int AuthStoreServer::refused() const {
  return state_->refused.load();
}
int AuthStoreServer::admitted() const {
  return state_->admitted.load();
}

// ---- client -------------------------------------------------------------------------------

AuthStoreClient::AuthStoreClient(std::string host, uint16_t port, std::string token,
                                 std::chrono::milliseconds timeout)
    : Store(timeout), host_(std::move(host)), port_(port), token_(std::move(token)) {
  init_sodium();
  if (token_.empty())
    throw InputError(where() + ": no job token to prove (RLHF_TOKEN is unset or empty)");
  const auto deadline = Clock::now() + (timeout.count() > 0 ? timeout : std::chrono::minutes(5));
  fd_ = connect_until(host_, port_, deadline, where());
  try {
    client_handshake(fd_, token_, where(), std::min(deadline, Clock::now() + kProofTime));
  } catch (...) {
    ::close(fd_);
    throw;
  }
}

AuthStoreClient::~AuthStoreClient() {
  if (fd_ >= 0) ::close(fd_);
}

std::string AuthStoreClient::where() const {
  return "rendezvous store " + host_ + ":" + std::to_string(port_);
}

AuthStoreClient::Fields AuthStoreClient::call(uint8_t op, std::chrono::milliseconds wait,
                                              const Fields& fields) {
  std::lock_guard<std::mutex> lock(mutex_);
  Bytes request{op};
  put_u64(request, static_cast<uint64_t>(std::max<int64_t>(wait.count(), 0)));
  put_fields(request, fields);
  try {
    write_all(fd_, request);
    const auto deadline = wait.count() > 0 ? Clock::now() + wait + kReplySlack : kForever;
    uint8_t head[5];
    read_exact(fd_, head, sizeof head, deadline);
    Fields reply = read_fields(fd_, static_cast<uint32_t>(get_be(head + 1, 4)), deadline);
    if (head[0] == kTimedOut) {
      std::string keys;
      for (const auto& f : fields) keys += (keys.empty() ? "" : ", ") + text_of(f);
      C10_THROW_ERROR(DistStoreError, where() + ": timed out after " +
                                          std::to_string(wait.count()) + " ms waiting for " + keys);
    }
    if (head[0] != kOk)
      throw RuntimeError(where() + ": " + (reply.empty() ? "failed" : text_of(reply[0])));
    return reply;
  } catch (const ConnectionLost& e) {
    throw RuntimeError(where() + ": lost the connection: " + e.what());
  }
}

c10::intrusive_ptr<c10d::Store> AuthStoreClient::clone() {
  return c10::make_intrusive<AuthStoreClient>(host_, port_, token_, timeout_);
}

void AuthStoreClient::set(const std::string& key, const std::vector<uint8_t>& value) {
  call(kSet, timeout_, {bytes_of(key), value});
}

std::vector<uint8_t> AuthStoreClient::compareSet(const std::string& key,
                                                 const std::vector<uint8_t>& expected,
                                                 const std::vector<uint8_t>& desired) {
  return call(kCompareSet, timeout_, {bytes_of(key), expected, desired}).at(0);
}

std::vector<uint8_t> AuthStoreClient::get(const std::string& key) {
  return call(kGet, timeout_, {bytes_of(key)}).at(0);
}

int64_t AuthStoreClient::add(const std::string& key, int64_t value) {
  return std::stoll(
      text_of(call(kAdd, timeout_, {bytes_of(key), bytes_of(std::to_string(value))}).at(0)));
}

bool AuthStoreClient::deleteKey(const std::string& key) {
  return text_of(call(kDelete, timeout_, {bytes_of(key)}).at(0)) == "1";
}

bool AuthStoreClient::check(const std::vector<std::string>& keys) {
  Fields fields;
  for (const auto& k : keys) fields.push_back(bytes_of(k));
  return text_of(call(kCheck, timeout_, fields).at(0)) == "1";
}

int64_t AuthStoreClient::getNumKeys() {
  return std::stoll(text_of(call(kNumKeys, timeout_, {}).at(0)));
}

void AuthStoreClient::wait(const std::vector<std::string>& keys) {
  wait(keys, timeout_);
}

void AuthStoreClient::wait(const std::vector<std::string>& keys,
                           const std::chrono::milliseconds& timeout) {
  Fields fields;
  for (const auto& k : keys) fields.push_back(bytes_of(k));
  call(kWait, timeout, fields);
}

}  // namespace rlhf::transport
