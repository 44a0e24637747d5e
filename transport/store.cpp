// Opens a group's rendezvous store (c10d FileStore, TCPStore, or a prefix of the job's store
// server) and runs the job's store server on a socket bound here, so the address and port
// range are ours to choose, behind the job token's proof (transport/auth_store.h).
#include "transport/store.h"

#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <torch/csrc/distributed/c10d/FileStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "core/errors.h"
#include "core/placement.h"
#include "transport/auth_store.h"

namespace rlhf::transport {
namespace {

constexpr const char* kScheme = "tcp://";

std::string message_of(const std::exception& e) {
  if (const auto* error = dynamic_cast<const c10::Error*>(&e))
    return error->what_without_backtrace();
  return e.what();
}

// A client of the job's store server at url that proves `token`, seen through the group's
// prefix.
c10::intrusive_ptr<c10d::Store> open_url(const StoreUrl& url, const std::string& token,
                                         std::chrono::milliseconds timeout) {
  const char* env = std::getenv(kEnvToken);
  auto client = c10::make_intrusive<AuthStoreClient>(url.host, url.port,
                                                     token.empty() && env ? env : token, timeout);
  return c10::make_intrusive<c10d::PrefixStore>(url.group + "/", client);
}

}  // namespace

std::string StoreUrl::text() const {
  return kScheme + host + ":" + std::to_string(port) + "/" + group;
}

std::optional<StoreUrl> parse_store_url(const std::string& text) {
  if (text.rfind(kScheme, 0) != 0) return std::nullopt;
  const std::string rest = text.substr(std::strlen(kScheme));
  const auto slash = rest.find('/');
  const auto colon = rest.rfind(':', slash);
  auto bad = [&](const std::string& why) {
    return InputError("store address \"" + text + "\": " + why +
                      " (expected tcp://HOST:PORT/GROUP)");
  };
  if (slash == std::string::npos || slash + 1 == rest.size()) throw bad("no group after the port");
  if (colon == std::string::npos || colon == 0) throw bad("no HOST:PORT");
  StoreUrl url;
  url.host = rest.substr(0, colon);
  const std::string port = rest.substr(colon + 1, slash - colon - 1);
  char* end = nullptr;
  const long p = std::strtol(port.c_str(), &end, 10);
  if (port.empty() || *end != '\0' || p < 1 || p > 65535) throw bad("port \"" + port + "\"");
  url.port = static_cast<uint16_t>(p);
  url.group = rest.substr(slash + 1);
  return url;
}

std::string collective_host(const std::string& fallback) {
  const char* host = std::getenv(kEnvCollectiveHost);
  return host && *host ? host : fallback;
}

c10::intrusive_ptr<c10d::Store> open_store(const CollectiveConfig& config) {
  const std::string who = "rank " + std::to_string(config.rank) + "/" + std::to_string(config.size);
  if (config.size < 1 || config.rank < 0 || config.rank >= config.size) {
    throw InputError("collective group: " + who + ": rank must be in [0, size)");
  }
  std::string where;
  try {
    if (config.store == StoreKind::kFile) {
      if (config.store_path.empty())
        throw InputError("collective group: file store needs store_path");
      if (auto url = parse_store_url(config.store_path)) {
        where = "store " + url->text();
        return open_url(*url, config.token, config.timeout);
      }
      where = "file store " + config.store_path;
      auto store = c10::make_intrusive<c10d::FileStore>(config.store_path, config.size);
      store->setTimeout(config.timeout);
      return store;
    }
    if (config.port == 0)
      throw InputError("collective group: tcp store needs a port (" + who + ")");
    where = "tcp store " + config.host + ":" + std::to_string(config.port);
    c10d::TCPStoreOptions options;
    options.port = config.port;
    options.isServer = config.store_host == StoreHost::kRank0 && config.rank == 0;
    options.numWorkers = c10::nullopt;  // do not wait for workers: the group's own init does
    options.waitWorkers = false;
    options.timeout = config.timeout;
    return c10::make_intrusive<c10d::TCPStore>(config.host, options);
  } catch (const InputError&) {
    throw;
  } catch (const std::exception& e) {
    throw RuntimeError("collective group: " + who + ": cannot open the " + where + ": " +
                       message_of(e));
  }
}

int listen_on_port_range(const std::string& host, uint16_t low, uint16_t high, uint16_t& port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* found = nullptr;
  const int rc = ::getaddrinfo(host.c_str(), nullptr, &hints, &found);
  if (rc != 0)
    throw RuntimeError("store server: cannot resolve host \"" + host + "\": " + gai_strerror(rc));
  std::unique_ptr<addrinfo, decltype(&::freeaddrinfo)> owned(found, &::freeaddrinfo);
  const std::string range = low == 0 && high == 0
                                ? std::string("any port")
                                : "ports " + std::to_string(low) + "-" + std::to_string(high);
  std::string last_error = "no address";
  for (uint32_t p = low; p <= high; ++p) {
    for (addrinfo* a = found; a; a = a->ai_next) {
      const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
      if (fd < 0) {
        last_error = std::strerror(errno);
        continue;
      }
      const int one = 1;
      (void)::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
      sockaddr_storage addr{};
      std::memcpy(&addr, a->ai_addr, a->ai_addrlen);
      if (a->ai_family == AF_INET)
        reinterpret_cast<sockaddr_in*>(&addr)->sin_port = htons(static_cast<uint16_t>(p));
      else if (a->ai_family == AF_INET6)
        reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port = htons(static_cast<uint16_t>(p));
      if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), a->ai_addrlen) == 0 &&
          ::listen(fd, 128) == 0) {
        socklen_t len = sizeof addr;
        if (::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
          port = ntohs(a->ai_family == AF_INET ? reinterpret_cast<sockaddr_in*>(&addr)->sin_port
                                               : reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port);
          return fd;
        }
      }
      last_error = std::strerror(errno);
      ::close(fd);
    }
  }
  throw RuntimeError("store server: cannot listen on " + host + " (" + range + "): " + last_error);
}

StoreServer::StoreServer(const std::string& host, uint16_t low_port, uint16_t high_port,
                         const std::string& token) {
  if (token.empty()) throw InputError("store server on " + host + ": the job token is empty");
  server_ = std::make_unique<AuthStoreServer>(
      listen_on_port_range(host, low_port, high_port, port_), token);
}

StoreServer::~StoreServer() = default;

int StoreServer::refused() const {
  return server_->refused();
}
int StoreServer::admitted() const {
  return server_->admitted();
}

StoreUrl StoreServer::url(const std::string& connect_host, const std::string& group) const {
  return StoreUrl{connect_host, port_, group};
}

}  // namespace rlhf::transport
