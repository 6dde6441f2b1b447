// Client calls that many integration tests make the same way.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <string>

#include "strata/client.h"

namespace strata::testing {

// A client of the daemon at `endpoint` with default options (a failed test where it fails).
inline std::unique_ptr<Client> ConnectClient(const std::string& endpoint) {
  ClientOptions o;
  o.endpoint = endpoint;
  auto c = Client::Connect(o);
  EXPECT_TRUE(c.ok()) << c.status();
  return c.ok() ? std::move(*c) : nullptr;
}

// A stats counter of the daemon (0 when absent or the call fails).
inline uint64_t StatsCounter(Client& c, const std::string& name) {
  auto stats = c.Stats();
  if (stats.ok())
    for (const auto& [n, v] : stats->counters)
      if (n == name) return v;
  return 0;
}

}  // namespace strata::testing
