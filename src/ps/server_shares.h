// SPDX-License-Identifier: Apache-2.0
// How big values are shared among the servers (docs/ps.md "Mixed placement").
//
// Equal shares suit servers that are all on hosts of their own (each carries
// n M / k per direction) or all on the workers' hosts. With k spare hosts
// next to n worker hosts that also serve, equal shares leave either kind of
// link idle part of the time. BytePS's split balances them: with one worker
// per host, equal links and a fraction a of every value of M bytes on the
// spare hosts, a worker host's link carries, per direction, a M (to the
// spare hosts) + 2 (1 - a)(n - 1) M / n (its pushes to the other worker
// hosts' servers, and its own server's replies to the other workers); a
// spare host's carries n a M / k. They are equal for
//
//   a = 2k(n-1) / (n^2 + kn - 2k),
//
// and the step then takes 2n(n-1) M / ((n^2 + kn - 2k) B), below both the
// ring's 2(n-1)/n M/B and the dedicated servers' max(1, n/k) M/B.
//
// Every worker computes the same weights from the same address book and
// setting: nothing is negotiated.
// Thread safety: pure functions.
#pragma once

#include <string>
#include <vector>

#include "cluster/protocol.h"

namespace pushpull::ps {

// The fraction of every big value BytePS's split puts on k spare hosts next
// to n worker hosts (0 for n <= 1: a lone worker's own server costs no link;
// 1 from k = n on: the spare hosts' links are then no slower than a
// worker's, and the worker hosts' servers get nothing).
double spare_host_fraction(int n, int k);

// One weight per server rank for `setting` (KVStoreOptions::ps_server_weights:
// "auto", "equal" or a comma-separated list of positive weights), or an empty
// vector for equal shares. "auto" classifies each server by its host: on a
// host with no worker (spare) or on a worker's host; with both kinds present
// it returns the split above, each host's share divided equally among its
// servers. Throws InvalidArgument for a malformed list or one whose length is
// not the number of servers.
std::vector<double> server_weights(const std::string& setting, const cluster::AddressBook& book);

// How much larger than an equal share's each server's links' socket buffers
// should be under `weights` (server_weights): sqrt(weight x servers / sum),
// within [1/8, 8]; empty for equal shares. Why: the flows between workers
// and servers are limited by their windows, so with equal buffers every flow
// runs at the same rate and the spare hosts' bigger slices finish last
// (cluster::Node::set_server_link_scale). Why the root, not the share
// itself: a flow's rate is its window over its round trip, and the spare
// hosts' ports queue more once their flows get more window; measured with 8
// workers at 500 Mbit/s (docs/scaling.md), buffers in proportion to the
// shares overshot at k = 2 (1.16x BytePS's bound, 1.11x with equal ones)
// where their square roots gave 1.07x (k = 2) and 1.09-1.10x (k = 4).
std::vector<double> link_scales(const std::vector<double>& weights);

}  // namespace pushpull::ps
