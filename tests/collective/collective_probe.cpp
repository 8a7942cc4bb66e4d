// SPDX-License-Identifier: Apache-2.0
// A rank of a multi-process collective test: bootstraps through the
// Horovod-style free functions (collective::init() from the environment, as
// `pushpull launch -s 0`, torchrun, mpirun or srun set it), runs every op on
// every requested dtype and size (and join with uneven batches) against a reference it computes
// locally (every rank's input is a known function of (rank, index)), and prints:
//   PLACE rank=R size=N local_rank=L local_size=S mode=M
//   PASS <number of checks>          (exit 0)   or   FAIL <what>  (exit 1)
// --victim R --after K: rank R kills itself (SIGKILL; --stop 1: stops itself
// with SIGSTOP, as if hung) after K allreduces, the others keep allreducing
// until an error (--elements N: allreduces of N floats, default 1024) and print
//   ERROR <PeerFailure|Timeout|...> <ms since the victim's last op> <message>
// exiting 3 on PeerFailure, 4 otherwise.
#include <signal.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "pushpull/collective.h"
#include "pushpull/error.h"

namespace cl = pushpull::collective;
using pushpull::Array;
using pushpull::DType;
using pushpull::Shape;

namespace {

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, ',');)
    if (!item.empty()) out.push_back(item);
  return out;
}

DType dtype_of(const std::string& name) {
  for (DType d : {DType::kFloat32, DType::kFloat16, DType::kBFloat16, DType::kFloat64,
                  DType::kInt32, DType::kInt64, DType::kInt8, DType::kUInt8})
    if (pushpull::dtype_name(d) == name) return d;
  throw pushpull::InvalidArgument("unknown dtype " + name);
}

// Small non-negative values: every sum, min, max is exact in every dtype.
double value(int rank, int64_t i) {
  return static_cast<double>((i * 7 + rank * 3) % 5);
}

Array input(DType dt, int rank, int64_t n) {
  Array a(Shape{n}, dt);
  for (int64_t i = 0; i < n; ++i)
    pushpull::set_element(a, i, value(rank, i));
  return a;
}

double reference(cl::Reduction op, DType dt, int size, int64_t i) {
  double acc = value(0, i);
  for (int r = 1; r < size; ++r) {
    double v = value(r, i);
    switch (op) {
      case cl::Reduction::kMin:
        acc = std::min(acc, v);
        break;
      case cl::Reduction::kMax:
        acc = std::max(acc, v);
        break;
      case cl::Reduction::kProduct:
        acc *= v;
        break;
      default:
        acc += v;
    }
  }
  if (op == cl::Reduction::kAverage) {
    acc /= size;
    if (!pushpull::is_floating(dt)) acc = std::trunc(acc);
  }
  return acc;
}

bool close(DType dt, double got, double want) {
  double tol = pushpull::is_half(dt) ? 1e-2 * std::max(1.0, std::fabs(want))
                                     : 1e-6 * std::max(1.0, std::fabs(want));
  return std::fabs(got - want) <= tol;
}

struct Checker {
  int checks = 0;
  void expect(bool ok, const std::string& what) {
    ++checks;
    if (!ok) throw std::runtime_error(what);
  }
};

void run_ops(const std::vector<std::string>& dtypes, const std::vector<int64_t>& sizes,
             Checker& c) {
  const int rank = cl::rank(), size = cl::size();
  for (const auto& dn : dtypes) {
    DType dt = dtype_of(dn);
    for (int64_t n : sizes) {
      const std::string tag = fmt::format("{}.{}", dn, n);
      for (cl::Reduction op : {cl::Reduction::kSum, cl::Reduction::kAverage, cl::Reduction::kMin,
                               cl::Reduction::kMax}) {
        Array a = input(dt, rank, n), out(Shape{n}, dt);
        cl::Handle h = cl::allreduce_async(fmt::format("ar.{}.{}", reduction_name(op), tag),
                                           a.view(), out.view(), op);
        cl::wait(h);
        for (int64_t i = 0; i < n; ++i)
          c.expect(close(dt, pushpull::get_element(out, i), reference(op, dt, size, i)),
                   fmt::format("allreduce {} {} element {}: got {} want {}", reduction_name(op),
                               tag, i, pushpull::get_element(out, i), reference(op, dt, size, i)));
      }
      // broadcast from the last rank
      Array b = input(dt, rank, n);
      cl::broadcast("bc." + tag, b.view(), size - 1);
      for (int64_t i = 0; i < n; ++i)
        c.expect(pushpull::get_element(b, i) == value(size - 1, i), "broadcast " + tag);
      // allgather: rank r contributes r + 1 rows of n elements
      Array g(Shape{rank + 1, n}, dt);
      for (int64_t i = 0; i < g.numel(); ++i)
        pushpull::set_element(g, i, value(rank, i));
      Array all = cl::allgather("ag." + tag, g.view());
      int64_t at = 0;
      for (int r = 0; r < size; ++r)
        for (int64_t i = 0; i < (r + 1) * n; ++i, ++at)
          c.expect(pushpull::get_element(all, at) == value(r, i),
                   fmt::format("allgather {} rank {} element {}", tag, r, i));
      c.expect(all.numel() == at, "allgather size " + tag);
      // reduce_scatter over n rows: rank r gets rows [r*q + min(r, m), ...)
      Array rs_in = input(dt, rank, n);
      Array part = cl::reduce_scatter("rs." + tag, rs_in.view());
      const int64_t q = n / size, m = n % size, first = rank * q + std::min<int64_t>(rank, m);
      c.expect(part.numel() == q + (rank < m ? 1 : 0), "reduce_scatter size " + tag);
      for (int64_t i = 0; i < part.numel(); ++i)
        c.expect(close(dt, pushpull::get_element(part, i),
                       reference(cl::Reduction::kSum, dt, size, first + i)),
                 fmt::format("reduce_scatter {} element {}", tag, first + i));
    }
  }
  cl::barrier();
  // join with uneven data: rank r has r + 1 batches; a joined rank adds 0.
  for (int i = 0; i <= rank; ++i) {
    Array one = Array::full(Shape{3}, 1.0);
    cl::allreduce(fmt::format("join.{}", i), one.view());
    c.expect(one.as<float>()[2] == static_cast<float>(size - i),
             fmt::format("allreduce join.{} with {} ranks joined", i, i));
  }
  cl::join();
}

int run_victim(int victim, int after, bool stop, int64_t elements) {
  const int rank = cl::rank();
  Array a = input(DType::kFloat32, rank, elements);
  auto last = std::chrono::steady_clock::now();
  for (int step = 0;; ++step) {
    if (rank == victim && step == after) raise(stop ? SIGSTOP : SIGKILL);
    try {
      cl::allreduce(fmt::format("step.{}", step % 4), a.view());
      last = std::chrono::steady_clock::now();
    } catch (const pushpull::Error& e) {
      auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                    std::chrono::steady_clock::now() - last)
                    .count();
      bool peer = e.code() == pushpull::ErrorCode::kPeerFailure;
      fmt::print("ERROR {} {} {}\n", peer ? "PeerFailure" : "other", ms, e.what());
      std::fflush(stdout);
      cl::shutdown();
      return peer ? 3 : 4;
    }
    if (step > 100000) return 5;  // the victim never died
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::string dtypes = "float32", sizes = "0,1,7,1000";
  int victim = -1, after = 0;
  bool stop = false;
  int64_t elements = 1024;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string k = argv[i], v = argv[i + 1];
    if (k == "--dtypes") dtypes = v;
    if (k == "--sizes") sizes = v;
    if (k == "--victim") victim = std::stoi(v);
    if (k == "--after") after = std::stoi(v);
    if (k == "--stop") stop = v == "1";
    if (k == "--elements") elements = std::stoll(v);
  }
  try {
    cl::init();
    fmt::print("PLACE rank={} size={} local_rank={} local_size={} mode={}\n", cl::rank(),
               cl::size(), cl::local_rank(), cl::local_size(), cl::default_session().mode());
    std::fflush(stdout);
    if (victim >= 0) return run_victim(victim, after, stop, elements);
    std::vector<int64_t> ns;
    for (const auto& s : split(sizes))
      ns.push_back(std::stoll(s));
    Checker c;
    run_ops(split(dtypes), ns, c);
    cl::shutdown();
    fmt::print("PASS {}\n", c.checks);
    return 0;
  } catch (const std::exception& e) {
    fmt::print("FAIL {}\n", e.what());
    return 1;
  }
}
