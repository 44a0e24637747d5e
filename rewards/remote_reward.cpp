#include "rewards/remote_reward.h"

#include <nlohmann/json.hpp>

#include "core/errors.h"
#include "rewards/http_client.h"

namespace rlhf::rewards {

RemoteReward::RemoteReward(RemoteRewardConfig config)
    : config_(std::move(config)), url_(parse_http_url(config_.url, "reward.remote_url")) {}

std::vector<double> RemoteReward::score(const std::vector<std::string>& prompts,
                                        const std::vector<std::string>& responses,
                                        const std::vector<std::string>& labels) const {
  nlohmann::json body = {{"prompts", prompts}, {"responses", responses}, {"labels", labels}};
  std::vector<std::string> query;
  for (size_t i = 0; i < responses.size(); ++i)
    query.push_back((i < prompts.size() ? prompts[i] : "") + responses[i]);
  body["query"] = query;
  // Responses of a byte-level policy need not be valid UTF-8: invalid bytes become U+FFFD.
  const std::string text =
      post_json(url_, body.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace),
                config_.timeout_s, "remote reward", "reward.remote_timeout_s");
  const std::string where = "remote reward " + config_.url + ": ";
  nlohmann::json reply = nlohmann::json::parse(text, nullptr, false);
  const nlohmann::json* scores = nullptr;
  if (reply.is_object())
    for (const char* key : {"rewards", "scores"})
      if (reply.contains(key) && reply[key].is_array()) scores = &reply[key];
  if (!scores)
    throw RuntimeError(
        where + "expected a JSON object with a \"rewards\" list, got: " + text.substr(0, 200));
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
