// SPDX-License-Identifier: Apache-2.0
// A free TCP port on loopback (transport::pick_unused_port: below the ephemeral
// range, bound, read back, released). Still racy by nature: prefer letting
// the code under test bind port 0 where it can.
#pragma once

namespace pushpull::test {
int free_port();
}  // namespace pushpull::test
