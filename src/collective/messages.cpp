// SPDX-License-Identifier: Apache-2.0
#include "collective/messages.h"

#include <algorithm>
#include <array>
#include <cmath>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "pushpull/checked.h"
#include "transport/wire.h"

namespace pushpull::collective {
namespace {

constexpr size_t kMaxItems = size_t{1} << 20;
constexpr size_t kMaxName = size_t{1} << 16;
constexpr size_t kMaxMessage = size_t{1} << 20;

// Smallest encodings, for Reader::count's check against the remaining input.
constexpr size_t kMinSpecBytes = 4 + 3 + 4 + 1 + 4 + 8;
constexpr size_t kMinTensorBytes = 4 + 4 + 1;
constexpr size_t kMinResponseBytes = 1 + 4 + 4 + 4 + 4 + 4;

void put_spec(transport::Writer& w, const Spec& s) {
  w.str(s.name);
  w.u<uint8_t>(static_cast<uint8_t>(s.type));
  w.u<uint8_t>(static_cast<uint8_t>(s.dtype));
  w.u<uint8_t>(static_cast<uint8_t>(s.reduction));
  w.u<int32_t>(s.root);
  w.u<uint8_t>(static_cast<uint8_t>(s.shape.ndim()));
  for (int i = 0; i < s.shape.ndim(); ++i)
    w.u<int64_t>(s.shape[i]);
  w.u<uint32_t>(static_cast<uint32_t>(s.members.size()));
  for (int32_t m : s.members)
    w.u<int32_t>(m);
  w.f64(s.postscale);
}

std::string as_string(std::vector<std::byte>&& b) {
  return std::string(reinterpret_cast<const char*>(b.data()), b.size());
}

// Decoding state: the reader plus the first reason the input was rejected.
struct Decoder {
  transport::Reader r;
  std::string why;

  bool fail(std::string what) {
    if (why.empty()) why = std::move(what);
    r.fail();
    return false;
  }
  Status status(size_t total) const {
    if (r.ok()) return {};
    return {ErrorCode::kProtocolError,
            fmt::format("collective: malformed control message ({} at byte {} of {}); the ranks "
                        "run incompatible pushpull versions or memory was corrupted",
                        why.empty() ? std::string("truncated or trailing bytes") : why, r.pos(),
                        total)};
  }
  bool spec(int size, Spec* s) {
    s->name = r.str(kMaxName);
    auto type = r.u<uint8_t>(), dtype = r.u<uint8_t>(), red = r.u<uint8_t>();
    s->root = r.u<int32_t>();
    int nd = r.u<uint8_t>();
    if (!r.ok()) return false;
    if (type > static_cast<uint8_t>(OpType::kBarrier) || !is_valid_dtype(dtype) ||
        red > static_cast<uint8_t>(Reduction::kProduct))
      return fail("bad op, dtype or reduction");
    s->type = static_cast<OpType>(type);
    s->dtype = static_cast<DType>(dtype);
    s->reduction = static_cast<Reduction>(red);
    if (s->root < 0 || s->root >= size) return fail(fmt::format("root {}", s->root));
    if (nd > Shape::kMaxDims) return fail(fmt::format("{} dimensions", nd));
    std::array<int64_t, Shape::kMaxDims> dims{};
    for (int i = 0; i < nd; ++i) {
      dims[static_cast<size_t>(i)] = r.u<int64_t>();
      if (dims[static_cast<size_t>(i)] < 0) return fail("negative dimension");
    }
    if (!r.ok()) return false;
    std::span<const int64_t> used(dims.data(), static_cast<size_t>(nd));
    int64_t numel;
    size_t bytes;
    if (!Shape::checked_numel(used, &numel) || !checked_bytes(numel, dtype_size(s->dtype), &bytes))
      return fail("shape too large");
    s->shape = Shape(used);
    // Members: strictly increasing ranks of this group (bounded by size).
    s->members.clear();
    for (size_t i = 0, n = r.count(static_cast<size_t>(size), 4); i < n && r.ok(); ++i) {
      int32_t m = r.u<int32_t>();
      if (!r.ok()) return false;
      if (m < 0 || m >= size || (!s->members.empty() && m <= s->members.back()))
        return fail(fmt::format("process set member {}", m));
      s->members.push_back(m);
    }
    s->postscale = r.f64();
    if (!r.ok()) return false;
    if (!std::isfinite(s->postscale)) return fail("postscale is not finite");
    if (!s->members.empty() && !s->includes(s->root) && s->type == OpType::kBroadcast)
      return fail(fmt::format("broadcast root {} outside its process set", s->root));
    return true;
  }
};

}  // namespace

std::string_view op_type_name(OpType t) {
  switch (t) {
    case OpType::kAllreduce:
      return "allreduce";
    case OpType::kBroadcast:
      return "broadcast";
    case OpType::kAllgather:
      return "allgather";
    case OpType::kReduceScatter:
      return "reduce_scatter";
    case OpType::kBarrier:
      return "barrier";
  }
  return "invalid";
}

bool operator==(const Spec& a, const Spec& b) {
  return a.name == b.name && a.type == b.type && a.dtype == b.dtype && a.reduction == b.reduction &&
         a.root == b.root && a.shape == b.shape && a.members == b.members &&
         a.postscale == b.postscale;
}

bool Spec::includes(int rank) const {
  return members.empty() || std::binary_search(members.begin(), members.end(), rank);
}

bool Spec::compatible(const Spec& o) const {
  if (name != o.name || type != o.type || dtype != o.dtype || members != o.members) return false;
  switch (type) {
    case OpType::kAllreduce:
      return reduction == o.reduction && shape == o.shape && postscale == o.postscale;
    case OpType::kReduceScatter:
      return reduction == o.reduction && shape == o.shape;
    case OpType::kBroadcast:
      return root == o.root && shape == o.shape;
    case OpType::kAllgather: {
      if (std::max(shape.ndim(), 1) != std::max(o.shape.ndim(), 1)) return false;
      for (int i = 1; i < shape.ndim(); ++i)
        if (shape[i] != o.shape[i]) return false;
      return true;
    }
    case OpType::kBarrier:
      return true;
  }
  return false;
}

std::string Spec::describe() const {
  std::string s = fmt::format("{} {}{}", op_type_name(type), dtype_name(dtype), shape.to_string());
  if (type == OpType::kAllreduce || type == OpType::kReduceScatter)
    s += fmt::format(" {}", reduction_name(reduction));
  if (type == OpType::kAllreduce && postscale != 1.0) s += fmt::format(" postscale {}", postscale);
  if (type == OpType::kBroadcast) s += fmt::format(" root {}", root);
  if (!members.empty()) s += fmt::format(" ranks [{}]", fmt::join(members, ", "));
  return s;
}

size_t Spec::bytes() const {
  size_t n;
  if (!checked_bytes(shape.numel(), dtype_size(dtype), &n))
    throw InvalidArgument(fmt::format("{} has more bytes than size_t can count", describe()));
  return n;
}

std::string encode(const Announce& a) {
  transport::Writer w;
  w.u<uint32_t>(static_cast<uint32_t>(a.specs.size()));
  for (const auto& s : a.specs)
    put_spec(w, s);
  w.u<uint32_t>(static_cast<uint32_t>(a.cached.size()));
  for (uint32_t id : a.cached)
    w.u<uint32_t>(id);
  w.u<uint8_t>(a.join ? 1 : 0);
  return as_string(w.take());
}

Status decode_announce(std::span<const std::byte> in, int size, Announce* out) {
  Decoder d{transport::Reader(in), {}};
  Announce a;
  if (in.size() > kMaxMessage) d.fail(fmt::format("{} bytes", in.size()));
  for (size_t i = 0, n = d.r.count(kMaxItems, kMinSpecBytes); i < n && d.r.ok(); ++i) {
    Spec s;
    if (d.spec(size, &s)) a.specs.push_back(std::move(s));
  }
  for (size_t i = 0, n = d.r.count(kMaxItems, 4); i < n && d.r.ok(); ++i)
    a.cached.push_back(d.r.u<uint32_t>());
  a.join = d.r.u<uint8_t>() != 0;
  d.r.done();
  if (Status st = d.status(in.size()); !st) return st;
  *out = std::move(a);
  return {};
}

Announce decode_announce(std::string_view bytes, int size) {
  Announce a;
  decode_announce(std::as_bytes(std::span(bytes.data(), bytes.size())), size, &a).raise();
  return a;
}

std::string encode(const Upward& u) {
  transport::Writer w;
  w.u<uint32_t>(static_cast<uint32_t>(u.specs.size()));
  for (const auto& s : u.specs) {
    w.u<int32_t>(s.rank);
    put_spec(w, s.spec);
  }
  w.u<uint32_t>(static_cast<uint32_t>(u.cached.size()));
  for (const auto& c : u.cached) {
    w.u<uint32_t>(c.id);
    w.u<uint8_t>(c.whole ? 1 : 0);
    w.u<uint32_t>(c.held_ms);
    w.u<uint32_t>(static_cast<uint32_t>(c.ranks.size()));
    for (int32_t r : c.ranks)
      w.u<int32_t>(r);
  }
  w.u<uint32_t>(static_cast<uint32_t>(u.joins.size()));
  for (int32_t r : u.joins)
    w.u<int32_t>(r);
  return as_string(w.take());
}

Status decode_upward(std::span<const std::byte> in, int size, Upward* out) {
  Decoder d{transport::Reader(in), {}};
  Upward u;
  auto rank = [&](int32_t r) {
    if (r < 0 || r >= size) d.fail(fmt::format("rank {}", r));
    return r;
  };
  if (in.size() > kMaxMessage) d.fail(fmt::format("{} bytes", in.size()));
  for (size_t i = 0, n = d.r.count(kMaxItems, 4 + kMinSpecBytes); i < n && d.r.ok(); ++i) {
    UpSpec s;
    s.rank = rank(d.r.u<int32_t>());
    if (d.r.ok() && d.spec(size, &s.spec)) u.specs.push_back(std::move(s));
  }
  for (size_t i = 0, n = d.r.count(kMaxItems, 4 + 1 + 4 + 4); i < n && d.r.ok(); ++i) {
    UpCached c;
    c.id = d.r.u<uint32_t>();
    c.whole = d.r.u<uint8_t>() != 0;
    c.held_ms = d.r.u<uint32_t>();
    for (size_t j = 0, m = d.r.count(static_cast<size_t>(size), 4); j < m && d.r.ok(); ++j)
      c.ranks.push_back(rank(d.r.u<int32_t>()));
    u.cached.push_back(std::move(c));
  }
  for (size_t i = 0, n = d.r.count(static_cast<size_t>(size), 4); i < n && d.r.ok(); ++i)
    u.joins.push_back(rank(d.r.u<int32_t>()));
  d.r.done();
  if (Status st = d.status(in.size()); !st) return st;
  *out = std::move(u);
  return {};
}

Upward decode_upward(std::string_view bytes, int size) {
  Upward u;
  decode_upward(std::as_bytes(std::span(bytes.data(), bytes.size())), size, &u).raise();
  return u;
}

std::string encode(const std::vector<Response>& rs) {
  transport::Writer w;
  w.u<uint32_t>(static_cast<uint32_t>(rs.size()));
  for (const auto& r : rs) {
    w.u<uint8_t>(static_cast<uint8_t>(r.kind));
    w.u<uint32_t>(static_cast<uint32_t>(r.tensors.size()));
    for (const auto& t : r.tensors) {
      w.str(t.name);
      w.u<uint32_t>(t.cache_id);
      w.u<uint8_t>(t.has_spec ? 1 : 0);
      if (t.has_spec) put_spec(w, t.spec);
    }
    w.u<uint32_t>(static_cast<uint32_t>(r.joined.size()));
    for (int32_t j : r.joined)
      w.u<int32_t>(j);
    w.u<uint32_t>(static_cast<uint32_t>(r.rows.size()));
    for (int64_t x : r.rows)
      w.u<int64_t>(x);
    w.u<int32_t>(static_cast<int32_t>(r.code));
    w.str(r.message);
  }
  return as_string(w.take());
}

Status decode_responses(std::span<const std::byte> in, int size, std::vector<Response>* out) {
  Decoder d{transport::Reader(in), {}};
  std::vector<Response> rs;
  if (in.size() > kMaxMessage) d.fail(fmt::format("{} bytes", in.size()));
  for (size_t i = 0, n = d.r.count(kMaxItems, kMinResponseBytes); i < n && d.r.ok(); ++i) {
    Response r;
    auto kind = d.r.u<uint8_t>();
    if (kind > static_cast<uint8_t>(Response::Kind::kJoinDone)) d.fail("bad response kind");
    r.kind = static_cast<Response::Kind>(kind);
    for (size_t j = 0, m = d.r.count(kMaxItems, kMinTensorBytes); j < m && d.r.ok(); ++j) {
      ResponseTensor t;
      t.name = d.r.str(kMaxName);
      t.cache_id = d.r.u<uint32_t>();
      t.has_spec = d.r.u<uint8_t>() != 0;
      if (t.has_spec) d.spec(size, &t.spec);
      r.tensors.push_back(std::move(t));
    }
    for (size_t j = 0, m = d.r.count(kMaxItems, 4); j < m && d.r.ok(); ++j) {
      int32_t x = d.r.u<int32_t>();
      if (x < 0 || x >= size) d.fail(fmt::format("rank {}", x));
      r.joined.push_back(x);
    }
    for (size_t j = 0, m = d.r.count(kMaxItems, 8); j < m && d.r.ok(); ++j)
      r.rows.push_back(d.r.u<int64_t>());
    int32_t code = d.r.u<int32_t>();
    if (code < 0 || code > static_cast<int32_t>(ErrorCode::kInternal)) d.fail("bad error code");
    r.code = static_cast<ErrorCode>(code);
    r.message = d.r.str(kMaxMessage);
    rs.push_back(std::move(r));
  }
  d.r.done();
  if (Status st = d.status(in.size()); !st) return st;
  *out = std::move(rs);
  return {};
}

std::vector<Response> decode_responses(std::string_view bytes, int size) {
  std::vector<Response> rs;
  decode_responses(std::as_bytes(std::span(bytes.data(), bytes.size())), size, &rs).raise();
  return rs;
}

}  // namespace pushpull::collective
