#include "collective/messages.h"

#include <cstring>

#include <fmt/format.h>

namespace pushpull::collective {
namespace {

constexpr uint32_t kMaxItems = 1u << 20;

class Writer {
 public:
  template <typename T>
  void put(T v) {
    char b[sizeof(T)];
    std::memcpy(b, &v, sizeof(T));
    out_.append(b, sizeof(T));
  }
  void str(std::string_view s) {
    put<uint32_t>(static_cast<uint32_t>(s.size()));
    out_.append(s);
  }
  void spec(const Spec& s) {
    str(s.name);
    put<uint8_t>(static_cast<uint8_t>(s.type));
    put<uint8_t>(static_cast<uint8_t>(s.dtype));
    put<uint8_t>(static_cast<uint8_t>(s.reduction));
    put<int32_t>(s.root);
    put<uint8_t>(static_cast<uint8_t>(s.shape.ndim()));
    for (int i = 0; i < s.shape.ndim(); ++i)
      put<int64_t>(s.shape[i]);
  }
  std::string take() { return std::move(out_); }

 private:
  std::string out_;
};

class Reader {
 public:
  explicit Reader(std::string_view b) : b_(b) {}
  template <typename T>
  T get() {
    need(sizeof(T));
    T v;
    std::memcpy(&v, b_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }
  uint32_t count() {
    uint32_t n = get<uint32_t>();
    if (n > kMaxItems) fail(fmt::format("{} items", n));
    return n;
  }
  std::string str() {
    uint32_t n = get<uint32_t>();
    need(n);
    std::string s(b_.substr(pos_, n));
    pos_ += n;
    return s;
  }
  Spec spec(int size) {
    Spec s;
    s.name = str();
    auto type = get<uint8_t>(), dtype = get<uint8_t>(), red = get<uint8_t>();
    if (type > static_cast<uint8_t>(OpType::kBarrier) || !is_valid_dtype(dtype) ||
        red > static_cast<uint8_t>(Reduction::kProduct))
      fail("bad op, dtype or reduction");
    s.type = static_cast<OpType>(type);
    s.dtype = static_cast<DType>(dtype);
    s.reduction = static_cast<Reduction>(red);
    s.root = get<int32_t>();
    if (s.root < 0 || s.root >= size) fail(fmt::format("root {}", s.root));
    int nd = get<uint8_t>();
    if (nd > Shape::kMaxDims) fail(fmt::format("{} dimensions", nd));
    std::vector<int64_t> dims(static_cast<size_t>(nd));
    for (auto& d : dims) {
      d = get<int64_t>();
      if (d < 0) fail("negative dimension");
    }
    s.shape = Shape(std::span<const int64_t>(dims));
    return s;
  }
  void need(size_t n) {
    if (b_.size() - pos_ < n) fail("truncated");
  }
  void done() {
    if (pos_ != b_.size()) fail("trailing bytes");
  }
  [[noreturn]] void fail(const std::string& what) {
    throw ProtocolError(
        fmt::format("collective: malformed control message ({} at byte {} of {}); the ranks run "
                    "incompatible pushpull versions or memory was corrupted",
                    what, pos_, b_.size()));
  }

 private:
  std::string_view b_;
  size_t pos_ = 0;
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
         a.root == b.root && a.shape == b.shape;
}

bool Spec::compatible(const Spec& o) const {
  if (name != o.name || type != o.type || dtype != o.dtype) return false;
  switch (type) {
    case OpType::kAllreduce:
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
  if (type == OpType::kBroadcast) s += fmt::format(" root {}", root);
  return s;
}

std::string encode(const Announce& a) {
  Writer w;
  w.put<uint32_t>(static_cast<uint32_t>(a.specs.size()));
  for (const auto& s : a.specs)
    w.spec(s);
  w.put<uint32_t>(static_cast<uint32_t>(a.cached.size()));
  for (uint32_t id : a.cached)
    w.put<uint32_t>(id);
  w.put<uint8_t>(a.join ? 1 : 0);
  return w.take();
}

Announce decode_announce(std::string_view bytes, int size) {
  Reader r(bytes);
  Announce a;
  for (uint32_t i = 0, n = r.count(); i < n; ++i)
    a.specs.push_back(r.spec(size));
  for (uint32_t i = 0, n = r.count(); i < n; ++i)
    a.cached.push_back(r.get<uint32_t>());
  a.join = r.get<uint8_t>() != 0;
  r.done();
  return a;
}

std::string encode(const std::vector<Response>& rs) {
  Writer w;
  w.put<uint32_t>(static_cast<uint32_t>(rs.size()));
  for (const auto& r : rs) {
    w.put<uint8_t>(static_cast<uint8_t>(r.kind));
    w.put<uint32_t>(static_cast<uint32_t>(r.tensors.size()));
    for (const auto& t : r.tensors) {
      w.str(t.name);
      w.put<uint32_t>(t.cache_id);
      w.put<uint8_t>(t.has_spec ? 1 : 0);
      if (t.has_spec) w.spec(t.spec);
    }
    w.put<uint32_t>(static_cast<uint32_t>(r.joined.size()));
    for (int32_t j : r.joined)
      w.put<int32_t>(j);
    w.put<uint32_t>(static_cast<uint32_t>(r.rows.size()));
    for (int64_t x : r.rows)
      w.put<int64_t>(x);
    w.put<int32_t>(static_cast<int32_t>(r.code));
    w.str(r.message);
  }
  return w.take();
}

std::vector<Response> decode_responses(std::string_view bytes, int size) {
  Reader rd(bytes);
  std::vector<Response> out;
  for (uint32_t i = 0, n = rd.count(); i < n; ++i) {
    Response r;
    auto kind = rd.get<uint8_t>();
    if (kind > static_cast<uint8_t>(Response::Kind::kJoinDone)) rd.fail("bad response kind");
    r.kind = static_cast<Response::Kind>(kind);
    for (uint32_t j = 0, m = rd.count(); j < m; ++j) {
      ResponseTensor t;
      t.name = rd.str();
      t.cache_id = rd.get<uint32_t>();
      t.has_spec = rd.get<uint8_t>() != 0;
      if (t.has_spec) t.spec = rd.spec(size);
      r.tensors.push_back(std::move(t));
    }
    for (uint32_t j = 0, m = rd.count(); j < m; ++j) {
      int32_t x = rd.get<int32_t>();
      if (x < 0 || x >= size) rd.fail(fmt::format("rank {}", x));
      r.joined.push_back(x);
    }
    for (uint32_t j = 0, m = rd.count(); j < m; ++j)
      r.rows.push_back(rd.get<int64_t>());
    int32_t code = rd.get<int32_t>();
    if (code < 0 || code > static_cast<int32_t>(ErrorCode::kInternal)) rd.fail("bad error code");
    r.code = static_cast<ErrorCode>(code);
    r.message = rd.str();
    out.push_back(std::move(r));
  }
  rd.done();
  return out;
}

}  // namespace pushpull::collective
