// Remote reward (reward.remote_url): POSTs a batch of samples as JSON to an HTTP endpoint
// and reads one score per sample, as verifier-based training needs. Plain HTTP/1.1 over
// Boost.Beast; the whole exchange is bounded by a timeout. Not a general HTTP client.
//
// Request:  {"prompts": [...], "responses": [...], "labels": [...],
//            "query": [prompt + response, ...]}        ("query" as OpenRLHF's remote RM)
// Reply:    {"rewards": [float, ...]}  (or "scores"), one per sample, in order.
#pragma once

#include <string>
#include <vector>

#include "rewards/http_client.h"

namespace rlhf::rewards {

struct RemoteRewardConfig {
  std::string url;          // http://host:port/path
  double timeout_s = 30.0;  // connect + send + receive
};

class RemoteReward {
 public:
  // Throws InputError when the URL is not http://host[:port][/path].
  explicit RemoteReward(RemoteRewardConfig config);

  // One score per response. Throws RuntimeError naming the URL on a timeout, a refused
  // connection, an HTTP status other than 200, a reply that is not the JSON above, or a
  // count that differs from the number of responses.
  std::vector<double> score(const std::vector<std::string>& prompts,
                            const std::vector<std::string>& responses,
                            const std::vector<std::string>& labels) const;

 private:
  RemoteRewardConfig config_;
  HttpUrl url_;
};

}  // namespace rlhf::rewards
