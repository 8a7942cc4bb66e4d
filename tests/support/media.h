// SPDX-License-Identifier: Apache-2.0
// The media a test of MessageTransport or of an engine above it runs over:
// TCP on loopback and the in-process medium (socketpairs, no port:
// transport/inproc/in_process_listeners.h). A test of a medium-independent
// property is a TEST_P of a fixture derived from Medium, instantiated with
//   INSTANTIATE_TEST_SUITE_P(Media, Suite, ::testing::ValuesIn(test::kMedia), test::medium_name);
#pragma once

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "transport/inproc/in_process_listeners.h"

namespace pushpull::test {

inline const std::vector<std::string> kMedia = {"127.0.0.1",
                                                std::string(transport::kInProcessHost)};

class Medium : public ::testing::TestWithParam<std::string> {
 protected:
  // What to listen on, connect to and advertise.
  const std::string& host() const { return GetParam(); }
};

// "tcp" or "inproc", for test names.
inline std::string medium_name(const ::testing::TestParamInfo<std::string>& info) {
  return transport::is_in_process_host(info.param) ? "inproc" : "tcp";
}

}  // namespace pushpull::test
