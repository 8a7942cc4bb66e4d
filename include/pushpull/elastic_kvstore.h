// SPDX-License-Identifier: Apache-2.0
// A dist_sync_allreduce KVStore in an elastic job (docs/elastic.md): joined
// to the elastic State, the store follows every re-formation of the group.
#pragma once

#include "pushpull/elastic.h"
#include "pushpull/kvstore.h"

namespace pushpull {

// Joins `store` to `state` (State::add_participant): commit() saves a copy of
// its values; when the group re-forms, its pending operations are abandoned
// (PeerFailure), the saved copy comes back after a member's failure, it
// re-binds to the new communicator and every value is re-synced from the new
// rank 0. `store` must be a dist_sync_allreduce store created in an elastic
// worker (create_kvstore under `pushpull launch --min-workers ...`, which
// binds it to the default session) and outlive its membership; any other
// store: InvalidArgument. Call from the training thread, before run().
void elastic_track_store(collective::elastic::State& state, KVStore& store);

}  // namespace pushpull
