// SPDX-License-Identifier: Apache-2.0
// The MASTER_ADDR rendezvous of the collective bootstrap (see bootstrap.h for
// the protocol and its message types): rank 0 hosts, the others connect,
// every rank leaves with every rank's (host, port).
//
// Blocking: rendezvous() returns when the book is complete or throws at the
// deadline (Timeout naming the missing ranks), on a peer's death
// (PeerFailure naming it), or on a conflicting configuration (InvalidArgument).
// Owns nothing after it returns (its net::Transport is stopped).
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "collective/transport.h"
#include "net/wire.h"
#include "pushpull/options.h"

namespace pushpull::collective {

struct RendezvousConfig {
  NetOptions net;  // job id, secret, message limits
  int rank = 0;
  int size = 1;
  std::string master_addr;
  int master_port = 0;
  // This rank's collective listener, as the others should reach it.
  std::string host;
  int port = 0;
  Millis timeout{120000};
};

using AddressList = std::vector<std::pair<std::string, int>>;

AddressList rendezvous(const RendezvousConfig& config);

// Wire forms (exposed for tests).
std::vector<std::byte> encode_hello(int rank, int size, const std::string& host, int port);
Status decode_hello(const std::byte* data, size_t n, int* rank, int* size, std::string* host,
                    int* port);
// An address list on the wire (the rendezvous' book, an elastic round's):
// its hosts as a table (net/host_table.h), then (host index, u16 port) per
// rank; ports 1..65535. get_address_list() reads at most `max_ranks`
// entries and false on anything malformed or not canonical.
void put_address_list(net::Writer& w, const AddressList& book);
bool get_address_list(net::Reader& r, size_t max_ranks, AddressList* book);
std::vector<std::byte> encode_book(const AddressList& book);
Status decode_book(const std::byte* data, size_t n, AddressList* book);

}  // namespace pushpull::collective
