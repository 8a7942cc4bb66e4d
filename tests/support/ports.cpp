// SPDX-License-Identifier: Apache-2.0
#include "support/ports.h"

#include "transport/socket.h"

namespace pushpull::test {

// Below the ephemeral range, as the launcher picks its ports: a connect()
// elsewhere on the machine cannot take it as its source port before the code
// under test binds it.
int free_port() {
  return transport::pick_unused_port("127.0.0.1");
}

}  // namespace pushpull::test
