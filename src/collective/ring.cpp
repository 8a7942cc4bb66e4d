// SPDX-License-Identifier: Apache-2.0
// Ring reduce-scatter / allgather / allreduce, pipelined in segments.
//
// Step t of the reduce-scatter sends block (r-t-1) to the right neighbour and
// receives block (r-t-2) from the left one, reducing it into place, so after
// n-1 steps rank r holds the full reduction of block r. Allgather step s sends
// block (r-s) and receives block (r-s-1) straight into place. Every block is
// cut into the same number of segments; segment k of step t+1 only needs
// segment k of step t, so as soon as one segment has been received (and
// reduced) it is forwarded, while later segments are still on the wire: with
// a window of several posted receives, sending, receiving and reducing
// overlap.
//
// Over a transport with direct streams (tcp_streams.h) the same schedule
// runs on the streams instead: the calling thread reads and reduces, and
// sends itself (small), with a StreamWriter thread (>= kWriterThreadBytes),
// and reads on a RingReader thread too (>= kReaderThreadBytes); see
// docs/performance.md for why and the measurements.
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <exception>
#include <functional>
#include <mutex>
#include <optional>

#include <fmt/format.h>

#include "collective/algorithms.h"
#include "collective/host_collectives.h"
#include "collective/tcp_streams.h"

namespace pushpull::collective {
namespace {

constexpr size_t kWindow = 4;                   // receives posted ahead
constexpr size_t kMinPipelineBytes = 64 << 10;  // below: one segment per block
constexpr size_t kStreamReadAhead = 8 << 20;    // scratch for reads ahead (streams)
constexpr size_t kWriterThreadBytes = 4 << 20;  // from this size a writer thread sends (streams)
// From this size a reader thread also receives while the caller reduces
// (measured: +25-40% at 16-64 MiB for n = 2 under load, a loss at 4 MiB).
constexpr size_t kReaderThreadBytes = 16 << 20;

// The reader thread of a large stream ring and its hand-offs with the
// algorithm thread: `received` units are in place (or in their slot),
// `reduced` units are done with their slot. It runs on the transport's reader
// thread (one per transport). Destruction aborts (the reader's pump watches
// abort_fd) and waits for the job to end.
struct RingReader {
  std::mutex mu;
  std::condition_variable cv;
  size_t received = 0, reduced = 0;
  bool abort = false, finished = false;
  std::exception_ptr error;
  int abort_fd = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  WorkerThread& thread;
  bool started = false, joined = false;

  explicit RingReader(WorkerThread& t) : thread(t) {
    if (abort_fd < 0) throw IoError("collective: eventfd failed for the ring reader");
  }
  ~RingReader() {
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
    if (abort) throw IoError("collective: ring reader aborted");
  }
  void publish(size_t count) {
    {
      std::lock_guard lk(mu);
      received = count;
    }
    cv.notify_all();
  }
  void reduced_up_to(size_t count) {
    {
      std::lock_guard lk(mu);
      reduced = count;
    }
    cv.notify_all();
  }
  // Until `count` units are received; rethrows the reader's error; `poll`
  // (the writer's check) runs at least every 100 ms.
  void wait_received(size_t count, Millis timeout, const std::function<void()>& poll) {
    auto deadline = Clock::now() + timeout;
    std::unique_lock lk(mu);
    while (received < count) {
      if (error) std::rethrow_exception(error);
      if (finished) throw Internal("collective: ring reader ended early");
      if (Clock::now() > deadline)
        throw Timeout(fmt::format("collective: ring unit {} not received within {} ms", count - 1,
                                  timeout.count()));
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

int mod(int a, int n) {
  return ((a % n) + n) % n;
}

}  // namespace

std::vector<Block> even_blocks(size_t count, int n) {
  std::vector<Block> out(static_cast<size_t>(n));
  size_t base = count / static_cast<size_t>(n), extra = count % static_cast<size_t>(n), off = 0;
  for (size_t i = 0; i < out.size(); ++i) {
    out[i].offset = off;
    out[i].count = base + (i < extra ? 1 : 0);
    off += out[i].count;
  }
  return out;
}

void ring(AlgoContext& ctx, void* base_ptr, DType dtype, ReduceOp op,
          const std::vector<Block>& blocks, bool reduce_scatter, bool allgather) {
  const int n = ctx.size(), r = ctx.rank();
  if (n == 1) return;
  const size_t esize = dtype_size(dtype);
  char* base = static_cast<char*>(base_ptr);
  size_t max_count = 0;
  for (const auto& b : blocks)
    max_count = std::max(max_count, b.count);
  const size_t max_bytes = max_count * esize;
  const size_t seg_bytes = std::max<uint64_t>(ctx.ring_segment_bytes, esize);
  size_t nseg = std::max<size_t>(1, (max_bytes + seg_bytes - 1) / seg_bytes);
  if (nseg == 1 && max_bytes >= 2 * kMinPipelineBytes) nseg = 2;

  const int rs_steps = reduce_scatter ? n - 1 : 0;
  const int steps = rs_steps + (allgather ? n - 1 : 0);
  const int right = mod(r + 1, n), left = mod(r - 1, n);
  auto send_block = [&](int t) {
    return t < rs_steps ? mod(r - t - 1, n) : mod(r - (t - rs_steps), n);
  };
  auto recv_block = [&](int t) {
    return t < rs_steps ? mod(r - t - 2, n) : mod(r - (t - rs_steps) - 1, n);
  };
  // Segment k of a block: elements [count*k/nseg, count*(k+1)/nseg).
  auto seg = [&](int blk, size_t k) {
    const Block& b = blocks[static_cast<size_t>(blk)];
    size_t lo = b.count * k / nseg, hi = b.count * (k + 1) / nseg;
    return Block{b.offset + lo, hi - lo};
  };

  const size_t max_seg_bytes = ((max_count + nseg - 1) / nseg) * esize;
  std::vector<char>& scratch = *ctx.scratch;
  if (reduce_scatter && scratch.size() < kWindow * max_seg_bytes)
    scratch.resize(kWindow * max_seg_bytes);

  const size_t units = static_cast<size_t>(steps) * nseg;
  auto tag = [&](size_t unit) { return op_tag(ctx.op_id, static_cast<uint32_t>(unit)); };

  // The decision by block size, the same on every rank (its messages are
  // the block's segments).
  if (DirectStreams* tcp = stream_transport(ctx.transport, max_bytes)) {
    // Direct streams: this thread writes to the right neighbour and reads
    // from the left one itself (see tcp_streams.h). The left stream carries
    // the units in order, so every receive can be queued up front and read
    // with few large readv calls: allgather units straight into place,
    // reduce-scatter units into a ring of scratch slots (reads run up to
    // `slots` units ahead of the reductions).
    const size_t slots = std::max<size_t>(2, kStreamReadAhead / std::max<size_t>(max_seg_bytes, 1));
    if (reduce_scatter && scratch.size() < slots * max_seg_bytes)
      scratch.resize(slots * max_seg_bytes);
    auto lock = tcp->lock_streams();
    StreamPump pump(*tcp, ctx.peer_timeout, fmt::format("ring (op {})", ctx.op_id));
    auto send = [&](size_t unit) {
      Block s = seg(send_block(static_cast<int>(unit / nseg)), unit % nseg);
      if (s.count > 0) pump.send(right, tag(unit), base + s.offset * esize, s.count * esize);
    };
    std::vector<size_t> index(units, SIZE_MAX), upto(units, 0);  // upto: last index <= unit
    for (size_t u = 0, posted = 0; u < units; ++u) {
      int t = static_cast<int>(u / nseg);
      Block s = seg(recv_block(t), u % nseg);
      upto[u] = s.count ? posted : (posted ? posted - 1 : 0);
      if (s.count == 0) continue;
      ++posted;
      char* dst =
          t < rs_steps ? scratch.data() + (u % slots) * max_seg_bytes : base + s.offset * esize;
      index[u] = pump.recv(left, tag(u), dst, s.count * esize);
    }
    // Last receive whose destination is free while unit u is awaited: the
    // next slots - 1 scratch units, or anything once only in-place
    // (allgather) receives are left.
    const size_t rs_units = static_cast<size_t>(rs_steps) * nseg;
    auto read_ahead = [&](size_t u) {
      return u + slots - 1 >= rs_units ? SIZE_MAX : upto[u + slots - 1];
    };
    // Large operations: a writer thread sends while this one reads and
    // reduces (StreamWriter); small ones do both here (no thread start).
    std::optional<StreamWriter> writer;
    std::vector<size_t> sent_upto(units + 1, 0);  // messages among units [0, u)
    if (max_bytes * static_cast<size_t>(n) >= kWriterThreadBytes) {
      std::vector<StreamWriter::Msg> msgs;
      for (size_t u = 0; u < units; ++u) {
        Block s = seg(send_block(static_cast<int>(u / nseg)), u % nseg);
        if (s.count > 0) msgs.push_back({tag(u), base + s.offset * esize, s.count * esize});
        sent_upto[u + 1] = msgs.size();
      }
      writer.emplace(*tcp, right, std::move(msgs), ctx.peer_timeout,
                     fmt::format("ring (op {})", ctx.op_id));
      pump.watch(writer->error_fd(), [&writer] { writer->check(); });
    }
    auto release = [&](size_t unit) {  // unit and every earlier one may go
      if (writer)
        writer->release(sent_upto[unit + 1]);
      else
        send(unit);
    };
    for (size_t k = 0; k < nseg; ++k)
      release(k);
    if (writer && max_bytes * static_cast<size_t>(n) >= kReaderThreadBytes) {
      // ... and a reader thread drains the left stream (into place, or into
      // a free scratch slot) while this one reduces or is descheduled.
      RingReader reader(tcp->reader_thread());
      pump.watch(reader.abort_fd, [&reader] { reader.check_abort(); });
      reader.start([&] {
        for (size_t u = 0; u < units; ++u) {
          if (index[u] != SIZE_MAX) {
            size_t allowed;
            {
              std::unique_lock lk(reader.mu);
              if (!reader.cv.wait_for(lk, ctx.peer_timeout, [&] {
                    return reader.abort || u >= rs_units || u < reader.reduced + slots;
                  }))
                throw Timeout(
                    fmt::format("collective: ring (op {}): no scratch slot freed in {} ms",
                                ctx.op_id, ctx.peer_timeout.count()));
              if (reader.abort) return;
              size_t w = reader.reduced + slots - 1;
              allowed = w >= rs_units ? SIZE_MAX : upto[w];
            }
            pump.wait_recv(left, index[u], allowed);
          }
          reader.publish(u + 1);
        }
      });
      for (size_t u = 0; u < units; ++u) {
        int t = static_cast<int>(u / nseg);
        reader.wait_received(u + 1, ctx.peer_timeout, [&] { writer->check(); });
        if (index[u] != SIZE_MAX && t < rs_steps) {
          Block s = seg(recv_block(t), u % nseg);
          reduce(op, dtype, base + s.offset * esize, scratch.data() + (u % slots) * max_seg_bytes,
                 s.count);
        }
        reader.reduced_up_to(u + 1);
        if (t + 1 < steps) release(u + nseg);
      }
      reader.join();
      writer->finish();
      return;
    }
    for (size_t u = 0; u < units; ++u) {
      int t = static_cast<int>(u / nseg);
      if (index[u] != SIZE_MAX) {
        pump.wait_recv(left, index[u], read_ahead(u));
        if (t < rs_steps) {
          Block s = seg(recv_block(t), u % nseg);
          reduce(op, dtype, base + s.offset * esize, scratch.data() + (u % slots) * max_seg_bytes,
                 s.count);
        }
      }
      if (t + 1 < steps) release(u + nseg);
    }
    pump.finish();
    if (writer) writer->finish();
    return;
  }
  std::vector<Request> sends;
  sends.reserve(units);
  auto post_send = [&](size_t unit) {
    int t = static_cast<int>(unit / nseg);
    Block s = seg(send_block(t), unit % nseg);
    if (s.count > 0)
      sends.push_back(
          isend(ctx.transport, right, tag(unit), base + s.offset * esize, s.count * esize));
  };
  std::vector<std::optional<Request>> recvs(units);
  auto post_recv = [&](size_t unit) {
    int t = static_cast<int>(unit / nseg);
    Block s = seg(recv_block(t), unit % nseg);
    if (s.count == 0) return;
    char* dst =
        t < rs_steps ? scratch.data() + (unit % kWindow) * max_seg_bytes : base + s.offset * esize;
    recvs[unit] = irecv(ctx.transport, left, tag(unit), dst, s.count * esize);
  };

  for (size_t k = 0; k < nseg; ++k)
    post_send(k);
  for (size_t u = 0; u < std::min(units, kWindow); ++u)
    post_recv(u);
  for (size_t u = 0; u < units; ++u) {
    int t = static_cast<int>(u / nseg);
    if (recvs[u]) {
      recvs[u]->wait(ctx.deadline(), fmt::format("ring step {} segment {} from rank {} (op {})", t,
                                                 u % nseg, left, ctx.op_id));
      recvs[u].reset();
      if (t < rs_steps) {
        Block s = seg(recv_block(t), u % nseg);
        reduce(op, dtype, base + s.offset * esize, scratch.data() + (u % kWindow) * max_seg_bytes,
               s.count);
      }
    }
    if (t + 1 < steps) post_send(u + nseg);
    if (u + kWindow < units) post_recv(u + kWindow);
  }
  for (auto& s : sends)
    s.wait(ctx.deadline(), fmt::format("ring send to rank {} (op {})", right, ctx.op_id));
}

void ring_allreduce(AlgoContext& ctx, void* data, size_t count, DType dtype, ReduceOp op) {
  ring(ctx, data, dtype, op, even_blocks(count, ctx.size()), true, true);
}

void allreduce(AlgoContext& ctx, void* data, size_t count, DType dtype, ReduceOp op,
               double postscale) {
  if (count == 0) return;
  if (HostCollectives* host = ctx.transport.host_collectives();
      host && ctx.size() > 1 && host->handles_allreduce(count * dtype_size(dtype))) {
    host->allreduce(data, count, dtype, op, ctx.peer_timeout, postscale);
    return;
  }
  if (ctx.size() > 1) {
    if (count * dtype_size(dtype) < ctx.small_allreduce_bytes)
      halving_doubling_allreduce(ctx, data, count, dtype, op);
    else
      ring_allreduce(ctx, data, count, dtype, op);
  }
  if (postscale != 1.0) scale(dtype, data, postscale, count);
}

}  // namespace pushpull::collective
