// The rendezvous store of a collective group (c10d FileStore or TCPStore), shared by the
// Gloo and NCCL backends, and the job's store server: one store on the driver's host where
// every group of the job meets under its own key prefix, so no shared filesystem is needed,
// and which admits only clients that prove the job token (transport/auth_store.h). Not a
// general key-value service.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include "transport/collective_group.h"

namespace rlhf::transport {

class AuthStoreServer;

// A group's place in a StoreServer, written "tcp://HOST:PORT/GROUP" where a store path goes
// (CollectiveConfig::store_path); anything not starting with "tcp://" is a FileStore path.
struct StoreUrl {
  std::string host;
  uint16_t port = 0;
  std::string group;  // key prefix: the group's keys never meet another group's
  std::string text() const;
};
// nullopt for a file path; throws InputError for a "tcp://" text that is not HOST:PORT/GROUP.
std::optional<StoreUrl> parse_store_url(const std::string& text);

// Opens the store named by `config`: a StoreServer group when store_path is a store URL
// (a client with the group's prefix that proves config.token, or $RLHF_TOKEN when that is
// empty), else a FileStore at store_path, or for kTcp with
// StoreHost::kRank0 a TCPStore whose server rank 0 starts. Throws rlhf::InputError for a bad
// config, rlhf::RuntimeError on failure (naming the store's address).
c10::intrusive_ptr<c10d::Store> open_store(const CollectiveConfig& config);

// The address a rank's Gloo device binds to: RLHF_COLLECTIVE_HOST when the scheduler set it
// (the worker's node host, for groups that span nodes), else `fallback`.
std::string collective_host(const std::string& fallback);
inline constexpr const char* kEnvCollectiveHost = "RLHF_COLLECTIVE_HOST";
// How long one collective may take, in ms (fault.collective_timeout_s, set by the scheduler):
// the default of CollectiveConfig::timeout in a worker.
inline constexpr const char* kEnvCollectiveTimeout = "RLHF_COLLECTIVE_TIMEOUT_MS";

// The server of a job's rendezvous store: an AuthStoreServer listening on `host` only (an
// address or name of this machine; "0.0.0.0" for every interface) at the first free port in
// [low_port, high_port] (both 0: any free port), admitting only clients that prove `token`.
// Lives as long as the job.
class StoreServer {
 public:
  // Throws RuntimeError naming host and ports when no port can be bound, InputError for an
  // empty token.
  StoreServer(const std::string& host, uint16_t low_port, uint16_t high_port,
              const std::string& token);
  ~StoreServer();
  StoreServer(const StoreServer&) = delete;
  StoreServer& operator=(const StoreServer&) = delete;

  uint16_t port() const { return port_; }
  // The URL of `group` for workers that reach this machine as `connect_host`.
  StoreUrl url(const std::string& connect_host, const std::string& group) const;
  // Connections refused so far (no valid proof of the token) and admitted.
  int refused() const;
  int admitted() const;

 private:
  std::unique_ptr<AuthStoreServer> server_;
  uint16_t port_ = 0;
};

// Binds a listening TCP socket to `host` at the first free port in [low, high] (0, 0: any);
// returns the fd and fills `port`. Throws RuntimeError naming host and range.
int listen_on_port_range(const std::string& host, uint16_t low, uint16_t high, uint16_t& port);

}  // namespace rlhf::transport
