// SPDX-License-Identifier: Apache-2.0
#include "meet.h"

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <fmt/format.h>

#include <string>
#include <vector>

#include "collective/store.h"
#include "pushpull/error.h"
#include "pushpull/options.h"

namespace pushpull::torch_pg {
namespace {

using collective::Clock;

// torch's store as the group's Store. Not write-once (c10d overwrites): two
// processes of one rank are refused later, by the mesh's authenticated
// connections. torch's stores report a timeout and a lost store alike (and
// not all as c10::Error): failing before the deadline is the store failing.
class C10dStore final : public collective::Store {
 public:
  explicit C10dStore(c10::intrusive_ptr<c10d::Store> s) : s_(std::move(s)) {}
  void set(const std::string& key, std::vector<std::byte> value) override {
    const auto* p = reinterpret_cast<const uint8_t*>(value.data());
    call(key, [&] { s_->set(kPrefix + key, std::vector<uint8_t>(p, p + value.size())); });
  }
  std::vector<std::byte> get(const std::string& key, Clock::time_point deadline) override {
    std::vector<uint8_t> v;
    call(
        key,
        [&] {
          s_->wait({kPrefix + key}, left(deadline));
          v = s_->get(kPrefix + key);
        },
        deadline);
    const auto* p = reinterpret_cast<const std::byte*>(v.data());
    return {p, p + v.size()};
  }
  std::vector<std::string> wait(const std::vector<std::string>& keys,
                                Clock::time_point deadline) override {
    for (size_t i = 0; i < keys.size(); ++i) {
      try {
        get(keys[i], deadline);
      } catch (const Timeout&) {
        std::vector<std::string> missing;
        for (size_t j = i; j < keys.size(); ++j)
          if (!s_->check({kPrefix + keys[j]})) missing.push_back(keys[j]);
        return missing;
      }
    }
    return {};
  }
  std::string where() const override { return "the torch.distributed store"; }

 private:
  static constexpr const char* kPrefix = "pushpull/";
  static std::chrono::milliseconds left(Clock::time_point deadline) {
    return std::max(std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now()),
                    std::chrono::milliseconds(1));
  }
  static std::string first_line(const char* what) {  // without c10's backtrace
    std::string s(what);
    return s.substr(0, s.find('\n'));
  }
  template <typename F>
  void call(const std::string& key, F&& f, Clock::time_point deadline = Clock::time_point::max()) {
    try {
      f();
    } catch (const std::exception& e) {
      if (Clock::now() + std::chrono::milliseconds(100) >= deadline)  // a store's clock may round
        throw Timeout(
            fmt::format("pushpull ProcessGroup: '{}{}' not in the torch.distributed "
                        "store by the deadline (PUSHPULL_STARTUP_TIMEOUT_MS): {}",
                        kPrefix, key, first_line(e.what())));
      throw PeerFailure(
          fmt::format("pushpull ProcessGroup: the torch.distributed store failed "
                      "on '{}{}': {}",
                      kPrefix, key, first_line(e.what())));
    }
  }
  c10::intrusive_ptr<c10d::Store> s_;
};

// The TCPStore under any PrefixStores, or nullptr.
c10d::TCPStore* tcp_store_of(c10d::Store* s) {
  for (int depth = 0; s != nullptr && depth < 16; ++depth) {
    if (auto* tcp = dynamic_cast<c10d::TCPStore*>(s)) return tcp;
    auto* prefix = dynamic_cast<c10d::PrefixStore*>(s);
    if (prefix == nullptr) return nullptr;
    s = prefix->getUnderlyingStore().get();
  }
  return nullptr;
}

}  // namespace

std::shared_ptr<collective::Session> meet(const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                          int size) {
  Options o = Options::from_env();
  // The group is exactly the c10d group: no scheduler, its rank and size.
  o.cluster.role = Role::kNone;
  o.cluster.num_servers = 0;
  const bool whole_world = o.collective.size == size;
  o.collective.rank = rank;
  o.collective.size = size;
  if (!whole_world) {  // a subgroup: count local ranks among its members' hosts
    o.collective.local_rank = -1;
    o.collective.local_size = -1;
  }
  if (size == 1) {
    o.collective.master_addr.clear();
    o.collective.master_port = 0;
    return std::make_shared<collective::Session>(o);
  }
  // The mesh advertises the host on the route to rank 0's side (bootstrap.h):
  // without MASTER_ADDR, the TCPStore's host; file:// or hash stores without
  // PUSHPULL_NODE_HOST either: one host, loopback.
  if (o.collective.master_addr.empty()) {
    auto* tcp = tcp_store_of(store.get());
    o.collective.master_addr = tcp != nullptr ? tcp->getHost() : "127.0.0.1";
  }
  C10dStore meeting(store);
  return std::make_shared<collective::Session>(o, meeting);
}

}  // namespace pushpull::torch_pg
