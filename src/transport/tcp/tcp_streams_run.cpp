// SPDX-License-Identifier: Apache-2.0
// run_on_streams: a Schedule (schedule.h) over the direct streams
// (tcp_streams.h), driven by the calling thread. Every receive is queued up
// front and read with few large readv calls: receives into place at once,
// receives into scratch as far as there are free slots (reads run up to
// `slots` scratch receives ahead of the reductions). Sends are queued as
// they become ready and written while the thread waits for its receives.
// Large operations (Schedule::footprint) with all their sends to one peer
// hand the sending to the transport's writer thread (StreamWriter), and from
// kReaderThreadBytes with all receives from one peer the reading to its
// reader thread, so the calling thread only reduces; docs/performance.md
// has the measurements behind the thresholds.
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <exception>
#include <functional>
#include <mutex>
#include <optional>

#include <fmt/format.h>

#include "transport/tcp/tcp_streams.h"

namespace pushpull::transport {
namespace {

constexpr size_t kStreamReadAhead = 8 << 20;    // scratch for reads ahead
constexpr size_t kWriterThreadBytes = 4 << 20;  // from this footprint a writer thread sends
// From this footprint a reader thread also receives while the caller reduces
// (measured: +25-40% at 16-64 MiB for n = 2 under load, a loss at 4 MiB).
constexpr size_t kReaderThreadBytes = 16 << 20;

// The reader thread's hand-offs with the calling thread: `received`
// receives are in place (or in their slot), `reduced` are done with their
// slot. It runs on the transport's reader thread (one per transport).
// Destruction aborts (the reader's pump watches abort_fd) and waits for the
// job to end.
struct Reader {
  std::mutex mu;
  std::condition_variable cv;
  size_t received = 0, reduced = 0;
  bool abort = false, finished = false;
  std::exception_ptr error;
  int abort_fd = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  WorkerThread& thread;
  bool started = false, joined = false;

  explicit Reader(WorkerThread& t) : thread(t) {
    if (abort_fd < 0) throw IoError("collective: eventfd failed for the stream reader");
  }
  ~Reader() {
    {
      std::lock_guard lk(mu);
      abort = true;
    }
    cv.notify_all();
    uint64_t one = 1;
    [[maybe_unused]] auto r = ::write(abort_fd, &one, sizeof one);
    if (started && !joined) thread.wait();
    ::close(abort_fd);
  }
  void start(std::function<void()> body) {
    started = true;
    thread.start([this, body = std::move(body)] {
      try {
        body();
      } catch (...) {
        std::lock_guard lk(mu);
        error = std::current_exception();
      }
      {
        std::lock_guard lk(mu);
        finished = true;
      }
      cv.notify_all();
    });
  }
  void check_abort() {
    std::lock_guard lk(mu);
    if (abort) throw IoError("collective: stream reader aborted");
  }
  void set(size_t Reader::*field, size_t count) {
    {
      std::lock_guard lk(mu);
      this->*field = count;
    }
    cv.notify_all();
  }
  // Until `count` receives are in; rethrows the reader's error; `poll` (the
  // writer's check) runs at least every 100 ms.
  void wait_received(size_t count, Millis timeout, const std::function<void()>& poll) {
    auto deadline = Clock::now() + timeout;
    std::unique_lock lk(mu);
    while (received < count) {
      if (error) std::rethrow_exception(error);
      if (finished) throw Internal("collective: stream reader ended early");
      if (Clock::now() > deadline)
        throw Timeout(
            fmt::format("collective: receive {} not in within {} ms", count - 1, timeout.count()));
      cv.wait_for(lk, std::chrono::milliseconds(100));
      lk.unlock();
      poll();
      lk.lock();
    }
  }
  void join() {
    thread.wait();
    joined = true;
    if (error) std::rethrow_exception(error);
  }
};

// Where each receive lands and how far reads may run ahead of the
// reductions.
struct Plan {
  std::vector<char*> dst;
  std::vector<size_t> index;           // receive i's index among its peer's
  std::vector<size_t> scratch_pos;     // receive index of scratch receive j
  std::vector<size_t> scratch_before;  // scratch receives among the first i
  size_t slots = 0;

  Plan(const Schedule& s) : dst(s.recvs.size()), index(s.recvs.size()) {
    const size_t slot = s.scratch_bytes();
    scratch_pos.reserve(s.recvs.size());
    scratch_before.reserve(s.recvs.size() + 1);
    scratch_before.push_back(0);
    for (size_t i = 0; i < s.recvs.size(); ++i) {
      if (s.recvs[i].dst == nullptr) scratch_pos.push_back(i);
      scratch_before.push_back(scratch_pos.size());
    }
    const size_t most = std::max<size_t>(2, kStreamReadAhead / std::max<size_t>(slot, 1));
    slots = std::min(scratch_pos.size(), most);
    // Scratch for `most` slots even when fewer are used, as the ring had
    // before schedules: with only the slots used, 1 MiB allreduces of 2
    // ranks measured ~10-40% slower (alternated runs, a noisy host; the
    // cause was not pinned down). Grown once, reused by every operation.
    if (slots > 0 && s.scratch->size() < most * slot) s.scratch->resize(most * slot);
    for (size_t i = 0; i < s.recvs.size(); ++i)
      dst[i] = s.recvs[i].dst ? static_cast<char*>(s.recvs[i].dst)
                              : s.scratch->data() + (scratch_before[i] % slots) * slot;
  }
  // The first receive whose slot is still taken once `done` receives are
  // done (scratch receive j reuses the slot of j - slots).
  size_t first_blocked(size_t done) const {
    size_t j = scratch_before[done] + slots;
    return j < scratch_pos.size() ? scratch_pos[j] : dst.size();
  }
  // The last index among `peer`'s receives that may be read while receives
  // before `limit` only may be: SIZE_MAX for no limit.
  size_t read_ahead(const Schedule& s, int peer, size_t limit) const {
    if (limit >= dst.size()) return SIZE_MAX;
    for (size_t i = limit; i-- > 0;)
      if (s.recvs[i].peer == peer) return index[i];
    return 0;
  }
};

bool one_peer(const auto& list) {
  return std::all_of(list.begin(), list.end(),
                     [&](const auto& m) { return m.peer == list.front().peer; });
}

}  // namespace

void run_on_streams(DirectStreams& t, const Schedule& s) {
  auto lock = t.lock_streams();
  StreamPump pump(t, s.timeout, s.what);
  const size_t n = s.recvs.size(), esize = dtype_size(s.dtype);
  Plan plan(s);
  for (size_t i = 0; i < n; ++i) {
    const auto& r = s.recvs[i];
    plan.index[i] = pump.recv(r.peer, r.tag, plan.dst[i], r.bytes);
  }
  auto reduce_recv = [&](size_t i) {
    const auto& r = s.recvs[i];
    if (r.after_sends) pump.wait_sent();  // never with a writer (below)
    if (r.reduce_into) reduce(s.op, s.dtype, r.reduce_into, plan.dst[i], r.bytes / esize);
  };
  // Sends: queued on the pump as they become ready, or released to a
  // writer thread.
  std::optional<StreamWriter> writer;
  std::vector<size_t> ready;  // with a writer: sends that may go once i receives are done
  if (s.footprint >= kWriterThreadBytes && !s.sends.empty() && one_peer(s.sends) &&
      std::none_of(s.recvs.begin(), s.recvs.end(), [](const auto& r) { return r.after_sends; })) {
    std::vector<StreamWriter::Msg> msgs;
    for (const auto& x : s.sends)
      msgs.push_back({x.tag, x.data, x.bytes});
    ready.assign(n + 1, 0);
    for (size_t k = 0, done = 0; done <= n; ++done) {
      while (k < s.sends.size() && s.sends[k].after <= done)
        ++k;
      ready[done] = k;
    }
    writer.emplace(t, s.sends.front().peer, std::move(msgs), s.timeout, s.what);
    pump.watch(writer->error_fd(), [&writer] { writer->check(); });
  }
  size_t next_send = 0;
  auto release = [&](size_t done) {
    if (writer) return writer->release(ready[done]);
    for (; next_send < s.sends.size() && s.sends[next_send].after <= done; ++next_send) {
      const auto& x = s.sends[next_send];
      pump.send(x.peer, x.tag, x.data, x.bytes);
    }
  };
  release(0);
  if (writer && s.footprint >= kReaderThreadBytes && n > 0 && one_peer(s.recvs)) {
    // ... and a reader thread drains the stream (into place, or into a free
    // scratch slot) while this one reduces or is descheduled.
    const int from = s.recvs.front().peer;
    Reader reader(t.reader_thread());
    pump.watch(reader.abort_fd, [&reader] { reader.check_abort(); });
    reader.start([&] {
      for (size_t i = 0; i < n; ++i) {
        size_t limit;
        {
          std::unique_lock lk(reader.mu);
          if (!reader.cv.wait_for(lk, s.timeout, [&] {
                return reader.abort || i < plan.first_blocked(reader.reduced);
              }))
            throw Timeout(fmt::format("collective: {}: no scratch slot freed in {} ms", s.what,
                                      s.timeout.count()));
          if (reader.abort) return;
          limit = plan.first_blocked(reader.reduced);
        }
        pump.wait_recv(from, plan.index[i], plan.read_ahead(s, from, limit));
        reader.set(&Reader::received, i + 1);
      }
    });
    for (size_t i = 0; i < n; ++i) {
      reader.wait_received(i + 1, s.timeout, [&] { writer->check(); });
      reduce_recv(i);
      reader.set(&Reader::reduced, i + 1);
      release(i + 1);
    }
    reader.join();
    writer->finish();
    return;
  }
  for (size_t i = 0; i < n; ++i) {
    const int peer = s.recvs[i].peer;
    pump.wait_recv(peer, plan.index[i], plan.read_ahead(s, peer, plan.first_blocked(i)));
    reduce_recv(i);
    release(i + 1);
  }
  pump.finish();
  if (writer) writer->finish();
}

}  // namespace pushpull::transport
