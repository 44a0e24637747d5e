// Opens a group's rendezvous store: c10d FileStore or TCPStore.
#include "transport/store.h"

#include <torch/csrc/distributed/c10d/FileStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "core/errors.h"

namespace rlhf::transport {

c10::intrusive_ptr<c10d::Store> open_store(const CollectiveConfig& config) {
  const std::string who = "rank " + std::to_string(config.rank) + "/" + std::to_string(config.size);
  if (config.size < 1 || config.rank < 0 || config.rank >= config.size) {
    throw InputError("collective group: " + who + ": rank must be in [0, size)");
  }
  try {
    if (config.store == StoreKind::kFile) {
      if (config.store_path.empty())
        throw InputError("collective group: file store needs store_path");
      auto store = c10::make_intrusive<c10d::FileStore>(config.store_path, config.size);
      store->setTimeout(config.timeout);
      return store;
    }
    if (config.port == 0)
      throw InputError("collective group: tcp store needs a port (" + who + ")");
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
    throw RuntimeError("collective group: " + who + ": cannot open the " +
                       (config.store == StoreKind::kFile
                            ? "file store " + config.store_path
                            : "tcp store " + config.host + ":" + std::to_string(config.port)) +
                       ": " + e.what());
  }
}

}  // namespace rlhf::transport
