// The wire version a worker states when it registers and a scheduler requires: the
// hand-kept kWireVersion (transport/operation.h) and a fingerprint of every typed
// operation's request and reply fields, so a worker from a build whose contract differs in
// any field is refused by name at registration, before it serves anything.
#pragma once

#include <string>

namespace rlhf {

// "<kWireVersion>-<16 hex digits>", the same in every binary built from the same sources.
const std::string& wire_version();

// Every typed operation's name with its request's and reply's field layout, one per line
// (what the fingerprint hashes; for messages and tests).
std::string wire_layout();

}  // namespace rlhf
