// SPDX-License-Identifier: Apache-2.0
#include "sim/scale_net.h"

#include <algorithm>
#include <cmath>

#include "transport/hello.h"
#include "transport/message.h"

namespace pushpull::sim::scale {

Net::Net(int nodes, const Costs& costs)
    : costs_(costs),
      busy_(static_cast<size_t>(nodes), 0),
      down_(static_cast<size_t>(nodes), false),
      count_(static_cast<size_t>(nodes)) {
  // The handshake's messages as transport/hello.cpp encodes them (a host name of
  // a typical address), each behind a message header.
  transport::Hello h;
  h.role = Role::kWorker;
  h.rank = 1;
  h.host = "10.0.12.34";
  h.port = 40000;
  challenge_bytes_ = transport::kHeaderBytes + transport::encode(transport::Challenge{}).size();
  hello_bytes_ = transport::kHeaderBytes + transport::encode(h).size();
  ack_bytes_ = transport::kHeaderBytes +
               transport::encode(transport::HelloAck{true, "", Role::kServer, 0, {}}).size();
}

void Net::at(uint64_t t, std::function<void()> fn) {
  queue_.push({std::max(t, now_), order_++, std::move(fn)});
}

bool Net::run(uint64_t until) {
  while (!queue_.empty() && queue_.top().t <= until) {
    // The handler may add events: take it out first.
    Event e = std::move(const_cast<Event&>(queue_.top()));
    queue_.pop();
    clock_.advance(std::chrono::microseconds(e.t - now_));
    now_ = e.t;
    ++events_;
    e.fn();
  }
  if (queue_.empty()) return false;
  clock_.advance(std::chrono::microseconds(until - now_));
  now_ = until;
  return true;
}

uint64_t Net::reserve(int node, uint64_t from_t, uint64_t us) {
  uint64_t& b = busy_[static_cast<size_t>(node)];
  b = std::max(b, from_t) + us;
  count_[static_cast<size_t>(node)].busy_us += us;
  return b;
}

uint64_t Net::send_counted(int from, int to, uint64_t bytes, uint64_t start) {
  const auto wire =
      static_cast<uint64_t>(std::ceil(static_cast<double>(bytes) / costs_.link_bytes_per_us));
  const uint64_t sent =
      reserve(from, start == UINT64_MAX ? now_ : start, costs_.per_message_us + wire);
  auto& a = count_[static_cast<size_t>(from)];
  auto& b = count_[static_cast<size_t>(to)];
  a.messages++, a.bytes += bytes, b.messages++, b.bytes += bytes;
  return reserve(to, sent + costs_.latency_us, costs_.per_message_us);
}

void Net::send(int from, int to, uint64_t bytes, std::function<void()> fn) {
  if (down(from) || down(to)) return;
  const auto wire =
      static_cast<uint64_t>(std::ceil(static_cast<double>(bytes) / costs_.link_bytes_per_us));
  const uint64_t sent = reserve(from, now_, costs_.per_message_us + wire);
  auto& a = count_[static_cast<size_t>(from)];
  auto& b = count_[static_cast<size_t>(to)];
  a.messages++, a.bytes += bytes, b.messages++, b.bytes += bytes;
  // The receiver's thread takes it when it arrives, behind what arrived
  // before (reserving at arrival, not at sending: a reservation in the
  // future would idle the thread until then).
  at(sent + costs_.latency_us, [this, to, fn = std::move(fn)]() mutable {
    if (down(to)) return;
    at(reserve(to, now_, costs_.per_message_us), [this, to, fn = std::move(fn)] {
      if (!down(to)) fn();
    });
  });
}

void Net::connect(int from, int to, std::function<void()> done, std::function<void()> accepted,
                  bool stream) {
  if (down(from) || down(to)) return;
  // The kernel accepts (SYN, SYN-ACK, ACK: one round trip, no thread time);
  // then the acceptor's challenge, the connector's hello, the acceptor's ack.
  at(now_ + 2 * costs_.latency_us,
     [this, from, to, done = std::move(done), accepted = std::move(accepted), stream] {
       send(to, from, challenge_bytes_, [this, from, to, done, accepted, stream] {
         send(from, to, hello_bytes_, [this, from, to, done, accepted, stream] {
           count_[static_cast<size_t>(to)].connections += stream ? 2 : 1;
           if (accepted) accepted();
           send(to, from, ack_bytes_, [this, from, to, done, stream] {
             if (!stream) {
               count_[static_cast<size_t>(from)].connections++;
               if (done) done();
               return;
             }
             // tcp_streams.h: a plain connection, authenticated by a nonce sent
             // over the net connection and echoed back on the stream.
             send(from, to, transport::kHeaderBytes + 32, [this, from, to, done] {
               send(to, from, 32, [this, from, done] {
                 count_[static_cast<size_t>(from)].connections += 2;
                 if (done) done();
               });
             });
           });
         });
       });
     });
}

void Net::lump(int node, uint64_t sent, uint64_t received, uint64_t bytes) {
  auto& c = count_[static_cast<size_t>(node)];
  c.messages += sent + received;
  c.bytes += (sent + received) * bytes;
  reserve(node, now_, (sent + received) * costs_.per_message_us);
}

Spread spread(const std::vector<Count>& before, const std::vector<Count>& after,
              const std::function<double(const Count&)>& field, int first, int last, int hub,
              double per) {
  Spread s;
  for (int i = first; i < last; ++i) {
    const double d =
        (field(after[static_cast<size_t>(i)]) - field(before[static_cast<size_t>(i)])) / per;
    s.mean += d;
    s.max = std::max(s.max, d);
  }
  if (last > first) s.mean /= last - first;
  if (hub >= 0)
    s.hub =
        (field(after[static_cast<size_t>(hub)]) - field(before[static_cast<size_t>(hub)])) / per;
  return s;
}

}  // namespace pushpull::sim::scale
