// The job's rendezvous key-value store, which admits only clients that prove the job token:
// every connection opens with a challenge (the server's random nonce) that the client answers
// with HMAC-SHA256(token, nonces), and the server answers in turn, so neither side sends the
// token and a client knows it met this job's store. After that, c10d's store operations (set,
// get, add, compareSet, check, wait, deleteKey, getNumKeys) travel in clear: this guards who
// may read or write keys (the NCCL unique id, Gloo's addresses), not what an eavesdropper on
// the wire sees, and it does not encrypt. Used by Gloo and NCCL groups through c10d::Store.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <vector>

namespace rlhf::transport {

// Serves the store on a listening socket until destroyed (one thread per connection;
// at most kMaxPendingConnections unproven connections at once, each given 10 s to prove).
class AuthStoreServer {
 public:
  static constexpr int kMaxPendingConnections = 64;
  // Takes over `listen_fd` (bound and listening). `token` must not be empty (InputError).
  AuthStoreServer(int listen_fd, std::string token);
  ~AuthStoreServer();  // closes every connection; clients then see their next call fail
  AuthStoreServer(const AuthStoreServer&) = delete;
  AuthStoreServer& operator=(const AuthStoreServer&) = delete;

  int refused() const;   // connections closed without a valid proof of the token so far
  int admitted() const;  // connections that proved it

 private:
  struct State;
  std::unique_ptr<State> state_;
};

// A client of an AuthStoreServer as a c10d::Store. Every call blocks; get and wait wait up
// to the store's timeout (0: forever) for their keys and then throw c10d::DistStoreError.
class AuthStoreClient final : public c10d::Store {
 public:
  // Connects to host:port (retrying while nothing listens, up to `timeout`) and proves the
  // token. Throws RuntimeError naming host:port when it cannot connect, when the server
  // refuses the token ("wrong or missing job token"), or when the server fails to prove it.
  AuthStoreClient(std::string host, uint16_t port, std::string token,
                  std::chrono::milliseconds timeout);
  ~AuthStoreClient() override;

  c10::intrusive_ptr<c10d::Store> clone() override;
  void set(const std::string& key, const std::vector<uint8_t>& value) override;
  std::vector<uint8_t> compareSet(const std::string& key, const std::vector<uint8_t>& expected,
                                  const std::vector<uint8_t>& desired) override;
  std::vector<uint8_t> get(const std::string& key) override;
  int64_t add(const std::string& key, int64_t value) override;
  bool deleteKey(const std::string& key) override;
  bool check(const std::vector<std::string>& keys) override;
  int64_t getNumKeys() override;
  void wait(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override;

 private:
  using Fields = std::vector<std::vector<uint8_t>>;
  // One request and its reply; throws DistStoreError on a server-side timeout.
  Fields call(uint8_t op, std::chrono::milliseconds wait, const Fields& fields);
  std::string where() const;

  std::string host_;
  uint16_t port_;
  std::string token_;
  int fd_ = -1;
  std::mutex mutex_;  // one request in flight per connection
};

}  // namespace rlhf::transport
