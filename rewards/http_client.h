// A plain HTTP/1.1 POST of JSON under one deadline (resolve, connect, send and receive), over
// Boost.Beast: what the remote reward (reward.remote_url) and a judge's chat completions
// share. http:// only; not a general HTTP client.
#pragma once

#include <string>

namespace rlhf::rewards {

struct HttpUrl {
  std::string text;  // as given, for messages
  std::string host, port, target;
};

// Throws InputError naming `key` when `url` is not http://host[:port][/path].
HttpUrl parse_http_url(const std::string& url, const std::string& key);

// POSTs `body` (JSON) and returns the reply's body when the status is 200. Throws
// RuntimeError starting "<who> <url>: " on a timeout (naming `timeout_key`), a refused
// connection or any failed stage, or another status (with the start of the body).
std::string post_json(const HttpUrl& url, const std::string& body, double timeout_s,
                      const std::string& who, const std::string& timeout_key);

}  // namespace rlhf::rewards
