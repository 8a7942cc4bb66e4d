// SPDX-License-Identifier: Apache-2.0
// `pushpull bench transport`: two Transports on loopback in this process.
//   ping-pong latency: half the round trip of a message echoed by the peer;
//   one-way throughput: back-to-back zero-copy sends read straight into a
//     posted buffer on the receiver, timed until the last one arrived;
//   iperf3: single-stream loopback TCP measured in the same run (a child
//     `iperf3 -s -1` we start and always reap), the ceiling to compare with.
// Each figure is the median of --reps runs. Output: see bench_common.h; the
// iperf3 row's bytes are the bytes it moved and median_us its run time.
#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <regex>
#include <thread>

#include <fmt/format.h>

#include "bench_common.h"
#include "bench_iperf.h"
#include "commands.h"
#include "transport/socket.h"
#include "transport/tcp/message_transport.h"

namespace pushpull::cli {
namespace {

using Clock = std::chrono::steady_clock;
constexpr uint16_t kPing = 200, kPong = 201, kData = 202;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

struct Pair {
  Pair() : a(config("server", Role::kServer)), b(config("worker", Role::kWorker)) {
    a.listen("127.0.0.1", 0);
    a.set_handler(kPing, kPing, [this](transport::Message&& m) {
      a.send_copy(m.conn, transport::Header{.type = kPong, .request_id = m.header.request_id},
                  m.payload.data(), m.payload.size());
    });
    a.set_connect_handler([this](transport::ConnId id, const transport::PeerInfo&) {
      std::lock_guard l(mu);
      a_conn = id;
      cv.notify_all();
    });
    a.start();
    b.start();
    b_conn = b.connect("127.0.0.1", a.port());
    std::unique_lock l(mu);
    if (!cv.wait_for(l, std::chrono::seconds(10), [&] { return a_conn != 0; }))
      throw Timeout("benchmark peer did not connect");
  }
  static transport::TransportConfig config(const char* label, Role role) {
    transport::TransportConfig c;
    c.role = role;
    c.label = label;
    c.net.max_message_bytes = uint64_t{1} << 31;
    return c;
  }
  transport::MessageTransport a, b;
  transport::ConnId a_conn = 0, b_conn = 0;
  std::mutex mu;
  std::condition_variable cv;
};

// Median one-way latency (us) of `bytes` messages: half a ping-pong.
double pingpong_us(Pair& p, uint64_t bytes, int iters) {
  std::vector<std::byte> out(bytes), in(bytes);
  std::vector<double> us;
  for (int i = 0; i < iters + 20; ++i) {
    bool done = false;
    Status st;
    p.b.post_recv(p.b_conn, {kPong, static_cast<uint64_t>(i), 0}, in.data(), in.size(),
                  [&](const Status& s, const transport::Header&) {
                    std::lock_guard l(p.mu);
                    st = s;
                    done = true;
                    p.cv.notify_all();
                  });
    auto t0 = Clock::now();
    p.b.send(p.b_conn, transport::Header{.type = kPing, .request_id = static_cast<uint64_t>(i)},
             out.data(), out.size(), nullptr);
    std::unique_lock l(p.mu);
    if (!p.cv.wait_for(l, std::chrono::seconds(10), [&] { return done; }))
      throw Timeout("ping-pong reply did not arrive within 10 s");
    st.raise();
    if (i >= 20) us.push_back(seconds_since(t0) * 1e6 / 2);  // after warm-up
  }
  return median(us);
}

// Median seconds to move `count` messages of `bytes` one way.
double oneway_seconds(Pair& p, uint64_t bytes, int count, int reps) {
  std::vector<std::byte> src(bytes, std::byte{1}), dst(bytes);
  std::vector<double> secs;
  for (int rep = 0; rep < reps + 1; ++rep) {
    int got = 0;
    Status st;
    // Each arrival posts the next receive from the I/O thread, before the
    // next header is read, so every payload lands straight in dst.
    std::function<void(const Status&, const transport::Header&)> on_recv;
    on_recv = [&](const Status& s, const transport::Header&) {
      std::lock_guard l(p.mu);
      if (!s) st = s;
      if (++got < count && s)
        p.a.post_recv(p.a_conn, {kData, static_cast<uint64_t>(got), 0}, dst.data(), dst.size(),
                      on_recv);
      p.cv.notify_all();
    };
    p.a.post_recv(p.a_conn, {kData, 0, 0}, dst.data(), dst.size(), on_recv);
    auto t0 = Clock::now();
    for (int i = 0; i < count; ++i)
      p.b.send(p.b_conn, transport::Header{.type = kData, .request_id = static_cast<uint64_t>(i)},
               src.data(), src.size(), nullptr);
    std::unique_lock l(p.mu);
    if (!p.cv.wait_for(l, std::chrono::seconds(60), [&] { return got == count || !st; }))
      throw Timeout("throughput run did not finish within 60 s");
    st.raise();
    if (rep > 0) secs.push_back(seconds_since(t0));  // rep 0 warms up buffers
  }
  return median(secs);
}

struct Settings {
  BenchFlags flags;
  std::string sizes = "1K..256M";
  std::string latency_sizes = "8,64,512,4K,32K";
  int reps = 5;
  int iperf_seconds = 2;
};

void run(const Settings& s) {
  BenchTable table(s.flags);
  Pair p;
  for (uint64_t bytes : parse_sizes(s.latency_sizes)) {
    double us = pingpong_us(p, bytes, 1000);
    double gbps = bytes / us / 1e3;
    table.add({"pushpull_pingpong", 2, bytes, us, gbps, gbps});
  }
  table.print("Ping-pong latency (one way = half the round trip), loopback");
  for (uint64_t bytes : parse_sizes(s.sizes)) {
    // Enough messages per run to be measurable, bounded for big sizes.
    uint64_t total = bytes >= (1 << 20) ? (uint64_t{512} << 20) : (uint64_t{64} << 20);
    int count = static_cast<int>(std::max<uint64_t>(2, total / bytes));
    double secs = oneway_seconds(p, bytes, count, s.reps);
    double gbps = static_cast<double>(bytes) * count / secs / 1e9;
    table.add({"pushpull", 2, bytes, secs / count * 1e6, gbps, gbps});
  }
  if (s.flags.peers()) {
    std::vector<double> rates, moved, secs;
    for (int i = 0; i < 3; ++i)
      if (auto r = iperf3_once(s.iperf_seconds)) {
        rates.push_back(r->first / r->second / 1e9);
        moved.push_back(r->first);
        secs.push_back(r->second);
      }
    if (rates.empty()) {
      std::fprintf(stderr, "iperf3 did not run (is it installed?); no peer figure\n");
    } else {
      double gbps = median(rates);
      table.add(
          {"iperf3", 2, static_cast<uint64_t>(median(moved)), median(secs) * 1e6, gbps, gbps});
    }
  }
  table.print("One-way throughput, loopback (iperf3: single stream, same run)");
}

}  // namespace

void register_bench_transport(CLI::App& bench) {
  auto settings = std::make_shared<Settings>();
  auto* cmd = bench.add_subcommand("transport", "Transport latency and throughput vs iperf3");
  add_bench_flags(cmd, &settings->flags);
  cmd->add_option("--sizes", settings->sizes, "Throughput message sizes, e.g. 1K..256M");
  cmd->add_option("--latency-sizes", settings->latency_sizes, "Ping-pong sizes, e.g. 8,64,4K");
  cmd->add_option("--reps", settings->reps, "Runs per size (median reported)")
      ->check(CLI::Range(1, 100));
  cmd->add_option("--iperf-seconds", settings->iperf_seconds, "Length of each iperf3 run")
      ->check(CLI::Range(1, 60));
  cmd->callback([settings] { run(*settings); });
}

}  // namespace pushpull::cli
