// SPDX-License-Identifier: Apache-2.0
// A free TCP port on loopback (bind to port 0, read it back, close). Racy by
// nature: prefer letting the code under test bind port 0 where it can.
#pragma once

namespace pushpull::test {
int free_port();
}  // namespace pushpull::test
